#include "core/token_buckets.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace colony {

Status CheckTokenRate(std::string_view per_second_name, double per_second,
                      std::string_view burst_name, double burst) {
  if (!std::isfinite(per_second) || per_second < 0) {
    return InvalidArgument(fmt::format("{} is {}, expected a finite rate >= 0 (0: no limit)",
                                       per_second_name, per_second));
  }
  if (!std::isfinite(burst) || burst < 1) {
    return InvalidArgument(
        fmt::format("{} is {}, expected a finite number >= 1", burst_name, burst));
  }
  return Status::Ok();
}

double TokenBuckets::Refilled(const Bucket& b, SteadyTime now) const {
  const double elapsed = std::max(0.0, std::chrono::duration<double>(now - b.last).count());
  return std::min(options_.burst, b.tokens + elapsed * options_.per_second);
}

void TokenBuckets::Forget(SteadyTime now) {
  std::erase_if(buckets_,
                [&](const auto& kv) { return Refilled(kv.second, now) >= options_.burst; });
  if (buckets_.size() < options_.max_keys) return;
  // Still full: drop the idlest eighth, so that this sweep runs once per many new keys.
  std::vector<SteadyTime> lasts;
  lasts.reserve(buckets_.size());
  for (const auto& [_, b] : buckets_) lasts.push_back(b.last);
  const size_t drop = std::max<size_t>(1, buckets_.size() / 8);
  std::nth_element(lasts.begin(), lasts.begin() + static_cast<std::ptrdiff_t>(drop - 1),
                   lasts.end());
  const SteadyTime cutoff = lasts[drop - 1];
  std::erase_if(buckets_, [&](const auto& kv) { return kv.second.last <= cutoff; });
}

std::optional<double> TokenBuckets::Take(const std::string& key, SteadyTime now) {
  auto it = buckets_.find(key);
  if (it == buckets_.end()) {
    if (buckets_.size() >= std::max<size_t>(1, options_.max_keys)) Forget(now);
    it = buckets_.emplace(key, Bucket{options_.burst, now}).first;
  }
  Bucket& b = it->second;
  b.tokens = Refilled(b, now);
  b.last = std::max(b.last, now);
  if (b.tokens >= 1) {
    b.tokens -= 1;
    return std::nullopt;
  }
  return (1 - b.tokens) / options_.per_second;
}

}  // namespace colony
