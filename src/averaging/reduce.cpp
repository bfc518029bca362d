#include "averaging/reduce.h"

#include <algorithm>
#include <cmath>

namespace colony::averaging {

void AddScaled(std::span<float> acc, std::span<const float> x, float w) {
  float* __restrict a = acc.data();
  const float* __restrict v = x.data();
  const size_t n = std::min(acc.size(), x.size());
  for (size_t i = 0; i < n; ++i) a[i] += w * v[i];
}

void Scale(std::span<float> x, float w) {
  float* __restrict a = x.data();
  for (size_t i = 0; i < x.size(); ++i) a[i] *= w;
}

bool AllFinite(std::span<const float> x) {
  // Branch-free accumulation so the loop vectorizes: x - x is 0 for finite x and NaN otherwise.
  float bad = 0;
  const float* __restrict v = x.data();
  for (size_t i = 0; i < x.size(); ++i) bad += v[i] - v[i];
  return bad == 0;
}

void CenteredClip(std::span<const std::span<const float>> xs, std::span<const double> weights,
                  const CenteredClipOptions& options, std::span<float> out) {
  const size_t n = out.size();
  double total_weight = 0;
  for (double w : weights) total_weight += w;
  std::vector<double> v(n, 0.0), delta(n);
  if (xs.empty() || total_weight <= 0) {
    std::fill(out.begin(), out.end(), 0.0f);
    return;
  }
  // Start from the coordinate-wise median: the weighted mean would start next to an attacker's
  // huge values, and each iteration moves v by at most tau.
  std::vector<float> column(xs.size());
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < xs.size(); ++k) column[k] = xs[k][i];
    auto mid = column.begin() + static_cast<ptrdiff_t>(column.size() / 2);
    std::nth_element(column.begin(), mid, column.end());
    v[i] = *mid;
  }
  for (int it = 0; it < options.iterations; ++it) {
    std::fill(delta.begin(), delta.end(), 0.0);
    double moved = 0;
    for (size_t k = 0; k < xs.size(); ++k) {
      double norm2 = 0;
      for (size_t i = 0; i < n; ++i) {
        const double d = xs[k][i] - v[i];
        norm2 += d * d;
      }
      const double norm = std::sqrt(norm2);
      const double clip = norm > options.tau ? options.tau / norm : 1.0;
      const double w = weights[k] / total_weight * clip;
      for (size_t i = 0; i < n; ++i) delta[i] += w * (xs[k][i] - v[i]);
    }
    for (size_t i = 0; i < n; ++i) {
      v[i] += delta[i];
      moved += delta[i] * delta[i];
    }
    if (moved == 0) break;
  }
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(v[i]);
}

}  // namespace colony::averaging
