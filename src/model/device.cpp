#include "model/device.h"

#include <ATen/Context.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>

#include <charconv>

namespace colony::model {

bool CudaAvailable() { return torch::cuda::is_available(); }

Result<c10::Device> ParseDevice(const std::string& name) {
  if (name == "cpu") return c10::Device(c10::kCPU);
  if (name == "auto") {
    return CudaAvailable() ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  }
  if (name != "cuda" && name.rfind("cuda:", 0) != 0) {
    return InvalidArgument(fmt::format("unknown device '{}': use cpu, cuda, cuda:N or auto", name));
  }
  int index = 0;
  if (name != "cuda") {
    const char* first = name.data() + 5;
    const char* last = name.data() + name.size();
    auto [end, ec] = std::from_chars(first, last, index);
    if (ec != std::errc() || end != last || index < 0 || index > 255) {
      return InvalidArgument(fmt::format("device '{}': N in cuda:N must be 0..255", name));
    }
  }
  if (!CudaAvailable()) {
    return FailedPrecondition(fmt::format(
        "device '{}': no CUDA device is usable here ({}); use --device cpu or auto", name,
        at::hasCUDA() ? "no GPU is visible" : "this LibTorch was built without CUDA"));
  }
  const auto count = static_cast<int>(torch::cuda::device_count());
  if (index >= count) {
    return FailedPrecondition(
        fmt::format("device '{}': only {} CUDA device{} visible (cuda:0..cuda:{})", name, count,
                    count == 1 ? " is" : "s are", count - 1));
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

void Synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

at::Tensor ToDevice(const at::Tensor& t, const c10::Device& device, at::ScalarType dtype) {
  if (!device.is_cuda() || !t.device().is_cpu()) return t.to(device, dtype);
  const at::Tensor pinned = t.is_pinned() ? t : t.pin_memory();
  // LibTorch's pinned-memory allocator keeps `pinned`'s block until the copy has run.
  return pinned.to(device, pinned.scalar_type(), /*non_blocking=*/true).to(dtype);
}

c10::Device DeviceOf(const torch::nn::Module& module) {
  for (const auto& p : module.parameters()) return p.device();
  for (const auto& b : module.buffers()) return b.device();
  return c10::Device(c10::kCPU);
}

}  // namespace colony::model
