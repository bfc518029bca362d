// The collaborative optimizer with several peers in one process, on real sockets: each peer has
// its own DHT node and averager, and trains on its own thread. Gradients are set by hand so that
// the expected result of every global step is known exactly.
#include "train/collaborative.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <thread>

#include "test_support.h"
#include "train/audit.h"
#include "train/collaborative_swarm.h"
#include "train/optimizer_state.h"
#include "train/optimizers.h"

namespace colony::train {
namespace {

using namespace std::chrono_literals;
using test::Gradient;
using test::kSize;
using test::Peer;
using test::Swarm;
using test::Train;

TEST(CollaborativeTest, AveragedGradientIsTheSampleWeightedMean) {
  Swarm swarm;
  const int64_t target = 1000;
  for (int i = 0; i < 4; ++i) swarm.Add({.target_batch_size = target});
  const std::vector<StepReport> reports = test::TrainOneEpochEach(swarm);
  ASSERT_EQ(reports.size(), 4u);
  // Expected: w = -sum(s_i g_i) / sum(s_i), with s_i the samples each peer contributed.
  const auto [expected, total] = test::SampleWeightedStep(swarm);
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(reports[i].averaged) << reports[i].note;
    EXPECT_EQ(reports[i].group_size, 4u);
    EXPECT_EQ(reports[i].realized_batch, total);
    EXPECT_TRUE(at::allclose(swarm.peers()[i]->w.detach(), expected, 1e-5, 1e-6));
    EXPECT_EQ(swarm.peers()[i]->co->local_epoch(), 1);
  }
  // The realized global batch stays close to the target: peers learn within a refresh
  // (50 ms here, about 2.5 batches of each peer) that the swarm is ready.
  EXPECT_GE(total, target);
  EXPECT_LE(static_cast<double>(total), 1.2 * static_cast<double>(target));
}

// Verified rounds (BTARD's check of the reducers): honest peers ban nobody and still step with
// the exact sample-weighted mean.
TEST(CollaborativeTest, VerifiedRoundsStepWithTheSampleWeightedMean) {
  Swarm swarm;
  for (int i = 0; i < 3; ++i) swarm.Add({.target_batch_size = 600, .verify_rounds = true});
  const std::vector<StepReport> reports = test::TrainOneEpochEach(swarm);
  ASSERT_EQ(reports.size(), 3u);
  const auto [expected, total] = test::SampleWeightedStep(swarm);
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(reports[i].averaged) << reports[i].note;
    EXPECT_EQ(reports[i].group_size, 3u);
    EXPECT_TRUE(at::allclose(swarm.peers()[i]->w.detach(), expected, 1e-5, 1e-6));
  }
  EXPECT_FALSE(CollaborativeOptimizer::Create(
                   *swarm.peers()[0]->node, {at::zeros({4})}, swarm.peers()[0]->opt,
                   {.run_id = "x", .verify_rounds = true, .diloco_inner_steps = 2})
                   .ok());
}

// Delayed averaging overlaps gradient rounds only: asked for with DiLoCo or local updates, which
// average parameters, it is refused by name rather than ignored.
TEST(CollaborativeTest, DelayedAveragingWithParameterAveragingIsRefusedByName) {
  Swarm swarm;
  swarm.Add({.target_batch_size = 100});
  auto& peer = *swarm.peers()[0];
  for (const CollaborativeOptions& o :
       {CollaborativeOptions{.run_id = "x", .delay_grad_averaging = true, .local_updates = true},
        CollaborativeOptions{
            .run_id = "x", .delay_grad_averaging = true, .diloco_inner_steps = 2}}) {
    auto made = CollaborativeOptimizer::Create(*peer.node, {at::zeros({4})}, peer.opt, o);
    ASSERT_FALSE(made.ok());
    EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(made.status().message().find("delay_grad_averaging"), std::string::npos)
        << made.status().ToString();
  }
  // Each alone is fine.
  EXPECT_TRUE(CollaborativeOptimizer::Create(*peer.node, {at::zeros({4})}, peer.opt,
                                             {.run_id = "y", .delay_grad_averaging = true})
                  .ok());
}

// A reducer that returns its own gradient as every part's mean: with verified rounds the honest
// peers ban it at the first epoch and average the next epochs among themselves.
TEST(CollaborativeTest, VerifiedRoundsBanACheatingReducerAndTrainOnWithoutIt) {
  Swarm swarm;
  for (int i = 0; i < 3; ++i) swarm.Add({.target_batch_size = 300, .verify_rounds = true});
  CollaborativeOptions liar{.target_batch_size = 300, .verify_rounds = true};
  liar.testing.wrong_result = true;
  swarm.Add(liar);
  const std::string liar_id = swarm.peers()[3]->node->peer_id().ToString();
  std::vector<std::future<std::vector<StepReport>>> runs;
  for (size_t i = 0; i < 4; ++i) {
    runs.push_back(std::async(std::launch::async, [&swarm, i] {
      return Train(*swarm.peers()[i], Gradient(static_cast<int>(i)), 10, i < 3 ? 3 : 1);
    }));
  }
  std::vector<std::vector<StepReport>> steps;
  for (auto& r : runs) steps.push_back(r.get());
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    ASSERT_EQ(steps[i].size(), 3u);
    EXPECT_TRUE(steps[i][0].averaged) << steps[i][0].note;
    EXPECT_EQ(steps[i][0].banned, std::vector<std::string>{liar_id});
    for (size_t e = 1; e < 3; ++e) {
      EXPECT_TRUE(steps[i][e].averaged) << steps[i][e].note;
      EXPECT_EQ(steps[i][e].group_size, 3u) << "epoch " << e;
      EXPECT_TRUE(steps[i][e].banned.empty());
    }
  }
}

// Audits: batch i of the data stream `seed` pulls w toward a target of its own (gradient
// w - target(seed, i)), which every peer can recompute for any other peer's claimed batches.
at::Tensor AuditTarget(uint64_t seed, int64_t index) {
  return at::arange(kSize, at::kFloat)
      .mul(0.05f)
      .add(static_cast<float>(seed % 7) + 0.3f * static_cast<float>(index % 11))
      .sin();
}

// What the attacker of an audited swarm does from epoch 1 on.
struct AuditedAttack {
  GradientAttack gradient = GradientAttack::kNone;       // what it sends instead of its gradient
  std::optional<uint64_t> chosen_stream = std::nullopt;  // it trains on this stream, claims it
  bool skips_odd_batches = false;                        // it leaves out its stream's odd batches
};

// Four peers, everyone audited every round, each training at every epoch on the first batches
// of the stream the run gives it (AuditDataSeed); peer 3 attacks from epoch 1 on. Every honest
// peer bans it in that epoch's round and nobody else, and the honest peers step alike.
void ExpectAuditsBanTheAttacker(const AuditedAttack& attack) {
  Swarm swarm;
  const int64_t batch = 10;
  for (int i = 0; i < 4; ++i) {
    auto w = std::make_shared<at::Tensor>();
    CollaborativeOptions o{.target_batch_size = 120, .verify_rounds = true, .audit_targets = 4};
    o.audit_data.batch_size = batch;
    o.audit_data.compute_batch = [w](uint64_t seed, int64_t, int64_t index) -> Result<int64_t> {
      w->mutable_grad() = w->detach() - AuditTarget(seed, index);
      return int64_t{10};
    };
    if (i == 3) {
      o.testing.attack_from_epoch = 1;
      o.testing.gradient_attack = attack.gradient;
      o.testing.chosen_data_seed = attack.chosen_stream;
    }
    *w = swarm.Add(o).w;
  }
  const std::string attacker = swarm.peers()[3]->node->peer_id().ToString();
  std::vector<std::future<std::vector<StepReport>>> runs;
  for (size_t i = 0; i < 4; ++i) {
    runs.push_back(std::async(std::launch::async, [&swarm, &attack, i] {
      Peer& p = *swarm.peers()[i];
      std::vector<StepReport> steps;
      int64_t epoch = -1;
      int64_t index = 0;  // in the epoch's stream
      for (int64_t b = 0; b < 2000 && steps.size() < (i < 3 ? 3u : 2u); ++b) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (p.co->local_epoch() != epoch) {
          epoch = p.co->local_epoch();
          index = 0;
        }
        const bool attacking = i == 3 && epoch >= 1;
        if (attacking && attack.skips_odd_batches && index % 2 == 1) {
          ++index;
          continue;
        }
        const uint64_t stream = attacking && attack.chosen_stream
                                    ? *attack.chosen_stream
                                    : AuditDataSeed("test.run", p.node->peer_id(), epoch);
        p.w.mutable_grad() = p.w.detach() - AuditTarget(stream, index);
        auto r = p.co->Step(batch, index++);
        EXPECT_TRUE(r.ok()) << r.status().ToString();
        if (!r.ok()) break;
        if (r->stepped) steps.push_back(*r);
      }
      return steps;
    }));
  }
  std::vector<std::vector<StepReport>> steps;
  for (auto& r : runs) steps.push_back(r.get());
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    ASSERT_EQ(steps[i].size(), 3u);
    EXPECT_TRUE(steps[i][0].banned.empty());  // honest data at epoch 0, the attacker's too
    EXPECT_EQ(steps[i][1].banned, std::vector<std::string>{attacker});
    EXPECT_TRUE(steps[i][2].banned.empty());
    for (const auto& s : steps[i]) EXPECT_TRUE(s.averaged) << s.note;
    EXPECT_EQ(steps[i][2].group_size, 3u);
    // The honest peers stepped alike (audits need it: they compare parameters).
    EXPECT_TRUE(at::equal(swarm.peers()[i]->w.detach(), swarm.peers()[0]->w.detach()));
  }
}

// A peer that sends its gradient's negation, claiming its true data.
TEST(CollaborativeTest, AuditsBanAPeerWhoseGradientIsNotWhatItsDataGives) {
  ExpectAuditsBanTheAttacker({.gradient = GradientAttack::kSignFlip});
}

// A peer that trains on data it chose (another stream: one it searched for, say) and says so:
// its values are what that data gives, but the run gave it other data.
TEST(CollaborativeTest, AuditsBanAPeerThatTrainedOnDataOfItsOwnChoosing) {
  ExpectAuditsBanTheAttacker({.chosen_stream = 12345});
}

// A peer that picks which of its batches to send (here every other one): the batches it left
// out give finite gradients, which an honest peer would have sent.
TEST(CollaborativeTest, AuditsBanAPeerThatLeftOutBatchesOfItsData) {
  ExpectAuditsBanTheAttacker({.skips_odd_batches = true});
}

// Delayed updates: each round runs in the background during the next batch and is applied a
// batch later; the peers still apply the same averaged gradients.
TEST(CollaborativeTest, DelayedAveragingAppliesTheSameStepsOnEveryPeer) {
  test::DelayedAveragingAppliesTheSameSteps(c10::kCPU);
}

// Local updates: every peer steps on each of its batches, and the parameters are averaged
// (weighted by samples) when the swarm reaches the target batch.
TEST(CollaborativeTest, LocalUpdatesAverageParametersAtEachEpoch) {
  Swarm swarm;
  for (int i = 0; i < 2; ++i) swarm.Add({.target_batch_size = 200, .local_updates = true});
  std::vector<std::future<std::vector<StepReport>>> runs;
  for (int i = 0; i < 2; ++i) {
    runs.push_back(std::async(std::launch::async,
                              [&, i] { return Train(*swarm.peers()[i], Gradient(i), 4, 2); }));
  }
  for (auto& r : runs) {
    auto steps = r.get();
    ASSERT_EQ(steps.size(), 2u);
    EXPECT_TRUE(steps[1].averaged) << steps[1].note;
  }
  const at::Tensor w0 = swarm.peers()[0]->w.detach(), w1 = swarm.peers()[1]->w.detach();
  EXPECT_TRUE(at::allclose(w0, w1, 1e-5, 1e-6));
  // Each local SGD step (lr 1) moves by -g_i; the average lies between the two peers' paths.
  const int64_t batches = swarm.peers()[0]->co->counters().local_batches;
  EXPECT_TRUE((w0 < 0).all().item<bool>());
  EXPECT_TRUE((w0 >= -static_cast<float>(batches + 50) * Gradient(1)).all().item<bool>());
  EXPECT_EQ(swarm.peers()[0]->co->counters().state_loads, 0);
}

TEST(CollaborativeTest, PeerSendingNonFiniteGradientsDoesNotDerailTheSwarm) {
  Swarm swarm;
  for (int i = 0; i < 3; ++i) swarm.Add({.target_batch_size = 300});
  swarm.Add({.target_batch_size = 300, .testing = {.unchecked_local_gradients = true}});
  at::Tensor nan_grad = Gradient(3);
  nan_grad[5] = std::numeric_limits<float>::quiet_NaN();
  nan_grad[9] = std::numeric_limits<float>::infinity();
  std::vector<std::future<std::vector<StepReport>>> runs;
  for (int i = 0; i < 4; ++i) {
    runs.push_back(std::async(std::launch::async, [&, i] {
      return Train(*swarm.peers()[i], i == 3 ? nan_grad : Gradient(i), 4, 2);
    }));
  }
  for (auto& r : runs) EXPECT_EQ(r.get().size(), 2u);
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(at::isfinite(swarm.peers()[i]->w.detach()).all().item<bool>());
  }
  // The honest peers moved by the mean of the honest gradients only (equal batch sizes give
  // equal weights only approximately, so bound it by the honest range).
  const at::Tensor w0 = swarm.peers()[0]->w.detach();
  for (int i = 1; i < 3; ++i) EXPECT_TRUE(at::allclose(swarm.peers()[i]->w.detach(), w0));
  const at::Tensor lo = -2 * Gradient(2), hi = -2 * Gradient(0);
  EXPECT_TRUE((w0 >= lo - 1e-5).all().item<bool>() && (w0 <= hi + 1e-5).all().item<bool>()) << w0;
}

TEST(CollaborativeTest, LocallyNonFiniteBatchesAreSkipped) {
  Swarm swarm;
  Peer& p = swarm.Add({.target_batch_size = 8});
  at::Tensor bad = Gradient(0);
  bad[0] = std::numeric_limits<float>::quiet_NaN();
  p.w.mutable_grad() = bad;
  auto r = p.co->Step(4);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->skipped_nonfinite);
  EXPECT_FALSE(r->stepped);
  EXPECT_EQ(p.co->counters().skipped_batches, 1);
  EXPECT_EQ(p.co->counters().local_samples, 0);
  // A lone peer then steps on its own once it has the target batch.
  auto steps = Train(p, Gradient(0), 4, 1, 0ms);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].group_size, 1u);
  EXPECT_TRUE(at::allclose(p.w.detach(), -Gradient(0)));
}

// A learning-rate schedule scales each global step's rate by its factor at the step's epoch:
// SGD with rate 1 and a constant gradient G moves w by -factor(e) G at epoch e. Factors of
// transformers' linear schedule with 1 warmup step and 4 in all: 0, 1, 2/3, 1/3, 0.
TEST(CollaborativeTest, ALearningRateScheduleScalesEachGlobalStep) {
  Swarm swarm;
  Peer& p = swarm.Add(
      {.target_batch_size = 8,
       .lr_schedule = {.kind = LrSchedule::Kind::kLinear, .warmup_epochs = 1, .total_epochs = 4}});
  const double factors[] = {0.0, 1.0, 2.0 / 3.0, 1.0 / 3.0, 0.0};
  double moved = 0;
  for (int e = 0; e < 5; ++e) {
    SCOPED_TRACE(e);
    ASSERT_EQ(Train(p, Gradient(0), 4, 1, 0ms).size(), 1u);
    moved += factors[e];
    EXPECT_TRUE(at::allclose(p.w.detach(), Gradient(0).mul(-moved), 1e-5, 1e-6));
  }
  // The optimizer's own rate is the schedule's at the last step, from the rate it came with.
  EXPECT_DOUBLE_EQ(p.opt->param_groups()[0].options().get_lr(), 0.0);
}

TEST(CollaborativeTest, ADecayingScheduleNeedsEpochsBeyondItsWarmup) {
  dht::NodeOptions o;
  o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  auto node = dht::Node::Start(KeyPair::Generate(), o);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  at::Tensor w = at::zeros({4}).set_requires_grad(true);
  auto opt = std::make_shared<torch::optim::SGD>(std::vector<at::Tensor>{w},
                                                 torch::optim::SGDOptions(1.0));
  auto co = CollaborativeOptimizer::Create(
      **node, {w}, opt,
      {.run_id = "r",
       .lr_schedule = {
           .kind = LrSchedule::Kind::kCosine, .warmup_epochs = 10, .total_epochs = 10}});
  ASSERT_FALSE(co.ok());
  EXPECT_NE(co.status().message().find("lr_schedule cosine decays the rate to 0 at "
                                       "lr_schedule.total_epochs (10), which must be above "
                                       "lr_schedule.warmup_epochs (10)"),
            std::string::npos)
      << co.status().ToString();
}

// Two Adam peers (global batch 100) train three epochs together: the donors of the tests below.
void TwoAdamPeersTrainThreeEpochs(Swarm& swarm) {
  for (int i = 0; i < 2; ++i) swarm.Add({.target_batch_size = 100}, /*adam=*/true);
  std::vector<std::future<std::vector<StepReport>>> runs;
  for (int i = 0; i < 2; ++i) {
    runs.push_back(std::async(std::launch::async,
                              [&, i] { return Train(*swarm.peers()[i], Gradient(i), 5, 3, 5ms); }));
  }
  for (auto& r : runs) ASSERT_EQ(r.get().size(), 3u);
}

TEST(CollaborativeTest, NewcomerDownloadsParametersOptimizerStateAndEpoch) {
  Swarm swarm;
  ASSERT_NO_FATAL_FAILURE(TwoAdamPeersTrainThreeEpochs(swarm));
  Peer& late = swarm.Add({.target_batch_size = 100}, /*adam=*/true);
  ASSERT_TRUE(late.co->LoadStateFromPeers().ok());
  EXPECT_EQ(late.co->local_epoch(), 3);
  EXPECT_TRUE(at::equal(late.w.detach(), swarm.peers()[0]->w.detach()));
  auto mine = ExportOptimizerState(*late.opt);
  auto theirs = ExportOptimizerState(*swarm.peers()[0]->opt);
  ASSERT_EQ(mine.size(), theirs.size());
  ASSERT_FALSE(mine.empty());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(mine[i].first, theirs[i].first);
    EXPECT_TRUE(at::equal(mine[i].second, theirs[i].second)) << mine[i].first;
  }
}

// A donor's state is checked against this peer's model before any tensor data comes: a peer of
// the same run whose parameter has another shape (a confused or hostile donor, as seen from it)
// downloads nothing and says why.
TEST(CollaborativeTest, NewcomerRefusesAStateThatDoesNotFitItsModel) {
  Swarm swarm;
  ASSERT_NO_FATAL_FAILURE(TwoAdamPeersTrainThreeEpochs(swarm));
  Peer& other =
      swarm.Add({.target_batch_size = 100, .load_state_timeout = 3s}, /*adam=*/true, kSize + 1);
  Status st = other.co->LoadStateFromPeers();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("is not a parameter of this model"), std::string::npos)
      << st.ToString();
  EXPECT_EQ(other.co->local_epoch(), 0);
  EXPECT_TRUE(at::equal(other.w.detach(), at::zeros({kSize + 1})));
}

TEST(CollaborativeTest, DilocoAppliesNesterovToTheAveragedPseudoGradient) {
  Swarm swarm;
  CollaborativeOptions o{.target_batch_size = 1,
                         .diloco_inner_steps = 2,
                         .outer_lr = 0.5,
                         .outer_momentum = 0.9,
                         .diloco_codec = compression::Codec::kNone};
  for (int i = 0; i < 2; ++i) swarm.Add(o);
  std::vector<std::future<std::vector<StepReport>>> runs;
  for (int i = 0; i < 2; ++i) {
    runs.push_back(std::async(std::launch::async,
                              [&, i] { return Train(*swarm.peers()[i], Gradient(i), 3, 1, 5ms); }));
  }
  for (auto& r : runs) {
    auto steps = r.get();
    ASSERT_EQ(steps.size(), 1u);
    EXPECT_TRUE(steps[0].averaged) << steps[0].note;
  }
  // Inner SGD (lr 1) for 2 steps: delta_i = 2 g_i; equal weights; m = delta;
  // Nesterov step = delta + 0.9 m; w = 0 - 0.5 * 1.9 * mean(delta).
  const at::Tensor delta = (2 * Gradient(0) + 2 * Gradient(1)) / 2;
  const at::Tensor expected = -0.5 * 1.9 * delta;
  for (auto& p : swarm.peers()) {
    EXPECT_TRUE(at::allclose(p->w.detach(), expected, 1e-5, 1e-6)) << p->w;
    EXPECT_EQ(p->co->local_epoch(), 1);
  }
}

TEST(CollaborativeTest, CheckpointRoundTrip) {
  colony::test::TempDir dir("ckpt");
  const auto file = dir.path() / "checkpoint.safetensors";
  Swarm swarm;
  Peer& a = swarm.Add({.target_batch_size = 4}, /*adam=*/true);
  ASSERT_EQ(Train(a, Gradient(0), 4, 2, 0ms).size(), 2u);
  ASSERT_TRUE(a.co->SaveCheckpoint(file).ok());
  Swarm other;
  Peer& b = other.Add({.target_batch_size = 4}, /*adam=*/true);
  Status st = b.co->LoadCheckpoint(file);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(b.co->local_epoch(), 2);
  EXPECT_TRUE(at::equal(a.w.detach(), b.w.detach()));
  // Both continue identically.
  Train(a, Gradient(1), 4, 1, 0ms);
  Train(b, Gradient(1), 4, 1, 0ms);
  EXPECT_TRUE(at::equal(a.w.detach(), b.w.detach()));
  // Garbage is refused with a message.
  { std::ofstream(file) << "not a checkpoint"; }
  EXPECT_FALSE(b.co->LoadCheckpoint(file).ok());
  std::filesystem::remove(file);
}

}  // namespace
}  // namespace colony::train
