// The collaborative optimizer with its parameters on a GPU (the default of `colony train
// --device cuda`): gradients are checked and accumulated there, the optimizer steps there, and
// only a round's mean gradient, a newcomer's state and checkpoints pass through host memory.
// Every expected value is computed apart on the CPU (the sample-weighted mean, the SGD step) or
// taken from a CPU peer doing the same. ctest label gpu; skipped, saying why, without a usable GPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <future>
#include <limits>
#include <vector>

#include "model/device.h"
#include "test_support.h"
#include "train/collaborative_swarm.h"
#include "train/optimizer_state.h"

namespace colony::train {
namespace {

using test::Gradient;
using test::kSize;
using test::Peer;
using test::Swarm;
using test::Train;

c10::Device Gpu() { return *model::ParseDevice("cuda"); }

#define SKIP_WITHOUT_GPU()                                                                     \
  if (!model::CudaAvailable()) {                                                               \
    GTEST_SKIP() << "needs a CUDA device: " << model::ParseDevice("cuda").status().ToString(); \
  }

// Two GPU peers and a CPU peer average one epoch: every peer steps with the sample-weighted mean
// of the three gradients, whatever device it computes on.
TEST(CollaborativeGpuTest, GpuAndCpuPeersStepWithTheSampleWeightedMean) {
  SKIP_WITHOUT_GPU();
  Swarm swarm;
  const c10::Device devices[] = {Gpu(), Gpu(), c10::kCPU};
  for (const auto& d : devices) swarm.Add({.target_batch_size = 600}, false, kSize, d);
  const std::vector<StepReport> reports = test::TrainOneEpochEach(swarm);
  ASSERT_EQ(reports.size(), 3u);
  const at::Tensor expected = test::SampleWeightedStep(swarm).first;
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(reports[i].averaged) << reports[i].note;
    EXPECT_EQ(reports[i].group_size, 3u);
    EXPECT_EQ(swarm.peers()[i]->w.device(), devices[i]) << "w moved off its device";
    EXPECT_TRUE(at::allclose(swarm.peers()[i]->Host(), expected, 1e-5, 1e-6));
  }
}

// A lone GPU peer skips a batch whose gradients are not finite (the check runs on the GPU), then
// steps alone with its own mean gradient, clipped to max_grad_norm, without a round.
TEST(CollaborativeGpuTest, ALoneGpuPeerSkipsNonFiniteBatchesAndClipsItsStep) {
  SKIP_WITHOUT_GPU();
  Swarm swarm;
  Peer& p = swarm.Add({.target_batch_size = 8, .max_grad_norm = 0.5}, false, kSize, Gpu());
  at::Tensor bad = Gradient(0);
  bad[3] = std::numeric_limits<float>::infinity();
  p.w.mutable_grad() = bad.to(Gpu());
  auto r = p.co->Step(4);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->skipped_nonfinite);
  EXPECT_EQ(p.co->counters().local_samples, 0);
  auto steps = Train(p, Gradient(0), 4, 1, std::chrono::milliseconds(0));
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].group_size, 1u);
  const at::Tensor g = Gradient(0);
  const at::Tensor expected = -g * (0.5 / g.to(at::kDouble).norm().item<double>());
  EXPECT_TRUE(at::allclose(p.Host(), expected, 1e-5, 1e-7)) << p.Host();
}

// Delayed averaging on GPU peers: the round runs in the background on the host copy while the
// next batch accumulates on the GPU, and both peers apply the same steps.
TEST(CollaborativeGpuTest, DelayedAveragingOnGpuPeersAppliesTheSameSteps) {
  SKIP_WITHOUT_GPU();
  test::DelayedAveragingAppliesTheSameSteps(Gpu());
}

// Two Adam peers on the GPU train three epochs together: the donors of the tests below.
void TwoGpuAdamPeersTrainThreeEpochs(Swarm& swarm) {
  for (int i = 0; i < 2; ++i) swarm.Add({.target_batch_size = 100}, true, kSize, Gpu());
  std::vector<std::future<std::vector<StepReport>>> runs;
  for (int i = 0; i < 2; ++i) {
    runs.push_back(std::async(std::launch::async, [&, i] {
      return Train(*swarm.peers()[i], Gradient(i), 5, 3, std::chrono::milliseconds(5));
    }));
  }
  for (auto& r : runs) ASSERT_EQ(r.get().size(), 3u);
}

// Adam state that lives on a GPU reaches a newcomer on `device` as the same values, and its
// optimizer state ends on that device.
void NewcomerTakesTheGpuState(c10::Device device) {
  Swarm swarm;
  ASSERT_NO_FATAL_FAILURE(TwoGpuAdamPeersTrainThreeEpochs(swarm));
  Peer& donor = *swarm.peers()[0];
  Peer& late = swarm.Add({.target_batch_size = 100}, true, kSize, device);
  ASSERT_TRUE(late.co->LoadStateFromPeers().ok());
  EXPECT_EQ(late.co->local_epoch(), 3);
  EXPECT_TRUE(at::equal(late.Host(), donor.Host()));
  const auto theirs = ExportOptimizerState(*donor.opt);
  const auto mine = ExportOptimizerState(*late.opt);
  ASSERT_FALSE(theirs.empty());
  ASSERT_EQ(mine.size(), theirs.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(mine[i].first, theirs[i].first);
    if (mine[i].second.dim() > 0) {
      EXPECT_EQ(mine[i].second.device(), device) << mine[i].first;
    }
    EXPECT_TRUE(at::equal(mine[i].second.cpu(), theirs[i].second.cpu())) << mine[i].first;
  }
}

TEST(CollaborativeGpuTest, ACpuNewcomerTakesTheStateOfGpuPeers) {
  SKIP_WITHOUT_GPU();
  NewcomerTakesTheGpuState(c10::kCPU);
}

TEST(CollaborativeGpuTest, AGpuNewcomerTakesTheStateOfGpuPeers) {
  SKIP_WITHOUT_GPU();
  NewcomerTakesTheGpuState(Gpu());
}

// A GPU peer's checkpoint (parameters, Adam state, epoch) restores a GPU peer exactly.
TEST(CollaborativeGpuTest, AGpuPeersCheckpointRestoresAGpuPeer) {
  SKIP_WITHOUT_GPU();
  colony::test::TempDir dir("gpu-ckpt");
  const auto file = dir.path() / "checkpoint.safetensors";
  Swarm swarm;
  Peer& a = swarm.Add({.target_batch_size = 4}, true, kSize, Gpu());
  ASSERT_EQ(Train(a, Gradient(0), 4, 2, std::chrono::milliseconds(0)).size(), 2u);
  ASSERT_TRUE(a.co->SaveCheckpoint(file).ok());
  Swarm other;
  Peer& b = other.Add({.target_batch_size = 4}, true, kSize, Gpu());
  Status st = b.co->LoadCheckpoint(file);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(b.co->local_epoch(), 2);
  EXPECT_TRUE(at::equal(a.Host(), b.Host()));
  // Both continue identically.
  Train(a, Gradient(1), 4, 1, std::chrono::milliseconds(0));
  Train(b, Gradient(1), 4, 1, std::chrono::milliseconds(0));
  EXPECT_TRUE(at::equal(a.Host(), b.Host()));
}

}  // namespace
}  // namespace colony::train
