// Access tokens: issuing, parsing and verifying them, their text form and what roles may call.
#include "net/access_token.h"

#include <sodium.h>

#include <array>
#include <cctype>
#include <cmath>
#include <cstring>

#include "net/protocol.pb.h"
#include "net/wire.h"

namespace colony::net {
namespace {

constexpr char kTokenContext[] = "colony-token-v1";
constexpr char kBase64Url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

Bytes SignedBytes(const std::string& body) {
  const std::string m = std::string(kTokenContext) + body;
  return Bytes(m.begin(), m.end());
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

}  // namespace

std::string_view AccessRoleName(AccessRole role) {
  switch (role) {
    case AccessRole::kAny:
      return "any";
    case AccessRole::kTrain:
      return "train";
    case AccessRole::kServe:
      return "serve";
    case AccessRole::kClient:
      return "client";
  }
  return "?";
}

Result<AccessRole> ParseAccessRole(std::string_view name) {
  for (AccessRole r :
       {AccessRole::kAny, AccessRole::kTrain, AccessRole::kServe, AccessRole::kClient}) {
    if (name == AccessRoleName(r)) return r;
  }
  return InvalidArgument("unknown access role '" + std::string(name) +
                         "' (known: any, train, serve, client)");
}

bool RoleMayCall(AccessRole role, std::string_view method) {
  if (StartsWith(method, "net.") || StartsWith(method, "relay.")) return true;
  switch (role) {
    case AccessRole::kAny:
      return true;
    case AccessRole::kTrain:
      return StartsWith(method, "dht.") || StartsWith(method, "avg.") ||
             StartsWith(method, "moe.") || method == "serve.forward" ||
             method == "serve.backward" || method == "serve.fence";
    case AccessRole::kServe:
      return StartsWith(method, "dht.") || StartsWith(method, "serve.");
    case AccessRole::kClient:
      return method == "dht.find" || method == "dht.ping" || StartsWith(method, "serve.") ||
             method == "moe.forward";
  }
  return false;
}

Bytes IssueAccessToken(const KeyPair& authority, const PeerId& peer, std::string_view name,
                       AccessRole role, double now, double ttl_seconds) {
  proto::TokenBody body;
  body.set_authority(authority.public_key().data(), authority.public_key().size());
  const Bytes id = peer.ToBytes();
  body.set_peer(id.data(), id.size());
  body.set_name(ValidUtf8Prefix(std::string(name), kMaxTokenNameBytes));
  body.set_role(role == AccessRole::kAny ? std::string() : std::string(AccessRoleName(role)));
  uint64_t serial = 0;
  randombytes_buf(&serial, sizeof(serial));
  body.set_serial(serial);
  body.set_issued_at(now);
  body.set_expires_at(now + ttl_seconds);
  proto::AccessToken token;
  token.set_body(body.SerializeAsString());
  const Signature sig = authority.Sign(SignedBytes(token.body()));
  token.set_signature(sig.data(), sig.size());
  const std::string out = token.SerializeAsString();
  return Bytes(out.begin(), out.end());
}

Result<AccessToken> DecodeAccessToken(ByteSpan bytes) {
  if (bytes.size() > kMaxTokenBytes) {
    return ProtocolError("access token of " + std::to_string(bytes.size()) + " bytes (limit " +
                         std::to_string(kMaxTokenBytes) + ")");
  }
  proto::AccessToken token;
  proto::TokenBody body;
  if (!token.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())) ||
      !body.ParseFromString(token.body())) {
    return ProtocolError("the access token is not a valid token");
  }
  if (body.authority().size() != kPublicKeySize || token.signature().size() != kSignatureSize) {
    return ProtocolError("the access token has a malformed authority key or signature");
  }
  AccessToken t;
  std::memcpy(t.authority.data(), body.authority().data(), kPublicKeySize);
  Signature sig;
  std::memcpy(sig.data(), token.signature().data(), kSignatureSize);
  if (!VerifySignature(t.authority, SignedBytes(token.body()), sig)) {
    return Unauthenticated("the access token's signature does not match its authority");
  }
  auto peer = PeerId::FromBytes(AsBytes(body.peer()));
  if (!peer.ok()) return ProtocolError("the access token names no valid peer id");
  if (body.name().size() > kMaxTokenNameBytes) return ProtocolError("access token name too long");
  if (!std::isfinite(body.issued_at()) || !std::isfinite(body.expires_at()) ||
      body.expires_at() < body.issued_at()) {
    return ProtocolError("the access token's times are not valid");
  }
  AccessRole role = AccessRole::kAny;
  if (!body.role().empty()) {
    auto r = ParseAccessRole(body.role());
    if (!r.ok() || *r == AccessRole::kAny) {
      return ProtocolError("the access token has an unknown role");
    }
    role = *r;
  }
  t.peer = *peer;
  t.name = body.name();
  t.role = role;
  t.serial = body.serial();
  t.issued_at = body.issued_at();
  t.expires_at = body.expires_at();
  return t;
}

std::string AccessTokenText(ByteSpan token) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (uint8_t b : token) {
    acc = (acc << 8) | b;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out += kBase64Url[(acc >> bits) & 63];
    }
  }
  if (bits > 0) out += kBase64Url[(acc << (6 - bits)) & 63];
  return out;
}

Result<Bytes> ParseAccessTokenText(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  if (text.empty()) return InvalidArgument("the access token is empty");
  if (text.size() > kMaxTokenBytes * 4 / 3 + 4)
    return InvalidArgument("the access token is too long");
  if (text.size() % 4 == 1) {
    return InvalidArgument(
        "the access token is cut short; copy it whole as `colony authority "
        "issue` printed it");
  }
  std::array<int8_t, 256> value;
  value.fill(-1);
  for (int i = 0; i < 64; ++i) value[static_cast<uint8_t>(kBase64Url[i])] = static_cast<int8_t>(i);
  Bytes out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    const int v = value[static_cast<uint8_t>(c)];
    if (v < 0) {
      return InvalidArgument(std::string("the access token holds '") + c +
                             "', which is not base64url; copy it whole as `colony authority "
                             "issue` printed it");
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>(acc >> bits));
    }
  }
  return out;
}

}  // namespace colony::net
