// Which microbatches a stage peer took, and which tries it fenced (microbatch_ledger.h).
#include "swarm/microbatch_ledger.h"

#include <algorithm>

namespace colony::swarm {

MicrobatchLedger::MicrobatchLedger(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

void MicrobatchLedger::Add(const Key& key, Entry entry) {
  entry.seq = next_seq_++;
  entries_[key] = entry;
  order_.emplace_back(key, entry.seq);
  // order_ may hold stale entries of forgotten or updated keys: it is bounded by twice the
  // capacity.
  while (entries_.size() > capacity_ || order_.size() > 2 * capacity_) {
    const auto [old, old_seq] = order_.front();
    order_.pop_front();
    auto it = entries_.find(old);
    if (it != entries_.end() && it->second.seq == old_seq) entries_.erase(it);
  }
}

bool MicrobatchLedger::Take(const Key& key, uint32_t attempt) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end() && (it->second.taken || attempt <= it->second.fenced_through)) {
    return false;
  }
  Add(key,
      Entry{.taken = true, .fenced_through = it != entries_.end() ? it->second.fenced_through : 0});
  return true;
}

void MicrobatchLedger::Forget(const Key& key) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.taken) return;
  if (it->second.fenced_through > 0) {
    it->second.taken = false;  // its fence holds
  } else {
    entries_.erase(it);
  }
}

bool MicrobatchLedger::Fence(const Key& key, uint32_t attempt) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.taken) return true;
  const uint32_t through =
      it != entries_.end() ? std::max(it->second.fenced_through, attempt) : attempt;
  Add(key, Entry{.fenced_through = through});
  return false;
}

size_t MicrobatchLedger::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace colony::swarm
