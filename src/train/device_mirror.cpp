#include "train/device_mirror.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <stdexcept>

#include "model/device.h"

namespace colony::train {

Status DeviceMirror::Check(const std::vector<at::Tensor>& params) {
  if (params.empty()) return InvalidArgument("no parameters given");
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    if (!p.defined() || p.scalar_type() != at::kFloat) {
      return InvalidArgument(fmt::format("parameter {} must be a defined float32 tensor", i));
    }
    if (p.device() != params.front().device()) {
      return InvalidArgument(fmt::format("parameter {} is on {}, parameter 0 on {}", i,
                                         p.device().str(), params.front().device().str()));
    }
  }
  return Status::Ok();
}

DeviceMirror::DeviceMirror(std::vector<at::Tensor> params, bool offload)
    : device_(std::move(params)) {
  if (Status st = Check(device_); !st.ok()) throw std::invalid_argument(st.ToString());
  for (const auto& p : device_) {
    if ((offload && !p.device().is_cpu()) || !p.is_contiguous()) offloaded_ = true;
  }
  if (!offloaded_) {
    master_ = device_;
    return;
  }
  const auto host = at::TensorOptions().dtype(at::kFloat).pinned_memory(model::CudaAvailable());
  for (const auto& p : device_) {
    at::Tensor m = at::empty(p.sizes(), host);
    m.copy_(p.detach());
    m.set_requires_grad(true);
    m.mutable_grad() = at::zeros(p.sizes(), host);
    master_.push_back(m);
  }
}

void DeviceMirror::PullGradients() {
  if (!offloaded_) return;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < device_.size(); ++i) {
    at::Tensor& g = master_[i].mutable_grad();
    if (!g.defined()) g = at::zeros_like(master_[i]);  // the optimizer dropped it
    const at::Tensor& d = device_[i].grad();
    if (d.defined()) {
      g.copy_(d, /*non_blocking=*/true);
    } else {
      g.zero_();
    }
  }
  // The host must see the copies complete before the optimizer reads them.
  model::Synchronize(device_.front().device());
  for (auto& p : device_) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

void DeviceMirror::PushParameters() {
  if (!offloaded_) return;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < device_.size(); ++i) device_[i].copy_(master_[i], /*non_blocking=*/true);
  // The next step of the optimizer writes the host copies again: finish reading them first.
  model::Synchronize(device_.front().device());
}

}  // namespace colony::train
