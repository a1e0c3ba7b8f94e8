// The native ops of specdraft's fp32 GGUF runtime (bound to Python in bindings.cpp).
#pragma once
#include "torch_lite.h"
#include <optional>
#include <tuple>
#include <string>
#include <vector>

// gguf_matmul.cpp: 8-bit activations against GGUF Q4_K / Q6_K weight records
std::vector<at::Tensor> quantize_q8k(at::Tensor x);
// one super-block of 256 floats -> 256 int8 q, its scale (1 / (127 / max |v|)) and 16 sums of 16 q
void quantize_q8k_block(const float* v, int8_t* q, float* scale, int16_t* bsums);
// quantize_q8k's three outputs for T rows of width in (a multiple of 256), in caller-owned memory:
// qx [T, in], xs [T, in / 256], bsums [T, in / 16]
struct Q8Rows {
    int8_t* qx; float* xs; int16_t* bsums; int64_t in;
    // super-block blk of the rows (row blk / (in / 256), its block blk % (in / 256)) from v [256]
    void quantize_block(const float* v, int64_t blk) const {
        quantize_q8k_block(v, qx + blk * 256, xs + blk, bsums + blk * 16);
    }
};
// quantize_q8k of x [T, out.in] float32 (row stride out.in; a padded row's tail holds zeros) into out
void quantize_q8k_rows(const float* x, int64_t T, const Q8Rows& out);
at::Tensor q4k_matmul(at::Tensor qx, at::Tensor xs, at::Tensor bsums, at::Tensor w, int64_t out_features);
at::Tensor q6k_matmul(at::Tensor qx, at::Tensor xs, at::Tensor bsums, at::Tensor w, int64_t out_features);
// y[t, 0 .. O) (row stride ldy) for T rows of quantized x of width in against kind 4 (Q4_K) or 6 (Q6_K) records w
void gguf_matmul_into(int64_t kind, const int8_t* qx, const float* xs, const int16_t* bsums, int64_t T, int64_t in,
                      const at::Tensor& w, int64_t O, float* y, int64_t ldy);
// the ISA path those kernels take ("avx2", "avx-vnni", "avx512-vnni", "amx-int8"), force one ("auto": the best), those this CPU has
std::string kernel_path();
void set_kernel_path(const std::string& name);
std::vector<std::string> kernel_paths();
// probe.cpp: [vpaddw, vpmaddubsw] instructions per second on the calling thread, timed for ~seconds in all
std::vector<double> issue_rates(double seconds);
// the amx-int8 path with its tile registers emulated (tests of the AMX kernel's logic where AVX-512 VNNI runs)
void set_amx_emulated(bool on);
// the active path is an AVX-512 one (avx512-vnni, amx-int8): the other kernels may take their AVX-512 loops
bool kernel_path_avx512();
// the AVX-512 VNNI kernels' form per rows a pass: bit masks (Q4_K short rows, Q4_K long, Q6_K short,
// Q6_K long), bit n set = n rows take two 8-row groups a zmm, clear = one group a ymm (same bits
// either way; by default the kernels time the products and take the faster form, gguf_forms.h)
std::vector<int64_t> vnni_forms();
void set_vnni_forms(const std::vector<int64_t>& masks);

// attention.cpp: a block of new rows over the KV cache, every row independent of the block -> [T, nh, hd]
at::Tensor block_attention(at::Tensor q, at::Tensor k, at::Tensor v, int64_t L,
                           std::optional<at::Tensor> mask);
// the same on caller-owned memory: q [nh, T, hd], the caches [nkv, C, hd] at strides ks, vs a head,
// mask [T, L] or nullptr (causal), out [T, nh, hd]
struct AttentionShape { int64_t nh, T, hd, nkv, ks, vs; };
void block_attention_rows(const float* q, const AttentionShape& shape, const float* k, const float* v, int64_t L,
                          const bool* mask, float* out);

// layer_ops.cpp: the steps of a decoder layer between the matrix products, fused (one call each)
std::vector<at::Tensor> rms_quantize(at::Tensor x, at::Tensor w, double eps);
std::vector<at::Tensor> swiglu_quantize(at::Tensor gate_up);
at::Tensor rope_cache(at::Tensor qkv, at::Tensor cos, at::Tensor sin_signed, at::Tensor k_cache,
                      at::Tensor v_cache, int64_t start, int64_t num_heads,
                      std::optional<at::Tensor> q_norm = std::nullopt, std::optional<at::Tensor> k_norm = std::nullopt,
                      double eps = 0.0);
// The same steps on caller-owned memory (NativeDecoder's workspace: a forward's steps allocate
// nothing). h, a: [T, out.in] float32 scratch whose rows' tails past H / I hold zeros.
void rms_quantize_rows(const float* x, const float* w, int64_t T, int64_t H, double eps, float* h, const Q8Rows& out);
void swiglu_quantize_rows(const float* gate_up, int64_t T, int64_t I, float* a, const Q8Rows& out);
struct RopeShape { int64_t T, nh, nkv, hd, C, start; };
// q_norm, k_norm: nullptr or [hd] each; q: [nh, T, hd]; the caches [nkv, C, hd]
void rope_cache_rows(const float* qkv, const RopeShape& shape, const float* cos, const float* sin_signed, float* k_cache,
                     float* v_cache, const float* q_norm, const float* k_norm, double eps, float* q);

// decoder.cpp: every decoder layer of a GGUF-weight model in one call (see there)
class NativeDecoder {
public:
    struct Part { int64_t kind; at::Tensor w; int64_t out; };
    struct Projection { std::vector<Part> parts; at::Tensor bias; int64_t out = 0; };
    struct Layer { at::Tensor ln1, ln2, k, v; Projection qkv, o, gate_up, down; std::optional<at::Tensor> q_norm, k_norm; };
    // the layers as bindings.cpp reads them from Python's list of tuples; their shapes checked here
    NativeDecoder(std::vector<Layer> layers, int64_t num_heads, double eps);
    at::Tensor forward(at::Tensor x, int64_t start, at::Tensor cos, at::Tensor sin_signed,
                       std::optional<at::Tensor> mask);
    // the same, also copying x after each layer of ``taps`` (ascending indices into the layers)
    // into tapped [T, len(taps), H]: one call where a cut after each tapped layer took one a part
    std::tuple<at::Tensor, at::Tensor> forward_tapped(at::Tensor x, int64_t start, at::Tensor cos, at::Tensor sin_signed,
                                                      std::optional<at::Tensor> mask, std::vector<int64_t> taps);
    // seconds spent in each step kind since construction or the last clear, summed over layers and
    // forwards, as STEP_NAMES orders them: where a forward's time goes (specdraft calibrate --steps)
    static constexpr const char* STEP_NAMES[8] = {"rms_quantize", "qkv", "rope_cache", "attention",
                                                  "o", "gate_up", "swiglu_quantize", "down"};
    std::vector<double> step_seconds() const { return std::vector<double>(steps_, steps_ + 8); }
    void clear_step_seconds() { std::fill(steps_, steps_ + 8, 0.0); }

private:
    struct Workspace {
        int64_t T = 0, Hp = 0, Ap = 0, Ip = 0;  // rows fitted; hidden, attention and MLP widths padded to 256
        std::vector<float> h, qkv, q, att, attp, y, gu, a, xs;
        std::vector<int8_t> qx;
        std::vector<int16_t> bsums;
        void fit(int64_t rows, int64_t H, const Layer& l, int64_t nh);
    };
    static void project(const Projection& p, const Q8Rows& xq, int64_t T, float* y);
    // forward's layers over x (cloned, contiguous [T, H]); after layer taps[j], x into tapped[:, j]
    at::Tensor run(at::Tensor x, int64_t start, const at::Tensor& cos, const at::Tensor& sin_signed,
                   const std::optional<at::Tensor>& mask, const std::vector<int64_t>& taps, float* tapped);
    Workspace ws_;
    std::vector<Layer> layers_;
    int64_t num_heads_;
    double eps_;
    double steps_[8] = {};  // see step_seconds; a residual add counts with the product before it
};
