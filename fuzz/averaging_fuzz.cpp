// Fuzz target for every averaging decoder (join requests and responses with their groups,
// declarations, reduce hellos, part headers, state adverts, requests and headers, verification
// statements, ban lists): whatever a decoder accepts must re-encode to bytes that decode again to
// the same encoding.
#include <cstddef>
#include <cstdint>

#include "averaging/ban_evidence.h"
#include "averaging/wire.h"
#include "dht_roundtrip.h"

using namespace colony::averaging;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  CheckFixedPoint(in, DecodeDeclaration, EncodeDeclaration);
  CheckFixedPoint(in, DecodeJoinRequest, EncodeJoinRequest);
  CheckFixedPoint(in, DecodeJoinResponse, EncodeJoinResponse);
  CheckFixedPoint(in, DecodeReduceHello, EncodeReduceHello);
  for (size_t group : {size_t{1}, size_t{4}, size_t{256}}) {
    auto decode = [group](std::string_view b) { return DecodePartHeader(b, group); };
    CheckFixedPoint(in, decode, EncodePartHeader);
    auto decode_statement = [group](std::string_view b) { return DecodeVerifyStatement(b, group); };
    CheckFixedPoint(in, decode_statement, EncodeVerifyStatement);
  }
  CheckFixedPoint(in, DecodeStateAdvert, EncodeStateAdvert);
  CheckFixedPoint(in, DecodeStateRequest, EncodeStateRequest);
  CheckFixedPoint(in, DecodeStateHeader, EncodeStateHeader);
  CheckFixedPoint(in, DecodeBanList, EncodeBanList);
  return 0;
}
