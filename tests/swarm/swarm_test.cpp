// SWARM training on loopback: stage servers (swarm/stage.h) with two peers per stage, a trainer
// (swarm/pipeline.h with a collaborative optimizer for its own parameters), against the same
// checkpoint trained in one process with the same batches and optimizer (an independent
// reference: plain LibTorch autograd and Adam over the whole model).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/files.h"
#include "dht/validation.h"
#include "loopback_dht.h"
#include "model/checkpoint.h"
#include "model/llama.h"
#include "runtime/tensor_io.h"
#include "serve/routing.h"
#include "serve/server.h"
#include "serve/wire.h"
#include "swarm/pipeline.h"
#include "swarm/stage.h"
#include "test_support.h"
#include "tiny_llama.h"
#include "train/collaborative.h"
#include "train/optimizers.h"
#include "train/progress_record.h"

namespace colony::swarm {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kMicrobatch = 2;  // sequences per microbatch
constexpr int64_t kPerEpoch = 4;    // microbatches per epoch (the target batch is 8)
constexpr int64_t kSeqLen = 12;
constexpr double kLr = 1e-2;

model::LlamaConfig Config() { return test::TinyStageModelConfig(); }

train::CollaborativeOptions Rounds(const std::string& run) {
  train::CollaborativeOptions o;
  o.run_id = run;
  o.target_batch_size = kMicrobatch * kPerEpoch;
  o.matchmaking_time = 3s;
  o.averaging_timeout = 30s;
  o.load_state_timeout = 3s;
  o.progress_min_refresh = 50ms;
  o.progress_max_refresh = 300ms;
  return o;
}

// A stage peer's training whose first backward is held until the trainer fences it (or the test
// opens it), before it runs (the peer never saw it when the trainer's deadline passed) or after
// (it took the microbatch's gradient but its reply came too late). Everything else runs as any
// peer's.
class LateFirstBackward final : public serve::BlockTraining {
 public:
  enum class Hold { kBeforeRunning, kAfterRunning };
  // fence_delay: how long the first fence waits before it is answered (past the trainer's 3 s,
  // it goes unanswered).
  explicit LateFirstBackward(Hold hold, std::chrono::milliseconds fence_delay = {})
      : hold_(hold), fence_delay_(fence_delay) {}
  void Wrap(std::shared_ptr<StageTraining> inner) { inner_ = std::move(inner); }
  StageTraining& inner() { return *inner_; }

  Status Run(const serve::TrainingCall& call, const std::function<Status()>& compute) override {
    bool held = false;
    {
      std::lock_guard lock(mu_);
      if (call.backward && !reached_) held = reached_ = true;
    }
    if (held && hold_ == Hold::kBeforeRunning) Wait();
    Status st = inner_->Run(call, compute);
    if (held && hold_ == Hold::kAfterRunning) Wait();
    if (held) {
      std::lock_guard lock(mu_);
      done_ = true;
      cv_.notify_all();
    }
    return st;
  }
  bool Fence(uint64_t microbatch, int64_t start, int64_t end, uint32_t attempt) override {
    if (!fenced_.exchange(true)) std::this_thread::sleep_for(fence_delay_);
    const bool taken = inner_->Fence(microbatch, start, end, attempt);
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
    return taken;
  }
  bool reached() {
    std::lock_guard lock(mu_);
    return reached_;
  }
  // Lets the held backward go and waits until it ran.
  bool OpenAndWait() {
    std::unique_lock lock(mu_);
    open_ = true;
    cv_.notify_all();
    return cv_.wait_for(lock, test::HangGuard(30s), [&] { return done_; });
  }

 private:
  void Wait() {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, test::HangGuard(60s), [&] { return open_; });
  }
  const Hold hold_;
  const std::chrono::milliseconds fence_delay_;
  std::atomic<bool> fenced_{false};
  std::shared_ptr<StageTraining> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool reached_ = false, open_ = false, done_ = false;
};

class SwarmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    dir_ = colony::test::TempPath("swarm-test");
    at::manual_seed(7);
    model::LlamaModel m(Config());
    ASSERT_TRUE(model::SaveLlama(dir_, m).ok());
    Status started = dht_.Start();
    ASSERT_TRUE(started.ok()) << started.ToString();
    // Counting sequences from random starts (s, s + 1, ... mod V): learnable.
    at::manual_seed(11);
    const at::Tensor steps = at::arange(kSeqLen + 1, at::kLong).unsqueeze(0);
    for (int i = 0; i < 24; ++i) {
      const at::Tensor starts = at::randint(Config().vocab_size, {kMicrobatch, 1}, at::kLong);
      batches_.push_back((starts + steps).remainder(Config().vocab_size));
    }
  }

  void TearDown() override {
    trainer_opt_.reset();
    pipeline_.reset();
    stages_.clear();
    StopLateStage();
    late_server_.reset();
    dht_.Shutdown();
    RemoveTree(dir_);
  }

  dht::Node& AddNode() { return dht_.Add(); }

  Stage& AddStage(int64_t first, int64_t last, int powersgd_rank = 0) {
    dht::Node& node = AddNode();
    StageOptions o;
    o.run = "run";
    o.model_dir = dir_;
    o.first_block = first;
    o.last_block = last;
    o.server.throughput_override = 100;
    o.server.announce_period = 1s;
    o.training.optimizer_config.lr = kLr;
    o.training.collaborative = Rounds("");
    o.training.collaborative.powersgd_rank = powersgd_rank;
    auto stage = Stage::Start(node, o);
    EXPECT_TRUE(stage.ok()) << stage.status().ToString();
    stages_.push_back(std::move(*stage));
    return *stages_.back();
  }

  void StartTrainer(compression::Codec boundary = compression::Codec::kNone,
                    std::chrono::milliseconds request_timeout = 60s,
                    std::chrono::milliseconds avoid_failed_for = 20s) {
    dht::Node& node = AddNode();
    auto p = Pipeline::Create(node, {.run = "run",
                                     .model_dir = dir_,
                                     .request_timeout = request_timeout,
                                     .avoid_failed_for = avoid_failed_for,
                                     .routing_seed = 5,
                                     .boundary_codec = boundary});
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    pipeline_ = std::move(*p);
    train::OptimizerConfig oc;
    oc.lr = kLr;
    auto inner = train::MakeOptimizer("adam", pipeline_->parameters(), oc);
    ASSERT_TRUE(inner.ok());
    auto opt = train::CollaborativeOptimizer::Create(
        node, pipeline_->parameters(), std::shared_ptr<torch::optim::Optimizer>(std::move(*inner)),
        Rounds("run"));
    ASSERT_TRUE(opt.ok()) << opt.status().ToString();
    trainer_opt_ = std::move(*opt);
  }

  // Waits until the trainer's routing sees `n` stage servers.
  void WaitForServers(size_t n) {
    ASSERT_TRUE(test::WaitUntil(
        [&] {
          (void)pipeline_->manager().Refresh();
          return pipeline_->manager().Servers().size() >= n;
        },
        test::HangGuard(10s)))
        << "the trainer sees " << pipeline_->manager().Servers().size() << " of " << n
        << " stage servers";
  }

  // The trainer's loop over microbatches [from, to): the losses it computed.
  std::vector<double> Train(size_t from, size_t to, bool steps_at_target = true) {
    std::vector<double> losses;
    for (size_t i = from; i < to; ++i) {
      pipeline_->SetEpoch(trainer_opt_->local_epoch());
      auto loss = pipeline_->TrainStep(batches_[i]);
      EXPECT_TRUE(loss.ok()) << "microbatch " << i << ": " << loss.status().ToString();
      if (!loss.ok()) return losses;
      losses.push_back(*loss);
      auto r = trainer_opt_->Step(kMicrobatch);
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      // The trainer steps exactly at the target batch: it is alone in its own run.
      if (steps_at_target) {
        EXPECT_EQ(r->stepped, (i + 1) % kPerEpoch == 0) << "microbatch " << i;
      }
    }
    return losses;
  }

  // The reference: the checkpoint trained in one process, one Adam step per kPerEpoch
  // microbatches on the mean of their gradients. Returns each microbatch's loss.
  std::vector<double> TrainLocally(model::LlamaModel& m, size_t microbatches) {
    torch::optim::Adam adam(m->parameters(), torch::optim::AdamOptions(kLr));
    std::vector<double> losses;
    for (size_t i = 0; i < microbatches; ++i) {
      const at::Tensor& b = batches_[i];
      at::Tensor loss =
          model::LanguageModelLoss(m->forward(b.slice(1, 0, kSeqLen)), b.slice(1, 1, kSeqLen + 1));
      losses.push_back(loss.item<double>());
      (loss / static_cast<double>(kPerEpoch)).backward();
      if ((i + 1) % kPerEpoch == 0) {
        adam.step();
        adam.zero_grad();
      }
    }
    return losses;
  }

  // A peer of stage [0, 4) whose first backward comes late (LateFirstBackward), kept in late_.
  void AddLateStage(LateFirstBackward::Hold hold, std::chrono::milliseconds fence_delay = {}) {
    dht::Node& node = AddNode();
    late_ = std::make_shared<LateFirstBackward>(hold, fence_delay);
    serve::ServerOptions so;
    so.model_dir = dir_;
    so.model_name = "run";
    so.first_block = 0;
    so.last_block = 4;
    so.throughput_override = 100;
    so.announce_period = 1s;
    StageTrainingOptions to;
    to.trainers_run = "run";
    to.optimizer_config.lr = kLr;
    to.collaborative = Rounds(StageRunId("run", 0));
    so.make_training =
        [this, &node,
         to](std::vector<at::Tensor> params) -> Result<std::shared_ptr<serve::BlockTraining>> {
      COLONY_ASSIGN_OR_RETURN(auto inner, StageTraining::Create(node, std::move(params), to));
      late_->Wrap(std::move(inner));
      return std::shared_ptr<serve::BlockTraining>(late_);
    };
    auto server = serve::BlockServer::Start(node, so);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    late_server_ = std::move(*server);
  }

  // Trains microbatches until one backward reached the late peer and a few after (3 epochs at
  // most); the held backward is let go as soon as the trainer has retried it elsewhere (the
  // microbatch's TrainStep returned), before the trainer steps. Returns the sequences trained.
  int64_t TrainPastTheLateBackward() {
    int64_t sequences = 0;
    bool opened = false;
    for (size_t i = 0; i < 3 * kPerEpoch; ++i) {
      pipeline_->SetEpoch(trainer_opt_->local_epoch());
      auto loss = pipeline_->TrainStep(batches_[i]);
      EXPECT_TRUE(loss.ok()) << "microbatch " << i << ": " << loss.status().ToString();
      if (!loss.ok()) break;
      sequences += kMicrobatch;
      if (!opened && late_->reached()) {
        EXPECT_TRUE(late_->OpenAndWait()) << "the held backward did not end";
        opened = true;
      }
      auto r = trainer_opt_->Step(kMicrobatch);
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (opened && (i + 1) % kPerEpoch == 0) break;
    }
    EXPECT_TRUE(opened) << "no backward reached the late peer";
    return sequences;
  }

  void ExpectEachSequenceCountedOnce(LateFirstBackward::Hold hold, uint64_t late_dropped,
                                     uint64_t other_dropped,
                                     std::chrono::milliseconds fence_delay = {});

  void StopLateStage() {
    if (late_server_) {
      late_->inner().Shutdown();
      late_server_->Shutdown();
    }
  }

  std::filesystem::path dir_;
  test::LoopbackDht dht_;
  std::shared_ptr<LateFirstBackward> late_;
  std::unique_ptr<serve::BlockServer> late_server_;
  std::vector<std::unique_ptr<Stage>> stages_;
  std::unique_ptr<Pipeline> pipeline_;
  std::unique_ptr<train::CollaborativeOptimizer> trainer_opt_;
  std::vector<at::Tensor> batches_;
};

double MaxAbsDiff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_TRUE(a[i].sizes().equals(b[i].sizes())) << "parameter " << i;
    d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  }
  return d;
}

// Two stages of two peers each, one trainer, three epochs: every microbatch's loss and the final
// parameters of every stage peer and of the trainer equal those of local training (up to float
// rounding), although each microbatch went through peers drawn at random and its backward maybe
// through other ones.
TEST_F(SwarmTest, TrainsAsOneProcessWouldWithTheSameBatches) {
  AddStage(0, 2);
  AddStage(0, 2);
  AddStage(2, 4);
  AddStage(2, 4);
  StartTrainer();
  WaitForServers(4);
  const size_t n = 3 * kPerEpoch;
  const std::vector<double> losses = Train(0, n);
  ASSERT_EQ(losses.size(), n);
  EXPECT_LT(losses.back(), losses.front() - 0.1);  // it learns
  // The stages end the last epoch when the next one starts: one more microbatch's forward.
  pipeline_->SetEpoch(trainer_opt_->local_epoch());
  ASSERT_TRUE(pipeline_->Loss(batches_[n]).ok());

  auto local = model::LoadLlama(dir_);
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  const std::vector<double> expected = TrainLocally(*local, n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(losses[i], expected[i], 1e-4 * std::abs(expected[i])) << "microbatch " << i;
  }

  for (const auto& stage : stages_) {
    const StageTrainingStats s = stage->training_stats();
    EXPECT_EQ(s.epoch, 3);
    EXPECT_EQ(s.rounds, 3u);
    std::vector<at::Tensor> want;
    const int64_t first = stage->server_stats().first;
    for (int64_t b = first; b < first + 2; ++b) {
      for (const auto& p : (*local)->block(b)->parameters()) want.push_back(p);
    }
    EXPECT_LT(MaxAbsDiff(stage->parameters(), want), 2e-5) << "stage at block " << first;
  }
  int64_t samples[2] = {0, 0};
  for (size_t i = 0; i < stages_.size(); ++i)
    samples[i / 2] += stages_[i]->training_stats().samples;
  EXPECT_EQ(samples[0], static_cast<int64_t>(n) * kMicrobatch);
  EXPECT_EQ(samples[1], static_cast<int64_t>(n) * kMicrobatch);
  // Both peers of each stage got traffic (about 1 in 2 microbatches each).
  for (const auto& stage : stages_) EXPECT_GT(stage->training_stats().backwards, 0u);

  std::vector<at::Tensor> want_head;
  for (const auto& item : (*local)->named_parameters()) {
    if (item.key().find("layers.") == std::string::npos) want_head.push_back(item.value());
  }
  EXPECT_LT(MaxAbsDiff(pipeline_->parameters(), want_head), 2e-5);
}

// 8-bit stage boundaries: hidden states and their gradients cross in blockwise 8-bit (1/127 of
// each 256 values' largest magnitude per step). Training is then close to, not equal to, the
// one-process run: every microbatch's loss within 1% of it (the error the codec puts in the
// activations moves a loss of ~4.5 by a few thousandths here), and the run learns as much.
TEST_F(SwarmTest, TrainsWithEightBitBoundariesCloseToOneProcess) {
  AddStage(0, 2);
  AddStage(2, 4);
  StartTrainer(compression::Codec::kBlockwise8);
  WaitForServers(2);
  const size_t n = 3 * kPerEpoch;
  const std::vector<double> losses = Train(0, n);
  ASSERT_EQ(losses.size(), n);
  auto local = model::LoadLlama(dir_);
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  const std::vector<double> expected = TrainLocally(*local, n);
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const double rel = std::abs(losses[i] - expected[i]) / std::abs(expected[i]);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-2) << "microbatch " << i << ": " << losses[i] << " vs " << expected[i];
  }
  EXPECT_GT(worst, 0) << "the boundaries were not compressed";
  EXPECT_LT(losses.back(), losses.front() - 0.1);
  std::printf("[swarm] 8-bit boundaries: losses within %.2e relative of one process\n", worst);
}

// PowerSGD in the stages' rounds (`swarm-train stage --powersgd-rank`): each stage's two peers
// average their blocks' gradient matrices as rank-4 factors (every matrix of this model is
// compressed at rank 4). Every round averages, the peers of a stage end each epoch with the same
// parameters (every member applies the same projected mean), the parameters differ from exact
// averaging's (the one-process run: the gradients were compressed), and the run learns about as
// well as that run.
TEST_F(SwarmTest, PowerSgdStagesAverageFactorsAndTheirPeersStayEqual) {
  AddStage(0, 2, 4);
  AddStage(0, 2, 4);
  AddStage(2, 4, 4);
  AddStage(2, 4, 4);
  StartTrainer();
  WaitForServers(4);
  const size_t n = 3 * kPerEpoch;
  const std::vector<double> losses = Train(0, n);
  ASSERT_EQ(losses.size(), n);
  pipeline_->SetEpoch(trainer_opt_->local_epoch());
  ASSERT_TRUE(pipeline_->Loss(batches_[n]).ok());  // the stages end the last epoch
  auto local = model::LoadLlama(dir_);
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  const std::vector<double> expected = TrainLocally(*local, n);
  for (const auto& stage : stages_) {
    const StageTrainingStats s = stage->training_stats();
    EXPECT_EQ(s.epoch, 3);
    EXPECT_EQ(s.averaged, 3u) << "a round of the stage at block " << stage->server_stats().first
                              << " did not average";
  }
  for (size_t i = 0; i < stages_.size(); i += 2) {
    const int64_t first = stages_[i]->server_stats().first;
    EXPECT_EQ(MaxAbsDiff(stages_[i]->parameters(), stages_[i + 1]->parameters()), 0)
        << "the peers of the stage at block " << first << " hold different parameters";
    std::vector<at::Tensor> exact;
    for (int64_t b = first; b < first + 2; ++b) {
      for (const auto& p : (*local)->block(b)->parameters()) exact.push_back(p);
    }
    EXPECT_GT(MaxAbsDiff(stages_[i]->parameters(), exact), 1e-4)
        << "the stage at block " << first << " averaged its gradients whole";
  }
  EXPECT_LT(losses.back(), losses.front() - 0.1);
  EXPECT_LT(losses.back(), expected.back() + 0.05 * std::abs(expected.back()));
  std::printf("[swarm] PowerSGD rank 4: last loss %.4f (exact averaging: %.4f)\n", losses.back(),
              expected.back());
}

// A peer of the second stage dies between microbatches: the trainer's next calls to it fail,
// go to the stage's other peer, and every microbatch still gets through (none is lost); the
// stage then steps without the dead peer.
TEST_F(SwarmTest, AStagePeerThatDiesLosesNoMicrobatch) {
  AddStage(0, 4);
  AddStage(0, 4);
  StartTrainer();
  WaitForServers(2);
  const std::vector<double> first = Train(0, kPerEpoch);
  ASSERT_EQ(first.size(), static_cast<size_t>(kPerEpoch));
  // Kill the peer the trainer measured last (its node goes: connections reset, calls fail).
  stages_[1]->Shutdown();
  dht_.nodes()[1]->Shutdown();
  const std::vector<double> rest = Train(kPerEpoch, 3 * kPerEpoch);
  ASSERT_EQ(rest.size(), static_cast<size_t>(2 * kPerEpoch));
  pipeline_->SetEpoch(trainer_opt_->local_epoch());
  ASSERT_TRUE(pipeline_->Loss(batches_[3 * kPerEpoch]).ok());
  const StageTrainingStats alive = stages_[0]->training_stats();
  EXPECT_EQ(alive.epoch, 3);
  // Every microbatch after the death went through the live peer.
  EXPECT_GE(alive.samples, 2 * kPerEpoch * kMicrobatch);
  EXPECT_LT(rest.back(), first.front());
}

// Stage [0, 4) with a normal peer and a late one (`hold`), a trainer whose deadline is 5 s:
// trains past the late backward, then expects the stage's two peers to have counted each of the
// trainer's sequences once, having dropped `late_dropped` and `other_dropped` backwards.
void SwarmTest::ExpectEachSequenceCountedOnce(LateFirstBackward::Hold hold, uint64_t late_dropped,
                                              uint64_t other_dropped,
                                              std::chrono::milliseconds fence_delay) {
  AddStage(0, 4);
  AddLateStage(hold, fence_delay);
  StartTrainer(compression::Codec::kNone, /*request_timeout=*/5s);
  WaitForServers(2);
  const int64_t sequences = TrainPastTheLateBackward();
  const StageTrainingStats late = late_->inner().stats(), other = stages_[0]->training_stats();
  EXPECT_EQ(late.dropped, late_dropped);
  EXPECT_EQ(other.dropped, other_dropped);
  EXPECT_EQ(late.samples + other.samples, sequences)
      << "late peer " << late.samples << ", other peer " << other.samples;
}

// A backward whose peer did not answer before the trainer's deadline is retried on the stage's
// other peer; the late peer then runs it all the same. The trainer fenced the microbatch there
// (serve.fence) before retrying, so the late peer computes it but drops its gradient: the stage
// counts each of the trainer's sequences once.
TEST_F(SwarmTest, ABackwardRetriedElsewhereAfterItsDeadlineIsCountedOnce) {
  ExpectEachSequenceCountedOnce(LateFirstBackward::Hold::kBeforeRunning, 1, 0);
}

// A backward whose gradient the late peer took but whose reply came after the trainer's deadline:
// the fence says so, and the retry on the other peer is a replay (its gradient dropped there).
TEST_F(SwarmTest, ABackwardTakenByAPeerWhoseReplyCameTooLateIsReplayedElsewhere) {
  ExpectEachSequenceCountedOnce(LateFirstBackward::Hold::kAfterRunning, 0, 1);
}

// As above, and the late peer's answer to the fence comes after the trainer's 3 s too (a peer
// behind a partition that heals): not knowing whether the late peer took the microbatch, the
// trainer retries it as a replay, so the stage counts it once (the other peer drops the replay).
TEST_F(SwarmTest, ABackwardWhoseFenceGoesUnansweredIsReplayedElsewhere) {
  ExpectEachSequenceCountedOnce(LateFirstBackward::Hold::kAfterRunning, 0, 1, 4s);
}

// With one peer in the stage the trainer retries the late backward there (once its ban of 1 s
// ended): the fenced first try is dropped when it runs, and the retry, a later try, is taken.
TEST_F(SwarmTest, ABackwardRetriedOnTheSamePeerAfterItsDeadlineIsCountedOnce) {
  AddLateStage(LateFirstBackward::Hold::kBeforeRunning);
  StartTrainer(compression::Codec::kNone, /*request_timeout=*/5s, /*avoid_failed_for=*/1s);
  WaitForServers(1);
  const int64_t sequences = TrainPastTheLateBackward();
  const StageTrainingStats late = late_->inner().stats();
  EXPECT_EQ(late.dropped, 1u);
  EXPECT_EQ(late.samples, sequences);
}

// A microbatch tried again with its id after a try whose backward the stage took (as swarm-lm
// does after an error) is a replay there: the stage counts it once.
TEST_F(SwarmTest, AMicrobatchTriedAgainWithItsIdIsCountedOnce) {
  Stage& stage = AddStage(0, 4);
  StartTrainer();
  WaitForServers(1);
  pipeline_->SetEpoch(0);
  const uint64_t id = Pipeline::NewMicrobatchId();
  auto first = pipeline_->TrainStep(batches_[0], id);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto again = pipeline_->TrainStep(batches_[0], id);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_DOUBLE_EQ(*again, *first);
  auto other = pipeline_->TrainStep(batches_[1]);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_EQ(stage.training_stats().samples, 2 * kMicrobatch);
  EXPECT_EQ(stage.training_stats().dropped, 1u);
  EXPECT_FALSE(pipeline_->TrainStep(batches_[2], 0).ok());  // 0 names no microbatch
  // serve.fence says the stage took the microbatch, fences one it never saw, and refuses what is
  // not a fence by name.
  const auto records = pipeline_->manager().Servers();
  ASSERT_EQ(records.size(), 1u);
  auto addr = Multiaddr::Parse(records[0].addresses.at(0));
  ASSERT_TRUE(addr.ok());
  auto fence = [&](const std::string& meta) {
    return pipeline_->manager().host().CallSync(*addr, "serve.fence", net::Message(meta),
                                                {.timeout = 10s});
  };
  for (const auto& [microbatch, taken] : {std::pair{id, true}, std::pair{id + 1, false}}) {
    auto r =
        fence(serve::EncodeFence({.start = 0, .end = 4, .microbatch = microbatch, .attempt = 1}));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto reply = serve::DecodeFenceReply(r->meta);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_EQ(reply->taken, taken) << microbatch;
  }
  auto bad = fence(serve::EncodeFence({.start = 0, .end = 4, .microbatch = 0, .attempt = 1}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("no microbatch id"), std::string::npos)
      << bad.status().ToString();
}

// A hostile peer against a stage: forwards tagged with an epoch far ahead, its own progress
// record in the trainers' run claiming that epoch (one of two trainers is no majority), and a
// record in the stage's run saying that a round started, do not move the stage; a backward
// without a tag is refused by name; and the honest trainer's microbatches all get through: the
// stage follows its epoch, not the liar's.
TEST_F(SwarmTest, AHostilePeerCannotMoveAStagesEpochs) {
  Stage& stage = AddStage(0, 4);
  StartTrainer();
  WaitForServers(1);
  ASSERT_EQ(Train(0, kPerEpoch).size(), static_cast<size_t>(kPerEpoch));
  dht::Node& attacker = AddNode();
  const train::PeerProgress lie{
      .peer = attacker.peer_id(), .epoch = int64_t{1} << 40, .samples = 8, .time = dht::Now()};
  ASSERT_TRUE(attacker
                  .StoreSync("run.progress", train::EncodeProgressRecord(lie), dht::Now() + 60,
                             dht::OwnerMarker(attacker.peer_id()))
                  .ok());
  const auto records = pipeline_->manager().Servers();
  ASSERT_EQ(records.size(), 1u);
  auto addr = Multiaddr::Parse(records[0].addresses.at(0));
  ASSERT_TRUE(addr.ok());
  auto call = [&](const std::string& method, const serve::BlockRequest& r, int tensors) {
    net::Message m(serve::EncodeBlockRequest(r));
    const at::Tensor x = at::randn({1, 4, Config().hidden_size});
    for (int i = 0; i < tensors; ++i) m.tensors.push_back(*runtime::ToFrame(x));
    return attacker.host().CallSync(*addr, method, std::move(m), {.timeout = 10s});
  };
  // The stage ends the trainer's first epoch (a request or its records tell it).
  test::WaitUntil([&] { return stage.training_stats().epoch >= 1; }, test::HangGuard(5s));
  const int64_t before = stage.training_stats().epoch;
  EXPECT_EQ(before, 1);
  for (int i = 0; i < 3; ++i) {
    auto r = call("serve.forward", {.start = 0, .end = 4, .epoch = serve::kMaxEpoch}, 1);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
  }
  EXPECT_EQ(stage.training_stats().epoch, before);
  // Nor does a record in the stage's own run that says a round of its epoch started.
  const train::PeerProgress round{.peer = attacker.peer_id(),
                                  .epoch = before,
                                  .time = dht::Now(),
                                  .phase = train::Phase::kRound};
  ASSERT_TRUE(attacker
                  .StoreSync("run.stage0.progress", train::EncodeProgressRecord(round),
                             dht::Now() + 60, dht::OwnerMarker(attacker.peer_id()))
                  .ok());
  // Two fetches of the trainers' records later (the watcher asks for one when it sees the round),
  // the stage has had every chance to act on the record.
  const uint64_t fetched = stage.training_stats().view_fetches;
  EXPECT_TRUE(test::WaitUntil([&] { return stage.training_stats().view_fetches >= fetched + 2; },
                              test::HangGuard(10s)));
  EXPECT_EQ(stage.training_stats().epoch, before);
  EXPECT_EQ(stage.training_stats().rounds, static_cast<uint64_t>(before));
  auto untagged = call("serve.backward", {.start = 0, .end = 4}, 2);
  ASSERT_FALSE(untagged.ok());
  EXPECT_NE(untagged.status().message().find("must carry its trainer's epoch"), std::string::npos)
      << untagged.status().ToString();
  // The honest trainer's microbatches all get through (its own optimizer may hold its steps
  // while it looks for the liar's epoch: train/progress.h), and the stage stays at its epoch.
  const auto refused_before = stage.training_stats().refused;
  ASSERT_EQ(Train(kPerEpoch, 3 * kPerEpoch, /*steps_at_target=*/false).size(),
            static_cast<size_t>(2 * kPerEpoch));
  const int64_t trainer_epoch = trainer_opt_->local_epoch();
  pipeline_->SetEpoch(trainer_epoch);
  ASSERT_TRUE(pipeline_->Loss(batches_[3 * kPerEpoch]).ok());
  test::WaitUntil([&] { return stage.training_stats().epoch >= trainer_epoch; },
                  test::HangGuard(5s));
  EXPECT_EQ(stage.training_stats().epoch, trainer_epoch);
  EXPECT_EQ(stage.training_stats().refused, refused_before);
}

}  // namespace
}  // namespace colony::swarm
