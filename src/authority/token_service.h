// The HTTP token issuer of a private swarm (`colony authority serve`): the swarm's members, each
// known by a name, a role and a secret key, fetch access tokens for their peer ids over HTTP, as
// Training Transformers Together's volunteers got theirs from an allowlist server. A peer's
// --access-token-command asks it whenever a third of its token's lifetime is left:
//
//   --access-token-command 'curl -sS --fail-with-body -H "Authorization: Bearer $(cat
//   alice.secret)"
//                           https://auth.example.org/v1/token/$COLONY_PEER_ID'
//
// GET /v1/token/<peer id>, with "Authorization: Bearer <member's key>": text/plain, the token (as
//   `colony authority issue` prints it) that admits that peer id, named after the member, with the
//   member's role, valid for `ttl_seconds`. 401 without a member's key, 400 for a malformed peer
//   id, 403 when the member already holds unexpired tokens for `max_peers_per_member` other peer
//   ids (one member cannot fill the swarm with identities), 429 past `requests_per_minute` per
//   client address (whether or not its key is right).
// GET /v1/authority: {"authority": id, "ttl_seconds": ...}, for anyone.
//
// The members file holds SHA-256 hashes of the keys, never the keys: a copy of it admits nobody.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/identity.h"
#include "core/periodic.h"
#include "core/status.h"
#include "http/server.h"
#include "net/access_token.h"

namespace colony::api {
class ClientGate;
}

namespace colony::authority {

inline constexpr size_t kMaxMembers = 100'000;

struct Member {
  std::string name;  // 1-128 bytes of [A-Za-z0-9._@+-]; the tokens' name
  net::AccessRole role = net::AccessRole::kAny;
  std::string key_sha256;  // 64 lower-case hex digits
};

// The members in `path`, one per line: NAME ROLE sha256:HEX ('#' comments and blank lines
// skipped), where ROLE is any, train, serve or client and HEX the SHA-256 of the member's key
// (`printf %s KEY | sha256sum`). A malformed line, a duplicate name or hash, or a file without
// members is an error naming the line.
Result<std::vector<Member>> LoadMembers(const std::string& path);
// OK for a member's name (1-128 bytes of letters, digits and ._@+-); an error naming it otherwise.
Status CheckMemberName(std::string_view name);
// The members file's line for `member`.
std::string MemberLine(const Member& member);
// A new random key (48 hex digits) and its hash, as a members file stores it.
std::pair<std::string, std::string> NewMemberKey();
// SHA-256 of `key`, lower-case hex.
std::string KeySha256(std::string_view key);

struct TokenServiceOptions {
  double ttl_seconds = 3600;
  // Distinct peer ids one member may hold unexpired tokens for at once.
  size_t max_peers_per_member = 8;
  // Per client address, in bursts of up to a minute's worth; 0: no limit.
  double requests_per_minute = 60;
  const Clock* clock = &SystemClock::Instance();
};

struct TokenServiceStats {
  int64_t issued = 0;
  int64_t unauthorized = 0;     // 401
  int64_t bad_peer_ids = 0;     // 400
  int64_t over_peer_limit = 0;  // 403
  int64_t rate_limited = 0;     // 429
};

class TokenService : public std::enable_shared_from_this<TokenService> {
 public:
  static Result<std::shared_ptr<TokenService>> Create(KeyPair authority,
                                                      std::vector<Member> members,
                                                      TokenServiceOptions options);
  // The routes above; their handlers keep the service alive.
  http::Router Routes();
  // Replaces the members (the members file changed): a removed member's key is refused from the
  // next request on, and the tokens it holds stay valid until they expire. InvalidArgument for
  // no members.
  Status ReplaceMembers(std::vector<Member> members);
  size_t member_count() const;
  TokenServiceStats stats() const;
  const PeerId& authority() const { return authority_id_; }

 private:
  TokenService(KeyPair authority, TokenServiceOptions options,
               std::shared_ptr<api::ClientGate> gate);
  http::Reply Issue(const http::Request& request);
  // The member whose key the request carries; nullopt when none.
  std::optional<Member> Authenticate(const http::Request& request) const;

  const KeyPair key_;
  const PeerId authority_id_;
  const TokenServiceOptions options_;
  const std::shared_ptr<api::ClientGate> gate_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Member> by_hash_;  // a key's SHA-256 -> its member
  // Per member name: the peer ids it holds unexpired tokens for, and when each expires.
  std::map<std::string, std::map<std::string, double>> held_;
  TokenServiceStats stats_;
};

// Reads a members file again whenever it changes (checked every `interval` while alive) and
// gives the service its members: removing a line revokes a member's key without a restart. A
// file that no longer loads is logged, and the members stay as they were.
class MembersWatcher {
 public:
  MembersWatcher(std::shared_ptr<TokenService> service, std::string path,
                 std::chrono::milliseconds interval);
  // Changes of the file handled so far (taken or refused).
  uint64_t changes() const { return changes_.load(); }

 private:
  void Check();

  const std::shared_ptr<TokenService> service_;
  const std::string path_;
  std::pair<int64_t, int64_t> seen_;  // the file's modification time (ns) and size
  std::atomic<uint64_t> changes_{0};
  Periodic periodic_;  // last: stops before the rest goes
};

}  // namespace colony::authority
