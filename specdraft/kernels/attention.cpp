// Attention of a block of new rows over an fp32 KV cache, one (head, row) at a time (inner loops in
// AVX-512 where the kernel path is an AVX-512 one: attention_avx512.cpp, the same bits).
//
// Why a kernel: the Python path computes each row with its own matmul calls (so that a row's
// result does not depend on the block it sits in: MKL picks kernels by shape) and paid ~0.2 ms a
// layer for T=1 and ~0.4 ms for T=4 in calls alone. Here every (head, row) runs the same code
// over the same sequence of visible keys, whatever T and wherever the row sits:
//   - the keys a row sees are listed in ascending cache position (causal: 0 .. its position;
//     tree mask: the prefix and its ancestors), and every reduction runs over that list, lane
//     i % 8 for the i-th visible key, so a row verified in a block (or a tree, whose ancestors
//     sit at other cache slots) gets bit for bit what one-token decoding computes for it;
//   - q.k over head_dim by dot8 (a fixed order per key); softmax with a deterministic
//     vector exp; out = (sum_i e_i v_i) / (sum_i e_i).
//
// q [nh, T, hd] f32 contiguous; k, v [nkv, C, hd] f32 (the whole cache, C >= L; rows contiguous);
// L = cache length including the T new rows (row t sits at position L - T + t);
// mask [T, L] bool (true = may attend) or none (causal). -> [T, nh, hd] (the layout the output
// projection reads). hd % 16 == 0.
#include "torch_lite.h"
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "attention_avx512.h"
#include "ops.h"
#include "simd.h"

using simd::hsum;
using simd::hmax;

namespace {

// The dot products of q with 8 key rows, as one vector (lane j: key j). Each lane sums its
// key's 8 partial sums (dims d = l mod 8) by the same tree, so a key's score is a function of
// (q, k) alone, whichever lane it lands in.
inline __m256 dot8(const float* q, const float* const* k, int64_t hd) {
    __m256 acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d);
        for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[j] + d), acc[j]);
    }
    // lanes of hadd(hadd(a0, a1), hadd(a2, a3)): per 128-bit half, (l0 + l1) + (l2 + l3) of keys 0-3,
    // then the halves' sums added: ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
    const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
    const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
    // h0 = [k0 k1 k2 k3 (low halves) | k0 k1 k2 k3 (high halves)], h1 likewise for keys 4-7
    const __m256 lo = _mm256_permute2f128_ps(h0, h1, 0x20), hi = _mm256_permute2f128_ps(h0, h1, 0x31);
    return _mm256_add_ps(lo, hi);
}

// out[h][0 .. 16) = sum_i e[h][i] * v[key(i)][0 .. 16) for H heads at once, keys in list order:
// each key's 16 values are loaded once for the H heads (a group's heads share the cache), and
// every head's lanes take the steps they take alone (one fma a key, in key order)
template <int H, typename Key>
inline void weighted_sum16(const float* const* e, int64_t n, Key key, float* const* out) {
    __m256 acc[H][2];
    for (int h = 0; h < H; ++h) acc[h][0] = acc[h][1] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; ++i) {
        if (i + attn512::PF_VALUES < n) _mm_prefetch((const char*)key(i + attn512::PF_VALUES), _MM_HINT_T0);  // its 16 floats: one line
        const float* vr = key(i);
        const __m256 v0 = _mm256_loadu_ps(vr), v1 = _mm256_loadu_ps(vr + 8);
        for (int h = 0; h < H; ++h) {
            const __m256 w = _mm256_broadcast_ss(e[h] + i);
            acc[h][0] = _mm256_fmadd_ps(w, v0, acc[h][0]);
            acc[h][1] = _mm256_fmadd_ps(w, v1, acc[h][1]);
        }
    }
    for (int h = 0; h < H; ++h) {
        _mm256_storeu_ps(out[h], acc[h][0]);
        _mm256_storeu_ps(out[h] + 8, acc[h][1]);
    }
}

// weighted_sum16 over heads [0, G) in passes of up to 4 (balanced: 6 heads are 3 + 3)
template <typename Key>
inline void weighted_sums(const float* const* e, int64_t G, int64_t n, Key key, float* const* out) {
    const int64_t passes = (G + 3) / 4;
    for (int64_t p = 0, h0 = 0; p < passes; ++p) {
        const int64_t H = G / passes + (p < G % passes);
        switch (H) {
            case 1: weighted_sum16<1>(e + h0, n, key, out + h0); break;
            case 2: weighted_sum16<2>(e + h0, n, key, out + h0); break;
            case 3: weighted_sum16<3>(e + h0, n, key, out + h0); break;
            default: weighted_sum16<4>(e + h0, n, key, out + h0); break;
        }
        h0 += H;
    }
}

// block_attention_rows's per-thread buffers, grown as needed: key positions, scores [g][L + 8], the
// heads' row pointers, q interleaved for the AVX-512 scores, 1 / the softmax sums
struct Scratch {
    std::vector<int32_t> idx;
    std::vector<float> sbuf, qi, inv;
    std::vector<const float*> e;
    std::vector<float*> o, od, sp;
    void fit(int64_t L, int64_t g, int64_t nqi) {
        if ((int64_t)idx.size() < L) idx.resize(L);
        if ((int64_t)sbuf.size() < g * (L + 8)) sbuf.resize(g * (L + 8));
        if ((int64_t)qi.size() < nqi) qi.resize(nqi);
        if ((int64_t)e.size() < g) inv.resize(g), e.resize(g), o.resize(g), od.resize(g), sp.resize(g);
    }
};

}  // namespace

at::Tensor block_attention(at::Tensor q, at::Tensor k, at::Tensor v, int64_t L,
                           std::optional<at::Tensor> mask) {
    TORCH_CHECK(q.dtype() == at::kFloat && q.dim() == 3 && q.is_contiguous(), "q: contiguous float32 [nh, T, hd]");
    TORCH_CHECK(k.dtype() == at::kFloat && v.dtype() == at::kFloat && k.dim() == 3 && v.dim() == 3,
                "k, v: float32 [nkv, C, hd]");
    const int64_t nh = q.size(0), T = q.size(1), hd = q.size(2), nkv = k.size(0);
    TORCH_CHECK(hd % 16 == 0, "head_dim must be a multiple of 16");
    TORCH_CHECK(k.sizes() == v.sizes() && k.size(2) == hd && k.stride(2) == 1 && k.stride(1) == hd &&
                v.stride(2) == 1 && v.stride(1) == hd, "k, v: [nkv, C, hd] with contiguous rows");
    TORCH_CHECK(nkv > 0 && nh % nkv == 0, "query heads must be a multiple of kv heads");
    TORCH_CHECK(T >= 1 && L >= T && L <= k.size(1), "need 1 <= T <= L <= cache capacity");
    const bool* pm = nullptr;
    if (mask) {
        TORCH_CHECK(mask->dtype() == at::kBool && mask->dim() == 2 && mask->size(0) == T && mask->size(1) == L &&
                    mask->is_contiguous(), "mask: contiguous bool [T, L]");
        pm = mask->data_ptr<bool>();
    }
    auto out = at::empty({T, nh, hd}, at::kFloat);
    block_attention_rows(q.data_ptr<float>(), {nh, T, hd, nkv, k.stride(0), v.stride(0)}, k.data_ptr<float>(),
                         v.data_ptr<float>(), L, pm, out.data_ptr<float>());
    return out;
}

void block_attention_rows(const float* pq, const AttentionShape& shape, const float* pk, const float* pv, int64_t L,
                          const bool* pm, float* po) {
    const int64_t nh = shape.nh, T = shape.T, hd = shape.hd, nkv = shape.nkv;
    const int64_t g = nh / nkv, ks = shape.ks, vs = shape.vs;
    const float scale = 1.0f / std::sqrt((float)hd);
    // the AVX-512 loops (same bits) where the kernels' path is an AVX-512 one: forcing the avx2
    // path (SPECDRAFT_KERNEL_PATH, set_kernel_path) runs these loops in AVX2 too
    const bool wide = kernel_path_avx512() && attn512::cpu_has_avx512f();
    const int64_t pairs = wide ? g / 2 : 0;  // heads 0 .. 2 pairs - 1 scored two a zmm, the rest by dot8
    // a task: one row t and the g query heads of one KV head, which see the same keys: each key
    // row is read once for all g heads while it sits in L1 (scores and weighted sums alike)
    at::parallel_for(0, nkv * T, 1, [&](int64_t begin, int64_t end) {
        // denormals flushed to zero, in and out (MXCSR FTZ | DAZ, this thread, restored below):
        // a key whose weight e^(s - max) is near e^-87 (the exp's clamp) makes weighted sums of
        // ~1e-38, and Intel cores take a microcode assist for each such operation (a very peaked
        // row, as random weights make: 16 rows of the default target's shapes at context 300 took
        // ~100 ms on an Emerald Rapids, ~17 on a Zen 3). Every path runs this, so the bits stay
        // the same on all of them; a flush moves an output by at most a few 1e-38 (only a sum
        // still in the denormal range is touched).
        const unsigned csr = _mm_getcsr();
        _mm_setcsr(csr | 0x8040);
        // a thread's scratch, kept from call to call (allocating it took ~10 us a call with the
        // caches cold after a product's weights, as every layer's attention finds them)
        thread_local Scratch scratch;
        scratch.fit(L, g, pairs * hd * 2);
        int32_t* idx = scratch.idx.data();
        float* sbuf = scratch.sbuf.data();
        const float** e = scratch.e.data();
        float **o = scratch.o.data(), **od = scratch.od.data(), **sp = scratch.sp.data();
        float *qi = scratch.qi.data(), *inv = scratch.inv.data();
        for (int64_t task = begin; task < end; ++task) {
            const int64_t kvh = task / T, t = task % T;
            const float *kh = pk + kvh * ks, *vh = pv + kvh * vs;
            int64_t n = 0;  // visible keys, in ascending position
            if (pm) {
                for (int64_t j = 0; j < L; ++j)
                    if (pm[t * L + j]) idx[n++] = (int32_t)j;
            } else {
                n = L - T + t + 1;
                for (int64_t j = 0; j < n; ++j) idx[j] = (int32_t)j;
            }
            for (int64_t a = 0; a < g; ++a) o[a] = po + (t * nh + kvh * g + a) * hd;
            if (n == 0) {  // sees nothing (not produced by the engine): zeros, as a defined answer
                for (int64_t a = 0; a < g; ++a) std::fill(o[a], o[a] + hd, 0.0f);
                continue;
            }
            const int64_t n8 = (n + 7) / 8 * 8;
            const __m256 sc = _mm256_set1_ps(scale);
            if (pairs) {  // [head 2p: q[8c .. 8c + 8) | head 2p + 1: the same] per pair p, per 8 dims c
                for (int64_t p = 0; p < pairs; ++p)
                    for (int64_t c = 0; c < hd / 8; ++c)
                        for (int64_t h = 0; h < 2; ++h)
                            std::memcpy(&qi[((p * (hd / 8) + c) * 2 + h) * 8], pq + ((kvh * g + 2 * p + h) * T + t) * hd + 8 * c,
                                        8 * sizeof(float));
                for (int64_t a = 0; a < g; ++a) sp[a] = sbuf + a * (L + 8);
                attn512::scores(qi, pairs, kh, idx, n, hd, scale, sp);
            }
            for (int64_t i = 0; i < n8 && 2 * pairs < g; i += 8) {
                attn512::prefetch_rows8(kh, idx, i + attn512::PF_KEYS, n, hd);
                const float* kr[8];
                for (int j = 0; j < 8; ++j) kr[j] = kh + idx[i + j < n ? i + j : 0] * hd;  // padding: any key, masked below
                for (int64_t a = 2 * pairs; a < g; ++a)
                    _mm256_storeu_ps(sbuf + a * (L + 8) + i, _mm256_mul_ps(dot8(pq + ((kvh * g + a) * T + t) * hd, kr, hd), sc));
            }
            for (int64_t a = 0; a < g; ++a) {  // softmax numerators in place, and 1 / their sum
                float* s = sbuf + a * (L + 8);
                for (int64_t i = n; i < n8; ++i) s[i] = -INFINITY;
                __m256 mx = _mm256_set1_ps(-INFINITY);
                for (int64_t i = 0; i < n8; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(&s[i]));
                const __m256 m = _mm256_set1_ps(hmax(mx));
                __m256 sum = _mm256_setzero_ps();
                for (int64_t i = 0; i < n8; i += 8) {
                    __m256 ex = simd::exp(_mm256_sub_ps(_mm256_loadu_ps(&s[i]), m));
                    if (i + 8 > n) {  // padding lanes contribute nothing
                        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                        ex = _mm256_and_ps(ex, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), lane)));
                    }
                    _mm256_storeu_ps(&s[i], ex);
                    sum = _mm256_add_ps(sum, ex);
                }
                inv[a] = 1.0f / hsum(sum);
                e[a] = s;
            }
            if (wide) {
                attn512::weighted_sums(e, g, n, vh, idx, hd, o);
            } else {
                for (int64_t d0 = 0; d0 < hd; d0 += 16) {
                    for (int64_t a = 0; a < g; ++a) od[a] = o[a] + d0;
                    weighted_sums(e, g, n, [&](int64_t i) { return vh + idx[i] * hd + d0; }, od);
                }
            }
            for (int64_t a = 0; a < g; ++a)
                for (int64_t d = 0; d < hd; d += 8)
                    _mm256_storeu_ps(o[a] + d, _mm256_mul_ps(_mm256_loadu_ps(o[a] + d), _mm256_set1_ps(inv[a])));
        }
        _mm_setcsr(csr);
    });
}
