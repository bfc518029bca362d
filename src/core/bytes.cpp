#include "core/bytes.h"

#include <algorithm>

namespace colony {

std::string HexEncode(ByteSpan bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 0xf]);
  }
  return out;
}

void ReserveRaw(RawBuffer& buffer, size_t capacity) {
  if (buffer.capacity() >= capacity) return;
  RawBuffer grown;
  grown.reserve(std::max(capacity, 2 * buffer.capacity()));
  grown.resize(buffer.size());  // no fill: the allocator leaves the bytes uninitialised
  if (!buffer.empty()) std::memcpy(grown.data(), buffer.data(), buffer.size());
  buffer.swap(grown);
}

}  // namespace colony
