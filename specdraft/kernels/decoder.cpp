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
#include <torch/extension.h>
#include <chrono>
#include <optional>
#include <vector>

#include "ops.h"

namespace py = pybind11;

namespace {

NativeDecoder::Projection read_projection(const py::handle& spec) {
    auto t = spec.cast<py::tuple>();
    NativeDecoder::Projection p;
    for (const auto& part : t[0].cast<py::list>()) {
        auto pt = part.cast<py::tuple>();
        p.parts.push_back({pt[0].cast<int64_t>(), pt[1].cast<torch::Tensor>(), pt[2].cast<int64_t>()});
        p.out += p.parts.back().out;
    }
    TORCH_CHECK(!p.parts.empty(), "a projection needs at least one part");
    if (!t[1].is_none()) {
        p.bias = t[1].cast<torch::Tensor>().contiguous();
        TORCH_CHECK(p.bias.dtype() == torch::kFloat32 && p.bias.numel() == p.out, "bias: float32 [out]");
    }
    return p;
}

}  // namespace

NativeDecoder::NativeDecoder(py::list layers, int64_t num_heads, double eps) : num_heads_(num_heads), eps_(eps) {
    for (const auto& item : layers) {
        auto t = item.cast<py::tuple>();
        TORCH_CHECK(t.size() == 8 || t.size() == 10, "a layer is (ln1, ln2, k_cache, v_cache, qkv, o, gate_up, down[, q_norm, k_norm])");
        Layer l{t[0].cast<torch::Tensor>(), t[1].cast<torch::Tensor>(), t[2].cast<torch::Tensor>(), t[3].cast<torch::Tensor>(),
                read_projection(t[4]), read_projection(t[5]), read_projection(t[6]), read_projection(t[7]), std::nullopt, std::nullopt};
        if (t.size() == 10 && !t[8].is_none()) {
            l.q_norm = t[8].cast<torch::Tensor>().contiguous();
            l.k_norm = t[9].cast<torch::Tensor>().contiguous();
        }
        TORCH_CHECK(l.gate_up.out % 2 == 0, "gate_up: [2I] outputs (gate | up)");
        layers_.push_back(std::move(l));
    }
}

// y [T, out] = quantized x times the projection's parts side by side (+ bias)
torch::Tensor NativeDecoder::project(const Projection& p, const std::vector<torch::Tensor>& xq) {
    const int64_t T = xq[0].size(0), in = xq[0].size(1);
    auto y = torch::empty({T, p.out}, torch::kFloat32);
    float* py = y.data_ptr<float>();
    int64_t col = 0;
    for (const auto& part : p.parts) {
        gguf_matmul_into(part.kind, xq[0].data_ptr<int8_t>(), xq[1].data_ptr<float>(), xq[2].data_ptr<int16_t>(), T, in,
                         part.w, part.out, py + col, p.out);
        col += part.out;
    }
    if (p.bias.defined()) {
        const float* b = p.bias.data_ptr<float>();
        for (int64_t t = 0; t < T; ++t)
            for (int64_t o = 0; o < p.out; ++o) py[t * p.out + o] += b[o];
    }
    return y;
}

torch::Tensor NativeDecoder::forward(torch::Tensor x, int64_t start, torch::Tensor cos, torch::Tensor sin_signed,
                                     std::optional<torch::Tensor> mask) {
    TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2, "x: float32 [T, H]");
    x = x.contiguous().clone();  // the residual stream, updated in place below
    const int64_t T = x.size(0);
    float* px = x.data_ptr<float>();
    auto add = [&](const torch::Tensor& y) {  // x += y, [T, H] both
        const float* py = y.data_ptr<float>();
        for (int64_t i = 0; i < x.numel(); ++i) px[i] += py[i];
    };
    // each step timed (~25 ns a clock read, 9 a layer) into steps_ (see step_seconds)
    auto t = std::chrono::steady_clock::now();
    auto lap = [&](int step) {
        const auto now = std::chrono::steady_clock::now();
        steps_[step] += std::chrono::duration<double>(now - t).count();
        t = now;
    };
    for (auto& l : layers_) {
        auto xq = rms_quantize(x, l.ln1, eps_);
        lap(0);
        torch::Tensor qkv = project(l.qkv, xq);
        lap(1);
        torch::Tensor q = rope_cache(qkv, cos, sin_signed, l.k, l.v, start, num_heads_, l.q_norm, l.k_norm, eps_);
        lap(2);
        torch::Tensor o = block_attention(q, l.k, l.v, start + T, mask);  // [T, nh, hd]
        lap(3);
        add(project(l.o, quantize_q8k(o.view({T, -1}))));
        lap(4);
        xq = rms_quantize(x, l.ln2, eps_);
        lap(0);
        torch::Tensor gate_up = project(l.gate_up, xq);
        lap(5);
        xq = swiglu_quantize(gate_up);
        lap(6);
        add(project(l.down, xq));
        lap(7);
    }
    return x;
}
