// Fuzz target for the DHT ping decoders (request and response), which parse what any peer sends.
#include <cstddef>
#include <cstdint>

#include "dht/wire.h"
#include "dht_roundtrip.h"

using namespace colony::dht;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  CheckFixedPoint(in, DecodePingRequest, EncodePingRequest);
  CheckFixedPoint(in, DecodePingResponse, EncodePingResponse);
  return 0;
}
