// All decoder layers of a GGUF-weight model in one native call per forward.
//
// Why: the Python layer loop made ~12 native calls and ~6 torch ops a layer (activations
// quantized, parts of fused projections concatenated, residual adds): measured ~9 ms of glue in
// an 87 ms one-token forward of the 1.5B target, and more in proportion for a small draft model.
// This runs the very same steps (rms_quantize -> qkv -> rope_cache -> block_attention -> o ->
// rms_quantize -> gate_up -> swiglu_quantize -> down, residual adds in float32) with the same
// kernels in the same order, so its results are bitwise those of the Python loop, and a row's
// result stays independent of the block it is computed in.
//
// Decoder(layers, num_heads, eps): layers is a list, one tuple per layer:
//   (ln1 [H], ln2 [H], k_cache, v_cache [nkv, C, hd], qkv, o, gate_up, down[, q_norm, k_norm [hd]])
// (q_norm, k_norm: Qwen3's per-head RMSNorm of q and k, in rope_cache; None or absent elsewhere)
// where each projection is (parts, bias or None) and parts a list of (kind: 4 = Q4_K, 6 = Q6_K,
// records uint8 [ceil(out / 8), in' / 256 * REC], out) stacked along the outputs.
// forward(x [T, H] f32, start, cos [T, hd], sin_signed [T, hd], mask [T, start + T] bool or None)
// -> x after the layers; the caches get the block's k and v at positions start .. start + T - 1.
// forward_tapped(..., taps) -> (x, tapped [T, len(taps), H]): x after each layer of taps as well
// (a drafting head's fused features), copied out as the loop passes it: the same steps, bitwise.
#include "torch_lite.h"
#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <vector>

#include "ops.h"

NativeDecoder::NativeDecoder(std::vector<Layer> layers, int64_t num_heads, double eps) : num_heads_(num_heads), eps_(eps) {
    for (auto& l : layers) {
        for (const Projection* p : {&l.qkv, &l.o, &l.gate_up, &l.down}) {
            TORCH_CHECK(!p->parts.empty(), "a projection needs at least one part");
            TORCH_CHECK(!p->bias.defined() || (p->bias.dtype() == at::kFloat && p->bias.numel() == p->out),
                        "bias: float32 [out]");
        }
        TORCH_CHECK(l.gate_up.out % 2 == 0, "gate_up: [2I] outputs (gate | up)");
        TORCH_CHECK(l.k.dtype() == at::kFloat && l.v.dtype() == at::kFloat && l.k.dim() == 3 && l.k.is_contiguous() &&
                    l.v.is_contiguous() && l.k.sizes() == l.v.sizes() && l.k.size(2) % 16 == 0 && l.k.size(2) <= 1024,
                    "caches: contiguous float32 [nkv, C, hd], hd a multiple of 16 up to 1024");
        TORCH_CHECK(num_heads % l.k.size(0) == 0, "query heads must be a multiple of kv heads");
        TORCH_CHECK(l.qkv.out == (num_heads + 2 * l.k.size(0)) * l.k.size(2), "qkv: (nh + 2 nkv) hd outputs");
        TORCH_CHECK(l.o.out == l.ln1.numel() && l.down.out == l.ln1.numel() && l.ln2.numel() == l.ln1.numel(),
                    "o, down: [H] outputs");
        if (!layers_.empty())
            TORCH_CHECK(l.k.sizes() == layers_.front().k.sizes() && l.gate_up.out == layers_.front().gate_up.out,
                        "every layer's shapes alike");
        layers_.push_back(std::move(l));
    }
}

// y [T, out] = quantized x times the projection's parts side by side (+ bias)
void NativeDecoder::project(const Projection& p, const Q8Rows& xq, int64_t T, float* y) {
    int64_t col = 0;
    for (const auto& part : p.parts) {
        gguf_matmul_into(part.kind, xq.qx, xq.xs, xq.bsums, T, xq.in, part.w, part.out, y + col, p.out);
        col += part.out;
    }
    if (p.bias.defined()) {
        const float* b = p.bias.data_ptr<float>();
        for (int64_t t = 0; t < T; ++t)
            for (int64_t o = 0; o < p.out; ++o) y[t * p.out + o] += b[o];
    }
}

// The buffers of a forward over T rows, kept from one forward to the next: allocating them in each
// step (~16 tensors a layer) cost ~20 us apiece with the caches cold after a product's weights
// streamed through them, ~4 ms of a one-token forward (measured on an AMX Xeon, BENCHMARKS.md).
// Padded rows (inputs rounded up to 256) keep zeros in their tails: nothing writes there.
void NativeDecoder::Workspace::fit(int64_t rows, int64_t H, const Layer& l, int64_t nh) {
    if (rows <= T) return;
    T = rows;
    const int64_t hd = l.k.size(2), A = nh * hd, I = l.gate_up.out / 2;
    Hp = (H + 255) / 256 * 256, Ap = (A + 255) / 256 * 256, Ip = (I + 255) / 256 * 256;
    const int64_t wide = std::max({Hp, Ap, Ip});
    const int64_t out = std::max({l.o.out, l.down.out});
    h.assign(T * Hp, 0.0f), a.assign(T * Ip, 0.0f), attp.assign(Ap == A ? 0 : T * Ap, 0.0f);
    qkv.resize(T * l.qkv.out), q.resize(T * A), att.resize(T * A), y.resize(T * out), gu.resize(T * l.gate_up.out);
    qx.resize(T * wide), xs.resize(T * wide / 256), bsums.resize(T * wide / 16);
}

at::Tensor NativeDecoder::forward(at::Tensor x, int64_t start, at::Tensor cos, at::Tensor sin_signed,
                                  std::optional<at::Tensor> mask) {
    return run(std::move(x), start, cos, sin_signed, mask, {}, nullptr);
}

std::tuple<at::Tensor, at::Tensor> NativeDecoder::forward_tapped(at::Tensor x, int64_t start, at::Tensor cos,
                                                                 at::Tensor sin_signed, std::optional<at::Tensor> mask,
                                                                 std::vector<int64_t> taps) {
    TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2, "x: float32 [T, H]");
    for (size_t j = 0; j < taps.size(); ++j)
        TORCH_CHECK(taps[j] >= 0 && taps[j] < (int64_t)layers_.size() && (j == 0 || taps[j] > taps[j - 1]),
                    "taps: ascending layer indices");
    at::Tensor tapped = at::empty({x.size(0), (int64_t)taps.size(), x.size(1)}, x.options());
    at::Tensor out = run(std::move(x), start, cos, sin_signed, mask, taps, tapped.data_ptr<float>());
    return {out, tapped};
}

at::Tensor NativeDecoder::run(at::Tensor x, int64_t start, const at::Tensor& cos, const at::Tensor& sin_signed,
                              const std::optional<at::Tensor>& mask, const std::vector<int64_t>& taps, float* tapped) {
    TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2, "x: float32 [T, H]");
    x = x.contiguous().clone();  // the residual stream, updated in place below
    const int64_t T = x.size(0), H = x.size(1);
    TORCH_CHECK(!layers_.empty(), "no layers");
    const Layer& first = layers_.front();
    const int64_t nkv = first.k.size(0), C = first.k.size(1), hd = first.k.size(2), nh = num_heads_;
    TORCH_CHECK(T >= 1 && H == first.ln1.numel() && H % 8 == 0, "x: [T, H] with H the layers' hidden size");
    TORCH_CHECK(cos.dtype() == at::kFloat && sin_signed.dtype() == at::kFloat && cos.is_contiguous() &&
                sin_signed.is_contiguous() && cos.numel() == T * hd && sin_signed.numel() == T * hd, "cos, sin: float32 [T, hd]");
    TORCH_CHECK(start >= 0 && start + T <= C, "cache overflow");
    const bool* pm = nullptr;
    if (mask) {
        TORCH_CHECK(mask->dtype() == at::kBool && mask->dim() == 2 && mask->size(0) == T && mask->size(1) == start + T &&
                    mask->is_contiguous(), "mask: contiguous bool [T, L]");
        pm = mask->data_ptr<bool>();
    }
    Workspace& w = ws_;
    w.fit(T, H, first, nh);
    float* px = x.data_ptr<float>();
    auto add = [&](const float* py) {  // x += y, [T, H] both
        for (int64_t i = 0; i < T * H; ++i) px[i] += py[i];
    };
    const Q8Rows qh{w.qx.data(), w.xs.data(), w.bsums.data(), w.Hp}, qa{w.qx.data(), w.xs.data(), w.bsums.data(), w.Ap},
        qi{w.qx.data(), w.xs.data(), w.bsums.data(), w.Ip};
    const int64_t A = nh * hd, I = first.gate_up.out / 2;
    const float *pc = cos.data_ptr<float>(), *ps = sin_signed.data_ptr<float>();
    // each step timed (~25 ns a clock read, 9 a layer) into steps_ (see step_seconds)
    auto t = std::chrono::steady_clock::now();
    auto lap = [&](int step) {
        const auto now = std::chrono::steady_clock::now();
        steps_[step] += std::chrono::duration<double>(now - t).count();
        t = now;
    };
    const int64_t K = (int64_t)taps.size();
    size_t next_tap = 0;
    for (size_t li = 0; li < layers_.size(); ++li) {
        const Layer& l = layers_[li];
        rms_quantize_rows(px, l.ln1.data_ptr<float>(), T, H, eps_, w.h.data(), qh);
        lap(0);
        project(l.qkv, qh, T, w.qkv.data());
        lap(1);
        rope_cache_rows(w.qkv.data(), {T, nh, nkv, hd, C, start}, pc, ps, l.k.data_ptr<float>(), l.v.data_ptr<float>(),
                        l.q_norm ? l.q_norm->data_ptr<float>() : nullptr, l.k_norm ? l.k_norm->data_ptr<float>() : nullptr,
                        eps_, w.q.data());
        lap(2);
        block_attention_rows(w.q.data(), {nh, T, hd, nkv, l.k.stride(0), l.v.stride(0)}, l.k.data_ptr<float>(),
                             l.v.data_ptr<float>(), start + T, pm, w.att.data());  // [T, nh, hd]
        lap(3);
        const float* att = w.att.data();
        if (w.Ap != A) {  // rows padded to whole super-blocks (e.g. 14 heads of 64)
            for (int64_t r = 0; r < T; ++r) std::memcpy(w.attp.data() + r * w.Ap, att + r * A, A * sizeof(float));
            att = w.attp.data();
        }
        quantize_q8k_rows(att, T, qa);
        project(l.o, qa, T, w.y.data());
        add(w.y.data());
        lap(4);
        rms_quantize_rows(px, l.ln2.data_ptr<float>(), T, H, eps_, w.h.data(), qh);
        lap(0);
        project(l.gate_up, qh, T, w.gu.data());
        lap(5);
        swiglu_quantize_rows(w.gu.data(), T, I, w.a.data(), qi);
        lap(6);
        project(l.down, qi, T, w.y.data());
        add(w.y.data());
        lap(7);
        if (next_tap < taps.size() && taps[next_tap] == (int64_t)li) {  // row t's x into tapped[t, j]
            for (int64_t t = 0; t < T; ++t)
                std::memcpy(tapped + (t * K + next_tap) * H, px + t * H, H * sizeof(float));
            ++next_tap;
        }
    }
    return x;
}
