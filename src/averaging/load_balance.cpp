#include "averaging/load_balance.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace colony::averaging {
namespace {

struct Interval {
  double lo = 0, hi = 0;
};

// The most values one reducer may own: kMaxSpanShare times an even split.
double SpanCap(double n, std::span<const PeerLoad> peers) {
  double reducers = 0;
  for (const PeerLoad& p : peers) reducers += p.reduces ? 1 : 0;
  return reducers > 0 ? std::min(n, kMaxSpanShare * n / reducers) : n;
}

// The allowed x_i (at most `cap`) for every peer at time T, or false when T is infeasible for
// some peer.
bool Intervals(double n, double g, double cap, std::span<const PeerLoad> peers, double t,
               std::vector<Interval>& out) {
  out.assign(peers.size(), {});
  for (size_t i = 0; i < peers.size(); ++i) {
    const PeerLoad& p = peers[i];
    const double s = p.sends ? 1 : 0;
    const double budget = t * p.bandwidth - s * n;  // what the span may cost: a * x <= budget
    if (!p.reduces) {
      if (budget < 0) return false;
      continue;
    }
    const double a = g - 2 * s;
    if (a > 0) {
      if (budget < 0) return false;
      out[i] = {0, budget / a};
    } else if (a == 0) {
      if (budget < 0) return false;
      out[i] = {0, std::numeric_limits<double>::infinity()};
    } else {
      out[i] = {std::max(0.0, -budget / -a), std::numeric_limits<double>::infinity()};
    }
    out[i].hi = std::min(out[i].hi, cap);
    if (out[i].lo > out[i].hi) return false;
  }
  return true;
}

bool Feasible(double n, const std::vector<Interval>& iv) {
  double lo = 0, hi = 0;
  for (const Interval& v : iv) {
    lo += v.lo;
    hi += v.hi;
  }
  return lo <= n && hi >= n;
}

}  // namespace

double MaxTransferTime(uint64_t total, std::span<const PeerLoad> peers,
                       std::span<const uint64_t> spans) {
  double g = 0;
  for (const PeerLoad& p : peers) g += p.sends ? 1 : 0;
  double worst = 0;
  for (size_t i = 0; i < peers.size(); ++i) {
    const double s = peers[i].sends ? 1 : 0;
    const double x = static_cast<double>(spans[i]);
    const double t = (s * static_cast<double>(total) + (g - 2 * s) * x) / peers[i].bandwidth;
    worst = std::max(worst, t);
  }
  return worst;
}

Result<std::vector<uint64_t>> LoadBalance(uint64_t total, std::span<const PeerLoad> peers) {
  size_t reducers = 0;
  double g = 0;
  for (const PeerLoad& p : peers) {
    if (!(p.bandwidth > 0) || !std::isfinite(p.bandwidth)) {
      return InvalidArgument("load balancing: every peer's bandwidth must be positive and finite");
    }
    reducers += p.reduces ? 1 : 0;
    g += p.sends ? 1 : 0;
  }
  if (reducers == 0) {
    return FailedPrecondition(
        "the group has no peer that can reduce (all are clients); at least one peer must run in "
        "node or aux mode");
  }
  std::vector<uint64_t> spans(peers.size(), 0);
  if (total == 0) return spans;
  const double n = static_cast<double>(total);
  const double cap = SpanCap(n, peers);

  // Bisect on T between 0 and a time that is surely feasible (everything on the fastest
  // reducer gives an upper bound).
  double hi = 0;
  {
    double worst = 0;
    for (size_t i = 0; i < peers.size(); ++i) {
      const double s = peers[i].sends ? 1 : 0;
      worst = std::max(worst, (s * n + std::abs(g - 2 * s) * n + n) / peers[i].bandwidth);
    }
    hi = worst * 2 + 1e-12;
  }
  double lo = 0;
  std::vector<Interval> iv;
  for (int iter = 0; iter < 200 && hi - lo > hi * 1e-12; ++iter) {
    const double mid = (lo + hi) / 2;
    if (Intervals(n, g, cap, peers, mid, iv) && Feasible(n, iv)) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  if (!Intervals(n, g, cap, peers, hi, iv) || !Feasible(n, iv)) {
    return Internal("load balancing found no feasible allocation");
  }

  // Start every reducer at its lower bound, then hand out the rest in proportion to bandwidth,
  // capped by upper bounds (water filling over the peers that still have room).
  std::vector<double> x(peers.size(), 0);
  double left = n;
  for (size_t i = 0; i < peers.size(); ++i) {
    if (!peers[i].reduces) continue;
    x[i] = iv[i].lo;
    left -= x[i];
  }
  for (int round = 0; round < 64 && left > 1e-9 * n; ++round) {
    double weight = 0;
    for (size_t i = 0; i < peers.size(); ++i) {
      if (peers[i].reduces && x[i] < iv[i].hi) weight += peers[i].bandwidth;
    }
    if (weight <= 0) break;
    double handed = 0;
    for (size_t i = 0; i < peers.size(); ++i) {
      if (!peers[i].reduces || x[i] >= iv[i].hi) continue;
      const double add = std::min(left * peers[i].bandwidth / weight, iv[i].hi - x[i]);
      x[i] += add;
      handed += add;
    }
    left -= handed;
  }

  // Round to whole values (largest remainder), keeping the sum exact.
  uint64_t assigned = 0;
  std::vector<std::pair<double, size_t>> remainders;
  for (size_t i = 0; i < peers.size(); ++i) {
    if (!peers[i].reduces) continue;
    const double floor_x = std::floor(std::max(0.0, x[i]));
    spans[i] = std::min<uint64_t>(static_cast<uint64_t>(floor_x), total);
    assigned += spans[i];
    remainders.emplace_back(x[i] - floor_x, i);
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t k = 0; assigned < total; k = (k + 1) % remainders.size()) {
    ++spans[remainders[k].second];
    ++assigned;
  }
  while (assigned > total) {  // only possible through rounding of huge totals
    for (size_t i = 0; i < spans.size() && assigned > total; ++i) {
      if (spans[i] > 0) {
        --spans[i];
        --assigned;
      }
    }
  }
  return spans;
}

void BoundBandwidths(std::span<PeerLoad> peers) {
  if (peers.empty()) return;
  std::vector<double> b;
  for (const PeerLoad& p : peers) b.push_back(p.bandwidth);
  const auto mid = b.begin() + static_cast<ptrdiff_t>((b.size() - 1) / 2);
  std::nth_element(b.begin(), mid, b.end());
  const double cap = *mid * kMaxBandwidthRatio;
  for (PeerLoad& p : peers) p.bandwidth = std::min(p.bandwidth, cap);
}

Status CheckLoadBalance(uint64_t total, std::span<const PeerLoad> bounded,
                        std::span<const uint64_t> spans) {
  if (spans.size() != bounded.size()) return ProtocolError("a group's spans do not match it");
  const double cap = SpanCap(static_cast<double>(total), bounded);
  for (size_t i = 0; i < spans.size(); ++i) {
    if (spans[i] > 0 && !bounded[i].reduces) {
      return ProtocolError("a peer that does not reduce was given a span");
    }
    if (static_cast<double>(spans[i]) > std::ceil(cap) + 1) {
      return ProtocolError(
          fmt::format("a peer was given {} of the group's {} values to reduce, "
                      "more than {}x an even split",
                      spans[i], total, kMaxSpanShare));
    }
  }
  COLONY_ASSIGN_OR_RETURN(auto best, LoadBalance(total, bounded));
  const double optimal = MaxTransferTime(total, bounded, best);
  const double given = MaxTransferTime(total, bounded, spans);
  double min_bandwidth = bounded.front().bandwidth;
  for (const PeerLoad& p : bounded) min_bandwidth = std::min(min_bandwidth, p.bandwidth);
  const double slack = 4.0 * static_cast<double>(bounded.size() + 2) / min_bandwidth;
  if (given > optimal * 1.01 + slack) {
    return ProtocolError(
        fmt::format("the group's spans make its slowest transfer {:.2f}x longer than a balanced "
                    "split (bandwidths above {}x the median count as that)",
                    given / optimal, kMaxBandwidthRatio));
  }
  return Status::Ok();
}

}  // namespace colony::averaging
