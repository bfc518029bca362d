#include "train/flat_grads.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "model/finite.h"

namespace colony::train {

FlatGradients::FlatGradients(std::vector<at::Tensor> params, bool pinned)
    : params_(std::move(params)) {
  int64_t total = 0;
  for (const auto& p : params_) total += p.numel();
  if (params_.empty()) return;
  flat_ = at::zeros({total}, params_.front().options().requires_grad(false).pinned_memory(pinned));
  int64_t offset = 0;
  for (const auto& p : params_) {
    views_.push_back(flat_.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& g = params_[i].grad();
    if (g.defined()) views_[i].copy_(g);
    params_[i].mutable_grad() = views_[i];
  }
}

bool FlatGradients::Bound(size_t i) const {
  const at::Tensor& g = params_[i].grad();
  return g.defined() && g.data_ptr() == views_[i].data_ptr() &&
         g.sizes().equals(views_[i].sizes()) && g.strides().equals(views_[i].strides()) &&
         g.scalar_type() == views_[i].scalar_type();
}

const at::Tensor& FlatGradients::Bind() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (Bound(i)) continue;
    const at::Tensor& g = params_[i].grad();
    if (g.defined()) {
      views_[i].copy_(g);
    } else {
      views_[i].zero_();  // no gradient is a zero gradient
    }
    params_[i].mutable_grad() = views_[i];
  }
  return flat_;
}

bool FlatGradients::AllFinite() { return !flat_.defined() || model::AllFinite(Bind()); }

void FlatGradients::Zero() {
  if (!flat_.defined()) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!Bound(i)) params_[i].mutable_grad() = views_[i];
  }
  at::NoGradGuard no_grad;
  flat_.zero_();
}

}  // namespace colony::train
