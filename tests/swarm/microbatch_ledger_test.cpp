// MicrobatchLedger (swarm/microbatch_ledger.h): a stage peer takes each microbatch's gradient at
// most once, and never a try it answered a fence for without having taken it.
#include "swarm/microbatch_ledger.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace colony::swarm {
namespace {

using Key = MicrobatchLedger::Key;

TEST(MicrobatchLedger, TakesEachMicrobatchOnceAndNoFencedTry) {
  MicrobatchLedger ledger;
  EXPECT_TRUE(ledger.Take({7, 0, 2}, 1));
  EXPECT_FALSE(ledger.Take({7, 0, 2}, 2));  // a repeat, whatever its try
  EXPECT_TRUE(ledger.Take({7, 2, 4}, 1));   // the same microbatch through other blocks
  EXPECT_TRUE(ledger.Take({8, 0, 2}, 1));
  EXPECT_TRUE(ledger.Fence({7, 0, 2}, 1));  // taken: the trainer's retry elsewhere is a replay
  // Not taken: the fenced try and earlier ones never are (the late request), a later one may be
  // (the trainer's retry, here or at another peer), once.
  EXPECT_FALSE(ledger.Fence({9, 0, 2}, 2));
  EXPECT_FALSE(ledger.Take({9, 0, 2}, 1));
  EXPECT_FALSE(ledger.Take({9, 0, 2}, 2));
  EXPECT_FALSE(ledger.Fence({9, 0, 2}, 1));  // an older fence lowers nothing
  EXPECT_FALSE(ledger.Take({9, 0, 2}, 2));
  EXPECT_TRUE(ledger.Take({9, 0, 2}, 3));
  EXPECT_FALSE(ledger.Take({9, 0, 2}, 4));
  EXPECT_TRUE(ledger.Fence({9, 0, 2}, 4));
  // A take whose accumulation failed is forgotten (a later try may be taken); a fence is not.
  ledger.Forget({8, 0, 2});
  EXPECT_TRUE(ledger.Take({8, 0, 2}, 2));
  ledger.Forget({9, 0, 2});
  EXPECT_FALSE(ledger.Take({9, 0, 2}, 2));
  EXPECT_TRUE(ledger.Take({9, 0, 2}, 5));
}

TEST(MicrobatchLedger, RemembersTheLatestKeysUpToItsCapacity) {
  MicrobatchLedger ledger(4);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(ledger.Take({id, 0, 1}, 1));
  EXPECT_FALSE(ledger.Fence({5, 0, 1}, 1));  // the fifth key: the first is forgotten
  EXPECT_EQ(ledger.size(), 4u);
  EXPECT_TRUE(ledger.Take({1, 0, 1}, 1));
  EXPECT_FALSE(ledger.Take({5, 0, 1}, 1));
  // Keys forgotten and taken again, or fenced again and again, are not evicted early by their
  // stale places in the order.
  MicrobatchLedger churn(4);
  for (int round = 0; round < 100; ++round) {
    ASSERT_TRUE(churn.Take({1, 0, 1}, 1));
    churn.Forget({1, 0, 1});
    churn.Fence({2, 0, 1}, 1);
  }
  ASSERT_TRUE(churn.Take({1, 0, 1}, 1));
  for (uint64_t id = 3; id <= 4; ++id) ASSERT_TRUE(churn.Take({id, 0, 1}, 1));
  EXPECT_FALSE(churn.Take({1, 0, 1}, 2));
  EXPECT_FALSE(churn.Take({2, 0, 1}, 1));
  EXPECT_EQ(churn.size(), 4u);
  // A flood of fences keeps the ledger at its capacity.
  for (uint64_t id = 100; id < 100'000; ++id) churn.Fence({id, 0, 1}, 1);
  EXPECT_EQ(churn.size(), 4u);
}

// A fence from a network thread races the compute thread's take of the same try: for every key
// exactly one wins, and the fence's answer says which.
TEST(MicrobatchLedger, AFenceAndATakeRacingAgreeOnWhoWon) {
  constexpr uint64_t kKeys = 20'000;
  MicrobatchLedger ledger(2 * kKeys);
  std::vector<char> took(kKeys), fenced_taken(kKeys);
  std::thread taker([&] {
    for (uint64_t i = 0; i < kKeys; ++i) took[i] = ledger.Take({i + 1, 0, 4}, 1);
  });
  std::thread fencer([&] {
    for (uint64_t i = kKeys; i-- > 0;) fenced_taken[i] = ledger.Fence({i + 1, 0, 4}, 1);
  });
  taker.join();
  fencer.join();
  for (uint64_t i = 0; i < kKeys; ++i) ASSERT_EQ(took[i], fenced_taken[i]) << "key " << i + 1;
}

}  // namespace
}  // namespace colony::swarm
