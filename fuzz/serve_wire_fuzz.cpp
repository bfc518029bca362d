// Fuzz target for the serve.* RPC messages (serve/wire.h), which block servers read from any
// client and clients read from any server: whatever a decoder accepts must re-encode to bytes that
// decode again to the same encoding, and every error must say what is wrong.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dht_roundtrip.h"
#include "serve/wire.h"

using namespace colony::serve;

namespace {

template <typename Decode>
void CheckError(std::string_view in, Decode decode) {
  auto r = decode(in);
  if (!r.ok() && r.status().message().empty()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  CheckFixedPoint(in, DecodeBlockRequest, EncodeBlockRequest);
  CheckFixedPoint(in, DecodeFence, EncodeFence);
  CheckFixedPoint(in, DecodeFenceReply, EncodeFenceReply);
  CheckFixedPoint(in, DecodeOpenSession, EncodeOpenSession);
  CheckFixedPoint(in, DecodeSessionOpened, EncodeSessionOpened);
  CheckFixedPoint(in, DecodeStep, EncodeStep);
  CheckFixedPoint(in, DecodeStepReply, EncodeStepReply);
  CheckFixedPoint(in, DecodePush, EncodePush);
  CheckFixedPoint(in, DecodeInfo, EncodeInfo);
  CheckError(in, DecodeBlockRequest);
  CheckError(in, DecodeFence);
  CheckError(in, DecodeOpenSession);
  CheckError(in, DecodeStep);
  CheckError(in, DecodePush);
  CheckError(in, DecodeInfo);
  return 0;
}
