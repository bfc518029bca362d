// The arithmetic of verifying an all-reduce (BTARD's check of a reducer, docs/averaging.md
// "Verification"): pure functions over float spans and the scalars members publish.
//
// A reducer's result r for a part is right when it is the reduction's fixed point:
//   sum_i w_i clip_tau(x_i - r) = 0
// (tau = infinity for the weighted mean, which makes r the mean exactly). After the round the
// group draws a random direction z that nobody knew while the results were fixed, and every
// contributor publishes <z, clip(x_i - r)> and |clip(x_i - r)|. A wrong r leaves a residual
// that a random direction sees: the weighted sum of the published projections is far from 0.
// One direction misses a wrong result with a probability of about the tolerance over the
// residual's spread on it (a few percent for a reducer that returns one of its inputs), so the
// group checks kDirections independent directions at once: a miss needs all of them to miss.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace colony::averaging {

inline constexpr size_t kDirections = 4;

// Elements first_index, first_index + 1, ... (indices into the flattened tensors) of the
// kDirections check directions drawn from `seed`, interleaved: out[kDirections * i + d] is
// element first_index + i of direction d. Uniform in [-1, 1) (16-bit steps), the same in every
// process. out.size() must be a multiple of kDirections.
void CheckDirections(uint64_t seed, uint64_t first_index, std::span<float> out);

struct Projection {
  std::array<double, kDirections> values{};  // <z_d, clip(x - r)>
  double norm = 0;                           // |clip(x - r)|
};
// The projections of one contributor's input `x` against the result `r` on the directions `z`
// (CheckDirections over the same elements). tau <= 0: no clipping (the weighted mean).
// Computed in double, so the contributor and the reducer, holding the same float32 values,
// agree to rounding (SameProjection).
Projection ProjectDeviation(std::span<const float> z, std::span<const float> x,
                            std::span<const float> r, double tau);
// Adds the projections of consecutive parts (sums of values, sums of norms).
inline Projection operator+(Projection a, const Projection& b) {
  for (size_t d = 0; d < kDirections; ++d) a.values[d] += b.values[d];
  a.norm += b.norm;
  return a;
}

// True when two computations of the same projection agree (they may run on different machines
// and compilers, so in a different summation order).
bool SameProjection(const Projection& a, const Projection& b);

// One run of consecutive parts of a span reduced from the same contributors.
struct RunValues {
  std::vector<double> weights;          // declared, one per contributor
  std::vector<Projection> projections;  // one per contributor, summed over the run's parts
  double result_norm = 0;               // |r| over the run's parts
};
struct FixedPointCheck {
  // The largest over the directions of |sum over runs and contributors of w_i * projection_i|.
  double residual = 0;
  double tolerance = 0;  // what an honest reducer's residual stays under
  bool ok = true;
};
// Kept in step with what the reducer guarantees: CenteredClip iterates until its residual is
// at most kReducerTolerance of the clipped norms (CenteredClipOptions::tolerance).
inline constexpr double kReducerTolerance = 1e-3;
// Whether a span's result is the fixed point its contributors' projections say it should be.
// `capped_weights`: CenteredClip (weights capped at their median per run) rather than the mean.
// The tolerance is 10 x kReducerTolerance of the weighted clipped norms (a random direction
// sees an honest residual at about 0.6 of that), plus float32 rounding of the result
// (1e-4 of |r| times the run's weight).
FixedPointCheck CheckFixedPoint(std::span<const RunValues> runs, bool capped_weights);

// Audits (AveragerOptions::audit_targets): values a member sent against those recomputed from
// its claim. They agree when |sent - recomputed| <= kAuditTolerance x max(|sent|, |recomputed|)
// (L2) plus 1e-6 per sqrt(value): room for another thread count's or device's rounding, far
// below what a changed gradient (another sign, other labels, older parameters) moves.
inline constexpr double kAuditTolerance = 1e-2;
struct AuditComparison {
  double relative_error = 0;  // |sent - recomputed| / max(|sent|, |recomputed|)
  bool ok = true;
};
AuditComparison CompareAudited(std::span<const float> sent, std::span<const float> recomputed);

}  // namespace colony::averaging
