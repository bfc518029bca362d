#include "train/low_rank.h"

#include <cmath>
#include <vector>

namespace colony::train {

void OrthonormalizeColumns(std::span<float> p, int64_t rows, int64_t cols) {
  const auto r = static_cast<size_t>(rows), c = static_cast<size_t>(cols);
  std::vector<double> done(r * c, 0.0);  // column-major: the orthonormal columns so far
  std::vector<double> v(r);
  for (size_t j = 0; j < c; ++j) {
    double original = 0;
    for (size_t i = 0; i < r; ++i) {
      v[i] = p[i * c + j];
      original += v[i] * v[i];
    }
    for (size_t k = 0; k < j; ++k) {
      const double* q = &done[k * r];
      double dot = 0;
      for (size_t i = 0; i < r; ++i) dot += v[i] * q[i];
      for (size_t i = 0; i < r; ++i) v[i] -= dot * q[i];
    }
    double norm = 0;
    for (size_t i = 0; i < r; ++i) norm += v[i] * v[i];
    norm = std::sqrt(norm);
    // What is left of a column in the span of the others is rounding error: drop it.
    const bool independent = norm > 1e-6 * std::sqrt(original) && norm > 1e-30;
    double* out = &done[j * r];
    for (size_t i = 0; i < r; ++i) {
      out[i] = independent ? v[i] / norm : 0.0;
      p[i * c + j] = static_cast<float>(out[i]);
    }
  }
}

void LowRankProduct(std::span<const float> p, std::span<const float> q, int64_t rows, int64_t cols,
                    int64_t rank, std::span<float> out) {
  const auto r = static_cast<size_t>(rows), c = static_cast<size_t>(cols),
             k = static_cast<size_t>(rank);
  for (size_t i = 0; i < r; ++i) {
    const float* pi = &p[i * k];
    float* row = &out[i * c];
    for (size_t j = 0; j < c; ++j) {
      const float* qj = &q[j * k];
      double sum = 0;
      for (size_t t = 0; t < k; ++t) sum += static_cast<double>(pi[t]) * qj[t];
      row[j] = static_cast<float>(sum);
    }
  }
}

}  // namespace colony::train
