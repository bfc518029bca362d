// The linear projections inside a decoder block: creation with Hugging Face's initialisation,
// int8 weights with per-row scales, and low-rank adapters (LoRA) that clients send to servers.
//
//   torch::nn::Linear q = MakeLinear(64, 64, /*bias=*/true);
//   torch::Tensor y = Project(q, x, &adapters.q_proj);     // W x + b + scale * B (A x)
#pragma once

#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <string>

namespace colony::model {

// A linear layer with weights ~ normal(0, 0.02) and zero bias (if any), as transformers
// initialises them.
torch::nn::Linear MakeLinear(int64_t in, int64_t out, bool bias = false);

// A low-rank adapter (LoRA) on one projection: y = W x + scale * B (A x), A [rank, in],
// B [out, rank]. Undefined tensors: no adapter.
struct LoraAdapter {
  torch::Tensor a, b;
  double scale = 1.0;
  bool defined() const { return a.defined() && b.defined(); }
};
// Adapters for the projections of one block (any subset). A server applies adapters a client
// sends, so that clients can train LoRA through frozen remote blocks.
struct BlockAdapters {
  LoraAdapter q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
  // The adapter for a projection by name ("q_proj", ...); null for an unknown name.
  LoraAdapter* Find(const std::string& name);
  // Whether any of the MLP's adapters (gate/up/down) is set.
  bool AnyMlp() const { return gate_proj.defined() || up_proj.defined() || down_proj.defined(); }
};

// x W^T + b (+ the adapter's term). W may be int8 codes with per-row scales (QuantizeInt8),
// which are dequantized to x's dtype for the product.
torch::Tensor Project(torch::nn::Linear& linear, const torch::Tensor& x,
                      const LoraAdapter* adapter);
// Stores the linear's weight as int8 codes with per-output-row absmax scales (buffer
// "weight_scale"): 4x less memory than float32. The weight must not require grad; a bias stays
// in its dtype.
void QuantizeInt8(torch::nn::Linear& linear);

}  // namespace colony::model
