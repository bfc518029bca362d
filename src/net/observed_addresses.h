// What peers report our address to be (the observed_addr of their handshakes), kept bounded.
//
// Any peer may report any string, and identities are free, so the book holds at most
// kMaxObservedAddresses addresses that parse as IP multiaddrs, each with at most
// kMaxReportersPerAddress distinct reporters. Addresses that more peers reported rank first
// (then the most recently reported); when the book is full, a new address replaces the one
// reported by the fewest peers, least recently. One peer cannot push the addresses that many
// peers agree on out of the book, nor put its own first. Not thread-safe (the host locks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/identity.h"

namespace colony::net {

inline constexpr size_t kMaxObservedAddresses = 16;
inline constexpr size_t kMaxReportersPerAddress = 8;

class ObservedAddressBook {
 public:
  // Notes that `reporter` sees us at `address`; ignored unless it parses as an IP multiaddr.
  void Add(const std::string& address, const PeerId& reporter);
  // The addresses, best first.
  std::vector<std::string> Ranked() const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::string address;
    std::vector<PeerId> reporters;
    uint64_t last_seen = 0;  // tick of the latest report
  };
  std::vector<Entry> entries_;
  uint64_t tick_ = 0;
};

}  // namespace colony::net
