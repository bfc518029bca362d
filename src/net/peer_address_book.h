// Where peers said they can be reached, for Host::Connect to try when the address a caller
// dials does not lead to the peer (a wildcard listener announces loopback and LAN addresses
// first, which lead elsewhere from another machine).
//
// Bounded: at most kMaxAddressesPerPeer addresses for each of at most `max_peers` peers; a new
// peer beyond that pushes out the one whose addresses were set longest ago. Only addresses the
// peer itself announced belong here (its signed records, its averaging announcements), not a
// third party's word about it. Not thread-safe (the host locks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "core/identity.h"
#include "core/multiaddr.h"

namespace colony::net {

// `addrs` as addresses of `peer`: those naming another peer left out, the others with
// /p2p/<peer>, each once, in order, at most `max`.
std::vector<Multiaddr> AddressesOfPeer(const PeerId& peer, const std::vector<Multiaddr>& addrs,
                                       size_t max = SIZE_MAX);

class PeerAddressBook {
 public:
  static constexpr size_t kMaxPeers = 4096;
  static constexpr size_t kMaxAddressesPerPeer = 8;

  explicit PeerAddressBook(size_t max_peers = kMaxPeers) : max_peers_(max_peers) {}

  // Replaces what is held for `peer`: the first kMaxAddressesPerPeer distinct addresses that do
  // not name another peer, each with /p2p/<peer>. None: the peer is forgotten.
  void Set(const PeerId& peer, const std::vector<Multiaddr>& addrs);
  // What is held for `peer` (empty when nothing).
  std::vector<Multiaddr> Get(const PeerId& peer) const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::vector<Multiaddr> addrs;
    std::list<PeerId>::iterator order;
  };
  size_t max_peers_;
  std::unordered_map<PeerId, Entry> entries_;
  std::list<PeerId> order_;  // least recently set first
};

}  // namespace colony::net
