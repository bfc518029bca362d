// Fuzz target for the safetensors header parser, which reads model files downloaded from the
// Internet. ParseSafetensorsHeader never crashes on any bytes (with file_size = the input size),
// and a header it accepts is consistent: the data section starts after the header, every tensor's
// byte range matches its shape and dtype, lies inside the input, and overlaps no other tensor.
#include <cstddef>
#include <cstdint>
#include <span>

#include "model/safetensors.h"

using namespace colony::model;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto header = ParseSafetensorsHeader(std::span<const uint8_t>(data, size), size);
  if (!header.ok()) {
    if (header.status().message().empty()) __builtin_trap();
    return 0;
  }
  if (header->data_offset < 8 || header->data_offset > size) __builtin_trap();
  const uint64_t data_size = size - header->data_offset;
  uint64_t prev_end = 0;
  for (const TensorInfo& t : header->tensors) {
    if (t.begin > t.end || t.end > data_size) __builtin_trap();
    uint64_t bytes = DTypeSize(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0) __builtin_trap();
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) __builtin_trap();
    }
    if (bytes != t.end - t.begin) __builtin_trap();
    if (t.begin != t.end) {
      if (t.begin < prev_end) __builtin_trap();  // sorted by offset, no overlaps
      prev_end = t.end;
    }
    if (!ParseDType(DTypeName(t.dtype)).ok()) __builtin_trap();
  }
  // Any shorter prefix than the header is refused, not misread.
  if (header->data_offset > 8) {
    auto truncated = ParseSafetensorsHeader(
        std::span<const uint8_t>(data, static_cast<size_t>(header->data_offset - 1)), size);
    if (truncated.ok()) __builtin_trap();
  }
  return 0;
}
