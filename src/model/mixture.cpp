// Mixtral's sparse mixture-of-experts feed-forward: top-k routing and the weighted sum of the
// chosen experts' outputs, differentiable through both.
#include "model/mixture.h"

#include <ATen/ATen.h>

#include "model/projection.h"

namespace colony::model {

ExpertMLPImpl::ExpertMLPImpl(int64_t hidden, int64_t intermediate) {
  w1 = register_module("w1", MakeLinear(hidden, intermediate));
  w2 = register_module("w2", MakeLinear(intermediate, hidden));
  w3 = register_module("w3", MakeLinear(hidden, intermediate));
}

torch::Tensor ExpertMLPImpl::forward(const torch::Tensor& x) {
  return Project(w2, at::silu(Project(w1, x, nullptr)) * Project(w3, x, nullptr), nullptr);
}

SparseMoEImpl::SparseMoEImpl(const LlamaConfig& config)
    : top_k_(config.num_experts_per_tok), num_experts_(config.num_experts) {
  gate = register_module("gate", MakeLinear(config.hidden_size, config.num_experts));
  experts = register_module("experts", torch::nn::ModuleList());
  for (int64_t e = 0; e < config.num_experts && !config.remote_experts; ++e) {
    experts_.emplace_back(config.hidden_size, config.intermediate_size);
    experts->push_back(experts_.back());
  }
}

torch::Tensor SparseMoEImpl::forward(const torch::Tensor& x) {
  const int64_t hidden = x.size(-1);
  const torch::Tensor flat = x.reshape({-1, hidden});
  const torch::Tensor probs = at::softmax(Project(gate, flat, nullptr), -1, at::kFloat);
  auto [weights, chosen] = probs.topk(top_k_, -1);
  weights = (weights / weights.sum(-1, /*keepdim=*/true)).to(x.scalar_type());
  torch::Tensor out = at::zeros_like(flat);
  for (int64_t e = 0; e < num_experts_; ++e) {
    const torch::Tensor hits = (chosen == e).nonzero();  // [M, 2]
    if (hits.size(0) == 0) continue;
    TORCH_CHECK(expert_fn_ || e < static_cast<int64_t>(experts_.size()),
                "this model's experts are remote and nothing reaches them "
                "(moe::UseRemoteExperts sets that up)");
    const torch::Tensor tokens = hits.select(1, 0), slots = hits.select(1, 1);
    const torch::Tensor weight = weights.index({tokens, slots}).unsqueeze(1);
    const torch::Tensor rows = flat.index_select(0, tokens);
    const torch::Tensor y = expert_fn_ ? expert_fn_(e, rows).to(x.scalar_type())
                                       : experts_[static_cast<size_t>(e)]->forward(rows);
    out = out.index_add(0, tokens, y * weight);
  }
  return out.view(x.sizes());
}

void SparseMoEImpl::Quantize(WeightQuantization q) {
  for (ExpertMLP& expert : experts_) {
    for (auto* l : {&expert->w1, &expert->w2, &expert->w3}) model::Quantize(*l, q);
  }
}

void SparseMoEImpl::set_expert_fn(ExpertFn fn) { expert_fn_ = std::move(fn); }

}  // namespace colony::model
