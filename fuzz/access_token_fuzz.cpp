// Fuzz target for access tokens (net/access_token.h), which any peer of a private swarm shows in
// its handshake and TOKEN frames: DecodeAccessToken must never crash, must accept only tokens
// whose signature verifies under the authority they name (a token it accepts is refused once any
// byte of it changes), and what it accepts is bounded; the text form round-trips.
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "net/access_token.h"

using colony::Bytes;
using colony::ByteSpan;
using namespace colony::net;

namespace {

[[maybe_unused]] const bool kProtobufQuiet = (google::protobuf::SetLogHandler(nullptr), true);

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteSpan in(data, size);
  auto token = DecodeAccessToken(in);
  if (!token.ok()) {
    if (token.status().message().empty()) __builtin_trap();
  } else {
    if (size > kMaxTokenBytes || !token->peer.valid() || token->name.size() > kMaxTokenNameBytes ||
        token->expires_at < token->issued_at) {
      __builtin_trap();
    }
    Bytes flipped(data, data + size);
    flipped[size / 2] ^= 0x01;
    auto again = DecodeAccessToken(flipped);
    // A changed byte may only be accepted if it changed nothing the signature covers (protobuf
    // may ignore it), never with different content.
    if (again.ok() && (again->serial != token->serial || again->peer != token->peer ||
                       again->expires_at != token->expires_at || again->name != token->name)) {
      __builtin_trap();
    }
  }
  auto text = ParseAccessTokenText(std::string_view(reinterpret_cast<const char*>(data), size));
  if (text.ok() && ParseAccessTokenText(AccessTokenText(*text)).value() != *text) __builtin_trap();
  return 0;
}
