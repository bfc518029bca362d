// Access tokens of private swarms (hivemind's TokenAuthorizer, Training Transformers Together).
//
// An authority is an Ed25519 key pair. It signs, for one peer id, a token that admits that peer to
// the swarm until it expires: "colony-token-v1" || TokenBody (protocol.proto). Peers of a private
// swarm know the authority's public key and refuse, at the handshake (handshake.h), every peer
// that cannot show an unexpired, unrevoked token signed by it for its own peer id. A token is
// useless to anyone else: the handshake proves the peer id, and the token names it.
//
// A token may carry a role that limits which RPCs its holder may call on others (RoleMayCall).
// Tokens travel as binary (EncodeAccessToken) and are written for people as base64url text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/bytes.h"
#include "core/identity.h"
#include "core/status.h"

namespace colony::net {

enum class AccessRole : uint8_t { kAny, kTrain, kServe, kClient };

// "any", "train", "serve", "client".
std::string_view AccessRoleName(AccessRole role);
// Parses a role name; the error lists the known ones.
Result<AccessRole> ParseAccessRole(std::string_view name);
// Whether a peer holding `role` may call `method` on us: train may use the DHT, averaging, experts
// (a mixture's trainer) and block servers' forward and backward (a SWARM trainer's stage peers),
// serve the DHT and the block servers, client the DHT's lookups, the block servers and experts'
// forward (a mixture's inference; their backward trains them); every role may use the
// transport's own methods (pings, relays, dial-backs, hole punching).
bool RoleMayCall(AccessRole role, std::string_view method);

inline constexpr size_t kMaxTokenBytes = 1024;
inline constexpr size_t kMaxTokenNameBytes = 128;

struct AccessToken {
  PublicKey authority{};
  PeerId peer;
  std::string name;
  AccessRole role = AccessRole::kAny;
  uint64_t serial = 0;
  double issued_at = 0;
  double expires_at = 0;
};

// Signs a token for `peer`, valid from `now` for `ttl_seconds`, with a random serial.
Bytes IssueAccessToken(const KeyPair& authority, const PeerId& peer, std::string_view name,
                       AccessRole role, double now, double ttl_seconds);
// Parses a token and checks its signature against the authority it names (not whether that is
// the authority a swarm trusts, nor its times: see AccessControl). Errors say what is wrong.
Result<AccessToken> DecodeAccessToken(ByteSpan bytes);

// Text form for files and command lines: base64url without padding. Whitespace around is ignored.
std::string AccessTokenText(ByteSpan token);
Result<Bytes> ParseAccessTokenText(std::string_view text);

}  // namespace colony::net
