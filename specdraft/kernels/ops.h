// The native ops of specdraft's fp32 GGUF runtime (bound to Python in bindings.cpp).
#pragma once
#include <torch/extension.h>
#include <optional>
#include <vector>

// gguf_matmul.cpp: 8-bit activations against GGUF Q4_K / Q6_K weight records
std::vector<torch::Tensor> quantize_q8k(torch::Tensor x);
torch::Tensor q4k_matmul(torch::Tensor qx, torch::Tensor xs, torch::Tensor bsums, torch::Tensor w, int64_t out_features);
torch::Tensor q6k_matmul(torch::Tensor qx, torch::Tensor xs, torch::Tensor bsums, torch::Tensor w, int64_t out_features);

// attention.cpp: a block of new rows over the KV cache, every row independent of the block -> [T, nh, hd]
torch::Tensor block_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, int64_t L,
                              std::optional<torch::Tensor> mask);

// layer_ops.cpp: the steps of a decoder layer between the matrix products, fused (one call each)
std::vector<torch::Tensor> rms_quantize(torch::Tensor x, torch::Tensor w, double eps);
std::vector<torch::Tensor> swiglu_quantize(torch::Tensor gate_up);
torch::Tensor rope_cache(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin_signed, torch::Tensor k_cache,
                         torch::Tensor v_cache, int64_t start, int64_t num_heads);
