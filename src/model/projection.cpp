// Block projections: initialisation, int8 weights with per-row scales, LoRA terms.
#include "model/projection.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

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

torch::Tensor Project(torch::nn::Linear& linear, const torch::Tensor& x,
                      const LoraAdapter* adapter) {
  torch::Tensor y;
  if (linear->weight.scalar_type() == at::kChar) {
    const auto buffers = linear->named_buffers(/*recurse=*/false);
    const torch::Tensor scale = *buffers.find("weight_scale");
    const torch::Tensor bias =
        linear->bias.defined() ? linear->bias.to(x.scalar_type()) : torch::Tensor();
    y = at::linear(x, linear->weight.to(x.scalar_type()) * scale.to(x.scalar_type()).unsqueeze(1),
                   bias);
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

void QuantizeInt8(torch::nn::Linear& linear) {
  torch::NoGradGuard no_grad;
  const torch::Tensor w = linear->weight.detach().to(at::kFloat);
  const torch::Tensor scale = w.abs().amax(1).clamp_min(1e-12) / 127.0;
  const torch::Tensor codes = (w / scale.unsqueeze(1)).round().clamp(-127, 127).to(at::kChar);
  linear->weight.set_requires_grad(false);
  linear->weight.set_data(codes);
  linear->register_buffer("weight_scale", scale);
}

}  // namespace colony::model
