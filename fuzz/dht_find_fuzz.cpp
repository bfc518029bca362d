// Fuzz target for the DHT find decoders (request and response), which parse what any peer sends.
#include <cstddef>
#include <cstdint>

#include "dht/wire.h"
#include "dht_roundtrip.h"

using namespace colony::dht;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  CheckFixedPoint(in, DecodeFindRequest, EncodeFindRequest);
  for (size_t n : {size_t{1}, size_t{2}}) {
    auto decode = [n](std::string_view b) {
      auto r = DecodeFindResponse(b, n);
      if (r.ok() && r->results.size() != n) __builtin_trap();
      return r;
    };
    CheckFixedPoint(in, decode, EncodeFindResponse);
  }
  return 0;
}
