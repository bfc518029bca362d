#include "dht/record.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "dht/validation.h"

namespace colony::dht {
namespace {

// Per-entry bookkeeping overhead charged on top of the bytes themselves.
constexpr size_t kEntryOverhead = 64;

// True when `a` replaces `b`: newer expiration, ties broken by the larger value.
bool Wins(const ValueEntry& a, const ValueEntry& b) {
  if (a.expiration != b.expiration) return a.expiration > b.expiration;
  return a.value > b.value;
}

bool Empty(const Record& r) { return r.is_dict ? r.subkeys.empty() : r.value.expiration == 0; }

}  // namespace

double Record::Expiration() const {
  if (!is_dict) return value.expiration;
  double e = 0;
  for (const auto& [_, v] : subkeys) e = std::max(e, v.expiration);
  return e;
}

void MergeRecord(Record& into, const Record& other) {
  if (Empty(other)) return;
  if (Empty(into)) {
    into = other;
    return;
  }
  if (into.is_dict && other.is_dict) {
    for (const auto& [sub, v] : other.subkeys) {
      auto it = into.subkeys.find(sub);
      if (it == into.subkeys.end()) {
        into.subkeys.emplace(sub, v);
      } else if (Wins(v, it->second)) {
        it->second = v;
      }
    }
  } else if (!into.is_dict && !other.is_dict) {
    if (Wins(other.value, into.value)) into.value = other.value;
  } else if (other.is_dict) {
    into = other;  // between kinds, the dictionary wins: a plain value cannot wipe subkeys
  }
}

size_t StoredBytes(const StoreItem& item) {
  return item.key.size() + (item.subkey ? item.subkey->size() : 0) + item.value.size() +
         kEntryOverhead;
}

namespace {

size_t EntryBytes(const std::string& key, std::string_view subkey, const ValueEntry& v) {
  return key.size() + subkey.size() + v.value.size() + kEntryOverhead;
}

size_t DictionaryBytes(const std::string& key, const Record& record) {
  size_t bytes = 0;
  for (const auto& [sub, v] : record.subkeys) bytes += EntryBytes(key, sub, v);
  return bytes;
}

}  // namespace

bool FitsLimits(const std::string& key, const Record& record, const StorageLimits& limits) {
  if (!record.is_dict) return record.value.value.size() <= limits.max_value_bytes;
  return record.subkeys.size() <= limits.max_subkeys &&
         DictionaryBytes(key, record) <= limits.max_record_bytes;
}

void TrimToLimits(const std::string& key, Record& record, const StorageLimits& limits,
                  const std::function<size_t(const std::string&)>& sources_holding) {
  if (!record.is_dict || FitsLimits(key, record, limits)) return;
  // Dropped in this order: held by fewer sources, unsigned, earliest expiration.
  std::vector<std::tuple<size_t, bool, double, std::string>> order;
  for (const auto& [sub, v] : record.subkeys) {
    order.emplace_back(sources_holding ? sources_holding(sub) : 0, HasOwnerMarker(sub),
                       v.expiration, sub);
  }
  std::sort(order.begin(), order.end());
  size_t bytes = DictionaryBytes(key, record);
  for (const auto& [sources, is_signed, expiration, sub] : order) {
    if (record.subkeys.size() <= limits.max_subkeys && bytes <= limits.max_record_bytes) break;
    auto it = record.subkeys.find(sub);
    bytes -= EntryBytes(key, sub, it->second);
    record.subkeys.erase(it);
  }
}

bool DropExpired(Record& record, double now) {
  if (record.is_dict) {
    std::erase_if(record.subkeys, [&](const auto& kv) { return kv.second.expiration <= now; });
    return !record.subkeys.empty();
  }
  return record.value.expiration > now;
}

Status CheckItem(const StoreItem& item, const StorageLimits& limits, double now) {
  if (item.key.empty()) return InvalidArgument("DHT key is empty");
  if (item.key.size() > limits.max_key_bytes) {
    return InvalidArgument(
        fmt::format("DHT key is {} bytes; the limit is {}", item.key.size(), limits.max_key_bytes));
  }
  if (item.subkey && item.subkey->size() > limits.max_subkey_bytes) {
    return InvalidArgument(fmt::format("DHT subkey is {} bytes; the limit is {}",
                                       item.subkey->size(), limits.max_subkey_bytes));
  }
  if (item.value.size() > limits.max_value_bytes) {
    return InvalidArgument(fmt::format("DHT value is {} bytes; the limit is {}", item.value.size(),
                                       limits.max_value_bytes));
  }
  if (!std::isfinite(item.expiration)) return InvalidArgument("DHT expiration is not finite");
  if (item.expiration <= now) {
    return InvalidArgument(
        fmt::format("DHT expiration {:.3f} is not in the future (now {:.3f}); use a positive ttl",
                    item.expiration, now));
  }
  if (item.expiration > now + limits.max_ttl_seconds + kExpirationClockSlack) {
    return InvalidArgument(fmt::format(
        "DHT expiration is {:.0f} s ahead; records live at most {:.0f} s; use a shorter ttl and "
        "store again before it ends",
        item.expiration - now, limits.max_ttl_seconds));
  }
  return Status::Ok();
}

size_t Storage::usage_of(const PeerId& peer) const {
  auto it = usage_.find(peer);
  return it == usage_.end() ? 0 : it->second;
}

size_t Storage::usage_of_source(const std::string& source) const {
  auto it = source_usage_.find(source);
  return it == source_usage_.end() ? 0 : it->second;
}

void Storage::Acquire(const Charge& c) {
  total_bytes_ += c.bytes;
  usage_[c.writer] += c.bytes;
  if (!c.source.empty()) source_usage_[c.source] += c.bytes;
}

void Storage::Release(const Charge& c) {
  total_bytes_ -= c.bytes;
  auto it = usage_.find(c.writer);
  if (it != usage_.end()) {
    it->second -= std::min(it->second, c.bytes);
    if (it->second == 0) usage_.erase(it);
  }
  if (c.source.empty()) return;
  auto source = source_usage_.find(c.source);
  if (source != source_usage_.end()) {
    source->second -= std::min(source->second, c.bytes);
    if (source->second == 0) source_usage_.erase(source);
  }
}

bool Storage::PruneSlot(Slot& slot, double now) {
  Record& r = slot.record;
  if (!r.is_dict) {
    if (r.value.expiration != 0 && r.value.expiration <= now) {
      Release(slot.value_charge);
      r.value = {};
      slot.value_charge = {};
    }
    return r.value.expiration != 0;
  }
  for (auto it = r.subkeys.begin(); it != r.subkeys.end();) {
    if (it->second.expiration <= now) {
      auto charge = slot.charges.find(it->first);
      Release(charge->second);
      slot.charges.erase(charge);
      it = r.subkeys.erase(it);
    } else {
      ++it;
    }
  }
  return !r.subkeys.empty();
}

void Storage::Erase(std::unordered_map<DhtId, Slot>::iterator it) {
  Slot& slot = it->second;
  if (slot.record.is_dict) {
    for (const auto& [_, c] : slot.charges) Release(c);
  } else if (slot.record.value.expiration != 0) {
    Release(slot.value_charge);
  }
  records_.erase(it);
}

Status Storage::Store(const DhtId& id, const StoreItem& item, const PeerId& writer, double now,
                      bool charge, const std::string& source) {
  COLONY_RETURN_IF_ERROR(CheckItem(item, limits_, now));
  auto it = records_.find(id);
  if (it != records_.end() && !PruneSlot(it->second, now)) {
    Erase(it);
    it = records_.end();
  }
  if (it != records_.end() && it->second.key != item.key) {
    // Two keys hashing to one id: astronomically unlikely unless forged; keep the first.
    return InvalidArgument("another key is stored under this key's DHT id");
  }

  Charge fresh{writer, charge ? source : std::string(), StoredBytes(item)};
  const ValueEntry entry{item.value, item.expiration};

  // What the store would free, to check quotas against the state after it.
  std::vector<const Charge*> freed;
  std::vector<std::string> evicted;  // unsigned subkeys pushed out by an owner-signed one
  if (it != records_.end()) {
    const Slot& slot = it->second;
    const Record& r = slot.record;
    if (!item.subkey) {
      if (r.is_dict) {
        return AlreadyExists(
            fmt::format("key '{}' holds a dictionary of {} subkeys; a plain value cannot replace "
                        "it (store under a subkey)",
                        item.key, r.subkeys.size()));
      }
      if (!Wins(entry, r.value)) {
        if (r.value == entry) return Status::Ok();
        return AlreadyExists(
            fmt::format("a value with a newer expiration ({:.3f}) is stored under key '{}'",
                        r.value.expiration, item.key));
      }
      freed.push_back(&slot.value_charge);
    } else if (!r.is_dict) {
      freed.push_back(&slot.value_charge);  // a dictionary replaces a plain value
    } else {
      auto sub = r.subkeys.find(*item.subkey);
      if (sub != r.subkeys.end()) {
        if (sub->second == entry) return Status::Ok();
        if (!Wins(entry, sub->second)) {
          return AlreadyExists(
              fmt::format("subkey '{}' of key '{}' holds a value with a newer expiration ({:.3f})",
                          *item.subkey, item.key, sub->second.expiration));
        }
        freed.push_back(&slot.charges.at(*item.subkey));
      }
      size_t count = r.subkeys.size() + (sub == r.subkeys.end() ? 1 : 0);
      size_t record_bytes = fresh.bytes;
      // The entries this store's source address would hold in the dictionary after it.
      size_t mine = 1, mine_bytes = fresh.bytes;
      for (const auto& [s, c] : slot.charges) {
        if (s == *item.subkey) continue;
        record_bytes += c.bytes;
        if (!fresh.source.empty() && c.source == fresh.source) {
          ++mine;
          mine_bytes += c.bytes;
        }
      }
      auto fits = [&] {
        return count <= limits_.max_subkeys && record_bytes <= limits_.max_record_bytes;
      };
      if (!fits() && HasOwnerMarker(*item.subkey)) {
        // Anyone may add unsigned subkeys; they must not keep an owner out of the dictionary.
        std::vector<std::pair<double, const std::string*>> unsigned_entries;
        for (const auto& [s, v] : r.subkeys) {
          if (!HasOwnerMarker(s)) unsigned_entries.emplace_back(v.expiration, &s);
        }
        std::sort(unsigned_entries.begin(), unsigned_entries.end(),
                  [](const auto& a, const auto& b) { return a.first < b.first; });
        for (const auto& [_, s] : unsigned_entries) {
          if (fits()) break;
          const Charge& c = slot.charges.at(*s);
          freed.push_back(&c);
          evicted.push_back(*s);
          --count;
          record_bytes -= c.bytes;
          if (!fresh.source.empty() && c.source == fresh.source) {
            --mine;
            mine_bytes -= c.bytes;
          }
        }
      }
      if (count > limits_.max_subkeys) {
        return ResourceExhausted(fmt::format("key '{}' already has the maximum of {} subkeys",
                                             item.key, limits_.max_subkeys));
      }
      if (record_bytes > limits_.max_record_bytes) {
        return ResourceExhausted(fmt::format("key '{}' would hold {} bytes; the limit is {}",
                                             item.key, record_bytes, limits_.max_record_bytes));
      }
      if (!fresh.source.empty()) {
        const double share = limits_.dictionary_share_per_source;
        const auto most = static_cast<size_t>(share * static_cast<double>(limits_.max_subkeys));
        const auto most_bytes =
            static_cast<size_t>(share * static_cast<double>(limits_.max_record_bytes));
        // An address may always hold one entry (of up to max_value_bytes): a share smaller
        // than one entry must not keep it out of a key, nor stop it refreshing its entry.
        if (mine > 1 && (mine > most || mine_bytes > most_bytes)) {
          return ResourceExhausted(fmt::format(
              "the peers at address {} would hold {} entries ({} bytes) of key '{}'; one address "
              "may hold {} ({} bytes), or one entry",
              fresh.source, mine, mine_bytes, item.key, most, most_bytes));
        }
      }
    }
  }

  size_t freed_total = 0, freed_by_writer = 0, freed_by_source = 0;
  for (const Charge* c : freed) {
    freed_total += c->bytes;
    if (c->writer == writer) freed_by_writer += c->bytes;
    if (!fresh.source.empty() && c->source == fresh.source) freed_by_source += c->bytes;
  }
  if (charge && usage_of(writer) - freed_by_writer + fresh.bytes > limits_.per_peer_quota_bytes) {
    return ResourceExhausted(
        fmt::format("peer {} has used its storage quota of {} bytes on this node", writer.Short(),
                    limits_.per_peer_quota_bytes));
  }
  if (!fresh.source.empty() && usage_of_source(fresh.source) - freed_by_source + fresh.bytes >
                                   limits_.per_source_quota_bytes) {
    return ResourceExhausted(
        fmt::format("the peers at address {} have used its storage quota of {} bytes on this node",
                    fresh.source, limits_.per_source_quota_bytes));
  }
  if (total_bytes_ - freed_total + fresh.bytes > limits_.capacity_bytes) {
    return ResourceExhausted(
        fmt::format("this node's DHT storage is full ({} bytes)", limits_.capacity_bytes));
  }
  if (!charge) fresh.writer = PeerId();  // uncharged entries count against nobody's quota

  Slot& slot = it != records_.end() ? it->second : records_[id];
  slot.key = item.key;
  Record& r = slot.record;
  if (!item.subkey) {
    if (r.value.expiration != 0) Release(slot.value_charge);
    r.value = entry;
    slot.value_charge = fresh;
  } else {
    if (!r.is_dict) {
      if (r.value.expiration != 0) Release(slot.value_charge);
      r.value = {};
      slot.value_charge = {};
      r.is_dict = true;
    }
    for (const std::string& s : evicted) {
      Release(slot.charges.at(s));
      slot.charges.erase(s);
      r.subkeys.erase(s);
    }
    auto old = slot.charges.find(*item.subkey);
    if (old != slot.charges.end()) Release(old->second);
    r.subkeys[*item.subkey] = entry;
    slot.charges[*item.subkey] = fresh;
  }
  Acquire(fresh);
  return Status::Ok();
}

const Record* Storage::Get(const DhtId& id, double now) {
  auto it = records_.find(id);
  if (it == records_.end()) return nullptr;
  if (!PruneSlot(it->second, now)) {
    Erase(it);
    return nullptr;
  }
  return &it->second.record;
}

const Record* Storage::Peek(const DhtId& id) const {
  auto it = records_.find(id);
  return it == records_.end() ? nullptr : &it->second.record;
}

const std::string* Storage::KeyOf(const DhtId& id) const {
  auto it = records_.find(id);
  return it == records_.end() ? nullptr : &it->second.key;
}

void Storage::Purge(double now) {
  for (auto it = records_.begin(); it != records_.end();) {
    auto next = std::next(it);
    if (!PruneSlot(it->second, now)) Erase(it);
    it = next;
  }
}

void Storage::MakeRoom(size_t bytes, double now) {
  Purge(now);
  if (total_bytes_ + bytes <= limits_.capacity_bytes) return;
  // The records that expire soonest go first: one pass and a heap, not a pass per victim (a
  // cache full of tiny records made each large value cost records x victims steps).
  using Entry = std::pair<double, std::unordered_map<DhtId, Slot>::iterator>;
  std::vector<Entry> order;
  order.reserve(records_.size());
  for (auto it = records_.begin(); it != records_.end(); ++it) {
    order.emplace_back(it->second.record.Expiration(), it);
  }
  const auto later = [](const Entry& a, const Entry& b) { return a.first > b.first; };
  std::make_heap(order.begin(), order.end(), later);
  while (!order.empty() && total_bytes_ + bytes > limits_.capacity_bytes) {
    std::pop_heap(order.begin(), order.end(), later);
    Erase(order.back().second);  // erasing one element leaves the others' iterators valid
    order.pop_back();
  }
}

}  // namespace colony::dht
