// Who may connect: the policy of a private swarm, checked at every handshake (handshake.h) and
// for as long as each connection lives (connection.h).
//
// A swarm is private when it names an authority (peers must show its access tokens,
// access_token.h) or an allowlist of peer ids (listed peers need no token), or both. A token
// admits its peer from issued_at - clock_skew to expires_at + clock_skew, unless the authority
// revoked its serial (revocations reach peers through the DHT: dht/revocations.h). A connection
// whose peer's token runs out without a renewal (a TOKEN frame) is closed.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/clock.h"
#include "core/identity.h"
#include "net/access_token.h"

namespace colony::net {

struct AccessOptions {
  // The authority whose tokens admit peers (its PeerId form names its public key).
  std::optional<PeerId> authority;
  // Peers admitted without a token.
  std::vector<PeerId> allowlist;
  // How far clocks of the authority, the holder and this peer may disagree.
  double clock_skew_seconds = 60;
};

// Why a peer was admitted, kept by its connection.
struct AccessGrant {
  bool allowlisted = false;
  AccessRole role = AccessRole::kAny;
  uint64_t serial = 0;
  double expires_at = 0;  // allowlisted: never
  std::string name;
};

// Revocations held at most (they are signed by the authority, but bounded all the same).
inline constexpr size_t kMaxRevocations = 100'000;

class AccessControl {
 public:
  explicit AccessControl(AccessOptions options, const Clock* clock = &SystemClock::Instance());

  const AccessOptions& options() const { return options_; }
  // Whether anyone is refused at all.
  bool is_private() const { return options_.authority.has_value() || !allowlist_.empty(); }

  // Our own token, shown to every peer we connect to. It must be the authority's, for `self`,
  // and not expired; the error says which of these it is not.
  Status SetOwnToken(const PeerId& self, Bytes token);
  std::optional<Bytes> own_token() const;
  std::optional<AccessToken> own_token_info() const;

  // Whether `peer`, showing `token` (empty: none), is admitted now. The error is what both sides
  // are told ("its access token expired 3 min ago", "it shows no access token", ...).
  Result<AccessGrant> Admit(const PeerId& peer, ByteSpan token) const;
  // Whether a grant still holds now (expiry, revocation), for connections already open.
  Status StillValid(const AccessGrant& grant) const;

  // Refuses the token with `serial` until `until` (Unix seconds); returns whether it is new.
  bool Revoke(uint64_t serial, double until);
  bool IsRevoked(uint64_t serial) const;
  size_t revocation_count() const;

 private:
  AccessOptions options_;
  const Clock* clock_;
  std::unordered_set<PeerId> allowlist_;
  mutable std::mutex mu_;
  std::optional<Bytes> own_token_;
  std::optional<AccessToken> own_info_;
  std::unordered_map<uint64_t, double> revoked_;  // serial -> until
};

// Reads an allowlist file: one peer id per line; blank lines and '#' comments are skipped. Errors
// name the file and line.
Result<std::vector<PeerId>> LoadAllowlist(const std::string& path);

}  // namespace colony::net
