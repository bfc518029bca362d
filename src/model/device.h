// Where the torch layers compute: `--device cpu`, `cuda`, `cuda:N` or `auto` (the first CUDA
// device when LibTorch was built with CUDA and one is visible, else the CPU).
//
//   COLONY_ASSIGN_OR_RETURN(torch::Device device, model::ParseDevice(flag));
//   model->to(device);
//   auto tokens = batch.to(device);
//
// A device Colony cannot use is an error that says why (no CUDA in this LibTorch build, no
// visible GPU, an index past the last GPU), never a silent fall-back to the CPU: only "auto"
// chooses.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <string>

#include "core/status.h"

namespace torch::nn {
class Module;
}

namespace colony::model {

// Parses and checks a device name (see above). Accepted: "cpu", "cuda", "cuda:N", "auto".
Result<c10::Device> ParseDevice(const std::string& name);

// True when LibTorch has CUDA and at least one device is visible.
bool CudaAvailable();

// Waits until the device has finished the work queued on it (a no-op on the CPU): timings of GPU
// work must end here.
void Synchronize(const c10::Device& device);

// `t` on `device` in `dtype`. A host tensor bound for a GPU is staged in page-locked memory and
// copied without waiting: the calling thread goes on queueing kernels behind the copy, which the
// GPU runs in order. (A copy from pageable memory makes the thread wait until the GPU has taken
// the data: a block server sharing an H200 with three other processes waited 0.08 ms more per
// step, a client 0.11 ms more for its servers' output.) Converts the dtype on the device.
// Otherwise the same as t.to(device, dtype).
at::Tensor ToDevice(const at::Tensor& t, const c10::Device& device, at::ScalarType dtype);
inline at::Tensor ToDevice(const at::Tensor& t, const c10::Device& device) {
  return ToDevice(t, device, t.scalar_type());
}

// The device of a module's first parameter or buffer; the CPU for a module that has none.
c10::Device DeviceOf(const torch::nn::Module& module);

}  // namespace colony::model
