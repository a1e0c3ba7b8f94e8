// The two inner loops of attention.cpp in 512-bit vectors, bit for bit what its AVX2 loops give.
//
// Why: a block of 16 new rows spent ~6 ms a forward of the 1.5B target in attention (context
// 300) against ~1 ms for one row; half the instructions a step is what AVX-512 buys, and the
// same bits are what keeps every ISA path's logits identical:
//   - scores: the AVX2 dot8 keeps, per (head, key), 8 lanes d mod 8 each summing q[d] k[d] by
//     one fma a step over d, then adds them by the tree ((l0 + l1) + (l2 + l3)) + ((l4 + l5) +
//     (l6 + l7)). Here a zmm holds two heads' 8 lanes for one key ([head 2p | head 2p + 1], the
//     key's 8 values broadcast to both halves), so each lane takes the very same fma chain, and
//     three rounds of pairwise sums (vpermt2ps even / odd lanes, then an add) build the same tree
//     for 8 keys x 2 heads at once (float addition is commutative: lane order within a pair
//     changes no bit);
//   - weighted sums of values: lanes are dims, one fma a key in key order, as in AVX2; a zmm is
//     16 of them.
// Built in every build with a target attribute, called only where the CPU has AVX-512F.
#include <immintrin.h>
#include <cstdint>

#include "attention_avx512.h"

#define AVX512_TARGET __attribute__((target("avx512f")))

namespace attn512 {

namespace {

// lanes [head 0: 8 | head 1: 8] of a and b -> [head 0: a's 4 pair sums, b's 4 | head 1: likewise]
AVX512_TARGET inline __m512 pair_sums(__m512 a, __m512 b) {
    // even[q] / odd[q]: for q's half h (0, 1) and r = q % 8: lane h*8 + 2 (r % 4) (+1) of a (r < 4) or b
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 16, 18, 20, 22, 8, 10, 12, 14, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 17, 19, 21, 23, 9, 11, 13, 15, 25, 27, 29, 31);
    return _mm512_add_ps(_mm512_permutex2var_ps(a, even, b), _mm512_permutex2var_ps(a, odd, b));
}

// scores of P head pairs against 8 keys (rows kr): acc[j][p] lanes [head 2p: d mod 8 | head 2p + 1]
template <int P>
AVX512_TARGET inline void score8(const float* qi, const float* const* kr, int64_t hd, float scale, float* const* s, int64_t i) {
    __m512 acc[8][P];
    for (int j = 0; j < 8; ++j)
        for (int p = 0; p < P; ++p) acc[j][p] = _mm512_setzero_ps();
    const int64_t chunks = hd / 8;
    for (int64_t c = 0; c < chunks; ++c) {
        __m512 q[P];
        for (int p = 0; p < P; ++p) q[p] = _mm512_loadu_ps(qi + (p * chunks + c) * 16);
        for (int j = 0; j < 8; ++j) {
            const __m512 k = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd((const double*)(kr[j] + 8 * c))));
            for (int p = 0; p < P; ++p) acc[j][p] = _mm512_fmadd_ps(q[p], k, acc[j][p]);
        }
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int p = 0; p < P; ++p) {
        const __m512 b0 = pair_sums(acc[0][p], acc[1][p]), b1 = pair_sums(acc[2][p], acc[3][p]);
        const __m512 b2 = pair_sums(acc[4][p], acc[5][p]), b3 = pair_sums(acc[6][p], acc[7][p]);
        const __m512 d = _mm512_mul_ps(pair_sums(pair_sums(b0, b1), pair_sums(b2, b3)), sc);  // [head 2p: keys 0-7 | 2p + 1]
        _mm256_storeu_ps(s[2 * p] + i, _mm512_castps512_ps256(d));
        _mm256_storeu_ps(s[2 * p + 1] + i, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(d), 1)));
    }
}

// weighted sums for H heads over DV x 16 dims from d0
template <int H, int DV>
AVX512_TARGET inline void weighted(const float* const* e, int64_t n, const float* vh, const int32_t* idx, int64_t hd,
                                   int64_t d0, float* const* out) {
    __m512 acc[H][DV];
    for (int h = 0; h < H; ++h)
        for (int k = 0; k < DV; ++k) acc[h][k] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; ++i) {
        if (i + PF_VALUES < n)  // the value row PF_VALUES keys ahead (this pass's DV x 16 floats)
            for (int k = 0; k < DV; ++k) _mm_prefetch((const char*)(vh + (int64_t)idx[i + PF_VALUES] * hd + d0 + 16 * k), _MM_HINT_T0);
        const float* vr = vh + (int64_t)idx[i] * hd + d0;
        __m512 v[DV];
        for (int k = 0; k < DV; ++k) v[k] = _mm512_loadu_ps(vr + 16 * k);
        for (int h = 0; h < H; ++h) {
            const __m512 w = _mm512_set1_ps(e[h][i]);
            for (int k = 0; k < DV; ++k) acc[h][k] = _mm512_fmadd_ps(w, v[k], acc[h][k]);
        }
    }
    for (int h = 0; h < H; ++h)
        for (int k = 0; k < DV; ++k) _mm512_storeu_ps(out[h] + d0 + 16 * k, acc[h][k]);
}

template <int DV>
AVX512_TARGET void weighted_heads(const float* const* e, int64_t G, int64_t n, const float* vh, const int32_t* idx,
                                  int64_t hd, float* const* out) {
    constexpr int MAXH = 24 / DV < 8 ? 24 / DV : 8;  // accumulators in registers: H x DV <= 24 of the 32
    const int64_t passes = (G + MAXH - 1) / MAXH;
    for (int64_t d0 = 0; d0 < hd; d0 += 16 * DV)
        for (int64_t p = 0, h0 = 0; p < passes; ++p) {
            const int64_t H = G / passes + (p < G % passes);
            switch (H) {
#define CASE(N) case N: if constexpr (N <= MAXH) weighted<N, DV>(e + h0, n, vh, idx, hd, d0, out + h0); break;
                CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
                default: break;
            }
            h0 += H;
        }
}

}  // namespace

AVX512_TARGET void scores(const float* qi, int64_t pairs, const float* kh, const int32_t* idx, int64_t n, int64_t hd,
                          float scale, float* const* s) {
    for (int64_t i = 0; i < n; i += 8) {
        prefetch_rows8(kh, idx, i + PF_KEYS, n, hd);
        const float* kr[8];
        for (int j = 0; j < 8; ++j) kr[j] = kh + (int64_t)idx[i + j < n ? i + j : 0] * hd;  // padding: any key, masked later
        for (int64_t p0 = 0; p0 < pairs; p0 += 3) {  // passes of up to 3 pairs: 24 accumulators
            const int64_t P = pairs - p0 < 3 ? pairs - p0 : 3;
            const float* q = qi + p0 * hd * 2;
            float* const* sp = s + 2 * p0;
            if (P == 3) score8<3>(q, kr, hd, scale, sp, i);
            else if (P == 2) score8<2>(q, kr, hd, scale, sp, i);
            else score8<1>(q, kr, hd, scale, sp, i);
        }
    }
}

AVX512_TARGET void weighted_sums(const float* const* e, int64_t G, int64_t n, const float* vh, const int32_t* idx,
                                 int64_t hd, float* const* out) {
    if (hd % 64 == 0) weighted_heads<4>(e, G, n, vh, idx, hd, out);
    else if (hd % 32 == 0) weighted_heads<2>(e, G, n, vh, idx, hd, out);
    else weighted_heads<1>(e, G, n, vh, idx, hd, out);
}

bool cpu_has_avx512f() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}

}  // namespace attn512
