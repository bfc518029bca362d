// AllFinite and AllFiniteBytes against std::isfinite, value by value: every special value at
// every position of arrays long enough for the vector loop and its tail, at every alignment.
#include "core/finite.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace colony {
namespace {

TEST(Finite, AgreesWithStdIsfiniteForEverySpecialValueAtEveryPositionAndAlignment) {
  using L = std::numeric_limits<float>;
  const std::vector<float> specials = {L::quiet_NaN(),
                                       -L::quiet_NaN(),
                                       L::signaling_NaN(),
                                       L::infinity(),
                                       -L::infinity(),
                                       L::max(),
                                       -L::max(),
                                       L::min(),
                                       L::denorm_min(),
                                       -L::denorm_min(),
                                       0.0f,
                                       -0.0f,
                                       1.0f};
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{31}, size_t{67}}) {
    for (size_t at = 0; at < std::max<size_t>(n, 1); ++at) {
      for (float special : specials) {
        std::vector<float> x(n, 0.5f);
        if (n > 0) x[at] = special;
        const bool expected =
            std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
        EXPECT_EQ(AllFinite(x), expected) << n << " values, " << special << " at " << at;
        for (size_t offset = 0; offset < 4; ++offset) {
          std::vector<uint8_t> bytes(offset + 4 * n + 3, 0xff);  // NaN bytes around the values
          if (n > 0) std::memcpy(bytes.data() + offset, x.data(), 4 * n);  // no null source
          EXPECT_EQ(AllFiniteBytes(std::span<const uint8_t>(bytes.data() + offset, 4 * n)),
                    expected)
              << n << " values, " << special << " at " << at << ", offset " << offset;
        }
      }
    }
  }
}

}  // namespace
}  // namespace colony
