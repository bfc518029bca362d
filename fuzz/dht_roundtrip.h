// Shared check of the DHT fuzz targets: whatever a decoder accepts must re-encode to bytes that
// decode again and re-encode to the same bytes (accepted messages are fully understood, with
// nothing dropped silently).
#pragma once

#include <string>
#include <string_view>

template <typename Decode, typename Encode>
void CheckFixedPoint(std::string_view in, Decode decode, Encode encode) {
  auto first = decode(in);
  if (!first.ok()) return;
  const std::string once = encode(*first);
  auto again = decode(once);
  if (!again.ok() || encode(*again) != once) __builtin_trap();
}
