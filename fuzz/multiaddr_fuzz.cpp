// Fuzz target for Multiaddr::Parse, which reads addresses from peers, DHT records and the command
// line. Checks that it never crashes and that whatever it accepts prints back to text that parses
// to an equal address (so addresses survive being gossiped as text).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/multiaddr.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto addr = colony::Multiaddr::Parse(text);
  if (!addr.ok()) {
    if (addr.status().message().empty()) __builtin_trap();  // errors must say what is wrong
    return 0;
  }
  std::string printed = addr->ToString();
  auto again = colony::Multiaddr::Parse(printed);
  if (!again.ok()) __builtin_trap();
  if (!(*again == *addr)) __builtin_trap();
  if (again->ToString() != printed) __builtin_trap();  // the printed form is canonical
  // An accepted host is printable text: no NULs or other control bytes smuggled into it.
  for (char c : addr->host()) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == '/' || c == 0x7f) __builtin_trap();
  }
  if (addr->peer_id() && !addr->peer_id()->valid()) __builtin_trap();
  return 0;
}
