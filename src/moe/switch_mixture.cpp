#include "moe/switch_mixture.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <limits>
#include <mutex>

namespace colony::moe {

struct RemoteSwitchMixtureOfExperts::Impl {
  SwitchOptions options;
  std::unique_ptr<ExpertDispatcher> dispatcher;
  Gating gating;
  std::mutex mu;  // guards what follows
  at::Generator noise;
  bool training = true;
  at::Tensor utilization;  // [sum(grid_size)]

  Result<Output> Forward(const at::Tensor& x) {
    const SwitchOptions& o = options;
    COLONY_RETURN_IF_ERROR(CheckMixtureInput(x, o));
    std::lock_guard lock(mu);
    at::Tensor gating_input = x;
    if (training && o.jitter_eps > 0) {
      gating_input = x * at::empty_like(x).uniform_(1 - o.jitter_eps, 1 + o.jitter_eps, noise);
    }
    const at::Tensor logits = at::linear(gating_input, gating.weight, gating.bias);
    std::vector<at::Tensor> dim_scores, dim_probs;
    for (size_t d = 0; d < o.grid_size.size(); ++d) {
      at::Tensor s = logits.narrow(1, gating.offsets[d], o.grid_size[d]);
      if (training && o.grid_dropout < 1) {
        // Each coordinate kept with probability grid_dropout, and at least one (the luckiest).
        const at::Tensor draw = at::empty({o.grid_size[d]}, at::kFloat).uniform_(0, 1, noise);
        const at::Tensor keep = (draw < o.grid_dropout) | (draw == draw.min());
        s = at::where(keep, s, at::full_like(s, -std::numeric_limits<float>::infinity()));
      }
      dim_probs.push_back(at::softmax(s, 1));
      dim_scores.push_back(s);
    }
    COLONY_ASSIGN_OR_RETURN(auto routed, dispatcher->Call(x, at::cat(dim_scores, 1).detach()));

    // The utilization: the fraction of answered slots at each coordinate, averaged over time.
    {
      at::NoGradGuard no_grad;
      std::vector<at::Tensor> batch_use;
      const at::Tensor alive = routed.alive.flatten();
      for (size_t d = 0; d < o.grid_size.size(); ++d) {
        const at::Tensor coords = routed.coords[d].flatten().masked_select(alive);
        at::Tensor counts = at::bincount(coords, {}, o.grid_size[d]).to(at::kFloat);
        const float total = counts.sum().item<float>();
        batch_use.push_back(total > 0 ? counts / total : counts);
      }
      utilization =
          o.utilization_alpha * utilization + (1 - o.utilization_alpha) * at::cat(batch_use);
    }
    at::Tensor prob = at::ones_like(routed.alive, logits.options());
    at::Tensor balance = at::zeros({}, logits.options());
    for (size_t d = 0; d < o.grid_size.size(); ++d) {
      prob = prob * dim_probs[d].gather(1, routed.coords[d]);
      const at::Tensor use = utilization.narrow(0, gating.offsets[d], o.grid_size[d]);
      const auto size = static_cast<double>(o.grid_size[d]);
      balance = balance + (dim_probs[d].mean(0) * use).mean() * size * size;
    }
    prob = at::where(routed.alive, prob, at::zeros_like(prob));
    at::Tensor y = x + (prob.unsqueeze(-1) * routed.outputs).sum(1);
    return Output{.y = y, .balancing_loss = balance};
  }
};

Result<std::unique_ptr<RemoteSwitchMixtureOfExperts>> RemoteSwitchMixtureOfExperts::Create(
    dht::Node& node, SwitchOptions options) {
  if (!(options.jitter_eps >= 0 && options.jitter_eps < 1)) {
    return InvalidArgument(fmt::format("jitter_eps {} outside [0, 1)", options.jitter_eps));
  }
  if (!(options.grid_dropout > 0 && options.grid_dropout <= 1)) {
    return InvalidArgument(fmt::format("grid_dropout {} outside (0, 1]", options.grid_dropout));
  }
  if (!(options.utilization_alpha >= 0 && options.utilization_alpha < 1)) {
    return InvalidArgument(
        fmt::format("utilization_alpha {} outside [0, 1)", options.utilization_alpha));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  COLONY_ASSIGN_OR_RETURN(impl->dispatcher, ExpertDispatcher::Create(node, options));
  impl->gating = MakeGating(options);
  impl->noise = at::make_generator<at::CPUGeneratorImpl>(options.seed + 1);
  std::vector<at::Tensor> uniform;
  for (int64_t n : options.grid_size) {
    uniform.push_back(at::full({n}, 1.0 / static_cast<double>(n), at::kFloat));
  }
  impl->utilization = at::cat(uniform);
  return std::unique_ptr<RemoteSwitchMixtureOfExperts>(
      new RemoteSwitchMixtureOfExperts(std::move(impl)));
}

RemoteSwitchMixtureOfExperts::RemoteSwitchMixtureOfExperts(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

RemoteSwitchMixtureOfExperts::~RemoteSwitchMixtureOfExperts() = default;

Result<RemoteSwitchMixtureOfExperts::Output> RemoteSwitchMixtureOfExperts::Forward(
    const at::Tensor& x) {
  try {
    return impl_->Forward(x);
  } catch (const c10::Error& e) {
    return Internal(std::string("switch mixture of experts: ") + e.what_without_backtrace());
  }
}

void RemoteSwitchMixtureOfExperts::set_training(bool training) {
  std::lock_guard lock(impl_->mu);
  impl_->training = training;
}

std::vector<at::Tensor> RemoteSwitchMixtureOfExperts::gating_parameters() const {
  return {impl_->gating.weight, impl_->gating.bias};
}

at::Tensor RemoteSwitchMixtureOfExperts::grid_utilization() const {
  std::lock_guard lock(impl_->mu);
  return impl_->utilization.clone();
}

MixtureStats RemoteSwitchMixtureOfExperts::stats() const { return impl_->dispatcher->stats(); }

}  // namespace colony::moe
