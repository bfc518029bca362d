// Publishing and reading the revocations of a private swarm's access tokens.
#include "dht/revocations.h"

#include <charconv>

#include "core/log.h"
#include "dht/validation.h"

namespace colony::dht {

std::string RevocationKey(const PeerId& authority) {
  return "colony.revoked." + OwnerMarker(authority);
}

Result<double> PublishRevocation(Node& node, const net::AccessToken& token) {
  if (PeerId::FromPublicKey(token.authority) != node.peer_id()) {
    return InvalidArgument("the token was issued by authority " +
                           PeerId::FromPublicKey(token.authority).ToString() +
                           ", not by the key this command runs with");
  }
  const double now = Now();
  const double until = std::min(token.expires_at, now + 24 * 3600.0 - 60);
  if (until <= now) return FailedPrecondition("the token has expired already; nobody accepts it");
  COLONY_RETURN_IF_ERROR(node.StoreSync(RevocationKey(node.peer_id()), token.name, until,
                                        std::to_string(token.serial)));
  return until;
}

Result<size_t> FetchRevocations(Node& node, net::AccessControl& access) {
  const auto& authority = access.options().authority;
  if (!authority) return FailedPrecondition("a swarm without an authority has no revocations");
  auto record = node.GetSync(RevocationKey(*authority), Freshness::kLatest);
  if (!record.ok()) {
    if (record.status().code() == StatusCode::kNotFound) return size_t{0};
    return record.status();
  }
  size_t added = 0;
  for (const auto& [subkey, entry] : record->subkeys) {
    uint64_t serial = 0;
    auto [end, ec] = std::from_chars(subkey.data(), subkey.data() + subkey.size(), serial);
    if (ec != std::errc() || end != subkey.data() + subkey.size()) continue;  // not a serial
    added += access.Revoke(serial, entry.expiration) ? 1 : 0;
  }
  return added;
}

RevocationWatcher::RevocationWatcher(Node& node, std::shared_ptr<net::AccessControl> access,
                                     std::chrono::milliseconds interval)
    : node_(node),
      access_(std::move(access)),
      worker_(
          interval, [this] { Check(); }, Periodic::Start::kNow) {}

void RevocationWatcher::Check() {
  auto added = FetchRevocations(node_, *access_);
  if (!added.ok()) {
    COLONY_LOG_DEBUG("private swarm: could not read the revocations: {}",
                     added.status().ToString());
  } else if (*added > 0) {
    COLONY_LOG_INFO("private swarm: {} access token(s) newly revoked", *added);
  }
}

}  // namespace colony::dht
