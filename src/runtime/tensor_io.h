// Torch tensors <-> the transport's tensor frames (net::TensorFrame), for RPCs that carry
// activations, gradients and weights.
//
//   net::Message m;
//   m.tensors.push_back(ToFrame(hidden));                  // no copy for a contiguous CPU tensor
//   COLONY_ASSIGN_OR_RETURN(at::Tensor h, FromFrame(reply.tensors[0], {.max_elements = 1 << 24}));
//   m.tensors.push_back(*ToFrame(hidden, compression::Codec::kBlockwise8));  // 8-bit, ~1/4 size
//
// Frames from the network are untrusted: FromFrame checks the codec, dtype, rank, element count
// and byte length, and copies the bytes into a tensor of its own. A compressed frame is refused
// unless the caller names its codec (FrameLimits::allowed_codecs): what its few bytes decode to
// is bounded by max_elements like a raw frame's, and a caller should allow only codecs whose
// decoded size is a small multiple of their bytes (8-bit: 4x).
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "compression/codec.h"
#include "core/status.h"
#include "net/wire.h"

namespace colony::runtime {

// The frame's dtype for a torch scalar type (nullopt when the wire has none for it).
std::optional<DType> WireDType(at::ScalarType type);
at::ScalarType TorchDType(DType dtype);

// A frame viewing the tensor's bytes (made contiguous on the CPU first if needed); the frame
// keeps that tensor alive. Fails for dtypes the wire lacks.
Result<net::TensorFrame> ToFrame(const at::Tensor& tensor);
// A frame of a floating-point tensor's values as float32 encoded with `codec`
// (compression/codec.h; lossy for most); kNone is ToFrame(tensor). A large GPU tensor is
// encoded on the GPU where the codec allows (device_codec.h), so only encoded bytes cross.
Result<net::TensorFrame> ToFrame(const at::Tensor& tensor, compression::Codec codec,
                                 const compression::CodecOptions& options = {});

struct FrameLimits {
  uint64_t max_elements = uint64_t{1} << 28;
  // When set, the dtype must be one of these.
  std::vector<DType> allowed_dtypes = {};
  // When >= 0, the rank must be exactly this.
  int rank = -1;
  // Besides raw frames, frames of these codecs (float32 values) are decoded.
  std::vector<compression::Codec> allowed_codecs = {};
};
// A new CPU tensor with the frame's contents (a float32 tensor for a compressed frame).
Result<at::Tensor> FromFrame(const net::TensorFrame& frame, const FrameLimits& limits = {});

}  // namespace colony::runtime
