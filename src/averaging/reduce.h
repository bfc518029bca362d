// Reductions run by the owner of a span: the weighted mean and CenteredClip (robust aggregation,
// as in BTARD). Pure functions over float spans; callers run them on a compute pool.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace colony::averaging {

struct CenteredClipOptions {
  double tau = 1.0;     // clipping radius: the L2 norm of a sender's deviation, per part
  int iterations = 20;  // fixed-point iterations
  // When > 0, iterate further (reweighted means, up to max_extra_iterations) until the fixed
  // point's residual |sum_i w_i clip(x_i - v)| is at most this fraction of
  // sum_i w_i |clip(x_i - v)|: what verification (docs/averaging.md) checks a reducer against.
  double tolerance = 0;
  int max_extra_iterations = 1000;
};

// acc[i] += w * x[i]
void AddScaled(std::span<float> acc, std::span<const float> x, float w);
// x[i] *= w
void Scale(std::span<float> x, float w);

// The same over little-endian float32 bytes at any alignment (a received raw tensor frame);
// `x` holds exactly 4 * acc.size() bytes.
void AddScaledBytes(std::span<float> acc, std::span<const uint8_t> x, float w);
// out[i] = w * x[i]
void CopyScaledBytes(std::span<float> out, std::span<const uint8_t> x, float w);
// (Their finiteness: core/finite.h.)

// The largest |x[i]| (0 for none), or -1 when a value is NaN or infinite (checking both in one
// pass): what bounds a reducer's output. A weighted
// mean with non-negative weights, and CenteredClip started inside its inputs' hull, never leave
// the range of their inputs, so an output above the inputs' largest magnitude (beyond rounding,
// OutputWithinInputs) is a bug or an overflow, never a result to send.
float MaxAbs(std::span<const float> x);
float MaxAbsBytes(std::span<const uint8_t> x);
// True when every output is finite and |out[i]| <= max_abs_in times (1 + 1e-4) (float rounding
// of sums over groups of up to about a thousand senders).
bool OutputWithinInputs(std::span<const float> out, float max_abs_in);

// Each weight capped at the lower median of `weights` (for an even count, the smaller middle).
std::vector<double> WeightsCappedAtMedian(std::span<const double> weights);

// CenteredClip: starting from the coordinate-wise median v, repeats
//   v <- v + sum_i w_i * min(1, tau / |x_i - v|) * (x_i - v) / sum_i w_i
// so that a sender far from the others moves v by at most tau * w_i / sum(w) per iteration,
// however large its values. The weights are the declared ones capped at their lower median
// (WeightsCappedAtMedian): a huge self-declared weight would otherwise make w_i / sum(w) near 1
// and let one sender pull v all the way to its values, tau per iteration. `out` receives v.
// Weights must be positive. Returns false when options.tolerance is set and was not reached.
bool CenteredClip(std::span<const std::span<const float>> xs, std::span<const double> weights,
                  const CenteredClipOptions& options, std::span<float> out);

}  // namespace colony::averaging
