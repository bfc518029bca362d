// A block's feed-forward as a mixture of experts (Mixtral's block_sparse_moe): a router scores
// every expert per token, each token goes through its top-k experts, and their outputs are
// summed with the router's softmax weights renormalised over those k.
//
//   SparseMoE moe(config);                  // config.num_experts, config.num_experts_per_tok
//   torch::Tensor y = moe->forward(x);      // [B, T, hidden] -> [B, T, hidden]
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "model/config.h"
#include "model/projection.h"

namespace colony::model {

// One expert: w2(silu(w1 x) * w3 x), under Mixtral's names.
class ExpertMLPImpl : public torch::nn::Module {
 public:
  ExpertMLPImpl(int64_t hidden, int64_t intermediate);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear w1{nullptr}, w2{nullptr}, w3{nullptr};
};
TORCH_MODULE(ExpertMLP);

class SparseMoEImpl : public torch::nn::Module {
 public:
  explicit SparseMoEImpl(const LlamaConfig& config);
  // x [..., hidden] -> [..., hidden]. Routing runs in float32, as transformers does.
  torch::Tensor forward(const torch::Tensor& x);
  // Quantizes every expert's projections (model::Quantize); the router stays in its dtype.
  void Quantize(WeightQuantization q);
  // Computes expert e's outputs elsewhere: forward calls fn(e, rows [M, hidden]) -> [M, hidden]
  // instead of the local expert (moe/checkpoint_experts.h calls experts on expert servers). It
  // may throw (c10::Error) to fail the forward. An empty fn restores the local experts.
  using ExpertFn = std::function<torch::Tensor(int64_t expert, const torch::Tensor& rows)>;
  void set_expert_fn(ExpertFn fn);

  torch::nn::Linear gate{nullptr};         // the router: hidden -> num_experts, no bias
  torch::nn::ModuleList experts{nullptr};  // empty with config.remote_experts

 private:
  int64_t top_k_;
  int64_t num_experts_;
  std::vector<ExpertMLP> experts_;
  ExpertFn expert_fn_;
};
TORCH_MODULE(SparseMoE);

}  // namespace colony::model
