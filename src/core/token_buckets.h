// Token buckets per key (a client, a source address): each key may take `burst` tokens at once
// and `per_second` more on average. Used for request rates at the HTTP API
// (api::ClientGate) and handshake rates per address at a host (net::HostOptions).
//
//   TokenBuckets rate({.per_second = 10, .burst = 64, .max_keys = 65536});
//   if (auto wait = rate.Take(address, now)) refuse("try again in *wait seconds");
//
// Memory is bounded: at max_keys, keys whose buckets are full again are forgotten, and if that
// is not enough the eighth that took a token longest ago. A forgotten key starts again with a
// full bucket, so the cap bounds memory, not the rate of a key that keeps taking. Not
// thread-safe: callers hold their own lock.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "core/clock.h"
#include "core/status.h"

namespace colony {

struct TokenBucketOptions {
  double per_second = 1;  // > 0
  double burst = 1;       // >= 1: tokens a key holds when full
  size_t max_keys = 65536;
};

// A rate and burst as a caller's options give them, checked before a TokenBuckets is built from
// them: InvalidArgument naming the option unless `per_second` is finite and >= 0 (callers take
// 0 as no limit) and `burst` finite and >= 1.
Status CheckTokenRate(std::string_view per_second_name, double per_second,
                      std::string_view burst_name, double burst);

class TokenBuckets {
 public:
  explicit TokenBuckets(TokenBucketOptions options) : options_(options) {}

  // Takes one of `key`'s tokens: nullopt when it had one, else the seconds until it will.
  std::optional<double> Take(const std::string& key, SteadyTime now);

  size_t keys() const { return buckets_.size(); }
  const TokenBucketOptions& options() const { return options_; }

 private:
  struct Bucket {
    double tokens = 0;
    SteadyTime last;
  };
  double Refilled(const Bucket& b, SteadyTime now) const;
  // Makes room for one more key (at max_keys).
  void Forget(SteadyTime now);

  TokenBucketOptions options_;
  std::unordered_map<std::string, Bucket> buckets_;
};

}  // namespace colony
