#include "core/finite.h"

#include <cstring>

#include "core/simd.h"

namespace colony {

namespace {

// An integer test on the bits, so that the loop vectorizes (a float reduction would not without
// -ffast-math): an all-ones exponent plus one carries into bit 31. memcpy compiles to an
// unaligned load.
COLONY_KERNEL bool AllFiniteBits(const uint8_t* __restrict p, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, p + 4 * i, sizeof(b));
    bad |= (b & 0x7f800000u) + 0x00800000u;
  }
  return (bad & 0x80000000u) == 0;
}

}  // namespace

bool AllFinite(std::span<const float> x) {
  return AllFiniteBits(reinterpret_cast<const uint8_t*>(x.data()), x.size());
}

bool AllFiniteBytes(std::span<const uint8_t> x) {
  return AllFiniteBits(x.data(), x.size() / sizeof(float));
}

}  // namespace colony
