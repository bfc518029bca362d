// Which microbatches a stage peer took or fenced (microbatch_ledger.h).
#include "swarm/microbatch_ledger.h"

#include <algorithm>

namespace colony::swarm {

MicrobatchLedger::MicrobatchLedger(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

void MicrobatchLedger::Add(const Key& key, State state) {
  const uint64_t seq = next_seq_++;
  entries_[key] = Entry{state, seq};
  order_.emplace_back(key, seq);
  // order_ may hold stale entries of forgotten keys: it is bounded by twice the capacity.
  while (entries_.size() > capacity_ || order_.size() > 2 * capacity_) {
    const auto [old, old_seq] = order_.front();
    order_.pop_front();
    auto it = entries_.find(old);
    if (it != entries_.end() && it->second.seq == old_seq) entries_.erase(it);
  }
}

bool MicrobatchLedger::Take(const Key& key) {
  std::lock_guard lock(mu_);
  if (entries_.count(key) > 0) return false;
  Add(key, State::kTaken);
  return true;
}

void MicrobatchLedger::Forget(const Key& key) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.state == State::kTaken) entries_.erase(it);
}

bool MicrobatchLedger::Fence(const Key& key) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end()) return it->second.state == State::kTaken;
  Add(key, State::kFenced);
  return false;
}

size_t MicrobatchLedger::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace colony::swarm
