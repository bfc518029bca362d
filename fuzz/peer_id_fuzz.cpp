// Fuzz target for the decoders of peer ids: PeerId::Parse (text, from addresses and the command
// line), PeerId::FromBytes (binary, from wire messages) and Base58Decode beneath them. Whatever
// they accept must round-trip exactly.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "core/base58.h"
#include "core/identity.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  colony::ByteSpan bytes(data, size);

  // Base58: a text has one spelling, leading '1's being zero bytes, so decode->encode is exact.
  auto decoded = colony::Base58Decode(text);
  if (decoded.ok()) {
    if (colony::Base58Encode(*decoded) != text) __builtin_trap();
  } else if (decoded.status().message().empty()) {
    __builtin_trap();
  }
  // And encode->decode is exact for any bytes short enough to be accepted back. (Base58 is
  // quadratic; ids are 38 bytes, so longer inputs add time and little coverage. 200 bytes encode
  // to 273 characters or fewer, so the over-long rejection is still reached.)
  if (size <= 200) {
    std::string encoded = colony::Base58Encode(bytes);
    auto back = colony::Base58Decode(encoded);
    if (encoded.size() <= 256) {
      if (!back.ok() || *back != colony::Bytes(bytes.begin(), bytes.end())) __builtin_trap();
    } else if (back.ok()) {
      __builtin_trap();
    }
  }

  // PeerId from text.
  auto parsed = colony::PeerId::Parse(text);
  if (parsed.ok()) {
    if (!parsed->valid()) __builtin_trap();
    if (parsed->ToString() != text) __builtin_trap();
    auto again = colony::PeerId::Parse(parsed->ToString());
    if (!again.ok() || !(*again == *parsed)) __builtin_trap();
    // Text and binary forms agree.
    if (!decoded.ok() || parsed->ToBytes() != *decoded) __builtin_trap();
  } else if (parsed.status().message().empty()) {
    __builtin_trap();
  }

  // PeerId from bytes.
  auto from_bytes = colony::PeerId::FromBytes(bytes);
  if (from_bytes.ok()) {
    if (!from_bytes->valid()) __builtin_trap();
    if (from_bytes->ToBytes() != colony::Bytes(bytes.begin(), bytes.end())) __builtin_trap();
    auto reparsed = colony::PeerId::Parse(from_bytes->ToString());
    if (!reparsed.ok() || !(*reparsed == *from_bytes)) __builtin_trap();
    if (std::hash<colony::PeerId>{}(*reparsed) != std::hash<colony::PeerId>{}(*from_bytes)) {
      __builtin_trap();
    }
  } else if (from_bytes.status().message().empty()) {
    __builtin_trap();
  }
  return 0;
}
