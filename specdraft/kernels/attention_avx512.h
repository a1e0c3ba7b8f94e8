// attention.cpp's inner loops in AVX-512 (attention_avx512.cpp): the same bits as its AVX2 loops,
// to be called only where cpu_has_avx512f().
#pragma once
#include <immintrin.h>
#include <cstdint>

namespace attn512 {

// Cache rows prefetched ahead into L1, in keys, by both attention loops (AVX2: attention.cpp,
// AVX-512: attention_avx512.cpp): after a layer's products stream the weights, the KV cache comes from memory, and a decode
// step has too little work per key to hide its latency. Measured on the AMX Xeon with the caches
// in 2 MB pages (one row, `specdraft calibrate --steps`'s attention step, context 1500 / 300): 5.8 /
// 1.36 ms a forward without, 4.9-5.0 / 1.14 with these (keys 16 ahead, 4 KB pages: no gain; 2 MB
// pages alone: 7.7 -> 5.8 / 2.0 -> 1.36).
constexpr int64_t PF_KEYS = 32, PF_VALUES = 16;

// every cache line of rows idx[from .. min(from + 8, n)) of base (hd floats each) into L1
inline void prefetch_rows8(const float* base, const int32_t* idx, int64_t from, int64_t n, int64_t hd) {
    for (int64_t j = from; j < from + 8 && j < n; ++j)
        for (int64_t d = 0; d < hd; d += 16) _mm_prefetch((const char*)(base + (int64_t)idx[j] * hd + d), _MM_HINT_T0);
}

bool cpu_has_avx512f();

// s[a][i] = scale * q_a . k_idx[i] for the 2 * pairs heads a of qi and the n keys listed in idx
// (rows of kh, hd floats apart); s[a] has room for n rounded up to 8 (the padding lanes hold
// some key's score). qi: per pair p, per 8 dims c, [head 2p's q[8c .. 8c + 8) | head 2p + 1's]
void scores(const float* qi, int64_t pairs, const float* kh, const int32_t* idx, int64_t n, int64_t hd, float scale,
            float* const* s);

// out[h][d] = sum_i e[h][i] * v_idx[i][d] over i in order, for G heads and every d < hd (hd % 16 == 0)
void weighted_sums(const float* const* e, int64_t G, int64_t n, const float* vh, const int32_t* idx, int64_t hd,
                   float* const* out);

}  // namespace attn512
