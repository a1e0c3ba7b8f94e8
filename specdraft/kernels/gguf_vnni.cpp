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

// Two groups of 8 rows a 512-bit vector: lanes 0-7 group g0's rows, 8-15 g1's (records a, b)
struct Zmm {
    static constexpr int GROUPS = 2;
    using I = __m512i;
    using F = __m512;
    KERNEL_TARGET static I load32(const uint8_t* a, const uint8_t* b) {
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)a)),
                                  _mm256_loadu_si256((const __m256i*)b), 1);
    }
    KERNEL_TARGET static __m128i load8x2(const uint8_t* a, const uint8_t* b) {
        return _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i*)a), _mm_loadl_epi64((const __m128i*)b));
    }
    KERNEL_TARGET static I u8to32(const uint8_t* a, const uint8_t* b) { return _mm512_cvtepu8_epi32(load8x2(a, b)); }
    KERNEL_TARGET static I i8to32(const uint8_t* a, const uint8_t* b) { return _mm512_cvtepi8_epi32(load8x2(a, b)); }
    KERNEL_TARGET static I u8to16(const uint8_t* a, const uint8_t* b) {
        return _mm512_cvtepu8_epi16(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)a)),
                                                            _mm_loadu_si128((const __m128i*)b), 1));
    }
    KERNEL_TARGET static F load8f(const uint8_t* a, const uint8_t* b) { return _mm512_castsi512_ps(load32(a, b)); }
    VNNI_LANE_OPS(_mm512, si512)
    KERNEL_TARGET static I dpbusd(I acc, I u8, I s8) { return _mm512_dpbusd_epi32(acc, u8, s8); }
    KERNEL_TARGET static I dpwssd(I acc, I a, I b) { return _mm512_dpwssd_epi32(acc, a, b); }
    KERNEL_TARGET static void store(float* p, int valid, F v) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << valid) - 1), v); }
};

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
