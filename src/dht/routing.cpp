#include "dht/routing.h"

#include <algorithm>

namespace colony::dht {

RoutingTable::RoutingTable(DhtId self, size_t bucket_size, size_t max_failures,
                           size_t max_per_address)
    : self_(self),
      k_(bucket_size),
      max_failures_(max_failures),
      max_per_address_(max_per_address),
      buckets_(kIdBits) {}

size_t RoutingTable::BucketOf(const DhtId& id) const {
  return std::min(self_.CommonPrefixBits(id), kIdBits - 1);
}

bool RoutingTable::GroupFits(const Bucket& b, const std::string& group,
                             const Entry* leaving) const {
  if (group.empty() || max_per_address_ == 0) return true;
  const auto held = std::count_if(b.entries.begin(), b.entries.end(), [&](const Entry& e) {
    return &e != leaving && e.group == group;
  });
  return static_cast<size_t>(held) < max_per_address_;
}

bool RoutingTable::Seen(const Contact& contact, SteadyTime now, const std::string& group,
                        bool update_addrs) {
  if (contact.id == self_) return false;
  Bucket& b = buckets_[BucketOf(contact.id)];
  auto it = std::find_if(b.entries.begin(), b.entries.end(),
                         [&](const Entry& e) { return e.contact.peer == contact.peer; });
  if (it != b.entries.end()) {
    Entry e = std::move(*it);
    b.entries.erase(it);
    if (update_addrs && !contact.addrs.empty()) e.contact.addrs = contact.addrs;
    e.last_seen = now;
    e.failures = 0;
    b.entries.push_back(std::move(e));
    return true;
  }
  auto failing = std::find_if(b.entries.begin(), b.entries.end(),
                              [](const Entry& e) { return e.failures > 0; });
  const Entry* leaving = b.entries.size() < k_ || failing == b.entries.end() ? nullptr : &*failing;
  if (!GroupFits(b, group, leaving)) {
    ++refused_for_address_;
    return false;  // not a replacement either: its address has its share of this bucket
  }
  if (b.entries.size() < k_) {
    b.entries.push_back({contact, group, now, 0});
    return true;
  }
  // Full: a contact that has been failing makes way at once; otherwise the newcomer waits in
  // the replacement list (Kademlia prefers long-lived contacts).
  if (failing != b.entries.end()) {
    b.entries.erase(failing);
    b.entries.push_back({contact, group, now, 0});
    return true;
  }
  std::erase_if(b.replacements, [&](const Entry& e) { return e.contact.peer == contact.peer; });
  b.replacements.push_back({contact, group, now, 0});
  if (b.replacements.size() > k_) b.replacements.erase(b.replacements.begin());
  return false;
}

void RoutingTable::Failed(const PeerId& peer) {
  const DhtId id = DhtId::ForPeer(peer);
  Bucket& b = buckets_[BucketOf(id)];
  auto it = std::find_if(b.entries.begin(), b.entries.end(),
                         [&](const Entry& e) { return e.contact.peer == peer; });
  if (it == b.entries.end()) {
    std::erase_if(b.replacements, [&](const Entry& e) { return e.contact.peer == peer; });
    return;
  }
  if (++it->failures < max_failures_) return;
  const SteadyTime seen = it->last_seen;
  b.entries.erase(it);
  // The freshest replacement whose address has room left in the bucket.
  for (auto r = b.replacements.rbegin(); r != b.replacements.rend(); ++r) {
    if (!GroupFits(b, r->group, nullptr)) continue;
    Entry promoted = std::move(*r);
    promoted.last_seen = seen;
    b.replacements.erase(std::next(r).base());
    b.entries.push_back(std::move(promoted));
    break;
  }
}

void RoutingTable::Remove(const PeerId& peer) {
  Bucket& b = buckets_[BucketOf(DhtId::ForPeer(peer))];
  std::erase_if(b.entries, [&](const Entry& e) { return e.contact.peer == peer; });
  std::erase_if(b.replacements, [&](const Entry& e) { return e.contact.peer == peer; });
}

namespace {

// XOR distance as big-endian words, so that sorting compares integers instead of bytes.
struct Distance {
  uint64_t hi, mid;
  uint32_t lo;
  auto operator<=>(const Distance&) const = default;
};

Distance DistanceTo(const DhtId& target, const DhtId& id) {
  const auto& a = target.bytes();
  const auto& b = id.bytes();
  auto word = [&](size_t from, size_t n) {
    uint64_t v = 0;
    for (size_t i = from; i < from + n; ++i) v = (v << 8) | static_cast<uint8_t>(a[i] ^ b[i]);
    return v;
  };
  return {word(0, 8), word(8, 8), static_cast<uint32_t>(word(16, 4))};
}

}  // namespace

std::vector<Contact> RoutingTable::Nearest(const DhtId& target, size_t count,
                                           const PeerId* exclude) const {
  std::vector<std::pair<Distance, const Contact*>> all;
  all.reserve(size());
  for (const Bucket& b : buckets_) {
    for (const Entry& e : b.entries) {
      if (exclude == nullptr || !(e.contact.peer == *exclude)) {
        all.emplace_back(DistanceTo(target, e.contact.id), &e.contact);
      }
    }
  }
  const size_t n = std::min(count, all.size());
  std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n), all.end(),
                    [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Contact> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(*all[i].second);
  return out;
}

std::optional<Contact> RoutingTable::Find(const PeerId& peer) const {
  const Bucket& b = buckets_[BucketOf(DhtId::ForPeer(peer))];
  for (const Entry& e : b.entries) {
    if (e.contact.peer == peer) return e.contact;
  }
  return std::nullopt;
}

size_t RoutingTable::size() const {
  size_t n = 0;
  for (const Bucket& b : buckets_) n += b.entries.size();
  return n;
}

std::vector<size_t> RoutingTable::StaleBuckets(SteadyTime before, SteadyTime sparse_before) const {
  size_t deepest = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (!buckets_[i].entries.empty()) deepest = i;
  }
  std::vector<size_t> out;
  for (size_t i = 0; i <= deepest; ++i) {
    const Bucket& b = buckets_[i];
    if (b.refreshed < before || (b.entries.size() < k_ && b.refreshed < sparse_before)) {
      out.push_back(i);
    }
  }
  return out;
}

void RoutingTable::MarkRefreshed(size_t bucket, SteadyTime now) {
  if (bucket < buckets_.size()) buckets_[bucket].refreshed = now;
}

std::vector<Contact> RoutingTable::All() const {
  std::vector<Contact> out;
  for (const Bucket& b : buckets_) {
    for (const Entry& e : b.entries) out.push_back(e.contact);
  }
  return out;
}

}  // namespace colony::dht
