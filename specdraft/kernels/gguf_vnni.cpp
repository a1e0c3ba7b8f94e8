// The Q4_K / Q6_K matrix kernels for CPUs with AVX-512 VNNI (Ice Lake, Zen 4 and later), over the
// same records as the AVX2 kernels (gguf_matmul.cpp, layout at its top). Built in every build with
// target attributes (the rest of the extension is AVX2), called only where the CPU has the ISA.
//
// Bitwise the AVX2 results: per super-block, both paths form the same exact int32 sums
// (sum_s sc * sum q x; the mins' sum_s mn * sum x) and then take the same float steps per (t, o)
// (cvt, d * xs, fma; dmin * xs, fnmadd), lane for lane. What changes is how the integers are got:
// vpdpbusd multiplies 4 unsigned quants by 4 signed x and adds them into an int32 lane, and a zmm
// holds two records (groups g, g + 1: 16 output rows) side by side, so every lane of a product
// wants the same 4 inputs of x: one broadcast dword a vpdpbusd, folded into its memory operand.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cstring>
#include <vector>

#include "gguf_common.h"

#define AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

namespace gguf {
namespace {

constexpr int TILE = 8;  // rows of x per pass over a pair of weight groups (32 zmm registers)

AVX512_VNNI inline __m512i join(const uint8_t* a, const uint8_t* b) {  // 32 bytes of a, then 32 of b
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)a)),
                              _mm256_loadu_si256((const __m256i*)b), 1);
}

AVX512_VNNI inline __m512 join_ps(const uint8_t* a, const uint8_t* b) { return _mm512_castsi512_ps(join(a, b)); }

AVX512_VNNI inline __m128i join8(const uint8_t* a, const uint8_t* b) {  // 8 bytes of a, then 8 of b
    return _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i*)a), _mm_loadl_epi64((const __m128i*)b));
}

AVX512_VNNI inline __m512i bcast4(const int8_t* x) {  // 4 bytes of x in every int32 lane
    int32_t v;
    std::memcpy(&v, x, 4);
    return _mm512_set1_epi32(v);
}

// NT rows of x against groups g0, g1 of a Q4_K matrix (w0, w1: their nb records; lanes 0-7 are
// g0's rows, 8-15 g1's), out: y[t0, 8 g0]. Per sub-block of 32 inputs: 8 vpdpbusd a row give
// each lane its sum q x (|.| <= 32 * 15 * 127), one vpmulld applies the row's scale.
// msum[t, b, k]: sub-blocks 2k, 2k + 1's sums of x as two i16 (the mins' vpdpwssd operand).
template <int NT>
AVX512_VNNI void q4k_rows16(const uint8_t* w0, const uint8_t* w1, const int8_t* qx, const float* xs,
                            const int32_t* msum, int64_t nb, int64_t in, int64_t t0, float* out, int64_t ldy,
                            __mmask16 keep) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512 acc[NT];
    for (int r = 0; r < NT; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *r0 = w0 + b * Q4K_REC, *r1 = w1 + b * Q4K_REC;
        const int8_t* xb = qx + t0 * in + b * 256;
        __m512i sum[NT];
        for (int r = 0; r < NT; ++r) sum[r] = _mm512_setzero_si512();
        for (int s = 0; s < 8; ++s) {  // sub-block s: inputs 32s .. 32s + 31
            prefetch_ahead<Q4K_REC, 8>(r0, s);
            prefetch_ahead<Q4K_REC, 8>(r1, s);
            const __m512i sc = _mm512_cvtepu8_epi32(join8(r0 + 1024 + 8 * s, r1 + 1024 + 8 * s));
            __m512i dot[NT];
            for (int r = 0; r < NT; ++r) dot[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {  // inputs 32s + 8c .. + 3 (low nibbles), + 4 .. + 7 (high)
                const __m512i v = join(r0 + 128 * s + 32 * c, r1 + 128 * s + 32 * c);
                const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
                for (int r = 0; r < NT; ++r) {
                    const int8_t* x = xb + r * in + 32 * s + 8 * c;
                    dot[r] = _mm512_dpbusd_epi32(dot[r], lo, bcast4(x));
                    dot[r] = _mm512_dpbusd_epi32(dot[r], hi, bcast4(x + 4));
                }
            }
            for (int r = 0; r < NT; ++r) sum[r] = _mm512_add_epi32(sum[r], _mm512_mullo_epi32(dot[r], sc));
        }
        // mins: mn as i16 pairs per row [pair k][row][2], both groups: one vpdpwssd per pair k
        __m512i mn[4];
        for (int k = 0; k < 4; ++k)
            mn[k] = _mm512_cvtepu8_epi16(_mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)(r0 + 1088 + 16 * k))),
                _mm_loadu_si128((const __m128i*)(r1 + 1088 + 16 * k)), 1));
        const __m512 d = join_ps(r0 + 1152, r1 + 1152), dmin = join_ps(r0 + 1184, r1 + 1184);
        for (int r = 0; r < NT; ++r) {
            const int32_t* ms = msum + ((t0 + r) * nb + b) * 4;
            __m512i m = _mm512_setzero_si512();
            for (int k = 0; k < 4; ++k) m = _mm512_dpwssd_epi32(m, mn[k], _mm512_set1_epi32(ms[k]));
            const __m512 x = _mm512_set1_ps(xs[(t0 + r) * nb + b]);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r]), _mm512_mul_ps(d, x), acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(dmin, x), acc[r]);
        }
    }
    for (int r = 0; r < NT; ++r) _mm512_mask_storeu_ps(out + (t0 + r) * ldy, keep, acc[r]);
}

// NT rows of x against groups g0, g1 of a Q6_K matrix, as q4k_rows16. Per sub-block of 16 inputs:
// a lane starts at -32 * (the sub-block's sum of x, corr) and 4 vpdpbusd add its sum q x (q in
// 0..63), which is sum (q - 32) x, exactly what the AVX2 kernel's 16-bit lanes add up to.
template <int NT>
AVX512_VNNI void q6k_rows16(const uint8_t* w0, const uint8_t* w1, const int8_t* qx, const float* xs,
                            const int32_t* corr, int64_t nb, int64_t in, int64_t t0, float* out, int64_t ldy,
                            __mmask16 keep) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), top2 = _mm512_set1_epi8(0x30);
    __m512 acc[NT];
    for (int r = 0; r < NT; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *r0 = w0 + b * Q6K_REC, *r1 = w1 + b * Q6K_REC;
        const int8_t* xb = qx + t0 * in + b * 256;
        __m512i sum[NT];
        for (int r = 0; r < NT; ++r) sum[r] = _mm512_setzero_si512();
        for (int s = 0; s < 16; ++s) {  // sub-block s: inputs 16s .. 16s + 15, quads k of 4 inputs
            prefetch_ahead<Q6K_REC, 16>(r0, s);
            prefetch_ahead<Q6K_REC, 16>(r1, s);
            const __m512i sc = _mm512_cvtepi8_epi32(join8(r0 + 1536 + 8 * s, r1 + 1536 + 8 * s));
            const __m512i v0 = join(r0 + 64 * s, r1 + 64 * s), v1 = join(r0 + 64 * s + 32, r1 + 64 * s + 32);
            const __m512i h = join(r0 + 1024 + 32 * s, r1 + 1024 + 32 * s);
            // quad k's top 2 bits are bits 2k, 2k + 1 of h's bytes, moved to bits 4, 5
            const __m512i q0 = _mm512_or_si512(_mm512_and_si512(v0, low4), _mm512_and_si512(_mm512_slli_epi16(h, 4), top2));
            const __m512i q1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v0, 4), low4),
                                               _mm512_and_si512(_mm512_slli_epi16(h, 2), top2));
            const __m512i q2 = _mm512_or_si512(_mm512_and_si512(v1, low4), _mm512_and_si512(h, top2));
            const __m512i q3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v1, 4), low4),
                                               _mm512_and_si512(_mm512_srli_epi16(h, 2), top2));
            for (int r = 0; r < NT; ++r) {
                const int8_t* x = xb + r * in + 16 * s;
                __m512i p = _mm512_set1_epi32(corr[((t0 + r) * nb + b) * 16 + s]);
                p = _mm512_dpbusd_epi32(p, q0, bcast4(x));
                p = _mm512_dpbusd_epi32(p, q1, bcast4(x + 4));
                p = _mm512_dpbusd_epi32(p, q2, bcast4(x + 8));
                p = _mm512_dpbusd_epi32(p, q3, bcast4(x + 12));
                sum[r] = _mm512_add_epi32(sum[r], _mm512_mullo_epi32(p, sc));
            }
        }
        const __m512 d = join_ps(r0 + 1664, r1 + 1664);
        for (int r = 0; r < NT; ++r)
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r]), _mm512_mul_ps(d, _mm512_set1_ps(xs[(t0 + r) * nb + b])), acc[r]);
    }
    for (int r = 0; r < NT; ++r) _mm512_mask_storeu_ps(out + (t0 + r) * ldy, keep, acc[r]);
}

// Calls rows(nt, w0, w1, t0, out, keep) for every pair of groups (the last alone, paired with
// itself, when the count is odd: its copy's lanes are not stored) and every tile of rows
template <int REC, typename Rows>
void over_pairs(const uint8_t* pw, int64_t groups, int64_t T, int64_t nb, int64_t O, float* y, Rows rows) {
    at::parallel_for(0, (groups + 1) / 2, 1, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
            const int64_t g0 = 2 * p, g1 = g0 + 1 < groups ? g0 + 1 : g0;
            const int64_t valid = O - g0 * GROUP < 2 * GROUP ? O - g0 * GROUP : 2 * GROUP;
            const __mmask16 keep = (__mmask16)((1u << valid) - 1);
            const uint8_t *w0 = pw + g0 * nb * REC, *w1 = pw + g1 * nb * REC;
            over_tiles<TILE>(T, [&](auto nt, int64_t t0) { rows(nt, w0, w1, t0, y + g0 * GROUP, keep); });
        }
    });
}

}  // namespace

bool cpu_has_avx512_vnni() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

void vnni_matmul(int64_t kind, const uint8_t* pw, int64_t groups, const int8_t* qx, const float* xs,
                 const int16_t* bsums, int64_t T, int64_t in, int64_t O, float* y, int64_t ldy) {
    const int64_t nb = in / 256, n16 = T * in / 16;
    if (kind == 4) {  // msum: sub-block pairs' sums of x (two i16 in an int32), as the AVX2 kernel forms them
        std::vector<int32_t> msum(n16 / 4);
        for (int64_t u = 0; u < n16 / 4; ++u) {
            const int16_t* bs = bsums + 4 * u;
            msum[u] = (int32_t)((uint32_t)(uint16_t)(bs[0] + bs[1]) | (uint32_t)(uint16_t)(bs[2] + bs[3]) << 16);
        }
        const int32_t* pm = msum.data();
        over_pairs<Q4K_REC>(pw, groups, T, nb, O, y, [&](auto nt, const uint8_t* w0, const uint8_t* w1, int64_t t0, float* out, __mmask16 keep) {
            q4k_rows16<decltype(nt)::value>(w0, w1, qx, xs, pm, nb, in, t0, out, ldy, keep);
        });
    } else {  // corr: -32 * each sub-block's sum of x
        std::vector<int32_t> corr(n16);
        for (int64_t u = 0; u < n16; ++u) corr[u] = -32 * (int32_t)bsums[u];
        const int32_t* pc = corr.data();
        over_pairs<Q6K_REC>(pw, groups, T, nb, O, y, [&](auto nt, const uint8_t* w0, const uint8_t* w1, int64_t t0, float* out, __mmask16 keep) {
            q6k_rows16<decltype(nt)::value>(w0, w1, qx, xs, pc, nb, in, t0, out, ldy, keep);
        });
    }
}

}  // namespace gguf
