// Handshake messages as pure functions over bytes (no I/O), so they can be fuzzed on their own.
// The protocol itself is described in handshake.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/identity.h"
#include "net/crypto.h"
#include "net/wire.h"

namespace colony::net {

enum class Role : uint8_t { kInitiator = 0, kResponder = 1 };

inline constexpr char kMagic[8] = {'c', 'o', 'l', 'o', 'n', 'y', '\r', '\n'};

// Receive limits announced in Auth.
struct PeerLimits {
  uint32_t stream_window = 4u << 20;
  uint64_t connection_window = 32ull << 20;
  uint32_t max_concurrent_streams = 256;
  uint64_t max_message_bytes = 64ull << 20;
};

struct HelloInfo {
  uint32_t version_major = 0;
  uint32_t version_minor = 0;
  Key32 ephemeral_key{};
  std::string agent;
  // A private swarm's peer: it checks who connects, and whose tokens it wants (if any).
  bool checks_access = false;
  std::optional<PeerId> authority;
};

// Hello protobuf bytes (without the magic and length prefix).
Bytes EncodeHello(const Key32& ephemeral_public, uint32_t major, uint32_t minor,
                  const std::string& agent, bool checks_access = false,
                  const std::optional<PeerId>& authority = std::nullopt);
// Parses and validates a Hello. FailedPrecondition when the major version differs from ours.
Result<HelloInfo> DecodeHello(ByteSpan bytes, uint32_t our_major, uint32_t our_minor);

struct AuthInfo {
  PeerId peer;
  Bytes access_token;  // empty: none shown (at most kMaxTokenBytes)
  std::string observed_addr;
  std::vector<std::string> listen_addrs;
  PeerLimits limits;
  bool probe = false;  // the dialer only tests reachability and closes after the handshake
};

// The bytes an Auth signature covers.
Bytes AuthSignedBytes(Role signer, const Key32& transcript);
Bytes EncodeAuth(const KeyPair& identity, Role role, const Key32& transcript,
                 const std::string& observed_addr, const std::vector<std::string>& listen_addrs,
                 const PeerLimits& limits, ByteSpan access_token = {}, bool probe = false);
// Parses an Auth sent by a peer playing `sender_role` and verifies its signature.
// Unauthenticated on a bad signature; ProtocolError on malformed content.
Result<AuthInfo> DecodeAuth(ByteSpan bytes, Role sender_role, const Key32& transcript);

// Private swarms: whether a side admits the other, and why not.
struct VerdictInfo {
  bool admitted = false;
  std::string reason;  // at most kMaxVerdictReason bytes
};
inline constexpr size_t kMaxVerdictReason = 512;
Bytes EncodeVerdict(const VerdictInfo& verdict);
Result<VerdictInfo> DecodeVerdict(ByteSpan bytes);

}  // namespace colony::net
