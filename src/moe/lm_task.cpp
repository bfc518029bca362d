#include "moe/lm_task.h"

#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>

#include "core/clock.h"
#include "core/log.h"
#include "model/llama.h"
#include "moe/mixture.h"
#include "train/lm_data.h"

namespace colony::moe {
namespace {

using train::LmData;
using train::Task;
using train::TaskOptions;

class MoeLmTask final : public Task {
 public:
  static Result<std::unique_ptr<MoeLmTask>> Create(const TaskOptions& a) {
    if (a.moe_k_best < 1 || a.moe_k_min > a.moe_k_best) {
      return InvalidArgument(fmt::format("moe-lm: k_min {} must lie in [0, k_best {}], k_best >= 1",
                                         a.moe_k_min, a.moe_k_best));
    }
    if (!(a.moe_timeout > 0) || !(a.moe_timeout_after_k_min >= 0)) {
      return InvalidArgument("moe-lm: the expert timeouts must be positive");
    }
    if (!a.device.is_cpu()) {
      return Unimplemented(fmt::format(
          "moe-lm computes on the CPU only (its experts' replies are combined in host memory); "
          "got --device {}",
          a.device.str()));
    }
    auto t = std::unique_ptr<MoeLmTask>(new MoeLmTask());
    t->options_ = a;
    COLONY_ASSIGN_OR_RETURN(t->data_, train::PrepareLmData(a));
    COLONY_ASSIGN_OR_RETURN(t->config_, train::LmModelConfig(a));
    t->config_.vocab_size = t->data_.tokenizer->vocab_size();
    // The blocks' own MLPs go unused (the experts replace them): keep them tiny.
    t->config_.intermediate_size = 1;
    COLONY_RETURN_IF_ERROR(t->config_.Validate());
    torch::manual_seed(a.init_seed);
    t->model_ = model::LlamaModel(t->config_);
    return t;
  }

  Status Connect(dht::Node& node) override {
    for (int64_t l = 0; l < model_->num_blocks(); ++l) {
      MixtureOptions o;
      o.grid_name = fmt::format("{}{}", options_.moe_prefix, l);
      o.grid_size = options_.moe_grid;
      o.hidden = config_.hidden_size;
      o.k_best = options_.moe_k_best;
      o.k_min = options_.moe_k_min;
      // An expert that answered the forward but not the backward only costs its gradient (its
      // server may have gone in between); the batch goes on.
      o.backward_k_min = 0;
      o.forward_timeout = o.backward_timeout = SecondsToMillis(options_.moe_timeout);
      o.timeout_after_k_min = SecondsToMillis(options_.moe_timeout_after_k_min);
      // A token whose experts all failed keeps its residual stream (the batch goes on); a batch
      // in which no expert answered at all is an error (TrainBatch).
      o.allow_zero_outputs = true;
      o.seed = options_.init_seed * 1000 + static_cast<uint64_t>(l);
      auto layer = RemoteMixtureOfExperts::Create(node, o);
      if (!layer.ok()) return layer.status().WithContext(fmt::format("block {}'s experts", l));
      layers_.push_back(std::move(*layer));
    }
    return Status::Ok();
  }

  std::vector<at::Tensor> Parameters() override {
    std::vector<at::Tensor> out;
    for (const auto& item : model_->named_parameters()) {
      if (item.key().find(".mlp.") == std::string::npos) out.push_back(item.value());
    }
    for (const auto& layer : layers_) {
      for (const auto& p : layer->gating_parameters()) out.push_back(p);
    }
    return out;
  }

  Result<Batch> TrainBatch() override {
    at::Tensor batch = train::TokensToTensor(data_.stream->Next());
    COLONY_ASSIGN_OR_RETURN(at::Tensor loss, Loss(batch));
    // Gradients into fresh tensors first, so that a failed backward adds nothing to those
    // accumulated so far.
    const std::vector<at::Tensor> params = Parameters();
    std::vector<at::Tensor> grads;
    try {
      grads = torch::autograd::grad({loss}, params, {}, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    } catch (const c10::Error& e) {
      return Unavailable(std::string("moe-lm: the backward pass failed: ") +
                         e.what_without_backtrace());
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) continue;
      at::Tensor p = params[i];
      if (p.grad().defined()) {
        p.mutable_grad().add_(grads[i]);
      } else {
        p.mutable_grad() = grads[i];
      }
    }
    return Batch{loss.item<double>(), batch.size(0)};
  }

  double Evaluate() override {
    at::NoGradGuard no_grad;
    auto loss = Loss(data_.valid);
    if (!loss.ok()) {
      COLONY_LOG_WARN("moe-lm: no held-out loss: {}", loss.status().ToString());
      return std::numeric_limits<double>::quiet_NaN();
    }
    return loss->item<double>();
  }

  nlohmann::json Describe() override {
    int64_t local = 0;
    for (const auto& p : Parameters()) local += p.numel();
    return {{"task", "moe-lm"},
            {"parameters", local},
            {"vocab_size", config_.vocab_size},
            {"hidden_size", config_.hidden_size},
            {"layers", config_.num_layers},
            {"expert_grids", fmt::format("{}[0..{}]", options_.moe_prefix, config_.num_layers - 1)},
            {"k_best", options_.moe_k_best},
            {"k_min", options_.moe_k_min},
            {"expert_calls", Calls()},
            {"failed_expert_calls", Failed()}};
  }

 private:
  MoeLmTask() = default;

  // The mean next-token loss of tokens [B, T + 1]: h = x + attn(norm(x)); h = h + moe(norm(h)).
  Result<at::Tensor> Loss(const at::Tensor& batch) {
    if (layers_.size() != static_cast<size_t>(model_->num_blocks())) {
      return FailedPrecondition("moe-lm: the task was not connected to the swarm");
    }
    const auto inputs = batch.slice(1, 0, batch.size(1) - 1);
    const auto targets = batch.slice(1, 1, batch.size(1));
    const uint64_t failed_before = Failed(), calls_before = Calls();
    at::Tensor h = model_->Embed(inputs);
    for (int64_t l = 0; l < model_->num_blocks(); ++l) {
      auto block = model_->block(l);
      h = h + block->self_attn(block->input_layernorm(h), 0, nullptr);
      const at::Tensor normed = block->post_attention_layernorm(h);
      auto mixed =
          layers_[static_cast<size_t>(l)]->Forward(normed.reshape({-1, config_.hidden_size}));
      if (!mixed.ok()) return mixed.status().WithContext(fmt::format("block {}", l));
      h = h + mixed->view_as(h);
    }
    const uint64_t calls = Calls() - calls_before, failed = Failed() - failed_before;
    if (calls == 0 || failed == calls) {
      return Unavailable(fmt::format(
          "moe-lm: none of the {} expert calls of this batch answered: are expert servers for "
          "the grids {}0..{}{} running (colony experts serve)?",
          calls, options_.moe_prefix, options_.moe_prefix, model_->num_blocks() - 1));
    }
    return model::LanguageModelLoss(model_->Head(h), targets);
  }

  uint64_t Calls() const {
    uint64_t n = 0;
    for (const auto& layer : layers_) n += layer->stats().expert_calls;
    return n;
  }
  uint64_t Failed() const {
    uint64_t n = 0;
    for (const auto& layer : layers_) n += layer->stats().failed_calls;
    return n;
  }

  TaskOptions options_;
  LmData data_;
  model::LlamaConfig config_;
  model::LlamaModel model_{nullptr};
  std::vector<std::unique_ptr<RemoteMixtureOfExperts>> layers_;
};

}  // namespace

Result<std::unique_ptr<train::Task>> MakeMoeLmTask(const train::TaskOptions& options) {
  COLONY_ASSIGN_OR_RETURN(auto t, MoeLmTask::Create(options));
  return std::unique_ptr<train::Task>(std::move(t));
}

}  // namespace colony::moe
