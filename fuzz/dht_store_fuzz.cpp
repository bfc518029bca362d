// Fuzz target for the DHT store decoders (request and response), which parse what any peer sends.
#include <cstddef>
#include <cstdint>

#include "dht/wire.h"
#include "dht_roundtrip.h"

using namespace colony::dht;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  CheckFixedPoint(in, DecodeStoreRequest, EncodeStoreRequest);
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}}) {
    auto decode = [n](std::string_view b) {
      auto r = DecodeStoreResponse(b, n);
      if (r.ok() && r->results.size() != n) __builtin_trap();
      return r;
    };
    CheckFixedPoint(in, decode, EncodeStoreResponse);
  }
  return 0;
}
