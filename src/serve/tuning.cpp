#include "serve/tuning.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

namespace colony::serve {

PromptTunedImpl::PromptTunedImpl(ClientModel head, std::shared_ptr<RemoteSequential> remote,
                                 PromptTuningOptions options)
    : head_(std::move(head)), remote_(std::move(remote)), options_(options) {
  const int64_t h = head_->config().hidden_size, p = options_.prompt_length;
  for (auto& param : head_->parameters()) param.set_requires_grad(false);
  prompts = register_parameter("prompts", at::randn({p, h}) * options_.init_std);
  if (options_.deep) {
    deep_prompts = register_parameter(
        "deep_prompts", at::randn({remote_->end() - remote_->start(), p, h}) * options_.init_std);
  }
}

std::vector<at::Tensor> PromptTunedImpl::TrainableParameters() {
  std::vector<at::Tensor> out{prompts};
  if (deep_prompts.defined()) out.push_back(deep_prompts);
  return out;
}

at::Tensor PromptTunedImpl::forward(const at::Tensor& tokens) {
  const int64_t b = tokens.size(0), p = options_.prompt_length;
  at::Tensor x = at::cat({prompts.unsqueeze(0).expand({b, -1, -1}), head_->Embed(tokens)}, 1);
  at::Tensor deep;
  if (deep_prompts.defined()) deep = deep_prompts.unsqueeze(1).expand({-1, b, -1, -1});
  at::Tensor h = remote_->forward(x, deep);
  return head_->Head(h.narrow(1, p, tokens.size(1)));
}

at::Tensor PromptTunedImpl::Loss(const at::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  at::Tensor logits = forward(tokens.narrow(1, 0, t - 1));
  return model::LanguageModelLoss(logits, tokens.narrow(1, 1, t - 1));
}

namespace {
std::pair<int64_t, int64_t> ProjectionDims(const model::LlamaConfig& c, const std::string& name) {
  const int64_t h = c.hidden_size, kv = c.num_kv_heads * c.head_dim();
  if (name == "k_proj" || name == "v_proj") return {h, kv};
  if (name == "gate_proj" || name == "up_proj") return {h, c.intermediate_size};
  if (name == "down_proj") return {c.intermediate_size, h};
  return {h, h};  // q_proj, o_proj
}
}  // namespace

LoraTunedImpl::LoraTunedImpl(ClientModel head, std::shared_ptr<RemoteSequential> remote,
                             LoraTuningOptions options)
    : head_(std::move(head)), remote_(std::move(remote)) {
  spec = {options.rank, options.targets, options.scale};
  for (auto& param : head_->parameters()) param.set_requires_grad(false);
  const auto& config = head_->config();
  for (int64_t b = remote_->start(); b < remote_->end(); ++b) {
    for (const auto& name : options.targets) {
      auto [in, out] = ProjectionDims(config, name);
      // As in the LoRA paper: A random, B zero, so training starts from the frozen model.
      adapters.push_back(register_parameter(fmt::format("lora_{}_{}_a", b, name),
                                            at::randn({options.rank, in}) / std::sqrt(in)));
      adapters.push_back(
          register_parameter(fmt::format("lora_{}_{}_b", b, name), at::zeros({out, options.rank})));
    }
  }
}

model::BlockAdapters LoraTunedImpl::AdaptersOf(int64_t block) const {
  model::BlockAdapters out;
  size_t k = static_cast<size_t>(block - remote_->start()) * 2 * spec.targets.size();
  for (const auto& name : spec.targets) {
    model::LoraAdapter* a = out.Find(name);
    a->a = adapters[k++];
    a->b = adapters[k++];
    a->scale = spec.scale;
  }
  return out;
}

at::Tensor LoraTunedImpl::forward(const at::Tensor& tokens) {
  at::Tensor h = remote_->forward(head_->Embed(tokens), {}, spec, adapters);
  return head_->Head(h);
}

at::Tensor LoraTunedImpl::Loss(const at::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  at::Tensor logits = forward(tokens.narrow(1, 0, t - 1));
  return model::LanguageModelLoss(logits, tokens.narrow(1, 1, t - 1));
}

}  // namespace colony::serve
