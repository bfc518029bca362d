// Kademlia routing table: one bucket of up to k contacts per shared-prefix length with our id,
// least recently seen first, plus a replacement list per bucket. Contacts that stop answering are
// dropped after `max_failures` consecutive failures and replaced by the freshest replacement.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/identity.h"
#include "dht/id.h"

namespace colony::dht {

struct Contact {
  PeerId peer;
  DhtId id;                        // DhtId::ForPeer(peer)
  std::vector<std::string> addrs;  // multiaddrs the peer accepts connections on
};

class RoutingTable {
 public:
  RoutingTable(DhtId self, size_t bucket_size, size_t max_failures = 2);

  // Records that `contact` answered (or contacted us). Returns true when it is in a bucket now.
  bool Seen(const Contact& contact, SteadyTime now);
  // Records a failed request; the contact is dropped after max_failures in a row.
  void Failed(const PeerId& peer);
  void Remove(const PeerId& peer);

  // Up to `count` contacts nearest to `target`, nearest first; `exclude` is left out.
  std::vector<Contact> Nearest(const DhtId& target, size_t count,
                               const PeerId* exclude = nullptr) const;
  std::optional<Contact> Find(const PeerId& peer) const;

  size_t size() const;
  size_t bucket_size() const { return k_; }
  // Bucket indices (shared-prefix lengths), up to the deepest non-empty bucket, that were not
  // refreshed since `before`, or since `sparse_before` when they hold fewer than k contacts.
  std::vector<size_t> StaleBuckets(SteadyTime before, SteadyTime sparse_before) const;
  void MarkRefreshed(size_t bucket, SteadyTime now);
  std::vector<Contact> All() const;

 private:
  struct Entry {
    Contact contact;
    SteadyTime last_seen;
    size_t failures = 0;
  };
  struct Bucket {
    std::vector<Entry> entries;         // least recently seen first
    std::vector<Contact> replacements;  // most recent last
    SteadyTime refreshed{};
  };
  size_t BucketOf(const DhtId& id) const;

  DhtId self_;
  size_t k_;
  size_t max_failures_;
  std::vector<Bucket> buckets_;
};

}  // namespace colony::dht
