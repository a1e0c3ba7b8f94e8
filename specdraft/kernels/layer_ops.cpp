// The steps of a decoder layer between its matrix products, one native call each (the Python
// path spent ~35 small torch calls a layer, ~6 ms a forward of the 1.5B target).
//
// Each works row by row (one token at a time) with fixed reduction orders, so a row's result
// does not depend on the block it is computed in.
#include "torch_lite.h"
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops.h"
#include "simd.h"

// 1 / sqrt(mean(x^2) + eps) of one row x [n], n a multiple of 8, in a fixed order
static inline float rms_scale(const float* x, int64_t n, double eps) {
    __m256 ss = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        ss = _mm256_fmadd_ps(v, v, ss);
    }
    return 1.0f / std::sqrt(simd::hsum(ss) / (float)n + (float)eps);
}

// out[i] = w[i] * (x[i] * r) for i in [lo, hi) (multiples of 8)
static inline void scaled(const float* x, const float* w, __m256 r, int64_t lo, int64_t hi, float* out) {
    for (int64_t i = lo; i < hi; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), r)));
}

// One row's RMSNorm: out[0 .. n) = w * (x / sqrt(mean(x^2) + eps)), n a multiple of 8, fixed order
static inline void rms_row(const float* x, const float* w, int64_t n, double eps, float* out) {
    scaled(x, w, _mm256_set1_ps(rms_scale(x, n, eps)), 0, n, out);
}

// RMSNorm then 8-bit quantization for the next product: h = w * (x / sqrt(mean(x^2) + eps)).
// x [T, H] f32, w [H] f32 -> quantize_q8k(h)
std::vector<at::Tensor> rms_quantize(at::Tensor x, at::Tensor w, double eps) {
    TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x: contiguous float32 [T, H]");
    const int64_t T = x.size(0), H = x.size(1), in = (H + 255) / 256 * 256;
    TORCH_CHECK(w.dtype() == at::kFloat && w.numel() == H && w.is_contiguous(), "w: float32 [H]");
    TORCH_CHECK(H % 8 == 0, "hidden size must be a multiple of 8");
    auto h = at::zeros({T, in}, at::kFloat);
    auto qx = at::empty({T, in}, at::kChar);
    auto xs = at::empty({T, in / 256}, at::kFloat);
    auto bsums = at::empty({T, in / 16}, at::kShort);
    rms_quantize_rows(x.data_ptr<float>(), w.data_ptr<float>(), T, H, eps, h.data_ptr<float>(),
                      {qx.data_ptr<int8_t>(), xs.data_ptr<float>(), bsums.data_ptr<int16_t>(), in});
    return {qx, xs, bsums};
}

void rms_quantize_rows(const float* x, const float* w, int64_t T, int64_t H, double eps, float* h, const Q8Rows& out) {
    const int64_t nb = out.in / 256;
    // tasks: (row, super-block), each normed and quantized while in L1, so a few rows take both
    // cores; a row's scale is summed in full by every task of it (fixed order: the same bits)
    at::parallel_for(0, T * nb, 12, [&](int64_t first, int64_t last) {
        int64_t row = -1;
        __m256 r = _mm256_setzero_ps();
        for (int64_t task = first; task < last; ++task) {
            const int64_t t = task / nb, lo = task % nb * 256, hi = std::min(H, lo + 256);
            const float* xr = x + t * H;
            if (t != row) r = _mm256_set1_ps(rms_scale(xr, H, eps)), row = t;
            float* hr = h + t * out.in;
            scaled(xr, w, r, lo, hi, hr);
            out.quantize_block(hr + lo, task);
        }
    });
}

// silu(gate) * up, quantized for the down projection. gate_up [T, 2I] f32 (gate | up) -> quantize_q8k([T, I])
std::vector<at::Tensor> swiglu_quantize(at::Tensor gate_up) {
    TORCH_CHECK(gate_up.dtype() == at::kFloat && gate_up.dim() == 2 && gate_up.is_contiguous(),
                "gate_up: contiguous float32 [T, 2I]");
    const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2, in = (I + 255) / 256 * 256;
    TORCH_CHECK(gate_up.size(1) == 2 * I && I % 8 == 0, "gate_up: [T, 2I] with I a multiple of 8");
    auto a = at::zeros({T, in}, at::kFloat);
    auto qx = at::empty({T, in}, at::kChar);
    auto xs = at::empty({T, in / 256}, at::kFloat);
    auto bsums = at::empty({T, in / 16}, at::kShort);
    swiglu_quantize_rows(gate_up.data_ptr<float>(), T, I, a.data_ptr<float>(),
                         {qx.data_ptr<int8_t>(), xs.data_ptr<float>(), bsums.data_ptr<int16_t>(), in});
    return {qx, xs, bsums};
}

void swiglu_quantize_rows(const float* gate_up, int64_t T, int64_t I, float* a, const Q8Rows& out) {
    const int64_t nb = out.in / 256;
    // tasks: (row, super-block), each computed and quantized while in L1: a few rows take both
    // cores (a row a thread left one idle: ~59 us of a 6-row check's layer on an AMX Xeon)
    at::parallel_for(0, T * nb, 4, [&](int64_t first, int64_t last) {
        const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
        for (int64_t task = first; task < last; ++task) {
            const int64_t t = task / nb, lo = task % nb * 256, hi = std::min(I, lo + 256);
            const float *g = gate_up + t * 2 * I, *u = g + I;
            float* ar = a + t * out.in;
            for (int64_t i = lo; i < hi; i += 8) {
                const __m256 gv = _mm256_loadu_ps(g + i);
                const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, simd::exp(_mm256_sub_ps(zero, gv))));
                _mm256_storeu_ps(ar + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
            }
            out.quantize_block(ar + lo, task);
        }
    });
}

// RoPE (rotate-half convention, sin with its first half negated: x cos + roll(x, hd/2) sin) on
// the q and k heads of qkv, k and v written to the caches at positions start .. start + T - 1.
// qkv [T, (nh + 2 nkv) hd] f32; cos, sin_signed [T, hd]; caches [nkv, C, hd] -> q [nh, T, hd]
// With q_norm, k_norm ([hd] f32 each; Qwen3) every q / k head is first RMS-normalised over its hd
// values and scaled by them, as the norms' weights times x / sqrt(mean(x^2) + eps).
at::Tensor rope_cache(at::Tensor qkv, at::Tensor cos, at::Tensor sin_signed, at::Tensor k_cache,
                      at::Tensor v_cache, int64_t start, int64_t num_heads,
                      std::optional<at::Tensor> q_norm, std::optional<at::Tensor> k_norm, double eps) {
    TORCH_CHECK(qkv.dtype() == at::kFloat && qkv.dim() == 2 && qkv.is_contiguous(), "qkv: contiguous float32 [T, n]");
    TORCH_CHECK(k_cache.dtype() == at::kFloat && v_cache.dtype() == at::kFloat && k_cache.dim() == 3 &&
                k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes(),
                "caches: contiguous float32 [nkv, C, hd]");
    const int64_t T = qkv.size(0), nkv = k_cache.size(0), C = k_cache.size(1), hd = k_cache.size(2), nh = num_heads;
    TORCH_CHECK(qkv.size(1) == (nh + 2 * nkv) * hd && hd % 16 == 0, "qkv: [T, (nh + 2 nkv) hd], hd a multiple of 16");
    TORCH_CHECK(cos.dtype() == at::kFloat && sin_signed.dtype() == at::kFloat && cos.is_contiguous() &&
                sin_signed.is_contiguous() && cos.numel() == T * hd && sin_signed.numel() == T * hd, "cos, sin: float32 [T, hd]");
    TORCH_CHECK(start >= 0 && start + T <= C, "cache overflow");
    TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "q_norm and k_norm come together");
    const float *pqn = nullptr, *pkn = nullptr;
    if (q_norm) {
        TORCH_CHECK(q_norm->dtype() == at::kFloat && k_norm->dtype() == at::kFloat && q_norm->is_contiguous() &&
                    k_norm->is_contiguous() && q_norm->numel() == hd && k_norm->numel() == hd && hd <= 1024,
                    "q_norm, k_norm: float32 [hd], hd up to 1024");
        pqn = q_norm->data_ptr<float>(), pkn = k_norm->data_ptr<float>();
    }
    auto q = at::empty({nh, T, hd}, at::kFloat);
    RopeShape shape{T, nh, nkv, hd, C, start};
    rope_cache_rows(qkv.data_ptr<float>(), shape, cos.data_ptr<float>(), sin_signed.data_ptr<float>(),
                    k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), pqn, pkn, eps, q.data_ptr<float>());
    return q;
}

void rope_cache_rows(const float* pqkv, const RopeShape& shape, const float* pc, const float* ps, float* pk, float* pv,
                     const float* pqn, const float* pkn, double eps, float* pq) {
    const int64_t T = shape.T, nh = shape.nh, nkv = shape.nkv, hd = shape.hd, C = shape.C, start = shape.start;
    alignas(32) float normed[1024];  // one head's normed values (hd <= 1024: checked by the callers)
    const int64_t half = hd / 2, width = (nh + 2 * nkv) * hd;
    for (int64_t t = 0; t < T; ++t) {
        const float *row = pqkv + t * width, *c = pc + t * hd, *s = ps + t * hd;
        for (int64_t h = 0; h < nh + nkv; ++h) {  // q heads, then k heads
            const float* x = row + h * hd;
            if (pqn) {  // the head's RMSNorm first
                rms_row(x, h < nh ? pqn : pkn, hd, eps, normed);
                x = normed;
            }
            float* out = h < nh ? pq + (h * T + t) * hd : pk + ((h - nh) * C + start + t) * hd;
            for (int64_t i = 0; i < hd; i += 8) {
                const int64_t j = (i + half) % hd;  // roll(x, hd/2)[i] = x[(i + hd/2) mod hd]
                const __m256 a = _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(c + i));
                const __m256 b = _mm256_mul_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(s + i));
                _mm256_storeu_ps(out + i, _mm256_add_ps(a, b));
            }
        }
        for (int64_t h = 0; h < nkv; ++h)
            std::memcpy(pv + (h * C + start + t) * hd, row + (nh + nkv + h) * hd, hd * sizeof(float));
    }
}
