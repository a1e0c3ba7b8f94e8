// The Q4_K / Q6_K kernels for CPUs with AVX-VNNI but no AVX-512 (Alder Lake and later client
// cores, Sierra Forest): the kernels of gguf_vnni_kernels.h with the VEX vpdpbusd on ymm, one
// 8-row group a vector. Built in every build with a target attribute, called only where the CPU
// has the ISA.
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cstring>
#include <vector>

#include "gguf_common.h"

#define KERNEL_TARGET __attribute__((target("avx2,fma,avxvnni")))
#define YMM_DPBUSD _mm256_dpbusd_avx_epi32
#define YMM_DPWSSD _mm256_dpwssd_avx_epi32

namespace gguf {
namespace avxvnni {
#include "gguf_vnni_kernels.h"
}  // namespace avxvnni

bool cpu_has_avx_vnni() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avxvnni");
}

// 16 ymm registers: tiles of 4 rows (4 float and 8 int32 accumulators, the weights)
void avxvnni_matmul(int64_t kind, const uint8_t* pw, int64_t groups, const int8_t* qx, const float* xs,
                    const int16_t* bsums, int64_t T, int64_t in, int64_t O, float* y, int64_t ldy) {
    avxvnni::matmul<avxvnni::Ymm, 4>(kind, pw, groups, qx, xs, bsums, T, in, O, y, ldy);
}

}  // namespace gguf
