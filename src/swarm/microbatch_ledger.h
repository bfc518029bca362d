// MicrobatchLedger: which microbatches' gradients a SWARM stage peer took, and which tries of
// them it promised never to take. A trainer retries a backward whose reply it did not get, on
// another peer of the stage or the same one; the peer of the failed try may have taken the
// microbatch's gradient all the same (the reply was lost, or arrived past the deadline). Before
// retrying, the trainer fences that try at that peer (serve.fence): the peer answers whether it
// took the microbatch, and if it did not, it never takes that try or an earlier one (a late
// request is computed, its input gradient returned, its parameter gradients dropped), while a
// later try may still be taken there. The trainer sends the retry as a replay (input gradient
// only) when the peer took it. So each stage counts each microbatch once, whichever peers saw it.
//
//   MicrobatchLedger ledger;
//   if (ledger.Take({id, start, end}, attempt)) accumulate(); else drop();  // the backward ran
//   bool taken = ledger.Fence({id, start, end}, attempt);                   // serve.fence
//
// Keys are (the trainer's random 64-bit id, the blocks); a trainer numbers the tries of a
// microbatch from 1. At most `capacity` keys are remembered (the oldest forgotten first: a
// microbatch whose retry comes after `capacity` others may be counted twice). Ordered (no hash a
// sender could make collide). Thread-safe; no call waits for anything but the ledger's own lock.
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
  // Try `attempt` of `key`'s backward ran: true when its gradient may be taken (the key is now
  // taken), false when the key was taken before or this try was fenced (drop it).
  bool Take(const Key& key, uint32_t attempt);
  // Taking the gradient failed after Take: the microbatch was not taken after all.
  void Forget(const Key& key);
  // serve.fence: true when `key` was taken; otherwise tries up to `attempt` are fenced (Take
  // refuses them) and later ones are not.
  bool Fence(const Key& key, uint32_t attempt);
  size_t size() const;

 private:
  struct Entry {
    bool taken = false;
    uint32_t fenced_through = 0;  // when not taken: the last try fenced
    uint64_t seq = 0;             // which of order_'s entries is this key's latest
  };
  void Add(const Key& key, Entry entry);  // mu_ held

  size_t capacity_;
  mutable std::mutex mu_;
  std::map<Key, Entry> entries_;
  std::deque<std::pair<Key, uint64_t>> order_;  // oldest first
  uint64_t next_seq_ = 0;
};

}  // namespace colony::swarm
