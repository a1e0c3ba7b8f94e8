// attention.cpp's inner loops in AVX-512 (attention_avx512.cpp): the same bits as its AVX2 loops,
// to be called only where cpu_has_avx512f().
#pragma once
#include <cstdint>

namespace attn512 {

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
