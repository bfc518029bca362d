// Records and local storage: hivemind's semantics where they are safe among strangers.
//
// A key holds either a plain value or a dictionary of subkeys. Every value carries an absolute
// expiration (wall-clock seconds since the Unix epoch), at most max_ttl_seconds ahead; the newest
// expiration wins and a store with an older one is rejected. A dictionary's expiration is the
// newest of its subkeys'. Equal expirations are broken by comparing the values' bytes (the larger
// wins), so replicas that see two writers in different orders still converge.
//
// Where hivemind's rules would let one peer erase others' entries, Colony's differ
// (docs/security.md says why): a plain value never replaces a dictionary, whatever its
// expiration (a dictionary does replace a plain value), and when a dictionary is full, an
// owner-signed subkey (validation.h) pushes out unsigned ones instead of being refused.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "core/identity.h"
#include "core/status.h"
#include "dht/id.h"

namespace colony::dht {

struct ValueEntry {
  std::string value;
  double expiration = 0;
  friend bool operator==(const ValueEntry&, const ValueEntry&) = default;
};

// What a key holds: a plain value, or a dictionary of subkeys.
struct Record {
  bool is_dict = false;
  ValueEntry value;                           // when !is_dict
  std::map<std::string, ValueEntry> subkeys;  // when is_dict
  double Expiration() const;
  friend bool operator==(const Record&, const Record&) = default;
};

// How fresh a get's answer must be.
enum class Freshness {
  kAnyCopy,  // the first unexpired copy found: this node's storage or cache, or any replica
  kLatest,   // the newest version among the nearest replicas (a full lookup, never the cache)
};

// One store request.
struct StoreItem {
  std::string key;
  std::optional<std::string> subkey;
  std::string value;
  double expiration = 0;
};

// The bytes a storage charges for an item (its key, subkey and value, and a fixed overhead).
size_t StoredBytes(const StoreItem& item);

// Merges `other` into `into` with the storage rules (per subkey for two dictionaries, the newer
// of two plain values, and a dictionary over a plain value). Used when a get gathers copies from
// several replicas.
void MergeRecord(Record& into, const Record& other);

// Drops expired entries; returns false when nothing unexpired is left.
bool DropExpired(Record& record, double now);

struct StorageLimits {
  size_t max_key_bytes = 1024;
  size_t max_subkey_bytes = 1024;
  size_t max_value_bytes = 1u << 20;
  // A dictionary's total (keys, subkeys, values), so that one find reply stays bounded.
  size_t max_record_bytes = 2u << 20;
  size_t max_subkeys = 4096;
  // Everything this node holds for others.
  size_t capacity_bytes = 256u << 20;
  // What any one remote peer may make this node hold.
  size_t per_peer_quota_bytes = 32u << 20;
  // What all the peers that reach this node from one source address may make it hold together
  // (identities are free: without it, 8 identities from one machine fill capacity_bytes).
  size_t per_source_quota_bytes = 64u << 20;
  // The part of one dictionary (of max_subkeys and of max_record_bytes) that the peers reaching
  // this node from one source address may hold, or one entry if that is more; in (0, 1] (Node
  // refuses other values). Identities are free: without it one machine fills a key that others
  // write to (a record family's dictionary) by itself. A peer reached through a relay counts
  // under its own identity (the relay caps the circuits one address opens).
  double dictionary_share_per_source = 0.25;
  // How far ahead an expiration may be. Longer is refused (not shortened: owners sign the exact
  // expiration), so that nobody can park a record for weeks.
  double max_ttl_seconds = 24 * 3600.0;
};

// Whether `record` (for `key`) is within what a node's storage holds under `limits`: a value of
// at most max_value_bytes; a dictionary of at most max_subkeys entries and max_record_bytes,
// counted as storage counts them. No honest replica answers with more.
bool FitsLimits(const std::string& key, const Record& record, const StorageLimits& limits);

// Drops entries of a dictionary merged from several replicas until it fits `limits`: those the
// fewest sources held first (`sources_holding`, when given: identities and signatures are free,
// so what one replica alone claims ranks below what several hold; see dht/vouches.h), then
// unsigned subkeys (anyone may write those) before owner-signed ones, earliest expiration first.
void TrimToLimits(const std::string& key, Record& record, const StorageLimits& limits,
                  const std::function<size_t(const std::string&)>& sources_holding = {});

// Slack on max_ttl_seconds for the clocks of the writer and the node that checks (the DHT
// refuses peers whose clocks differ by more than a few seconds).
inline constexpr double kExpirationClockSlack = 60.0;

// Checks sizes and the expiration of an item before it is signed, sent or stored.
Status CheckItem(const StoreItem& item, const StorageLimits& limits, double now);

// Records held by one node (its replicas, or its cache). Not thread-safe: the protocol core
// owns it on its one thread.
class Storage {
 public:
  explicit Storage(StorageLimits limits = {}) : limits_(limits) {}

  // Stores `item` under `id`, written by `writer` from `source` (net::SourceKey: its address,
  // or "" when exempt), quota-charged to both unless `charge` is false.
  // The caller has validated it: a subkey that names an owner is taken as signed by the owner.
  // OK also when an identical entry is already stored. Errors: AlreadyExists ("a newer value
  // is stored", "a plain value cannot replace a dictionary"), ResourceExhausted (a quota,
  // capacity, dictionary full), InvalidArgument (sizes, expiration in the past or too far).
  Status Store(const DhtId& id, const StoreItem& item, const PeerId& writer, double now,
               bool charge = true, const std::string& source = {});
  // The unexpired record under `id`, or nullptr. Expired entries are dropped on the way.
  const Record* Get(const DhtId& id, double now);
  // The record under `id` as held, expired entries included (for inspection).
  const Record* Peek(const DhtId& id) const;
  // The original key of a stored id (for re-validation and republishing).
  const std::string* KeyOf(const DhtId& id) const;
  // Drops everything expired.
  void Purge(double now);
  // Evicts the records that expire soonest until `bytes` more fit under capacity (caches).
  void MakeRoom(size_t bytes, double now);

  size_t size() const { return records_.size(); }
  size_t bytes() const { return total_bytes_; }
  size_t usage_of(const PeerId& peer) const;
  size_t usage_of_source(const std::string& source) const;
  const StorageLimits& limits() const { return limits_; }
  template <typename F>
  void ForEach(F&& f) const {
    for (const auto& [id, slot] : records_) f(id, slot.key, slot.record);
  }

 private:
  struct Charge {
    PeerId writer;
    std::string source;  // "" when exempt or uncharged
    size_t bytes = 0;
  };
  struct Slot {
    std::string key;
    Record record;
    Charge value_charge;                    // plain value
    std::map<std::string, Charge> charges;  // per subkey
  };
  void Release(const Charge& c);
  void Acquire(const Charge& c);
  bool PruneSlot(Slot& slot, double now);  // false when the slot is empty now
  void Erase(std::unordered_map<DhtId, Slot>::iterator it);

  StorageLimits limits_;
  std::unordered_map<DhtId, Slot> records_;
  std::unordered_map<PeerId, size_t> usage_;
  std::unordered_map<std::string, size_t> source_usage_;  // only sources holding something
  size_t total_bytes_ = 0;
};

}  // namespace colony::dht
