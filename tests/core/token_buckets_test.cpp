// TokenBuckets (core/token_buckets.h) on a synthetic clock: the burst, the refill rate, keys kept
// apart, the bound on remembered keys, and the check of a caller's rate options.
#include "core/token_buckets.h"

#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <string>

namespace colony {
namespace {

using std::chrono::milliseconds;

const SteadyTime kStart{std::chrono::hours(1)};

TEST(TokenBuckets, AKeyTakesItsBurstAtOnceThenItsRate) {
  TokenBuckets rate({.per_second = 4, .burst = 3});
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(rate.Take("a", kStart)) << i;
  const auto wait = rate.Take("a", kStart);
  ASSERT_TRUE(wait);
  EXPECT_DOUBLE_EQ(*wait, 0.25);  // one token per 1/4 s
  EXPECT_TRUE(rate.Take("a", kStart + milliseconds(200)));
  EXPECT_FALSE(rate.Take("a", kStart + milliseconds(260)));
  EXPECT_TRUE(rate.Take("a", kStart + milliseconds(260)));
  // Over 10 s of asking every 10 ms, a key gets its rate (40), not a token per request.
  int taken = 0;
  for (int ms = 270; ms < 10'270; ms += 10) taken += !rate.Take("a", kStart + milliseconds(ms));
  EXPECT_GE(taken, 39);
  EXPECT_LE(taken, 41);
}

TEST(TokenBuckets, RefillStopsAtTheBurstAndKeysAreApart) {
  TokenBuckets rate({.per_second = 10, .burst = 2});
  EXPECT_FALSE(rate.Take("a", kStart));
  EXPECT_FALSE(rate.Take("a", kStart));
  EXPECT_TRUE(rate.Take("a", kStart));
  EXPECT_FALSE(rate.Take("b", kStart));  // another key has its own bucket
  // An hour idle refills two tokens, not 36,000.
  const SteadyTime later = kStart + std::chrono::hours(1);
  EXPECT_FALSE(rate.Take("a", later));
  EXPECT_FALSE(rate.Take("a", later));
  EXPECT_TRUE(rate.Take("a", later));
  // A clock that steps back refills nothing.
  EXPECT_TRUE(rate.Take("a", later - std::chrono::seconds(5)));
}

TEST(TokenBuckets, RemembersAtMostMaxKeysAndForgetsFullBucketsFirst) {
  TokenBuckets rate({.per_second = 1, .burst = 2, .max_keys = 8});
  for (int i = 0; i < 8; ++i) EXPECT_FALSE(rate.Take("k" + std::to_string(i), kStart));
  EXPECT_EQ(rate.keys(), 8u);
  EXPECT_FALSE(rate.Take("k0", kStart));  // "k0" empties its bucket
  // At the cap, the buckets that are full again are forgotten: all but k0's.
  EXPECT_FALSE(rate.Take("new", kStart + milliseconds(1500)));
  EXPECT_EQ(rate.keys(), 2u);
  EXPECT_FALSE(rate.Take("k0", kStart + milliseconds(1500)));  // 1.5 tokens refilled
  EXPECT_TRUE(rate.Take("k0", kStart + milliseconds(1500)));   // remembered, not a fresh bucket
  // When no bucket is full, the idlest eighth (at least one) makes room.
  TokenBuckets busy({.per_second = 1, .burst = 1, .max_keys = 16});
  for (int i = 0; i < 16; ++i) busy.Take("k" + std::to_string(i), kStart + milliseconds(i));
  for (int i = 0; i < 100; ++i) {
    busy.Take("n" + std::to_string(i), kStart + milliseconds(20 + i));
    EXPECT_LE(busy.keys(), 16u);
  }
}

TEST(TokenBuckets, RatesThatAreNoRateAreRefusedNamingTheOption) {
  EXPECT_TRUE(CheckTokenRate("r", 0, "b", 1).ok());  // 0: no limit
  EXPECT_TRUE(CheckTokenRate("r", 20, "b", 64).ok());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const double bad : {-1.0, nan, inf}) {
    const Status st = CheckTokenRate("my_rate", bad, "my_burst", 1);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("my_rate"), std::string::npos) << st.message();
  }
  for (const double bad : {0.0, 0.5, -3.0, nan, inf}) {
    const Status st = CheckTokenRate("my_rate", 1, "my_burst", bad);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("my_burst"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace colony
