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
    master_.push_back(m);
  }
  // One copy over the bus and one zeroing per batch, not one per parameter.
  device_grads_ = std::make_unique<FlatGradients>(device_);
  master_grads_ = std::make_unique<FlatGradients>(master_, model::CudaAvailable());
}

DeviceMirror::~DeviceMirror() = default;

void DeviceMirror::PullGradients() {
  if (!offloaded_) return;
  at::NoGradGuard no_grad;
  // Bind(): a gradient the optimizer dropped is a zero (the views are bound again).
  master_grads_->Bind().copy_(device_grads_->Bind(), /*non_blocking=*/true);
  // The host must see the copy complete before the optimizer reads it.
  model::Synchronize(device_.front().device());
  device_grads_->Zero();
}

void DeviceMirror::PushParameters() {
  if (!offloaded_) return;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < device_.size(); ++i) device_[i].copy_(master_[i], /*non_blocking=*/true);
  // The next step of the optimizer writes the host copies again: finish reading them first.
  model::Synchronize(device_.front().device());
}

}  // namespace colony::train
