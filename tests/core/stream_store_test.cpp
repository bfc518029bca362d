// Tests of the non-temporal copy: every byte lands where memcpy would put it, at every alignment
// of source and destination and every length around the 16-byte step of its loop, and
// nothing outside the destination is touched.
#include "core/stream_store.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace colony {
namespace {

TEST(StreamStore, CopiesLikeMemcpyAtEveryAlignmentAndLength) {
  constexpr size_t kGuard = 64;
  std::vector<uint8_t> src(4096 + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  const size_t lengths[] = {0, 1, 3, 15, 16, 17, 31, 48, 63, 64, 65, 127, 128, 129, 1000, 4173};
  const size_t src_offsets[] = {0, 1, 4, 13};
  for (size_t n : lengths) {
    for (size_t dst_off = 0; dst_off < 16; ++dst_off) {
      for (size_t src_off : src_offsets) {
        SCOPED_TRACE("n=" + std::to_string(n) + " dst+" + std::to_string(dst_off) + " src+" +
                     std::to_string(src_off));
        std::vector<uint8_t> dst(n + 2 * kGuard + 16, 0xa5);
        uint8_t* to = dst.data() + kGuard + dst_off;
        StreamStore(to, src.data() + src_off, n);
        StreamFence();
        ASSERT_EQ(std::memcmp(to, src.data() + src_off, n), 0);
        for (size_t i = 0; i < dst.size(); ++i) {
          if (dst.data() + i < to || dst.data() + i >= to + n) {
            ASSERT_EQ(dst[i], 0xa5) << "byte " << i << " outside the destination changed";
          }
        }
      }
    }
  }
}

TEST(StreamStore, CopiesMoreThanTheCachesHold) {
  const size_t n = kStreamMinBytes + 12345;
  std::vector<uint32_t> src(n / 4 + 1), dst(n / 4 + 1, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint32_t>(i * 2654435761u);
  StreamStore(dst.data(), src.data(), n);
  StreamFence();
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), n), 0);
}

}  // namespace
}  // namespace colony
