// The policy of a private swarm: admitting peers by token or allowlist, revocations.
#include "net/access_control.h"

#include <cmath>
#include <fstream>

namespace colony::net {
namespace {

std::string Ago(double seconds) {
  if (seconds < 120) return std::to_string(static_cast<int64_t>(seconds)) + " s";
  if (seconds < 7200) return std::to_string(static_cast<int64_t>(seconds / 60)) + " min";
  return std::to_string(static_cast<int64_t>(seconds / 3600)) + " h";
}

}  // namespace

AccessControl::AccessControl(AccessOptions options, const Clock* clock)
    : options_(std::move(options)),
      clock_(clock),
      allowlist_(options_.allowlist.begin(), options_.allowlist.end()) {}

Status AccessControl::SetOwnToken(const PeerId& self, Bytes token) {
  if (!options_.authority) {
    return FailedPrecondition("an access token needs the swarm's authority (--authority)");
  }
  auto t = DecodeAccessToken(token);
  if (!t.ok()) return t.status();
  if (t->authority != options_.authority->public_key()) {
    return InvalidArgument("the access token was signed by authority " +
                           PeerId::FromPublicKey(t->authority).ToString() + ", not the swarm's " +
                           options_.authority->ToString());
  }
  if (t->peer != self) {
    return InvalidArgument("the access token is for peer " + t->peer.ToString() +
                           ", not this peer (" + self.ToString() +
                           "); ask the authority for a token for this peer's identity");
  }
  const double now = clock_->WallSeconds();
  if (t->expires_at + options_.clock_skew_seconds < now) {
    return InvalidArgument("the access token expired " + Ago(now - t->expires_at) + " ago");
  }
  std::lock_guard lock(mu_);
  own_token_ = std::move(token);
  own_info_ = std::move(*t);
  return Status::Ok();
}

std::optional<Bytes> AccessControl::own_token() const {
  std::lock_guard lock(mu_);
  return own_token_;
}

std::optional<AccessToken> AccessControl::own_token_info() const {
  std::lock_guard lock(mu_);
  return own_info_;
}

Result<AccessGrant> AccessControl::Admit(const PeerId& peer, ByteSpan token) const {
  if (allowlist_.count(peer)) {
    AccessGrant g;
    g.allowlisted = true;
    g.expires_at = INFINITY;
    return g;
  }
  if (!options_.authority) {
    return PermissionDenied("it is not on this swarm's allowlist");
  }
  if (token.empty()) {
    return PermissionDenied(
        "it shows no access token (this swarm admits holders of tokens from "
        "authority " +
        options_.authority->ToString() + ")");
  }
  auto t = DecodeAccessToken(token);
  if (!t.ok()) return PermissionDenied("its access token is invalid: " + t.status().message());
  if (t->authority != options_.authority->public_key()) {
    return PermissionDenied("its access token is from another authority (" +
                            PeerId::FromPublicKey(t->authority).ToString() + ", not " +
                            options_.authority->ToString() + ")");
  }
  if (t->peer != peer) {
    return PermissionDenied("its access token was issued to another peer (" + t->peer.ToString() +
                            ")");
  }
  AccessGrant g;
  g.role = t->role;
  g.serial = t->serial;
  g.expires_at = t->expires_at;
  g.name = t->name;
  const double now = clock_->WallSeconds();
  if (t->issued_at - options_.clock_skew_seconds > now) {
    return PermissionDenied("its access token is not valid yet (issued " + Ago(t->issued_at - now) +
                            " in the future; check the clocks)");
  }
  COLONY_RETURN_IF_ERROR(StillValid(g));
  return g;
}

Status AccessControl::StillValid(const AccessGrant& grant) const {
  if (grant.allowlisted) return Status::Ok();
  const double now = clock_->WallSeconds();
  if (grant.expires_at + options_.clock_skew_seconds < now) {
    return PermissionDenied("its access token ('" + grant.name + "') expired " +
                            Ago(now - grant.expires_at) + " ago");
  }
  if (IsRevoked(grant.serial)) {
    return PermissionDenied("its access token ('" + grant.name + "') was revoked by the authority");
  }
  return Status::Ok();
}

bool AccessControl::Revoke(uint64_t serial, double until) {
  std::lock_guard lock(mu_);
  auto it = revoked_.find(serial);
  if (it != revoked_.end()) {
    it->second = std::max(it->second, until);
    return false;
  }
  if (revoked_.size() >= kMaxRevocations) {
    const double now = clock_->WallSeconds();
    std::erase_if(revoked_,
                  [&](const auto& e) { return e.second + options_.clock_skew_seconds < now; });
    if (revoked_.size() >= kMaxRevocations) return false;
  }
  revoked_.emplace(serial, until);
  return true;
}

bool AccessControl::IsRevoked(uint64_t serial) const {
  std::lock_guard lock(mu_);
  return revoked_.count(serial) > 0;
}

size_t AccessControl::revocation_count() const {
  std::lock_guard lock(mu_);
  return revoked_.size();
}

Result<std::vector<PeerId>> LoadAllowlist(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot read the allowlist " + path);
  std::vector<PeerId> peers;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    const auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos) continue;
    const auto e = line.find_last_not_of(" \t\r");
    auto id = PeerId::Parse(std::string_view(line).substr(b, e - b + 1));
    if (!id.ok()) {
      return InvalidArgument(path + ":" + std::to_string(n) + ": " + id.status().message());
    }
    peers.push_back(*id);
  }
  return peers;
}

}  // namespace colony::net
