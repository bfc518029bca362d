// The tasks' part in audits (task.h): drawing their data by epoch, and another peer recomputing
// the gradient of a batch of that data at the same parameters, in pieces of its own batch size
// when the batch is larger.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "train/task.h"

namespace colony::train {
namespace {

TaskOptions SmallLm(int64_t batch_size) {
  return {.task = "lm",
          .batch_size = batch_size,
          .seed = 1,
          .init_seed = 3,
          .corpus_bytes = 300'000,
          .vocab_size = 512,
          .seq_len = 32};
}

// The parameters' gradients, flat, and zeroes them.
at::Tensor TakeGrads(Task& task) {
  std::vector<at::Tensor> flat;
  for (auto& p : task.Parameters()) {
    flat.push_back(p.grad().defined() ? p.grad().flatten().clone() : at::zeros({p.numel()}));
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
  return at::cat(flat);
}

// Peer a trains on batches 0 and 1 of its epoch-2 stream; peer b, at the same parameters but
// with smaller batches (so a's batch is recomputed in pieces), recomputes batch 1 from the
// stream's seed and index alone and gets a's gradient; batch 0, or batch 1 of another epoch's
// stream, gives another.
void ExpectAnotherPeerRecomputesABatch(const TaskOptions& peer_a, const TaskOptions& peer_b) {
  auto a = Task::Create(peer_a);
  auto b = Task::Create(peer_b);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto seed_of = [](int64_t epoch) { return 1000 + static_cast<uint64_t>(epoch); };
  (*a)->DrawDataByEpoch(seed_of);
  (*a)->SetEpoch(2);
  EXPECT_EQ((*a)->NextBatchIndex(), 0);
  ASSERT_TRUE((*a)->TrainBatch().ok());
  const at::Tensor batch0 = TakeGrads(**a);
  ASSERT_TRUE((*a)->TrainBatch().ok());
  const at::Tensor batch1 = TakeGrads(**a);
  EXPECT_EQ((*a)->NextBatchIndex(), 2);
  ASSERT_GT(batch1.norm().item<double>(), 0);

  const int64_t size = peer_a.batch_size;
  auto n = (*b)->ComputeBatchOf(seed_of(2), size, 1);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, size);
  const at::Tensor recomputed = TakeGrads(**b);
  EXPECT_TRUE(at::allclose(recomputed, batch1, /*rtol=*/1e-4, /*atol=*/1e-6))
      << "largest difference " << (recomputed - batch1).abs().max().item<double>();
  EXPECT_FALSE(at::allclose(batch0, batch1, 1e-2, 1e-4));
  ASSERT_TRUE((*b)->ComputeBatchOf(seed_of(3), size, 1).ok());
  EXPECT_FALSE(at::allclose(TakeGrads(**b), batch1, 1e-2, 1e-4));
  // Going back to an earlier batch of the same stream reads it again.
  ASSERT_TRUE((*b)->ComputeBatchOf(seed_of(2), size, 0).ok());
  EXPECT_TRUE(at::allclose(TakeGrads(**b), batch0, 1e-4, 1e-6));

  // The next epoch's data is its own stream, from its start.
  (*a)->SetEpoch(3);
  EXPECT_EQ((*a)->NextBatchIndex(), 0);
  EXPECT_FALSE((*b)->ComputeBatchOf(seed_of(2), 0, 1).ok());
  EXPECT_FALSE((*b)->ComputeBatchOf(seed_of(2), size, -1).ok());
}

// Batches of 4 token windows recomputed in pieces of 3 and 1.
TEST(LmTaskTest, AnotherPeerRecomputesTheGradientOfABatchOfAnEpochsStream) {
  ExpectAnotherPeerRecomputesABatch(SmallLm(4), SmallLm(3));
}

// Batches of 64 images recomputed in pieces of 10 (the CNN: a claimed batch far larger than
// the auditor's own must not take memory in proportion).
TEST(FashionTaskTest, AnotherPeerRecomputesTheGradientOfABatchOfAnEpochsStream) {
  TaskOptions a{.task = "fashion-mnist", .batch_size = 64, .init_seed = 3};
  TaskOptions b = a;
  b.batch_size = 10;
  ExpectAnotherPeerRecomputesABatch(a, b);
}

}  // namespace
}  // namespace colony::train
