// What a state donor says about the state it sends (JSON metadata: run id, epoch, inner step,
// whether its parameters left the swarm's, and each tensor's name, dtype and shape), parsed
// field by field: it comes from the network. Torch-free, so that it can be fuzzed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace colony::train {

struct DonorTensor {
  std::string name;   // at most kMaxDonorTensorName bytes
  std::string dtype;  // one of LibTorch's scalar type names ("Float", "BFloat16", "Long", ...)
  std::vector<int64_t> shape;
  int64_t numel = 1;  // the product of shape, at most 2^40
};

struct DonorState {
  std::vector<DonorTensor> tensors;
  int64_t epoch = 0, inner_step = 0;  // not negative
  bool diverged = false;
};

inline constexpr size_t kMaxDonorTensorName = 256;
inline constexpr size_t kMaxDonorTensorDims = 8;

// Errors name the field at fault; a state of another run is refused.
Result<DonorState> ParseDonorState(const std::string& metadata, const std::string& run_id);

}  // namespace colony::train
