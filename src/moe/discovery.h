// Declaring and finding experts in the DHT (Learning@home's discovery, over moe/expert_records.h).
//
//   moe::DeclareExperts(node, {"ffn.4.17", "ffn.4.18"}, dht::Now() + 60);  // every 30 s
//   auto found = moe::GetExperts(node, {"ffn.4.17"});      // who hosts it, at which addresses
//   auto next = moe::GetActiveSuccessors(node, {"ffn.4."}); // {17: [...], 18: [...]}
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/identity.h"
#include "core/status.h"
#include "dht/node.h"
#include "moe/expert_records.h"

namespace colony::moe {

// A server's own entry under one DHT key.
struct ServerEntry {
  PeerId server;
  ExpertEntry entry;
};

// An expert and the servers that host it (several servers may declare the same id).
struct RemoteExpertInfo {
  std::string uid;
  std::vector<PeerId> servers = {};
  std::vector<std::vector<std::string>> addrs = {};  // per server
};

// The most servers a search result or GetExperts names for one expert; a call tries at most
// RemoteExpert::kMaxServersPerCall of them. A record may list thousands (identities are free),
// and what a client keeps per expert is copied per input, slot and cached expert.
inline constexpr size_t kMaxServersPerExpert = 16;

// How much a client prefers a server (higher first; 0: nothing known), e.g. how lately it
// answered a call.
using ServerRank = std::function<uint64_t(const PeerId&)>;

// At most kMaxServersPerExpert of `servers`: those `rank` scores highest first, then in an order
// keyed by a secret of this process (stable here, so a cached expert keeps its servers; no order
// an attacker controls, such as its identities or expirations, decides which are kept). Servers
// whose calls fail are left out of later searches (BeamSearcher::Avoid), and others come in.
std::vector<const ServerEntry*> ChooseServers(std::vector<const ServerEntry*> servers,
                                              const ServerRank& rank = {});

// The entries a server with identity `self` reachable at `addrs` stores to declare `uids`: one
// under each expert and one under each prefix with at least one coordinate (next = the
// coordinates of its own experts that follow it). Refuses malformed ids.
Result<std::vector<dht::StoreItem>> DeclarationItems(const std::vector<std::string>& uids,
                                                     const PeerId& self,
                                                     const std::vector<std::string>& addrs,
                                                     double expiration);

// Stores the declaration of `uids` for this node (its visible addresses) until `expiration`;
// an error naming the keys whose store failed. hivemind re-declares every 30 s with a 60 s
// expiration.
Status DeclareExperts(dht::Node& node, const std::vector<std::string>& uids, double expiration);

// The valid owner entries of fetched records, per key (missing and malformed ones left out).
// `absent`, when given, receives the keys the DHT holds no valid entry for (not those whose
// lookup failed).
std::map<std::string, std::vector<ServerEntry>> FetchEntries(
    dht::Node& node, const std::vector<std::string>& keys, dht::Freshness freshness,
    std::vector<std::string>* absent = nullptr);

// For each uid: who hosts it (ChooseServers of its declarations), or nullopt when nobody
// declares it.
std::vector<std::optional<RemoteExpertInfo>> GetExperts(
    dht::Node& node, const std::vector<std::string>& uids,
    dht::Freshness freshness = dht::Freshness::kLatest);

// For each prefix ("ffn.4."): the coordinates that follow it among live experts, each with the
// servers that declare it.
std::map<std::string, std::map<int64_t, std::vector<ServerEntry>>> GetActiveSuccessors(
    dht::Node& node, const std::vector<std::string>& prefixes,
    dht::Freshness freshness = dht::Freshness::kLatest);

}  // namespace colony::moe
