// The arithmetic of PowerSGD (train/powersgd.h) that every member of a group must compute bit for
// bit alike: orthonormalizing the averaged left factor P and forming P Q^T. Fixed-order loops in
// double precision, compiled without floating-point contraction (src/train/CMakeLists.txt), so
// that peers on different machines and builds apply the same gradient and their parameters stay
// equal (state downloads cross-check them by digest). Pure functions; torch-free.
#pragma once

#include <cstdint>
#include <span>

namespace colony::train {

// Orthonormalizes the `cols` columns of the row-major rows x cols matrix `p` in place (modified
// Gram-Schmidt). A column that is (numerically) in the span of the ones before it becomes zeros,
// so that a zero or rank-deficient gradient gives a zero (not a NaN) approximation.
void OrthonormalizeColumns(std::span<float> p, int64_t rows, int64_t cols);

// out (rows x cols, row-major) = p (rows x rank) x q^T, where q is cols x rank (row-major).
void LowRankProduct(std::span<const float> p, std::span<const float> q, int64_t rows, int64_t cols,
                    int64_t rank, std::span<float> out);

}  // namespace colony::train
