// Load balancing of the butterfly all-reduce: how many values each peer reduces.
//
// Peer i reduces a contiguous span of x_i values. With G senders in the group, its upload is
//   s_i * (N - x_i)           its own data for the other spans (s_i = 1 when it sends)
// + (G - s_i) * x_i           the averaged span back to every other sender
// and its download is the mirror image, so its time is (s_i * N + (G - 2 s_i) * x_i) / b_i for
// bandwidth b_i. We choose x (sum N, x_i >= 0, x_i = 0 for peers that do not reduce) to minimise
// the slowest peer's time. The problem is one-dimensional in that time T: for a given T each
// peer's x_i has an interval of allowed values, and T is feasible when the intervals can sum to
// N. We bisect on T, then fill the slack in proportion to bandwidth.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace colony::averaging {

struct PeerLoad {
  double bandwidth = 1;  // bytes/s (any unit, used relatively); must be > 0 and finite
  bool sends = true;     // contributes data (NODE, CLIENT)
  bool reduces = true;   // owns a span (NODE, AUX)
};

// Span sizes in values, one per peer, summing to `total`, none above kMaxSpanShare times an even
// split over the reducers. Error when no peer reduces or a bandwidth is not positive.
Result<std::vector<uint64_t>> LoadBalance(uint64_t total, std::span<const PeerLoad> peers);

// The slowest peer's time (in units of values / bandwidth) for a given allocation.
double MaxTransferTime(uint64_t total, std::span<const PeerLoad> peers,
                       std::span<const uint64_t> spans);

// Bandwidths are self-declared: a peer announcing a huge one would be given (nearly) the whole
// vector to reduce, and could then withhold or corrupt it all. Load balancing therefore counts
// no bandwidth above kMaxBandwidthRatio times the group's lower-median bandwidth
// (BoundBandwidths), and gives no reducer more than kMaxSpanShare times an even split (in groups
// of more than kMaxSpanShare reducers; LoadBalance applies it).
inline constexpr double kMaxBandwidthRatio = 8;
inline constexpr double kMaxSpanShare = 4;
void BoundBandwidths(std::span<PeerLoad> peers);

// Checks an allocation made by another peer (a group's leader): its slowest transfer may take at
// most 1% (and a few values) longer than LoadBalance's over the bounded bandwidths. Recomputing
// the exact spans would break between machines whose floating point rounds differently.
Status CheckLoadBalance(uint64_t total, std::span<const PeerLoad> bounded,
                        std::span<const uint64_t> spans);

}  // namespace colony::averaging
