#include "averaging/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/simd.h"

namespace colony::averaging {

namespace {

// The kernels: plain loops over restrict pointers (vectorized: -ftree-vectorize in
// CMakeLists.txt), each also compiled for AVX2 (core/simd.h). Received parts are little-endian
// float32 bytes at any alignment; memcpy compiles to an unaligned load.

COLONY_KERNEL void KAddScaled(float* __restrict a, const float* __restrict v, size_t n, float w) {
  for (size_t i = 0; i < n; ++i) a[i] += w * v[i];
}

COLONY_KERNEL void KScale(float* __restrict a, size_t n, float w) {
  for (size_t i = 0; i < n; ++i) a[i] *= w;
}

COLONY_KERNEL void KAddScaledBytes(float* __restrict a, const uint8_t* __restrict v, size_t n,
                                   float w) {
  for (size_t i = 0; i < n; ++i) {
    float x;
    std::memcpy(&x, v + 4 * i, sizeof(x));
    a[i] += w * x;
  }
}

COLONY_KERNEL void KCopyScaledBytes(float* __restrict a, const uint8_t* __restrict v, size_t n,
                                    float w) {
  for (size_t i = 0; i < n; ++i) {
    float x;
    std::memcpy(&x, v + 4 * i, sizeof(x));
    a[i] = w * x;
  }
}

// The bits of |x| order as unsigned integers for finite floats; the finiteness test is
// core/finite.cpp's (an all-ones exponent plus one carries into bit 31), in the same pass, so a
// received part is read once. SSE2 has no unsigned 32-bit max (five instructions stand in for
// it); AVX2 does, which makes this ~4x faster.
COLONY_KERNEL float MaxAbsBits(const uint8_t* __restrict p, size_t n) {
  uint32_t bad = 0, most = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, p + 4 * i, sizeof(b));
    bad |= (b & 0x7f800000u) + 0x00800000u;
    most = std::max(most, b & 0x7fffffffu);
  }
  if ((bad & 0x80000000u) != 0) return -1.0f;
  float out;
  std::memcpy(&out, &most, sizeof(out));
  return out;
}

}  // namespace

void AddScaled(std::span<float> acc, std::span<const float> x, float w) {
  KAddScaled(acc.data(), x.data(), std::min(acc.size(), x.size()), w);
}

void Scale(std::span<float> x, float w) { KScale(x.data(), x.size(), w); }

float MaxAbs(std::span<const float> x) {
  return MaxAbsBits(reinterpret_cast<const uint8_t*>(x.data()), x.size());
}

float MaxAbsBytes(std::span<const uint8_t> x) {
  return MaxAbsBits(x.data(), x.size() / sizeof(float));
}

bool OutputWithinInputs(std::span<const float> out, float max_abs_in) {
  const float most = MaxAbs(out);
  return most >= 0 && most <= max_abs_in * (1.0f + 1e-4f);
}

void AddScaledBytes(std::span<float> acc, std::span<const uint8_t> x, float w) {
  KAddScaledBytes(acc.data(), x.data(), std::min(acc.size(), x.size() / sizeof(float)), w);
}

void CopyScaledBytes(std::span<float> out, std::span<const uint8_t> x, float w) {
  KCopyScaledBytes(out.data(), x.data(), std::min(out.size(), x.size() / sizeof(float)), w);
}

std::vector<double> WeightsCappedAtMedian(std::span<const double> weights) {
  std::vector<double> sorted(weights.begin(), weights.end());
  if (sorted.empty()) return sorted;
  const auto mid = sorted.begin() + static_cast<ptrdiff_t>((sorted.size() - 1) / 2);
  std::nth_element(sorted.begin(), mid, sorted.end());
  const double cap = *mid;
  std::vector<double> out(weights.begin(), weights.end());
  for (double& w : out) w = std::min(w, cap);
  return out;
}

namespace {
// |x - v| (L2).
double Distance(std::span<const float> x, const std::vector<double>& v) {
  double norm2 = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const double d = x[i] - v[i];
    norm2 += d * d;
  }
  return std::sqrt(norm2);
}
}  // namespace

bool CenteredClip(std::span<const std::span<const float>> xs, std::span<const double> declared,
                  const CenteredClipOptions& options, std::span<float> out) {
  const size_t n = out.size();
  // Self-declared weights above the (lower) median count as the median: with a minority of
  // attackers the median is an honest weight, so no attacker outweighs every honest sender.
  const std::vector<double> weights = WeightsCappedAtMedian(declared);
  double total_weight = 0;
  for (double w : weights) total_weight += w;
  std::vector<double> v(n, 0.0), delta(n);
  if (xs.empty() || total_weight <= 0) {
    std::fill(out.begin(), out.end(), 0.0f);
    return true;
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
      const double norm = Distance(xs[k], v);
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
  bool converged = true;
  if (options.tolerance > 0) {
    // The step above moves v by the residual over the total weight: slow when many inputs are
    // clipped. The reweighted mean v = sum w_i c_i x_i / sum w_i c_i has the same fixed point
    // (sum w_i c_i (x_i - v) = 0) and converges much faster (Huber's IRLS).
    converged = false;
    std::vector<double> next(n);
    for (int it = 0; it <= options.max_extra_iterations; ++it) {
      std::fill(delta.begin(), delta.end(), 0.0);
      std::fill(next.begin(), next.end(), 0.0);
      double clipped_norms = 0, clipped_weight = 0;
      for (size_t k = 0; k < xs.size(); ++k) {
        const double norm = Distance(xs[k], v);
        const double clip = norm > options.tau ? options.tau / norm : 1.0;
        const double w = weights[k] * clip;
        clipped_norms += weights[k] * clip * norm;
        clipped_weight += w;
        for (size_t i = 0; i < n; ++i) {
          delta[i] += w * (xs[k][i] - v[i]);
          next[i] += w * xs[k][i];
        }
      }
      double residual2 = 0;
      for (double d : delta) residual2 += d * d;
      if (std::sqrt(residual2) <= options.tolerance * clipped_norms) {
        converged = true;
        break;
      }
      for (size_t i = 0; i < n; ++i) v[i] = next[i] / clipped_weight;
    }
  }
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(v[i]);
  return converged;
}

}  // namespace colony::averaging
