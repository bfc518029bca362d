// Fuzz target for dht::Storage, the records a node holds for strangers: the input is a sequence of
// stores (by several writers from a few source addresses, under a few keys, plain or with subkeys,
// some naming an owner) and clock advances. After every step the storage's rules must hold: its
// byte and quota accounting (per writer and per address) equals what it holds, no dictionary
// exceeds its limits, a plain value never replaces a dictionary, and no owner's entry disappears
// before it expires unless the owner replaced it.
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dht/record.h"
#include "dht/validation.h"

using namespace colony;
using namespace colony::dht;

namespace {

constexpr double kStart = 1.7e9;
constexpr size_t kEntryOverhead = 64;  // as record.cpp charges

struct Peers {
  std::vector<PeerId> ids;
  Peers() {
    for (uint8_t i = 0; i < 3; ++i) {
      Bytes seed(32, i + 1);
      ids.push_back(KeyPair::FromSeed(seed).peer_id());
    }
  }
};

const Peers& ThePeers() {
  static const Peers peers;
  return peers;
}

class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool empty() const { return p_ == end_; }
  uint8_t Byte() { return p_ == end_ ? 0 : *p_++; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

[[noreturn]] void Fail() { __builtin_trap(); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& peers = ThePeers().ids;
  StorageLimits limits;
  limits.max_subkeys = 6;
  limits.max_record_bytes = 1200;
  limits.per_peer_quota_bytes = 2000;
  limits.per_source_quota_bytes = 2600;
  limits.capacity_bytes = 3500;
  limits.max_ttl_seconds = 1000;
  Storage storage(limits);
  const std::vector<std::string> keys{"a", "b", "c"};
  const std::vector<std::string> sources{"", "10.0.0.1", "10.0.0.2"};  // "": exempt
  // The owners' entries the storage accepted: (key, subkey) -> entry.
  std::map<std::pair<std::string, std::string>, ValueEntry> owned;
  double now = kStart;
  Input in(data, size);
  int steps = 0;
  while (!in.empty() && ++steps < 400) {
    const uint8_t op = in.Byte();
    if (op % 8 == 7) {  // the clock moves on
      now += in.Byte();
      continue;
    }
    StoreItem item;
    item.key = keys[in.Byte() % keys.size()];
    const uint8_t sub = in.Byte();
    if (sub % 4 == 1) {
      item.subkey = "s" + std::to_string(sub % 16);
    } else if (sub % 4 == 2) {
      item.subkey = OwnerMarker(peers[sub % peers.size()]);
    }
    item.value.assign(in.Byte() % 200, static_cast<char>('a' + op % 26));
    item.expiration = now + static_cast<double>(in.Byte()) * 5 - 20;  // past, near and too far
    const PeerId& writer = peers[op % peers.size()];
    const DhtId id = DhtId::ForKey(item.key);

    const Record* before = storage.Peek(id);
    const bool held_dict =
        before != nullptr && before->is_dict && before->Expiration() > now && [&] {
          for (const auto& [_, v] : before->subkeys) {
            if (v.expiration > now) return true;
          }
          return false;
        }();
    size_t unsigned_before = 0;
    if (before != nullptr && before->is_dict) {
      for (const auto& [s, v] : before->subkeys) {
        if (v.expiration > now && !HasOwnerMarker(s)) ++unsigned_before;
      }
    }
    const Status st =
        storage.Store(id, item, writer, now, (op & 16) == 0, sources[(op >> 5) % sources.size()]);
    // A full dictionary makes room for an owner by pushing out unsigned entries.
    if (st.code() == StatusCode::kResourceExhausted && item.subkey &&
        HasOwnerMarker(*item.subkey) && unsigned_before > 0 &&
        st.message().find("maximum of") != std::string::npos) {
      Fail();
    }
    if (st.ok() && !item.subkey && held_dict) Fail();  // a plain value replaced a dictionary
    if (st.ok() && item.subkey && HasOwnerMarker(*item.subkey)) {
      owned[{item.key, *item.subkey}] = {item.value, item.expiration};
    }
    if (st.ok() && item.expiration > now + limits.max_ttl_seconds + kExpirationClockSlack) Fail();

    // The accounting equals what is held, and dictionaries keep their limits.
    size_t total = 0;
    storage.ForEach([&](const DhtId&, const std::string& key, const Record& r) {
      if (r.is_dict) {
        if (r.subkeys.size() > limits.max_subkeys) Fail();
        size_t record_bytes = 0;
        for (const auto& [s, v] : r.subkeys) {
          record_bytes += key.size() + s.size() + v.value.size() + kEntryOverhead;
        }
        if (record_bytes > limits.max_record_bytes) Fail();
        total += record_bytes;
      } else if (r.value.expiration != 0) {
        total += key.size() + r.value.value.size() + kEntryOverhead;
      }
    });
    if (total != storage.bytes() || total > limits.capacity_bytes) Fail();
    size_t charged = 0;
    for (const PeerId& p : peers) {
      if (storage.usage_of(p) > limits.per_peer_quota_bytes) Fail();
      charged += storage.usage_of(p);
    }
    if (charged > total) Fail();
    size_t charged_to_sources = 0;
    for (const std::string& source : sources) {
      if (storage.usage_of_source(source) > limits.per_source_quota_bytes) Fail();
      charged_to_sources += storage.usage_of_source(source);
    }
    if (storage.usage_of_source("") != 0 || charged_to_sources > charged) Fail();
    // Every owner's entry that has not expired is still there, as new as the owner left it.
    for (auto it = owned.begin(); it != owned.end();) {
      if (it->second.expiration <= now) {
        it = owned.erase(it);
        continue;
      }
      const Record* r = storage.Peek(DhtId::ForKey(it->first.first));
      if (r == nullptr || !r->is_dict) Fail();
      auto held = r->subkeys.find(it->first.second);
      if (held == r->subkeys.end() || held->second.expiration < it->second.expiration) Fail();
      ++it;
    }
  }
  return 0;
}
