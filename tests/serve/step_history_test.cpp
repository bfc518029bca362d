// StepHistory against the concatenation it replaces: every step rolls back, reorders and appends
// as `Reference` (at::cat, computed apart) does, while the storage grows by doubling.
#include "serve/step_history.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <random>
#include <set>

namespace colony::serve {
namespace {

// What the client kept before: the history's first `position` positions, rows reordered by
// hypo_ids, then x, as a new tensor each step.
at::Tensor Reference(const at::Tensor& history, int64_t position, const at::Tensor& hypo_ids,
                     const at::Tensor& x) {
  if (!history.defined() || position == 0) return x.clone();
  at::Tensor h = history.narrow(1, 0, position);
  if (hypo_ids.defined()) h = h.index_select(0, hypo_ids);
  return at::cat({h, x}, 1);
}

TEST(StepHistory, RandomStepsEqualConcatenation) {
  constexpr int64_t kBatch = 3, kHidden = 5;
  std::mt19937 rng(7);
  // Unbounded, and capped at a max_length the history reaches often (restarts when full).
  for (int64_t max_length : {0, 24}) {
    StepHistory history(max_length);
    at::Tensor expected;
    int64_t reorders = 0;
    for (int step = 0; step < 200; ++step) {
      const int64_t length = history.length();
      // Mostly one new token at the end; sometimes several, a rollback or a restart.
      int64_t position = length;
      const int kind = static_cast<int>(rng() % 10);
      if (kind == 0 && length > 0) position = static_cast<int64_t>(rng() % length);
      if (kind == 1) position = 0;
      const int64_t tokens = kind == 2 ? 1 + static_cast<int64_t>(rng() % 7) : 1;
      if (max_length > 0 && position + tokens > max_length) position = 0;
      at::Tensor hypo;
      if (kind >= 8 && position > 0) {
        hypo = at::randint(kBatch, {kBatch}, at::kLong);
        ++reorders;
      }
      const at::Tensor x = at::randn({kBatch, tokens, kHidden});
      expected = Reference(expected, position, hypo, x);
      history.Advance(position, hypo, x);
      ASSERT_EQ(history.length(), expected.size(1)) << "step " << step;
      ASSERT_TRUE(at::equal(history.tensor(), expected)) << "step " << step;
      if (max_length > 0) {
        ASSERT_LE(history.capacity(), max_length);
      }
    }
    EXPECT_GT(reorders, 10);
    if (max_length > 0) {
      EXPECT_EQ(history.capacity(), max_length);
    }
  }
}

TEST(StepHistory, AppendsInPlaceAndDoubles) {
  StepHistory history;
  std::set<const void*> storages;
  std::vector<at::Tensor> pieces;
  for (int64_t t = 0; t < 1000; ++t) {
    pieces.push_back(at::full({2, 1, 4}, static_cast<float>(t)));
    history.Advance(t, {}, pieces.back());
    storages.insert(history.tensor().storage().data());
  }
  // Doubling from 16: 16, 32, ..., 1024 (7 storages); a copy per step would make 1000.
  EXPECT_LE(storages.size(), 7u);
  EXPECT_TRUE(at::equal(history.tensor(), at::cat(pieces, 1)));
  EXPECT_LT(history.capacity(), 2 * 1000);

  // Sized to max_length from the first step that needs it: never past it.
  StepHistory capped(40);
  for (int64_t t = 0; t < 40; ++t) capped.Advance(t, {}, at::ones({1, 1, 4}));
  EXPECT_EQ(capped.capacity(), 40);
}

TEST(StepHistory, DoesNotAliasItsInputs) {
  // The first step's x is the caller's tensor (a CPU hidden state is not copied on its way in):
  // later steps must not write into it.
  const at::Tensor x = at::randn({2, 4, 3});
  const at::Tensor x_before = x.clone();
  StepHistory history;
  history.Advance(0, {}, x);
  history.Advance(1, {}, at::zeros({2, 1, 3}));
  EXPECT_TRUE(at::equal(x, x_before));

  // An assigned tensor (a replacement's replayed inputs) is shared until a step writes: a
  // rollback writes into its positions, so it moves first.
  const at::Tensor replayed = at::randn({2, 6, 3});
  const at::Tensor replayed_before = replayed.clone();
  history.Assign(replayed);
  EXPECT_TRUE(at::equal(history.tensor(), replayed));
  history.Advance(2, {}, at::ones({2, 1, 3}));
  EXPECT_TRUE(at::equal(replayed, replayed_before));
  EXPECT_TRUE(at::equal(history.tensor(),
                        at::cat({replayed_before.narrow(1, 0, 2), at::ones({2, 1, 3})}, 1)));

  // A view handed out before a reorder keeps its rows (the reorder moves to new storage).
  const at::Tensor before_reorder = history.tensor().clone();
  const at::Tensor view = history.tensor();
  history.Advance(3, at::tensor({1, 0}, at::kLong), at::zeros({2, 1, 3}));
  EXPECT_TRUE(at::equal(view, before_reorder));
  EXPECT_TRUE(at::equal(history.tensor().narrow(1, 0, 3),
                        before_reorder.index_select(0, at::tensor({1, 0}, at::kLong))));
}

TEST(StepHistory, AssignedReplayIsExtendedAndReorderedWithoutBeingWritten) {
  const at::Tensor hypo = at::tensor({2, 2, 0}, at::kLong);
  for (const bool reorder : {false, true}) {
    const at::Tensor replayed = at::randn({3, 5, 2});
    const at::Tensor replayed_before = replayed.clone();
    StepHistory history(64);
    history.Assign(replayed);
    at::Tensor expected = replayed_before;
    for (int64_t t = 0; t < 20; ++t) {  // past the assigned positions, then past the doubling
      const at::Tensor rows = reorder ? hypo : at::Tensor();
      const at::Tensor x = at::randn({3, 1, 2});
      expected = Reference(expected, expected.size(1), rows, x);
      history.Advance(history.length(), rows, x);
      ASSERT_TRUE(at::equal(history.tensor(), expected)) << "step " << t;
    }
    EXPECT_TRUE(at::equal(replayed, replayed_before));
  }
}

TEST(StepHistory, FailedStepsLeaveTheHistoryAndMovesLeaveItEmpty) {
  StepHistory history;
  history.Advance(0, {}, at::randn({2, 3, 4}));
  const at::Tensor kept = history.tensor().clone();
  // A row index out of range fails in the reorder, before anything is replaced.
  EXPECT_THROW(history.Advance(3, at::tensor({0, 7}, at::kLong), at::randn({2, 1, 4})), c10::Error);
  EXPECT_TRUE(at::equal(history.tensor(), kept));
  EXPECT_EQ(history.length(), 3);

  StepHistory moved = std::move(history);
  EXPECT_TRUE(at::equal(moved.tensor(), kept));
  EXPECT_EQ(history.length(), 0);  // NOLINT(bugprone-use-after-move): what is checked
  EXPECT_FALSE(history.tensor().defined());
  EXPECT_EQ(history.capacity(), 0);
}

TEST(StepHistory, OtherShapesAndTypesBehaveAsConcatenation) {
  StepHistory history;
  history.Advance(0, {}, at::ones({2, 3, 4}));
  // Another dtype: promoted, as at::cat does.
  history.Advance(3, {}, at::ones({2, 1, 4}, at::kDouble));
  EXPECT_EQ(history.tensor().scalar_type(), at::kDouble);
  EXPECT_EQ(history.length(), 4);
  // The promoted history then appends in place (into the storage the concatenation made).
  const void* storage = history.tensor().data_ptr();
  history.Advance(2, {}, at::full({2, 2, 4}, 3.0, at::kDouble));
  EXPECT_EQ(history.tensor().data_ptr(), storage);
  EXPECT_TRUE(at::equal(
      history.tensor(),
      at::cat({at::ones({2, 2, 4}, at::kDouble), at::full({2, 2, 4}, 3.0, at::kDouble)}, 1)));
  // Another batch or hidden size fails as at::cat fails, and the history is unchanged.
  const at::Tensor kept = history.tensor().clone();
  EXPECT_THROW(history.Advance(4, {}, at::ones({3, 1, 4}, at::kDouble)), c10::Error);
  EXPECT_THROW(history.Advance(4, {}, at::ones({2, 1, 5}, at::kDouble)), c10::Error);
  EXPECT_TRUE(at::equal(history.tensor(), kept));
  // A position past the history and a tensor that is not [B, T, H] are errors.
  EXPECT_THROW(history.Advance(5, {}, at::ones({2, 1, 4}, at::kDouble)), c10::Error);
  EXPECT_THROW(history.Advance(4, {}, at::ones({2, 4}, at::kDouble)), c10::Error);
  // Position 0 starts afresh, whatever the batch.
  history.Advance(0, {}, at::ones({5, 2, 4}));
  EXPECT_EQ(history.tensor().sizes(), (std::vector<int64_t>{5, 2, 4}));
}

}  // namespace
}  // namespace colony::serve
