// The HTTP token issuer of a private swarm (token_service.h).
#include "authority/token_service.h"

#include <fmt/format.h>
#include <sodium.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "api/client_gate.h"
#include "core/bytes.h"
#include "core/log.h"

namespace colony::authority {
namespace {

constexpr std::string_view kHashPrefix = "sha256:";
constexpr std::string_view kTokenPath = "/v1/token/";
// A peer id's text is ~52 characters; anything far longer is not one.
constexpr size_t kMaxPeerIdText = 128;

bool NameCharacter(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '.' || c == '_' || c == '@' ||
         c == '+' || c == '-';
}

bool LowerHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

http::Reply Text(int status, std::string body) {
  http::Reply r;
  r.status = status;
  r.content_type = "text/plain; charset=utf-8";
  r.body = std::move(body);
  return r;
}

}  // namespace

std::string KeySha256(std::string_view key) {
  std::array<unsigned char, crypto_hash_sha256_BYTES> digest{};
  crypto_hash_sha256(digest.data(), reinterpret_cast<const unsigned char*>(key.data()), key.size());
  return HexEncode(ByteSpan(digest.data(), digest.size()));
}

std::pair<std::string, std::string> NewMemberKey() {
  std::array<unsigned char, 24> bytes{};
  randombytes_buf(bytes.data(), bytes.size());
  std::string key = HexEncode(ByteSpan(bytes.data(), bytes.size()));
  std::string hash = KeySha256(key);
  return {std::move(key), std::move(hash)};
}

Status CheckMemberName(std::string_view name) {
  if (name.empty() || name.size() > net::kMaxTokenNameBytes ||
      !std::all_of(name.begin(), name.end(), NameCharacter)) {
    return InvalidArgument(
        fmt::format("the name '{}' is not 1-{} characters of letters, digits "
                    "and ._@+-",
                    name.substr(0, 64), net::kMaxTokenNameBytes));
  }
  return Status::Ok();
}

std::string MemberLine(const Member& member) {
  return fmt::format("{} {} {}{}", member.name, net::AccessRoleName(member.role), kHashPrefix,
                     member.key_sha256);
}

Result<std::vector<Member>> LoadMembers(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(fmt::format("cannot read the members file {}", path));
  std::vector<Member> members;
  std::set<std::string> names, hashes;
  std::string line;
  for (size_t lineno = 1; std::getline(in, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    const auto where = [&] { return fmt::format("{} line {}", path, lineno); };
    std::istringstream fields(line);
    std::string name, role, hash, extra;
    fields >> name >> role >> hash;
    if (hash.empty() || (fields >> extra)) {
      return InvalidArgument(fmt::format(
          "{}: a member is one line 'NAME ROLE sha256:HEX' (three fields; `colony authority "
          "add-member` writes them)",
          where()));
    }
    if (Status st = CheckMemberName(name); !st.ok()) return st.WithContext(where());
    auto parsed_role = net::ParseAccessRole(role);
    if (!parsed_role.ok()) {
      return InvalidArgument(fmt::format("{}: role: {}", where(), parsed_role.status().message()));
    }
    if (!hash.starts_with(kHashPrefix) || hash.size() != kHashPrefix.size() + 64 ||
        !LowerHex(std::string_view(hash).substr(kHashPrefix.size()))) {
      return InvalidArgument(fmt::format(
          "{}: the third field is 'sha256:' and the 64 lower-case hex digits of the SHA-256 of "
          "the member's key (`printf %s KEY | sha256sum`), never the key itself",
          where()));
    }
    hash = hash.substr(kHashPrefix.size());
    if (!names.insert(name).second) {
      return InvalidArgument(fmt::format("{}: the member '{}' is listed twice", where(), name));
    }
    if (!hashes.insert(hash).second) {
      return InvalidArgument(
          fmt::format("{}: the key of '{}' is another member's too", where(), name));
    }
    if (members.size() >= kMaxMembers) {
      return InvalidArgument(fmt::format("{}: more than {} members", where(), kMaxMembers));
    }
    members.push_back({.name = name, .role = *parsed_role, .key_sha256 = hash});
  }
  if (members.empty()) return InvalidArgument(fmt::format("{} lists no member", path));
  return members;
}

Result<std::shared_ptr<TokenService>> TokenService::Create(KeyPair authority,
                                                           std::vector<Member> members,
                                                           TokenServiceOptions options) {
  if (!(options.ttl_seconds >= 1) || options.ttl_seconds > 366 * 86400.0) {
    return InvalidArgument(
        fmt::format("a token's lifetime is 1 s to 366 days, not {} s", options.ttl_seconds));
  }
  if (options.max_peers_per_member == 0) {
    return InvalidArgument("a member must be allowed at least one peer id");
  }
  COLONY_ASSIGN_OR_RETURN(
      auto gate, api::ClientGate::Create({.requests_per_minute = options.requests_per_minute}));
  auto service = std::shared_ptr<TokenService>(
      new TokenService(std::move(authority), options, std::move(gate)));
  COLONY_RETURN_IF_ERROR(service->ReplaceMembers(std::move(members)));
  return service;
}

TokenService::TokenService(KeyPair authority, TokenServiceOptions options,
                           std::shared_ptr<api::ClientGate> gate)
    : key_(std::move(authority)),
      authority_id_(key_.peer_id()),
      options_(options),
      gate_(std::move(gate)) {}

Status TokenService::ReplaceMembers(std::vector<Member> members) {
  if (members.empty()) return InvalidArgument("the token service has no member");
  std::unordered_map<std::string, Member> by_hash;
  for (auto& m : members) {
    std::string hash = m.key_sha256;
    by_hash.emplace(std::move(hash), std::move(m));
  }
  std::set<std::string> names;
  for (const auto& [_, m] : by_hash) names.insert(m.name);
  std::lock_guard lock(mu_);
  by_hash_ = std::move(by_hash);
  // What a removed member held is forgotten (its tokens stay valid until they expire).
  std::erase_if(held_, [&](const auto& kv) { return !names.contains(kv.first); });
  return Status::Ok();
}

size_t TokenService::member_count() const {
  std::lock_guard lock(mu_);
  return by_hash_.size();
}

std::optional<Member> TokenService::Authenticate(const http::Request& request) const {
  const std::string_view key = api::BearerToken(request.Header("authorization"));
  if (key.empty() || key.size() > 1024) return std::nullopt;
  // Looked up by hash: how long it takes says nothing about a key the caller does not hold.
  const std::string hash = KeySha256(key);
  std::lock_guard lock(mu_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  return it->second;
}

http::Reply TokenService::Issue(const http::Request& request) {
  if (auto refused = gate_->Admit(request)) {
    std::lock_guard lock(mu_);
    ++stats_.rate_limited;
    return std::move(*refused);
  }
  const std::optional<Member> member = Authenticate(request);
  if (!member) {
    {
      std::lock_guard lock(mu_);
      ++stats_.unauthorized;
    }
    http::Reply r =
        Text(401, api::BearerToken(request.Header("authorization")).empty()
                      ? "no key: send 'Authorization: Bearer YOUR_KEY' (the key the "
                        "swarm's operator gave you)\n"
                      : "this key belongs to no member of the swarm; ask its operator\n");
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    return r;
  }
  const std::string_view text = std::string_view(request.path).substr(kTokenPath.size());
  auto peer = text.size() <= kMaxPeerIdText ? PeerId::Parse(text)
                                            : Result<PeerId>(InvalidArgument("too long"));
  if (!peer.ok()) {
    std::lock_guard lock(mu_);
    ++stats_.bad_peer_ids;
    return Text(400, fmt::format("'{}' is not a peer id ({})\n", text.substr(0, 64),
                                 peer.status().message()));
  }
  const std::string peer_text = peer->ToString();
  const double now = options_.clock->WallSeconds();
  const double expires = now + options_.ttl_seconds;
  {
    std::lock_guard lock(mu_);
    auto& held = held_[member->name];
    std::erase_if(held, [&](const auto& kv) { return kv.second <= now; });
    if (!held.contains(peer_text) && held.size() >= options_.max_peers_per_member) {
      ++stats_.over_peer_limit;
      double first = expires;
      for (const auto& [_, until] : held) first = std::min(first, until);
      return Text(403, fmt::format("'{}' already holds tokens for {} peer ids, the most one member "
                                   "may; the first expires in {:.0f} s\n",
                                   member->name, held.size(), std::ceil(first - now)));
    }
    held[peer_text] = expires;
    ++stats_.issued;
  }
  const Bytes token =
      net::IssueAccessToken(key_, *peer, member->name, member->role, now, options_.ttl_seconds);
  COLONY_LOG_INFO("authority: issued a {} token for {} to '{}' ({}), valid {:.0f} s",
                  net::AccessRoleName(member->role), peer_text, member->name,
                  request.remote_address, options_.ttl_seconds);
  return Text(200, net::AccessTokenText(token) + "\n");
}

http::Router TokenService::Routes() {
  http::Router router;
  auto self = shared_from_this();
  router.AddPrefix("GET", std::string(kTokenPath),
                   [self](const http::Request& r) { return self->Issue(r); });
  router.Add("GET", "/v1/authority", [self](const http::Request&) {
    return http::Json(200, nlohmann::json{{"authority", self->authority_id_.ToString()},
                                          {"ttl_seconds", self->options_.ttl_seconds}}
                               .dump());
  });
  return router;
}

TokenServiceStats TokenService::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

namespace {

// The file's modification time (ns) and size; zeros when it cannot be read.
std::pair<int64_t, int64_t> FileVersion(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {0, 0};
  return {static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
          static_cast<int64_t>(st.st_size)};
}

}  // namespace

MembersWatcher::MembersWatcher(std::shared_ptr<TokenService> service, std::string path,
                               std::chrono::milliseconds interval)
    : service_(std::move(service)),
      path_(std::move(path)),
      seen_(FileVersion(path_)),
      periodic_(
          interval, [this] { Check(); }, Periodic::Start::kAfterInterval) {}

void MembersWatcher::Check() {
  const auto version = FileVersion(path_);
  if (version == seen_) return;
  seen_ = version;
  auto members = LoadMembers(path_);
  Status st = members.ok() ? service_->ReplaceMembers(std::move(*members)) : members.status();
  if (!st.ok()) {
    COLONY_LOG_ERROR("authority: {} changed but cannot be used ({}); the {} members stay", path_,
                     st.ToString(), service_->member_count());
  } else {
    COLONY_LOG_INFO("authority: {} changed: {} members now", path_, service_->member_count());
  }
  ++changes_;
}

}  // namespace colony::authority
