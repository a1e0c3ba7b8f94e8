// The Q4_K / Q6_K kernels for CPUs with AVX-512 VNNI (Ice Lake, Zen 4 and later): the kernels of
// gguf_vnni_kernels.h over two 8-row groups a zmm (16 rows: half the instructions a row of the
// ymm form) and, for blocks of few rows, one group a ymm (EVEX vpdpbusd): one weight stream a
// thread, as the AVX2 kernels read it (measured below). Built in every build with target
// attributes (the rest of the extension is AVX2), called only where the CPU has the ISA.
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cstring>
#include <vector>

#include "gguf_common.h"

#define KERNEL_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define YMM_DPBUSD _mm256_dpbusd_epi32
#define YMM_DPWSSD _mm256_dpwssd_epi32

namespace gguf {
namespace avx512 {

#include "gguf_vnni_kernels.h"

#include "gguf_zmm.h"

}  // namespace avx512

bool cpu_has_avx512_vnni() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

// Tiles of 8 rows over pairs of groups (16 rows a zmm: 32 registers hold 8 rows' accumulators);
// one group a ymm for 1-2 rows against short rows (< 16 super-blocks): there two groups' records
// are two short streams a thread, and one row is memory-bound (measured, Zen 5, one thread, Q6_K
// 151936 x 1536, one row: 6.3-6.9 ms over pairs, 5.2 one group a ymm, 5.8 AVX2; Q6_K 1536 x 8960:
// pairs 0.30, one group 0.35)
void vnni_matmul(int64_t kind, const uint8_t* pw, int64_t groups, const int8_t* qx, const float* xs,
                 const int16_t* bsums, int64_t T, int64_t in, int64_t O, float* y, int64_t ldy) {
    if (T <= 2 && in / 256 < 16)
        avx512::matmul<avx512::Ymm, 4>(kind, pw, groups, qx, xs, bsums, T, in, O, y, ldy);
    else
        avx512::matmul<avx512::Zmm, 8>(kind, pw, groups, qx, xs, bsums, T, in, O, y, ldy);
}

}  // namespace gguf
