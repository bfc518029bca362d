// Kademlia routing table: one bucket of up to k contacts per shared-prefix length with our id,
// least recently seen first, plus a replacement list per bucket. Contacts that stop answering are
// dropped after `max_failures` consecutive failures and replaced by the freshest replacement.
//
// Identities are free, so a bucket holds at most `max_per_address` contacts reached at one
// address (the group the caller names for each contact: the source address of the connection
// it answered on, "" for none to cap): one machine cannot fill the buckets a lookup draws from
// with its own identities (an eclipse) however many it makes.
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
  // max_per_address 0: no cap per address.
  RoutingTable(DhtId self, size_t bucket_size, size_t max_failures = 2, size_t max_per_address = 0);

  // Records that `contact` answered (or contacted us), reached at address group `group` ("":
  // not capped). Returns true when it is in a bucket now. A contact already in a bucket keeps
  // the group it entered with, and its addresses unless `update_addrs` (addresses another peer
  // referred it at must not replace those it gave itself).
  bool Seen(const Contact& contact, SteadyTime now, const std::string& group = {},
            bool update_addrs = true);
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
  // Contacts turned away because their bucket held max_per_address of their address already.
  uint64_t refused_for_address() const { return refused_for_address_; }

 private:
  struct Entry {
    Contact contact;
    std::string group;
    SteadyTime last_seen{};
    size_t failures = 0;
  };
  struct Bucket {
    std::vector<Entry> entries;       // least recently seen first
    std::vector<Entry> replacements;  // most recent last
    SteadyTime refreshed{};
  };
  size_t BucketOf(const DhtId& id) const;
  // Whether `b` may take one more contact of `group`, `leaving` (if any) making way for it.
  bool GroupFits(const Bucket& b, const std::string& group, const Entry* leaving) const;

  DhtId self_;
  size_t k_;
  size_t max_failures_;
  size_t max_per_address_;
  std::vector<Bucket> buckets_;
  uint64_t refused_for_address_ = 0;
};

}  // namespace colony::dht
