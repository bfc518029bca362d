// Torch tensors <-> the transport's tensor frames (net::TensorFrame), for RPCs that carry
// activations, gradients and weights.
//
//   net::Message m;
//   m.tensors.push_back(ToFrame(hidden));                  // no copy for a contiguous CPU tensor
//   COLONY_ASSIGN_OR_RETURN(at::Tensor h, FromFrame(reply.tensors[0], {.max_elements = 1 << 24}));
//
// Frames from the network are untrusted: FromFrame checks the codec, dtype, rank, element count
// and byte length, and copies the bytes into a tensor of its own.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "core/status.h"
#include "net/wire.h"

namespace colony::runtime {

// The frame's dtype for a torch scalar type (nullopt when the wire has none for it).
std::optional<DType> WireDType(at::ScalarType type);
at::ScalarType TorchDType(DType dtype);

// A frame viewing the tensor's bytes (made contiguous on the CPU first if needed); the frame
// keeps that tensor alive. Fails for dtypes the wire lacks.
Result<net::TensorFrame> ToFrame(const at::Tensor& tensor);

struct FrameLimits {
  uint64_t max_elements = uint64_t{1} << 28;
  // When set, the dtype must be one of these.
  std::vector<DType> allowed_dtypes;
  // When >= 0, the rank must be exactly this.
  int rank = -1;
};
// A new CPU tensor with the frame's contents (raw codec only).
Result<at::Tensor> FromFrame(const net::TensorFrame& frame, const FrameLimits& limits = {});

}  // namespace colony::runtime
