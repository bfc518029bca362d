// Fuzz target for DecodeStatus, which reads the payload of every STATUS, RESET and GOAWAY frame,
// and for EncodeStatus, which carries handler errors (arbitrary text) to the peer.
//  - DecodeStatus never fails: malformed input becomes a ProtocolError status; every decoded status
//    survives EncodeStatus -> DecodeStatus (code always; message while within the 4000 bytes kept).
//  - Any status, whatever bytes its message holds, reaches the peer with its code intact (the
//    message is a protobuf string: bytes that are not UTF-8 must not make the payload undecodable).
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "net/wire.h"

using colony::ByteSpan;
using colony::Status;
using colony::StatusCode;
using namespace colony::net;

namespace {
// Malformed protobuf strings make libprotobuf log each rejection; discard its log to keep the
// fuzzer fast and its output readable.
[[maybe_unused]] const bool kProtobufQuiet = (google::protobuf::SetLogHandler(nullptr), true);
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Status s = DecodeStatus(ByteSpan(data, size));
  if (!s.ok()) {
    if (static_cast<int>(s.code()) < 1 || s.code() > StatusCode::kProtocolError) __builtin_trap();
    Status back = DecodeStatus(EncodeStatus(s));
    if (back.code() != s.code()) __builtin_trap();
    if (s.message().size() <= 4000 && back.message() != s.message()) __builtin_trap();
  }

  if (size == 0) return 0;
  const auto code =
      static_cast<StatusCode>(1 + data[0] % static_cast<int>(StatusCode::kProtocolError));
  std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  Status sent(code, text);
  Status got = DecodeStatus(EncodeStatus(sent));
  if (got.code() != code || got.message().size() > 4000) __builtin_trap();
  bool ascii = true;
  for (char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii && text.size() <= 4000 && got.message() != text) __builtin_trap();
  return 0;
}
