// Fuzz target for the DHT ping decoders (request and response), which parse what any peer
// sends. Whatever a decoder accepts must re-encode to bytes that decode again and re-encode to
// the same bytes (so accepted messages are fully understood, with nothing dropped silently).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "dht/wire.h"

using namespace colony::dht;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  if (auto req = DecodePingRequest(in); req.ok()) {
    const std::string once = EncodePingRequest(*req);
    auto again = DecodePingRequest(once);
    if (!again.ok() || EncodePingRequest(*again) != once) __builtin_trap();
  }
  if (auto resp = DecodePingResponse(in); resp.ok()) {
    const std::string once = EncodePingResponse(*resp);
    auto again = DecodePingResponse(once);
    if (!again.ok() || EncodePingResponse(*again) != once) __builtin_trap();
  }
  return 0;
}
