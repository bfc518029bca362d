// MicrobatchLedger (swarm/microbatch_ledger.h): a stage peer takes each microbatch's gradient at
// most once, and never after it answered a fence that it had not.
#include "swarm/microbatch_ledger.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace colony::swarm {
namespace {

using Key = MicrobatchLedger::Key;

TEST(MicrobatchLedger, TakesEachMicrobatchOnceAndNeverAfterAFence) {
  MicrobatchLedger ledger;
  EXPECT_TRUE(ledger.Take({7, 0, 2}));
  EXPECT_FALSE(ledger.Take({7, 0, 2}));  // a repeat
  EXPECT_TRUE(ledger.Take({7, 2, 4}));   // the same microbatch through other blocks
  EXPECT_TRUE(ledger.Take({8, 0, 2}));
  EXPECT_TRUE(ledger.Fence({7, 0, 2}));   // taken: the trainer's retry elsewhere is a replay
  EXPECT_FALSE(ledger.Fence({9, 0, 2}));  // not taken, and now never
  EXPECT_FALSE(ledger.Take({9, 0, 2}));
  EXPECT_FALSE(ledger.Fence({9, 0, 2}));  // asked again: still not taken
  // A take whose accumulation failed is forgotten (the microbatch may come again); a fence is not.
  ledger.Forget({8, 0, 2});
  EXPECT_TRUE(ledger.Take({8, 0, 2}));
  ledger.Forget({9, 0, 2});
  EXPECT_FALSE(ledger.Take({9, 0, 2}));
}

TEST(MicrobatchLedger, RemembersTheLatestKeysUpToItsCapacity) {
  MicrobatchLedger ledger(4);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(ledger.Take({id, 0, 1}));
  EXPECT_FALSE(ledger.Fence({5, 0, 1}));  // the fifth key: the first is forgotten
  EXPECT_EQ(ledger.size(), 4u);
  EXPECT_TRUE(ledger.Take({1, 0, 1}));
  EXPECT_FALSE(ledger.Take({5, 0, 1}));
  // Keys forgotten and taken again are not evicted early by their stale places in the order.
  MicrobatchLedger churn(4);
  for (int round = 0; round < 100; ++round) {
    ASSERT_TRUE(churn.Take({1, 0, 1}));
    churn.Forget({1, 0, 1});
  }
  ASSERT_TRUE(churn.Take({1, 0, 1}));
  for (uint64_t id = 2; id <= 4; ++id) ASSERT_TRUE(churn.Take({id, 0, 1}));
  EXPECT_FALSE(churn.Take({1, 0, 1}));
  EXPECT_EQ(churn.size(), 4u);
  // A flood of fences keeps the ledger at its capacity.
  for (uint64_t id = 100; id < 100'000; ++id) churn.Fence({id, 0, 1});
  EXPECT_EQ(churn.size(), 4u);
}

// A fence from a network thread races the compute thread's take: for every key exactly one
// wins, and the fence's answer says which.
TEST(MicrobatchLedger, AFenceAndATakeRacingAgreeOnWhoWon) {
  constexpr uint64_t kKeys = 20'000;
  MicrobatchLedger ledger(2 * kKeys);
  std::vector<char> took(kKeys), fenced_taken(kKeys);
  std::thread taker([&] {
    for (uint64_t i = 0; i < kKeys; ++i) took[i] = ledger.Take({i + 1, 0, 4});
  });
  std::thread fencer([&] {
    for (uint64_t i = kKeys; i-- > 0;) fenced_taken[i] = ledger.Fence({i + 1, 0, 4});
  });
  taker.join();
  fencer.join();
  for (uint64_t i = 0; i < kKeys; ++i) ASSERT_EQ(took[i], fenced_taken[i]) << "key " << i + 1;
}

}  // namespace
}  // namespace colony::swarm
