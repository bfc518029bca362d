#include "net/peer_address_book.h"

#include <algorithm>

namespace colony::net {

std::vector<Multiaddr> AddressesOfPeer(const PeerId& peer, const std::vector<Multiaddr>& addrs,
                                       size_t max) {
  std::vector<Multiaddr> out;
  for (const Multiaddr& a : addrs) {
    if (out.size() >= max) break;
    if (a.peer_id() && *a.peer_id() != peer) continue;
    Multiaddr named = a.WithPeerId(peer);
    if (std::find(out.begin(), out.end(), named) == out.end()) out.push_back(std::move(named));
  }
  return out;
}

void PeerAddressBook::Set(const PeerId& peer, const std::vector<Multiaddr>& addrs) {
  std::vector<Multiaddr> kept = AddressesOfPeer(peer, addrs, kMaxAddressesPerPeer);
  auto it = entries_.find(peer);
  if (it != entries_.end()) {
    order_.erase(it->second.order);
    entries_.erase(it);
  }
  if (kept.empty()) return;
  while (entries_.size() >= max_peers_ && !order_.empty()) {
    entries_.erase(order_.front());
    order_.pop_front();
  }
  order_.push_back(peer);
  entries_.emplace(peer, Entry{std::move(kept), std::prev(order_.end())});
}

std::vector<Multiaddr> PeerAddressBook::Get(const PeerId& peer) const {
  auto it = entries_.find(peer);
  return it == entries_.end() ? std::vector<Multiaddr>{} : it->second.addrs;
}

}  // namespace colony::net
