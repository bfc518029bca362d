#include "moe/mixture.h"

#include <ATen/ATen.h>

#include <limits>

namespace colony::moe {

struct RemoteMixtureOfExperts::Impl {
  MixtureOptions options;
  std::unique_ptr<ExpertDispatcher> dispatcher;
  Gating gating;

  Result<at::Tensor> Forward(const at::Tensor& x) {
    const MixtureOptions& o = options;
    COLONY_RETURN_IF_ERROR(CheckMixtureInput(x, o));
    const at::Tensor logits = at::linear(x, gating.weight, gating.bias);
    COLONY_ASSIGN_OR_RETURN(auto routed, dispatcher->Call(x, logits.detach()));
    // Each slot's score: the sum of its expert's coordinates' scores; softmax over the slots
    // whose expert answered (an input with none gets zero weights).
    at::Tensor sel = at::zeros_like(routed.alive, logits.options());
    for (size_t d = 0; d < o.grid_size.size(); ++d) {
      sel = sel + logits.narrow(1, gating.offsets[d], o.grid_size[d]).gather(1, routed.coords[d]);
    }
    const at::Tensor& alive = routed.alive;
    const at::Tensor any = alive.any(1, /*keepdim=*/true);
    const at::Tensor masked =
        at::where(alive, sel,
                  at::where(any, at::full_like(sel, -std::numeric_limits<float>::infinity()),
                            at::zeros_like(sel)));
    const at::Tensor weights = at::softmax(masked, 1) * alive.to(at::kFloat);
    return (weights.unsqueeze(-1) * routed.outputs).sum(1);
  }
};

Result<std::unique_ptr<RemoteMixtureOfExperts>> RemoteMixtureOfExperts::Create(
    dht::Node& node, MixtureOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  COLONY_ASSIGN_OR_RETURN(impl->dispatcher, ExpertDispatcher::Create(node, options));
  impl->gating = MakeGating(options);
  return std::unique_ptr<RemoteMixtureOfExperts>(new RemoteMixtureOfExperts(std::move(impl)));
}

RemoteMixtureOfExperts::RemoteMixtureOfExperts(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

RemoteMixtureOfExperts::~RemoteMixtureOfExperts() = default;

Result<at::Tensor> RemoteMixtureOfExperts::Forward(const at::Tensor& x) {
  try {
    return impl_->Forward(x);
  } catch (const c10::Error& e) {
    return Internal(std::string("mixture of experts: ") + e.what_without_backtrace());
  }
}

std::vector<at::Tensor> RemoteMixtureOfExperts::gating_parameters() const {
  return {impl_->gating.weight, impl_->gating.bias};
}

MixtureStats RemoteMixtureOfExperts::stats() const { return impl_->dispatcher->stats(); }

}  // namespace colony::moe
