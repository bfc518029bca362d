// The linear projections inside a decoder block: creation with Hugging Face's initialisation,
// quantized weights (int8 with per-row scales, NF4 with per-block scales), and low-rank adapters
// (LoRA) that clients send to servers.
//
//   torch::nn::Linear q = MakeLinear(64, 64, /*bias=*/true);
//   torch::Tensor y = Project(q, x, &adapters.q_proj);     // W x + b + scale * B (A x)
#pragma once

#include <torch/nn/modules/linear.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

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

// x W^T + b (+ the adapter's term). W may be quantized (QuantizeInt8, QuantizeNf4): it is
// dequantized to x's dtype for the product, one matrix at a time.
torch::Tensor Project(torch::nn::Linear& linear, const torch::Tensor& x,
                      const LoraAdapter* adapter);

// How a server stores its blocks' projections.
enum class WeightQuantization { kNone, kInt8, kNf4 };
// "none", "int8" or "nf4"; InvalidArgument naming the value otherwise.
Result<WeightQuantization> ParseWeightQuantization(std::string_view name);
// Quantizes the linear's weight as `q` says (kNone: leaves it).
void Quantize(torch::nn::Linear& linear, WeightQuantization q);

// Stores the linear's weight as int8 codes with per-output-row absmax scales (buffer
// "weight_scale"): 4x less memory than float32. The weight must not require grad; a bias stays
// in its dtype.
void QuantizeInt8(torch::nn::Linear& linear);

// The 16 levels of 4-bit NormalFloat (QLoRA's NF4, as bitsandbytes tabulates them): quantiles of
// a standard normal scaled to [-1, 1], ascending, with an exact 0.
inline constexpr std::array<float, 16> kNf4Levels = {-1.0f,
                                                     -0.6961928009986877f,
                                                     -0.5250730514526367f,
                                                     -0.39491748809814453f,
                                                     -0.28444138169288635f,
                                                     -0.18477343022823334f,
                                                     -0.09105003625154495f,
                                                     0.0f,
                                                     0.07958029955625534f,
                                                     0.16093020141124725f,
                                                     0.24611230194568634f,
                                                     0.33791524171829224f,
                                                     0.44070982933044434f,
                                                     0.5626170039176941f,
                                                     0.7229568362236023f,
                                                     1.0f};
// Weights per NF4 block, and block scales per group of their double quantization
// (bitsandbytes' and Petals' defaults).
inline constexpr int64_t kNf4BlockSize = 64;
inline constexpr int64_t kNf4AbsmaxGroup = 256;
// The smallest block scale (an all-zero block's).
inline constexpr double kNf4MinAbsmax = 1e-12;
// Stores the linear's weight in NF4 with double quantization (QLoRA; Petals' default for large
// models). Each row is cut into blocks of 64 weights (the last padded with zeros); each block
// has an absmax scale, and each weight is the index of the level nearest to it over that scale,
// two per byte, the first in the high nibble (uint8 [out, blocks * 32]). The scales themselves
// are int8 codes (buffer "weight_absmax" [out, blocks]) of their deviation from their mean
// ("weight_absmax_offset" [1], float32), with a float32 scale per group of 256 consecutive
// codes ("weight_absmax_scale" [groups]); the weights are coded against the scales as decoded.
// 4.13 bits per weight, 7.75x less memory than float32. The weight must not require grad; a
// bias stays in its dtype.
void QuantizeNf4(torch::nn::Linear& linear);
// The block scales [out, blocks] (float32) that NF4's double-quantized buffers decode to:
// codes x scale of their group + offset, at least kNf4MinAbsmax.
torch::Tensor Nf4Absmax(const torch::Tensor& codes, const torch::Tensor& scale,
                        const torch::Tensor& offset);

}  // namespace colony::model
