#include "net/handshake_messages.h"

#include <cstring>

#include "net/access_token.h"
#include "net/protocol.pb.h"

namespace colony::net {
namespace {

constexpr char kAuthContext[] = "colony-auth-v1";

template <typename Msg>
Bytes Serialize(const Msg& m) {
  Bytes out(m.ByteSizeLong());
  m.SerializeToArray(out.data(), static_cast<int>(out.size()));
  return out;
}

std::string VersionText(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

}  // namespace

Bytes EncodeHello(const Key32& ephemeral_public, uint32_t major, uint32_t minor,
                  const std::string& agent, bool checks_access,
                  const std::optional<PeerId>& authority) {
  proto::Hello h;
  h.set_checks_access(checks_access);
  if (authority) h.set_authority(authority->public_key().data(), kPublicKeySize);
  h.set_version_major(major);
  h.set_version_minor(minor);
  h.set_ephemeral_key(ephemeral_public.data(), ephemeral_public.size());
  h.set_agent(ValidUtf8Prefix(agent, 128));
  return Serialize(h);
}

Result<HelloInfo> DecodeHello(ByteSpan bytes, uint32_t our_major, uint32_t our_minor) {
  proto::Hello h;
  if (!h.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return ProtocolError("handshake Hello is not a valid message");
  }
  if (h.version_major() != our_major) {
    return FailedPrecondition("incompatible protocol versions: the peer speaks Colony protocol " +
                              VersionText(h.version_major(), h.version_minor()) +
                              ", this node speaks " + VersionText(our_major, our_minor) +
                              "; upgrade the older side");
  }
  if (h.ephemeral_key().size() != 32) {
    return ProtocolError("handshake Hello carries a " + std::to_string(h.ephemeral_key().size()) +
                         "-byte ephemeral key; expected 32");
  }
  if (h.agent().size() > 128) return ProtocolError("handshake Hello agent string too long");
  HelloInfo info;
  info.version_major = h.version_major();
  info.version_minor = h.version_minor();
  std::memcpy(info.ephemeral_key.data(), h.ephemeral_key().data(), 32);
  info.agent = h.agent();
  info.checks_access = h.checks_access();
  if (!h.authority().empty()) {
    if (h.authority().size() != kPublicKeySize) {
      return ProtocolError("handshake Hello names a malformed authority key");
    }
    PublicKey key;
    std::memcpy(key.data(), h.authority().data(), kPublicKeySize);
    info.authority = PeerId::FromPublicKey(key);
  }
  return info;
}

Bytes AuthSignedBytes(Role signer, const Key32& transcript) {
  Bytes b(kAuthContext, kAuthContext + sizeof(kAuthContext) - 1);
  b.push_back(static_cast<uint8_t>(signer));
  b.insert(b.end(), transcript.begin(), transcript.end());
  return b;
}

Bytes EncodeAuth(const KeyPair& identity, Role role, const Key32& transcript,
                 const std::string& observed_addr, const std::vector<std::string>& listen_addrs,
                 const PeerLimits& limits, ByteSpan access_token, bool probe) {
  proto::Auth a;
  a.set_probe(probe);
  if (!access_token.empty()) a.set_access_token(access_token.data(), access_token.size());
  a.set_public_key(identity.public_key().data(), identity.public_key().size());
  Signature sig = identity.Sign(AuthSignedBytes(role, transcript));
  a.set_signature(sig.data(), sig.size());
  a.set_observed_addr(observed_addr);
  for (const auto& l : listen_addrs) a.add_listen_addrs(l);
  a.set_stream_window(limits.stream_window);
  a.set_connection_window(limits.connection_window);
  a.set_max_concurrent_streams(limits.max_concurrent_streams);
  a.set_max_message_bytes(limits.max_message_bytes);
  return Serialize(a);
}

Result<AuthInfo> DecodeAuth(ByteSpan bytes, Role sender_role, const Key32& transcript) {
  proto::Auth a;
  if (!a.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return ProtocolError("handshake Auth is not a valid message");
  }
  if (a.public_key().size() != kPublicKeySize || a.signature().size() != kSignatureSize) {
    return ProtocolError("handshake Auth has a malformed key or signature");
  }
  if (a.listen_addrs_size() > 32 || a.observed_addr().size() > 256) {
    return ProtocolError("handshake Auth lists too many or too long addresses");
  }
  if (a.access_token().size() > kMaxTokenBytes) {
    return ProtocolError("handshake Auth carries an access token of " +
                         std::to_string(a.access_token().size()) + " bytes (limit " +
                         std::to_string(kMaxTokenBytes) + ")");
  }
  PublicKey key;
  std::memcpy(key.data(), a.public_key().data(), kPublicKeySize);
  Signature sig;
  std::memcpy(sig.data(), a.signature().data(), kSignatureSize);
  if (!VerifySignature(key, AuthSignedBytes(sender_role, transcript), sig)) {
    return Unauthenticated("the peer failed to prove it holds its identity key (bad signature)");
  }
  // Limits below these floors would make the connection unusable; treat as malformed.
  if (a.stream_window() < 64 * 1024 || a.connection_window() < a.stream_window() ||
      a.max_concurrent_streams() < 1 || a.max_message_bytes() < 64 * 1024) {
    return ProtocolError("handshake Auth announces unusable receive limits");
  }
  AuthInfo info;
  info.peer = PeerId::FromPublicKey(key);
  info.observed_addr = a.observed_addr();
  info.listen_addrs.assign(a.listen_addrs().begin(), a.listen_addrs().end());
  info.limits.stream_window = a.stream_window();
  info.limits.connection_window = a.connection_window();
  info.limits.max_concurrent_streams = a.max_concurrent_streams();
  info.limits.max_message_bytes = a.max_message_bytes();
  info.access_token.assign(a.access_token().begin(), a.access_token().end());
  info.probe = a.probe();
  return info;
}

Bytes EncodeVerdict(const VerdictInfo& verdict) {
  proto::Verdict v;
  v.set_admitted(verdict.admitted);
  v.set_reason(ValidUtf8Prefix(verdict.reason, kMaxVerdictReason));
  return Serialize(v);
}

Result<VerdictInfo> DecodeVerdict(ByteSpan bytes) {
  proto::Verdict v;
  if (!v.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())) ||
      v.reason().size() > kMaxVerdictReason) {
    return ProtocolError("handshake Verdict is not a valid message");
  }
  return VerdictInfo{v.admitted(), v.reason()};
}

}  // namespace colony::net
