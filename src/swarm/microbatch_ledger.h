// MicrobatchLedger: which microbatches' gradients a SWARM stage peer took, and which it promised
// never to take. A trainer retries a backward whose reply it did not get on another peer of the
// stage; the first peer may have taken the microbatch's gradient all the same (the reply was lost,
// or arrived past the deadline). Before retrying, the trainer fences the microbatch at the first
// peer (serve.fence): that peer answers whether it took it, and if it did not, it never will (a
// late request is computed, its input gradient returned, its parameter gradients dropped). The
// trainer then sends the retry as a replay (input gradient only) when the first peer took it. So
// each stage counts each microbatch once, whichever peers saw it.
//
//   MicrobatchLedger ledger;
//   if (ledger.Take({id, start, end})) accumulate(); else drop();   // after the backward ran
//   bool taken = ledger.Fence({id, start, end});                     // serve.fence
//
// Keys are (the trainer's random 64-bit id, the blocks). At most `capacity` keys are remembered
// (the oldest forgotten first: a microbatch whose retry comes after `capacity` others may be
// counted twice). Ordered (no hash a sender could make collide). Thread-safe; no call waits for
// anything but the ledger's own lock.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>

namespace colony::swarm {

class MicrobatchLedger {
 public:
  struct Key {
    uint64_t microbatch = 0;
    int64_t start = 0, end = 0;
    auto operator<=>(const Key&) const = default;
  };
  static constexpr size_t kDefaultCapacity = 65'536;

  explicit MicrobatchLedger(size_t capacity = kDefaultCapacity);
  // A backward of `key` ran: true when its gradient may be taken (it is now marked taken), false
  // when it was taken before or fenced (drop it).
  bool Take(const Key& key);
  // Taking the gradient failed after Take: the microbatch was not taken after all.
  void Forget(const Key& key);
  // serve.fence: true when `key` was taken; otherwise it is fenced and Take refuses it.
  bool Fence(const Key& key);
  size_t size() const;

 private:
  enum class State : uint8_t { kTaken, kFenced };
  struct Entry {
    State state;
    uint64_t seq;  // which of order_'s entries is this key's latest
  };
  void Add(const Key& key, State state);  // mu_ held

  size_t capacity_;
  mutable std::mutex mu_;
  std::map<Key, Entry> entries_;
  std::deque<std::pair<Key, uint64_t>> order_;  // oldest first
  uint64_t next_seq_ = 0;
};

}  // namespace colony::swarm
