// SourceBudget: an amount that remote callers share (bytes of requests held, requests queued),
// with a hard total and a cap on what one source may hold, so that one client machine cannot
// take it all from the others.
//
// A source is a net::SourceKey (an address, an IPv6 /64, a relayed peer's id); "" (loopback,
// exempt from per-address caps) is held to the total only. A source that holds nothing may take
// up to the whole total at once (one request larger than a share is served while its sender
// waits for nothing else); a source that holds some may hold at most `per_source` in all.
//
//   SourceBudget budget({.limit = 1 << 30, .per_source = 1 << 28, .unit = "bytes of requests"});
//   auto lease = budget.Open(net::SourceKey(ctx, limit_loopback));
//   COLONY_RETURN_IF_ERROR(lease.Take(bytes));  // ResourceExhausted naming the share or total
//   ...                                         // given back when `lease` is destroyed
//
// Thread-safe. The budget must outlive its leases.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "core/status.h"

namespace colony::net {

class SourceBudget {
 public:
  struct Options {
    uint64_t limit = 0;
    uint64_t per_source = 0;
    // Name the amount and its holder in refusals: "4096 bytes of requests on this server".
    std::string unit = "bytes";
    std::string holder = "this server";
  };

  // What one caller holds; given back when destroyed (or moved from).
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { Release(); }

    // Takes `n` more for the lease's source; when that is over the source's share or the total,
    // ResourceExhausted naming which, and nothing is taken.
    Status Take(uint64_t n);
    // Gives back everything held.
    void Release();
    uint64_t held() const { return held_; }

   private:
    friend class SourceBudget;
    Lease(SourceBudget* budget, std::string source) : budget_(budget), source_(std::move(source)) {}
    SourceBudget* budget_ = nullptr;
    std::string source_;
    uint64_t held_ = 0;
  };

  explicit SourceBudget(Options options) : options_(std::move(options)) {}
  SourceBudget(const SourceBudget&) = delete;
  SourceBudget& operator=(const SourceBudget&) = delete;

  // A lease for `source` holding nothing yet.
  Lease Open(std::string source) { return Lease(this, std::move(source)); }

  uint64_t limit() const { return options_.limit; }
  uint64_t per_source() const { return options_.per_source; }
  uint64_t used() const;
  // The most held at once.
  uint64_t peak() const;
  // Sources holding something now.
  size_t sources() const;
  // Takes refused (for a share or the total).
  uint64_t refused() const;

 private:
  Status Take(const std::string& source, uint64_t n);
  void Give(const std::string& source, uint64_t n);

  const Options options_;
  mutable std::mutex mu_;
  uint64_t used_ = 0;
  uint64_t peak_ = 0;
  uint64_t refused_ = 0;
  std::map<std::string, uint64_t> held_;  // non-empty sources holding something
};

}  // namespace colony::net
