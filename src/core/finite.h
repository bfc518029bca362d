// Whether float32 values are all finite (no NaN, no infinity): one pass over the values' bits,
// no allocation, vectorized and built for AVX2 too (core/simd.h). Received tensors, reducers'
// results, averaged parameters and expert inputs are checked with it before they are used.
#pragma once

#include <cstdint>
#include <span>

namespace colony {

bool AllFinite(std::span<const float> x);
// The same over little-endian float32 bytes at any alignment (a received raw tensor frame):
// x.size() / 4 values.
bool AllFiniteBytes(std::span<const uint8_t> x);

}  // namespace colony
