// Block projections: initialisation, int8 and NF4 weights, LoRA terms.
#include "model/projection.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "model/config.h"

namespace colony::model {

torch::nn::Linear MakeLinear(int64_t in, int64_t out, bool bias) {
  torch::nn::Linear linear(torch::nn::LinearOptions(in, out).bias(bias));
  torch::NoGradGuard no_grad;
  linear->weight.normal_(0, kInitializerRange);
  if (bias) linear->bias.zero_();
  return linear;
}

LoraAdapter* BlockAdapters::Find(const std::string& name) {
  if (name == "q_proj") return &q_proj;
  if (name == "k_proj") return &k_proj;
  if (name == "v_proj") return &v_proj;
  if (name == "o_proj") return &o_proj;
  if (name == "gate_proj") return &gate_proj;
  if (name == "up_proj") return &up_proj;
  if (name == "down_proj") return &down_proj;
  return nullptr;
}

torch::Tensor Nf4Absmax(const torch::Tensor& codes, const torch::Tensor& scale,
                        const torch::Tensor& offset) {
  const int64_t n = codes.numel(), groups = scale.size(0);
  const torch::Tensor grouped =
      at::constant_pad_nd(codes.reshape({-1}).to(at::kFloat), {0, groups * kNf4AbsmaxGroup - n})
          .view({groups, kNf4AbsmaxGroup});
  return (grouped * scale.unsqueeze(-1) + offset)
      .reshape({-1})
      .narrow(0, 0, n)
      .view(codes.sizes())
      .clamp_min(kNf4MinAbsmax);
}

namespace {

// Rows [first, first + n) of the NF4 weight of `linear`, as float32 [n, in]: each byte looks up
// its two levels in a 256-entry table, then each block is scaled by its absmax.
torch::Tensor DequantizeNf4Rows(torch::nn::Linear& linear, const torch::Tensor& absmax,
                                int64_t first, int64_t n) {
  const torch::Tensor codes = linear->weight.narrow(0, first, n);  // uint8 [n, blocks * 32]
  // Built once: the two levels of each byte, high nibble first.
  static const torch::Tensor kPairs = [] {
    std::vector<float> pairs;
    pairs.reserve(512);
    for (int byte = 0; byte < 256; ++byte) {
      pairs.push_back(kNf4Levels[static_cast<size_t>(byte >> 4)]);
      pairs.push_back(kNf4Levels[static_cast<size_t>(byte & 15)]);
    }
    return at::tensor(pairs).view({256, 2});
  }();
  const torch::Tensor table = kPairs.to(codes.device());
  return (table.index_select(0, codes.reshape({-1}).to(at::kInt)).view({n, -1, kNf4BlockSize}) *
          absmax.narrow(0, first, n).unsqueeze(-1))
      .view({n, -1})
      .narrow(1, 0, linear->options.in_features());
}

// x W^T for an NF4 weight, dequantized a band of rows at a time (at most 4M weights), so that
// a large matrix never exists whole in float.
torch::Tensor ProjectNf4(torch::nn::Linear& linear, const torch::Tensor& absmax,
                         const torch::Tensor& x) {
  const int64_t out = linear->weight.size(0);
  const int64_t band = std::max<int64_t>(1, (int64_t{1} << 22) / linear->options.in_features());
  if (band >= out)
    return at::linear(x, DequantizeNf4Rows(linear, absmax, 0, out).to(x.scalar_type()));
  std::vector<torch::Tensor> parts;
  for (int64_t first = 0; first < out; first += band) {
    const int64_t n = std::min(band, out - first);
    parts.push_back(at::linear(x, DequantizeNf4Rows(linear, absmax, first, n).to(x.scalar_type())));
  }
  return at::cat(parts, -1);
}

}  // namespace

torch::Tensor Project(torch::nn::Linear& linear, const torch::Tensor& x,
                      const LoraAdapter* adapter) {
  torch::Tensor y;
  const auto type = linear->weight.scalar_type();
  if (type == at::kChar || type == at::kByte) {
    const auto buffers = linear->named_buffers(/*recurse=*/false);
    const torch::Tensor bias =
        linear->bias.defined() ? linear->bias.to(x.scalar_type()) : torch::Tensor();
    if (type == at::kChar) {
      const torch::Tensor scale = *buffers.find("weight_scale");
      y = at::linear(x, linear->weight.to(x.scalar_type()) * scale.to(x.scalar_type()).unsqueeze(1),
                     bias);
    } else {
      y = ProjectNf4(linear,
                     Nf4Absmax(*buffers.find("weight_absmax"), *buffers.find("weight_absmax_scale"),
                               *buffers.find("weight_absmax_offset")),
                     x);
      if (bias.defined()) y = y + bias;
    }
  } else {
    y = linear(x);
  }
  if (adapter != nullptr && adapter->defined()) {
    y = y +
        at::linear(at::linear(x, adapter->a.to(x.scalar_type())), adapter->b.to(x.scalar_type())) *
            adapter->scale;
  }
  return y;
}

Result<WeightQuantization> ParseWeightQuantization(std::string_view name) {
  if (name == "none") return WeightQuantization::kNone;
  if (name == "int8") return WeightQuantization::kInt8;
  if (name == "nf4") return WeightQuantization::kNf4;
  return InvalidArgument(fmt::format("unknown quantization '{}'; use none, int8 or nf4", name));
}

void Quantize(torch::nn::Linear& linear, WeightQuantization q) {
  if (q == WeightQuantization::kInt8) QuantizeInt8(linear);
  if (q == WeightQuantization::kNf4) QuantizeNf4(linear);
}

void QuantizeInt8(torch::nn::Linear& linear) {
  torch::NoGradGuard no_grad;
  const torch::Tensor w = linear->weight.detach().to(at::kFloat);
  const torch::Tensor scale = w.abs().amax(1).clamp_min(1e-12) / 127.0;
  const torch::Tensor codes = (w / scale.unsqueeze(1)).round().clamp(-127, 127).to(at::kChar);
  linear->weight.set_requires_grad(false);
  linear->weight.set_data(codes);
  linear->register_buffer("weight_scale", scale);
}

void QuantizeNf4(torch::nn::Linear& linear) {
  torch::NoGradGuard no_grad;
  const torch::Tensor w = linear->weight.detach().to(at::kFloat);
  const int64_t out = w.size(0), in = w.size(1);
  const int64_t blocks = (in + kNf4BlockSize - 1) / kNf4BlockSize;
  const torch::Tensor padded =
      at::constant_pad_nd(w, {0, blocks * kNf4BlockSize - in}).view({out, blocks, kNf4BlockSize});
  const torch::Tensor exact = padded.abs().amax(-1);  // [out, blocks]
  // Double quantization (QLoRA's): the scales as int8 codes of their deviation from their mean,
  // with a float32 scale per group of 256 of them.
  const torch::Tensor offset = exact.mean().reshape({1});
  const int64_t n = exact.numel(), groups = (n + kNf4AbsmaxGroup - 1) / kNf4AbsmaxGroup;
  const torch::Tensor deviation =
      at::constant_pad_nd((exact - offset).reshape({-1}), {0, groups * kNf4AbsmaxGroup - n})
          .view({groups, kNf4AbsmaxGroup});
  const torch::Tensor scale = deviation.abs().amax(-1).clamp_min(kNf4MinAbsmax) / 127.0;
  const torch::Tensor absmax_codes = (deviation / scale.unsqueeze(-1))
                                         .round()
                                         .clamp(-127, 127)
                                         .to(at::kChar)
                                         .reshape({-1})
                                         .narrow(0, 0, n)
                                         .view({out, blocks})
                                         .contiguous();
  // The weights are coded against the scales as products will decode them.
  const torch::Tensor absmax = Nf4Absmax(absmax_codes, scale, offset);
  // About [-1, 1]: a decoded scale a little under its block's absmax leaves a weight just
  // outside, and it takes the level +-1.
  const torch::Tensor normalized = padded / absmax.unsqueeze(-1);
  // The nearest level: the number of midpoints between levels below the value (a value on a
  // midpoint takes the lower level).
  std::vector<float> mid;
  for (size_t i = 0; i + 1 < kNf4Levels.size(); ++i) {
    mid.push_back((kNf4Levels[i] + kNf4Levels[i + 1]) / 2);
  }
  const torch::Tensor midpoints = at::tensor(mid, at::TensorOptions().device(w.device()));
  const torch::Tensor idx =
      at::bucketize(normalized, midpoints).to(at::kByte).view({out, blocks * kNf4BlockSize / 2, 2});
  const torch::Tensor codes =
      idx.select(-1, 0).__lshift__(4).bitwise_or(idx.select(-1, 1)).contiguous();
  linear->weight.set_requires_grad(false);
  linear->weight.set_data(codes);
  linear->register_buffer("weight_absmax", absmax_codes);
  linear->register_buffer("weight_absmax_scale", scale);
  linear->register_buffer("weight_absmax_offset", offset);
}

}  // namespace colony::model
