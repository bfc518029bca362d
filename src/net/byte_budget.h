// ByteBudget: a byte count shared by many connections of one host, with a hard limit.
//
// The host keeps one for the replies its handlers are sending (from Write() until the bytes are
// sealed) and one for the incoming messages being assembled, so that the memory remote peers can
// make a node hold is bounded by documented numbers however many connections they open
// (docs/security.md, "Memory"). Thread-safe: connections on different strands share it.
#pragma once

#include <atomic>
#include <cstdint>

namespace colony::net {

class ByteBudget {
 public:
  explicit ByteBudget(uint64_t limit) : limit_(limit) {}
  ByteBudget(const ByteBudget&) = delete;
  ByteBudget& operator=(const ByteBudget&) = delete;

  // Takes `n` bytes when they fit under the limit; false (and nothing taken) otherwise.
  bool TryTake(uint64_t n);
  // Gives back `n` bytes taken before.
  void Give(uint64_t n);

  uint64_t limit() const { return limit_; }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  // The most ever taken at once.
  uint64_t peak() const { return peak_.load(std::memory_order_relaxed); }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
  std::atomic<uint64_t> peak_{0};
};

}  // namespace colony::net
