#include "serve/tuning.h"

#include <ATen/ATen.h>

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

}  // namespace colony::serve
