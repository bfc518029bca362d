// Framework-neutral tensor descriptions. Layers below `model` move tensors as typed byte spans;
// LibTorch tensors are wrapped into these at the model layer without copying.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace colony {

// Element types. The numeric values are part of the wire format: never renumber.
enum class DType : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat16 = 6,
  kBFloat16 = 7,
  kFloat32 = 8,
  kFloat64 = 9,
  kBool = 10,
};

// Size in bytes of one element; 0 for an unknown value (as read off the wire).
size_t DTypeSize(DType dtype);
std::string_view DTypeName(DType dtype);
// Validates a dtype read from untrusted input.
std::optional<DType> DTypeFromWire(uint8_t value);

inline constexpr size_t kMaxTensorRank = 8;

// A non-owning view of a dense, contiguous tensor.
struct TensorView {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::span<const uint8_t> data;

  // Number of elements, or nullopt when a dimension is negative or the product overflows.
  static std::optional<uint64_t> NumElements(std::span<const int64_t> shape);
};

}  // namespace colony
