#include "averaging/verify_math.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "averaging/reduce.h"

namespace colony::averaging {

static_assert(kDirections == 4, "one 64-bit hash gives four 16-bit values");

void CheckDirections(uint64_t seed, uint64_t first_index, std::span<float> out) {
  for (size_t i = 0; i < out.size() / kDirections; ++i) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + (first_index + i) * 0xD1B54A32D192ED03ull +
                 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (size_t d = 0; d < kDirections; ++d) {
      // The middle of one of 65,536 equal steps of [-1, 1): exact in float, never 0.
      const auto step = static_cast<float>((z >> (16 * d)) & 0xffff);
      out[kDirections * i + d] = (step + 0.5f) / 32768.0f - 1.0f;
    }
  }
}

Projection ProjectDeviation(std::span<const float> z, std::span<const float> x,
                            std::span<const float> r, double tau) {
  Projection p;
  double norm2 = 0;
  const size_t n = std::min({z.size() / kDirections, x.size(), r.size()});
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - static_cast<double>(r[i]);
    norm2 += d * d;
    for (size_t k = 0; k < kDirections; ++k) p.values[k] += z[kDirections * i + k] * d;
  }
  const double norm = std::sqrt(norm2);
  const double clip = tau > 0 && norm > tau ? tau / norm : 1.0;
  for (double& v : p.values) v *= clip;
  p.norm = clip * norm;
  return p;
}

bool SameProjection(const Projection& a, const Projection& b) {
  // Both sums run over the same doubles; only their order may differ. Relative to the norm
  // (which bounds |value| times the direction's largest entry, 1, times sqrt(length)), 1e-9
  // leaves room for any order.
  double scale = std::max({a.norm, b.norm, 1e-30});
  for (size_t d = 0; d < kDirections; ++d) {
    scale = std::max({scale, std::abs(a.values[d]), std::abs(b.values[d])});
  }
  bool same = std::abs(a.norm - b.norm) <= 1e-9 * scale;
  for (size_t d = 0; d < kDirections; ++d) {
    same = same && std::abs(a.values[d] - b.values[d]) <= 1e-9 * scale;
  }
  return same;
}

FixedPointCheck CheckFixedPoint(std::span<const RunValues> runs, bool capped_weights) {
  std::array<double, kDirections> sums{};
  double norms = 0, rounding = 0;
  for (const RunValues& run : runs) {
    const std::vector<double> weights =
        capped_weights ? WeightsCappedAtMedian(run.weights) : run.weights;
    double total = 0;
    for (size_t c = 0; c < weights.size() && c < run.projections.size(); ++c) {
      for (size_t d = 0; d < kDirections; ++d) {
        sums[d] += weights[c] * run.projections[c].values[d];
      }
      norms += weights[c] * run.projections[c].norm;
      total += weights[c];
    }
    rounding += total * run.result_norm;
  }
  FixedPointCheck check;
  for (double s : sums) check.residual = std::max(check.residual, std::abs(s));
  check.tolerance = 10 * kReducerTolerance * norms + 1e-4 * rounding + 1e-30;
  check.ok = check.residual <= check.tolerance;
  return check;
}

AuditComparison CompareAudited(std::span<const float> sent, std::span<const float> recomputed) {
  AuditComparison out;
  if (sent.size() != recomputed.size()) {
    out.relative_error = std::numeric_limits<double>::infinity();
    out.ok = false;
    return out;
  }
  double diff = 0, a = 0, b = 0;
  for (size_t k = 0; k < sent.size(); ++k) {
    const double x = sent[k], y = recomputed[k];
    diff += (x - y) * (x - y);
    a += x * x;
    b += y * y;
  }
  diff = std::sqrt(diff);
  const double scale = std::sqrt(std::max(a, b));
  out.relative_error = scale > 0 ? diff / scale : (diff > 0 ? 1.0 : 0.0);
  out.ok = std::isfinite(diff) &&
           diff <= kAuditTolerance * scale + 1e-6 * std::sqrt(static_cast<double>(sent.size()));
  return out;
}

}  // namespace colony::averaging
