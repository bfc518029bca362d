#include "moe/discovery.h"

#include <fmt/format.h>
#include <sodium.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <set>
#include <tuple>

#include "dht/validation.h"

namespace colony::moe {

namespace {

// A server's place among equally ranked ones: SipHash of its id under a key drawn once per
// process, so that the order is stable here (a cached expert keeps its servers) and nobody else
// can compute it (or make identities that come first).
uint64_t KeyedOrder(const PeerId& server) {
  static const auto key = [] {
    std::array<unsigned char, crypto_shorthash_KEYBYTES> k{};
    if (sodium_init() < 0) std::abort();  // libsodium cannot run here at all
    randombytes_buf(k.data(), k.size());
    return k;
  }();
  const Bytes id = server.ToBytes();
  std::array<unsigned char, crypto_shorthash_BYTES> out{};
  crypto_shorthash(out.data(), id.data(), id.size(), key.data());
  uint64_t v = 0;
  std::memcpy(&v, out.data(), sizeof(v));
  return v;
}

}  // namespace

std::vector<const ServerEntry*> ChooseServers(std::vector<const ServerEntry*> servers,
                                              const ServerRank& rank) {
  if (servers.size() <= kMaxServersPerExpert) return servers;
  std::vector<std::tuple<uint64_t, uint64_t, const ServerEntry*>> ordered;
  ordered.reserve(servers.size());
  for (const ServerEntry* s : servers) {
    ordered.emplace_back(rank ? rank(s->server) : 0, KeyedOrder(s->server), s);
  }
  std::partial_sort(ordered.begin(), ordered.begin() + kMaxServersPerExpert, ordered.end(),
                    [](const auto& a, const auto& b) {
                      if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) > std::get<0>(b);
                      return std::get<1>(a) < std::get<1>(b);
                    });
  servers.resize(kMaxServersPerExpert);
  for (size_t i = 0; i < kMaxServersPerExpert; ++i) servers[i] = std::get<2>(ordered[i]);
  return servers;
}

Result<std::vector<dht::StoreItem>> DeclarationItems(const std::vector<std::string>& uids,
                                                     const PeerId& self,
                                                     const std::vector<std::string>& addrs,
                                                     double expiration) {
  if (addrs.empty() || addrs.size() > kMaxEntryAddresses) {
    return InvalidArgument(fmt::format("declaring experts needs 1 to {} addresses, got {}",
                                       kMaxEntryAddresses, addrs.size()));
  }
  std::set<std::string> experts;
  std::map<std::string, std::set<int64_t>> successors;  // prefix -> next coordinates
  for (const auto& text : uids) {
    COLONY_ASSIGN_OR_RETURN(ExpertUid uid, ParseExpertUid(text));
    experts.insert(uid.ToString());
    for (size_t d = 1; d < uid.coords.size(); ++d) successors[uid.Prefix(d)].insert(uid.coords[d]);
  }
  const std::string subkey = dht::OwnerMarker(self);
  std::vector<dht::StoreItem> items;
  for (const auto& uid : experts) {
    items.push_back({.key = ExpertKey(uid),
                     .subkey = subkey,
                     .value = EncodeExpertEntry({.addrs = addrs}),
                     .expiration = expiration});
  }
  for (const auto& [prefix, next] : successors) {
    if (next.size() > kMaxEntrySuccessors) {
      return InvalidArgument(
          fmt::format("more than {} experts follow prefix '{}'", kMaxEntrySuccessors, prefix));
    }
    items.push_back(
        {.key = ExpertKey(prefix),
         .subkey = subkey,
         .value = EncodeExpertEntry({.next = {next.begin(), next.end()}, .addrs = addrs}),
         .expiration = expiration});
  }
  return items;
}

Status DeclareExperts(dht::Node& node, const std::vector<std::string>& uids, double expiration) {
  std::vector<std::string> addrs;
  for (const auto& a : node.VisibleAddresses()) {
    if (addrs.size() < kMaxEntryAddresses) addrs.push_back(a.ToString());
  }
  COLONY_ASSIGN_OR_RETURN(auto items, DeclarationItems(uids, node.peer_id(), addrs, expiration));
  std::vector<std::string> keys;
  for (const auto& item : items) keys.push_back(item.key);
  const std::vector<Status> stored = node.StoreManySync(std::move(items));
  std::string failed;
  for (size_t i = 0; i < stored.size(); ++i) {
    if (stored[i].ok()) continue;
    if (!failed.empty()) failed += "; ";
    failed += keys[i] + ": " + stored[i].ToString();
  }
  if (!failed.empty()) return Unavailable("declaring experts failed for " + failed);
  return Status::Ok();
}

std::map<std::string, std::vector<ServerEntry>> FetchEntries(dht::Node& node,
                                                             const std::vector<std::string>& keys,
                                                             dht::Freshness freshness,
                                                             std::vector<std::string>* absent) {
  std::map<std::string, std::vector<ServerEntry>> out;
  if (keys.empty()) return out;
  const auto records = node.GetManySync(keys, freshness);
  for (size_t i = 0; i < keys.size() && i < records.size(); ++i) {
    if (!records[i].ok() || !records[i]->is_dict) {
      if (absent && (records[i].ok() || records[i].status().code() == StatusCode::kNotFound)) {
        absent->push_back(keys[i]);
      }
      continue;
    }
    const bool prefix = keys[i].back() == kUidDelimiter;
    for (const auto& [subkey, v] : records[i]->subkeys) {
      auto owner = dht::ParseOwnerMarker(subkey);
      if (!owner) continue;
      auto entry = ParseExpertEntry(v.value, prefix);
      if (!entry.ok()) continue;
      out[keys[i]].push_back({.server = *owner, .entry = std::move(*entry)});
    }
    if (absent && !out.contains(keys[i])) absent->push_back(keys[i]);
  }
  return out;
}

std::vector<std::optional<RemoteExpertInfo>> GetExperts(dht::Node& node,
                                                        const std::vector<std::string>& uids,
                                                        dht::Freshness freshness) {
  std::vector<std::string> keys;
  for (const auto& uid : uids) keys.push_back(ExpertKey(uid));
  const auto found = FetchEntries(node, keys, freshness);
  std::vector<std::optional<RemoteExpertInfo>> out;
  for (size_t i = 0; i < uids.size(); ++i) {
    auto it = found.find(keys[i]);
    if (it == found.end() || it->second.empty()) {
      out.emplace_back();
      continue;
    }
    RemoteExpertInfo info{.uid = uids[i]};
    std::vector<const ServerEntry*> entries;
    for (const auto& e : it->second) entries.push_back(&e);
    for (const ServerEntry* e : ChooseServers(std::move(entries))) {
      info.servers.push_back(e->server);
      info.addrs.push_back(e->entry.addrs);
    }
    out.emplace_back(std::move(info));
  }
  return out;
}

std::map<std::string, std::map<int64_t, std::vector<ServerEntry>>> GetActiveSuccessors(
    dht::Node& node, const std::vector<std::string>& prefixes, dht::Freshness freshness) {
  std::vector<std::string> keys;
  for (const auto& p : prefixes) keys.push_back(ExpertKey(p));
  const auto found = FetchEntries(node, keys, freshness);
  std::map<std::string, std::map<int64_t, std::vector<ServerEntry>>> out;
  for (size_t i = 0; i < prefixes.size(); ++i) {
    auto& next = out[prefixes[i]];
    auto it = found.find(keys[i]);
    if (it == found.end()) continue;
    for (const auto& e : it->second) {
      for (int64_t c : e.entry.next) next[c].push_back(e);
    }
  }
  return out;
}

}  // namespace colony::moe
