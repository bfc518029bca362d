// Revoked access tokens of a private swarm, published in the DHT (net/access_control.h).
//
// The authority revokes a token by storing its serial under RevocationKey(authority): the key
// names the authority as owner, so every entry must carry the authority's signature (validation.h)
// and nobody else can add or remove one. Each entry's expiration is the token's own (at most the
// DHT's 1-day limit ahead: revoking a longer token must be repeated daily). Peers of the swarm
// read the key periodically and refuse the revoked tokens, closing connections that hold them.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/periodic.h"
#include "dht/node.h"
#include "net/access_control.h"

namespace colony::dht {

std::string RevocationKey(const PeerId& authority);

// Stores the revocation of `token`. `node` must run with the authority's own key as its identity
// (its entries are signed by the node). Returns the expiration used.
Result<double> PublishRevocation(Node& node, const net::AccessToken& token);

// Reads the revocations into `access` now; returns how many entries were new.
Result<size_t> FetchRevocations(Node& node, net::AccessControl& access);

// Calls FetchRevocations every `interval` until destroyed.
class RevocationWatcher {
 public:
  RevocationWatcher(Node& node, std::shared_ptr<net::AccessControl> access,
                    std::chrono::milliseconds interval);

 private:
  void Check();

  Node& node_;
  std::shared_ptr<net::AccessControl> access_;
  Periodic worker_;  // last: it stops before the members it uses go
};

}  // namespace colony::dht
