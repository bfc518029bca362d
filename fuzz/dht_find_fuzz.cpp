// Fuzz target for the DHT find decoders (request and response), which parse what any peer
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
  if (auto req = DecodeFindRequest(in); req.ok()) {
    const std::string once = EncodeFindRequest(*req);
    auto again = DecodeFindRequest(once);
    if (!again.ok() || EncodeFindRequest(*again) != once) __builtin_trap();
  }
  for (size_t n : {size_t{1}, size_t{2}}) {
    if (auto resp = DecodeFindResponse(in, n); resp.ok()) {
      if (resp->results.size() != n) __builtin_trap();
      const std::string once = EncodeFindResponse(*resp);
      auto again = DecodeFindResponse(once, n);
      if (!again.ok() || EncodeFindResponse(*again) != once) __builtin_trap();
    }
  }
  return 0;
}
