#include "runtime/tensor_io.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <string>

#include "runtime/device_codec.h"

namespace colony::runtime {

std::optional<DType> WireDType(at::ScalarType type) {
  switch (type) {
    case at::kByte:
      return DType::kUInt8;
    case at::kChar:
      return DType::kInt8;
    case at::kShort:
      return DType::kInt16;
    case at::kInt:
      return DType::kInt32;
    case at::kLong:
      return DType::kInt64;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kFloat:
      return DType::kFloat32;
    case at::kDouble:
      return DType::kFloat64;
    case at::kBool:
      return DType::kBool;
    default:
      return std::nullopt;
  }
}

at::ScalarType TorchDType(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
      return at::kByte;
    case DType::kInt8:
      return at::kChar;
    case DType::kInt16:
      return at::kShort;
    case DType::kInt32:
      return at::kInt;
    case DType::kInt64:
      return at::kLong;
    case DType::kFloat16:
      return at::kHalf;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kFloat32:
      return at::kFloat;
    case DType::kFloat64:
      return at::kDouble;
    case DType::kBool:
      return at::kBool;
  }
  return at::kFloat;
}

Result<net::TensorFrame> ToFrame(const at::Tensor& tensor) {
  if (!tensor.defined()) return InvalidArgument("cannot send an undefined tensor");
  auto dtype = WireDType(tensor.scalar_type());
  if (!dtype) {
    return InvalidArgument(
        fmt::format("tensors of type {} cannot be sent", c10::toString(tensor.scalar_type())));
  }
  if (tensor.dim() > static_cast<int64_t>(kMaxTensorRank)) {
    return InvalidArgument(fmt::format("tensor rank {} exceeds {}", tensor.dim(), kMaxTensorRank));
  }
  auto owned = std::make_shared<at::Tensor>(tensor.detach().to(at::kCPU).contiguous());
  net::TensorFrame frame;
  frame.dtype = *dtype;
  frame.shape.assign(owned->sizes().begin(), owned->sizes().end());
  frame.data = ByteSpan(static_cast<const uint8_t*>(owned->data_ptr()), owned->nbytes());
  frame.owner = owned;
  return frame;
}

Result<net::TensorFrame> ToFrame(const at::Tensor& tensor, compression::Codec codec,
                                 const compression::CodecOptions& options) {
  if (codec == compression::Codec::kNone) return ToFrame(tensor);
  if (!tensor.defined() || !at::isFloatingType(tensor.scalar_type())) {
    return InvalidArgument(fmt::format("only floating-point tensors can be sent as {}",
                                       compression::CodecName(codec)));
  }
  if (tensor.dim() > static_cast<int64_t>(kMaxTensorRank)) {
    return InvalidArgument(fmt::format("tensor rank {} exceeds {}", tensor.dim(), kMaxTensorRank));
  }
  std::shared_ptr<Bytes> bytes;
  if (!tensor.is_cpu() && EncodesOnDevice(codec) && tensor.numel() >= kDeviceEncodeMinElements) {
    // Encoded on the GPU: only the encoded bytes cross to the host.
    COLONY_ASSIGN_OR_RETURN(bytes, EncodeOnDevice(tensor, codec, options));
  } else {
    const at::Tensor values = tensor.detach().to(at::kCPU, at::kFloat).contiguous();
    bytes = std::make_shared<Bytes>();
    COLONY_RETURN_IF_ERROR(compression::Encode(
        codec,
        std::span<const float>(values.data_ptr<float>(), static_cast<size_t>(values.numel())),
        *bytes, options));
  }
  net::TensorFrame frame;
  frame.dtype = DType::kFloat32;
  frame.codec = static_cast<uint8_t>(codec);
  frame.shape.assign(tensor.sizes().begin(), tensor.sizes().end());
  frame.data = ByteSpan(bytes->data(), bytes->size());
  frame.owner = bytes;
  return frame;
}

Result<at::Tensor> FromFrame(const net::TensorFrame& frame, const FrameLimits& limits) {
  std::optional<compression::Codec> codec;
  if (frame.codec != 0) {
    codec = compression::CodecFromWire(frame.codec);
    if (!codec || std::find(limits.allowed_codecs.begin(), limits.allowed_codecs.end(), *codec) ==
                      limits.allowed_codecs.end()) {
      return InvalidArgument(fmt::format(
          "tensor uses codec {}, which is not accepted here",
          codec ? std::string(compression::CodecName(*codec)) : std::to_string(frame.codec)));
    }
    if (frame.dtype != DType::kFloat32) {
      return InvalidArgument(fmt::format("a tensor of codec {} must carry float32 values, not {}",
                                         compression::CodecName(*codec), DTypeName(frame.dtype)));
    }
  }
  if (!limits.allowed_dtypes.empty() &&
      std::find(limits.allowed_dtypes.begin(), limits.allowed_dtypes.end(), frame.dtype) ==
          limits.allowed_dtypes.end()) {
    return InvalidArgument(
        fmt::format("tensor dtype {} is not accepted here", DTypeName(frame.dtype)));
  }
  if (limits.rank >= 0 && frame.shape.size() != static_cast<size_t>(limits.rank)) {
    return InvalidArgument(
        fmt::format("expected a tensor of rank {}, got rank {}", limits.rank, frame.shape.size()));
  }
  auto n = TensorView::NumElements(frame.shape);
  if (!n) return InvalidArgument("tensor shape has a negative or overflowing dimension");
  if (*n > limits.max_elements) {
    return ResourceExhausted(
        fmt::format("tensor of {} elements exceeds the limit of {}", *n, limits.max_elements));
  }
  if (codec) {
    // The encoding names its codec again: it must be the frame's (an allowed one).
    COLONY_ASSIGN_OR_RETURN(auto header, compression::PeekHeader(frame.data));
    if (header.codec != *codec || header.count != *n) {
      return InvalidArgument(fmt::format(
          "a {} tensor of {} values carries an encoding of {} values of codec {}",
          compression::CodecName(*codec), *n, header.count, compression::CodecName(header.codec)));
    }
    at::Tensor t = at::empty(frame.shape, at::TensorOptions().dtype(at::kFloat));
    COLONY_RETURN_IF_ERROR(compression::Decode(
        frame.data, std::span<float>(t.data_ptr<float>(), static_cast<size_t>(*n)),
        /*max_threads=*/1));
    return t;
  }
  const size_t size = DTypeSize(frame.dtype);
  if (size == 0 || frame.data.size() != *n * size) {
    return InvalidArgument(
        fmt::format("tensor has {} bytes, expected {}", frame.data.size(), *n * size));
  }
  at::Tensor t = at::empty(frame.shape, at::TensorOptions().dtype(TorchDType(frame.dtype)));
  if (!frame.data.empty()) std::memcpy(t.data_ptr(), frame.data.data(), frame.data.size());
  return t;
}

}  // namespace colony::runtime
