#include "core/tensor.h"

namespace colony {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kBool:
      return 1;
    case DType::kInt16:
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
    case DType::kFloat64:
      return 8;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
      return "uint8";
    case DType::kInt8:
      return "int8";
    case DType::kInt16:
      return "int16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kBool:
      return "bool";
  }
  return "unknown";
}

std::optional<DType> DTypeFromWire(uint8_t value) {
  if (value < 1 || value > 10) return std::nullopt;
  return static_cast<DType>(value);
}

std::optional<uint64_t> TensorView::NumElements(std::span<const int64_t> shape) {
  // Validate every dimension first, so the answer does not depend on their order: a zero
  // dimension makes the tensor empty whatever the others are (as in PyTorch).
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d == 0) empty = true;
  }
  if (empty) return 0;
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (n > UINT64_MAX / static_cast<uint64_t>(d)) return std::nullopt;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

}  // namespace colony
