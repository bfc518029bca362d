// ByteBudget: lock-free take and give of a shared byte limit.
#include "net/byte_budget.h"

namespace colony::net {

bool ByteBudget::TryTake(uint64_t n) {
  uint64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (n > limit_ || used > limit_ - n) return false;
  } while (!used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed));
  const uint64_t now = used + n;
  uint64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  return true;
}

void ByteBudget::Give(uint64_t n) { used_.fetch_sub(n, std::memory_order_relaxed); }

}  // namespace colony::net
