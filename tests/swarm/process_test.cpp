// `colony swarm-train` processes on loopback: init, two stages of two peers each, and a trainer.
// A peer of the second stage is SIGKILLed while microbatches flow, a new peer joins the first
// stage, and the run goes on: no microbatch is lost (every stage accounts for every sample the
// trainer trained on after the kill, the survivors' and the newcomer's counts added), the
// newcomer takes the stage's state and gets traffic, and the held-out loss keeps falling.
// Epochs, not seconds: the test holds on any machine.
#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "process_events.h"
#include "test_support.h"

namespace colony::swarm {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

class SwarmTrainProcesses : public ::testing::Test {
 protected:
  void SetUp() override {
    auto boot = swarm_.Start("dht", {"dht", "--listen", "/ip4/127.0.0.1/tcp/0"}, "warn");
    ASSERT_TRUE(boot.ok()) << boot.status().ToString();
    boot_ = *boot;
    const std::vector<std::string> init = {"swarm-train",    "init",
                                           "--out",          model_.string(),
                                           "--cache-dir",    cache_.string(),
                                           "--corpus-bytes", "300000",
                                           "--vocab-size",   "512",
                                           "--hidden-size",  "64",
                                           "--layers",       "4",
                                           "--seq-len",      "32",
                                           "--init-seed",    "2"};
    auto made = swarm_.Start("init", init, "warn", test::HangGuard(120s));
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    ASSERT_EQ(json::parse(*made)["event"], "initialized") << *made;
  }

  Result<json> StartStage(const std::string& label, const std::string& blocks,
                          const std::vector<std::string>& extra = {"--rebalance-period", "0"}) {
    std::vector<std::string> args = {"swarm-train",
                                     "stage",
                                     "--model",
                                     model_.string(),
                                     "--blocks",
                                     blocks,
                                     "--run-id",
                                     run_,
                                     "--initial-peers",
                                     boot_,
                                     "--listen",
                                     "/ip4/127.0.0.1/tcp/0",
                                     "--threads",
                                     "1",
                                     "--target-batch-size",
                                     "16",
                                     "--matchmaking-time",
                                     "2",
                                     "--lr",
                                     "3e-3"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto ready = swarm_.Start(label, args, "warn", test::HangGuard(60s));
    if (!ready.ok()) return ready.status();
    return json::parse(*ready);
  }

  // SIGTERM: the stage's "done" line (its counters).
  json StopStage(const std::string& label) {
    swarm_[label].Signal(SIGTERM);
    auto line = swarm_[label].ReadLine(test::HangGuard(30s));
    EXPECT_TRUE(line.ok()) << swarm_.Tail(label);
    return line.ok() ? json::parse(*line, nullptr, false) : json();
  }

  // The trainer's arguments for `epochs` epochs of kTarget samples in microbatches of kBatch.
  std::vector<std::string> TrainerArgs(int64_t epochs) const {
    return {"swarm-train",
            "trainer",
            "--swarm-model",
            model_.string(),
            "--run-id",
            run_,
            "--initial-peers",
            boot_,
            "--json",
            "--threads",
            "1",
            "--cache-dir",
            cache_.string(),
            "--corpus-bytes",
            "300000",
            "--vocab-size",
            "512",
            "--seq-len",
            "32",
            "--batch-size",
            std::to_string(kBatch),
            "--target-batch-size",
            std::to_string(kTarget),
            "--max-epochs",
            std::to_string(epochs),
            "--eval-every",
            "10",
            "--progress-interval",
            "0",
            "--lr",
            "3e-3"};
  }
  static constexpr int64_t kBatch = 8, kTarget = 16;

  // The trainer's next JSON event.
  Result<json> Next(std::chrono::milliseconds timeout) {
    return test::NextEvent(swarm_, "trainer", timeout);
  }

  test::TempDir dir_{"swarm-train"};
  test::ProcessGroup swarm_{dir_.path()};
  std::filesystem::path model_ = dir_.path() / "init";
  std::filesystem::path cache_ = dir_.path() / "cache";
  std::string run_ = "swarm-" + std::to_string(::getpid());
  std::string boot_;
};

TEST_F(SwarmTrainProcesses, TrainsThroughStagesAndLosesNothingWhenAStagePeerIsKilled) {
  for (const auto& [label, blocks] : std::vector<std::pair<std::string, std::string>>{
           {"s0a", "0:2"}, {"s0b", "0:2"}, {"s1a", "2:4"}, {"s1b", "2:4"}}) {
    auto ready = StartStage(label, blocks);
    ASSERT_TRUE(ready.ok()) << ready.status().ToString();
    EXPECT_EQ((*ready)["stage"], run_ + (blocks == "0:2" ? ".stage0" : ".stage2"));
  }
  constexpr int64_t kEpochs = 40, kKillAt = 10;
  auto ready = swarm_.Start("trainer", TrainerArgs(kEpochs), "warn", test::HangGuard(120s));
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_EQ(json::parse(*ready)["model"]["task"], "swarm-lm") << *ready;
  std::map<int64_t, double> evals;
  json done;
  int64_t samples_at_kill = -1;
  while (done.is_null()) {
    auto e = Next(test::HangGuard(120s));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    if (e->contains("eval_loss")) evals[(*e)["epoch"].get<int64_t>()] = (*e)["eval_loss"];
    if ((*e)["event"] == "step" && (*e)["epoch"] == kKillAt && samples_at_kill < 0) {
      swarm_.Kill("s1b");
      samples_at_kill = (*e)["samples"].get<int64_t>();
      auto joined = StartStage("s0c", "0:2");
      ASSERT_TRUE(joined.ok()) << joined.status().ToString();
    }
    if ((*e)["event"] == "done") done = *e;
  }
  ASSERT_TRUE(evals.contains(0) && evals.contains(kKillAt) && evals.contains(kEpochs))
      << done.dump();
  std::printf(
      "[swarm] held-out loss: %.3f at epoch 0, %.3f at %lld (then a stage peer killed), "
      "%.3f at %lld\n",
      evals[0], evals[kKillAt], static_cast<long long>(kKillAt), evals[kEpochs],
      static_cast<long long>(kEpochs));
  EXPECT_LT(evals[kKillAt], evals[0] - 0.3);
  EXPECT_LT(evals[kEpochs], evals[kKillAt] - 0.1);
  // No microbatch lost: the trainer skipped nothing and trained kEpochs x kTarget samples.
  EXPECT_EQ(done["skipped_batches"], 0);
  EXPECT_EQ(done["samples"].get<int64_t>(), kEpochs * kTarget);
  auto code = swarm_["trainer"].Wait(test::HangGuard(30s));
  ASSERT_TRUE(code.ok() && *code == 0) << swarm_.Tail("trainer");

  std::map<std::string, json> stages;
  for (const char* label : {"s0a", "s0b", "s0c", "s1a"}) stages[label] = StopStage(label);
  // The final evaluation (tagged with the last epoch) made every live peer end the last epoch.
  for (const auto& [label, s] : stages) {
    EXPECT_EQ(s["epoch"], kEpochs) << label << ": " << s.dump();
  }
  // Every sample went through each stage once: stage 0's three peers add up to all of them;
  // after the kill, the second stage's survivor took every microbatch.
  const int64_t total = kEpochs * kTarget;
  EXPECT_EQ(stages["s0a"]["samples"].get<int64_t>() + stages["s0b"]["samples"].get<int64_t>() +
                stages["s0c"]["samples"].get<int64_t>(),
            total);
  EXPECT_GE(stages["s1a"]["samples"].get<int64_t>(), total - samples_at_kill);
  // The newcomer took the stage's state and got traffic within a routing refresh.
  EXPECT_GE(stages["s0c"]["state_loads"].get<int64_t>(), 1) << stages["s0c"].dump();
  EXPECT_GT(stages["s0c"]["backwards"].get<int64_t>(), 0) << stages["s0c"].dump();
}

}  // namespace
}  // namespace colony::swarm

namespace colony::swarm {
namespace {

// Rebalancing: 3 peers in the first stage and 2 in the second; one of the second stage's is
// SIGKILLed. Once its record expires, the pipeline (3 : 1) is below 0.75 of what its peers could
// give, and exactly one peer of the first stage moves to the second (3 : 1 -> 2 : 2), takes the
// stage's state and gets microbatches; the trainer loses none, before or after the move.
TEST_F(SwarmTrainProcesses, APeerOfAnotherStageRefillsAStageThatLostHalfItsPeers) {
  const std::vector<std::string> rebalancing = {"--rebalance-period", "2", "--throughput", "100",
                                                "--record-ttl",       "4"};
  // Started in turns (1+0, 1+1, 2+1, 2+2, 3+2), so that no placement on the way is unbalanced
  // enough for a peer to move before the kill.
  for (const auto& [label, blocks] : std::vector<std::pair<std::string, std::string>>{
           {"s0a", "0:2"}, {"s1a", "2:4"}, {"s0b", "0:2"}, {"s1b", "2:4"}, {"s0c", "0:2"}}) {
    auto ready = StartStage(label, blocks, rebalancing);
    ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  }
  constexpr int64_t kKillAt = 3, kAfterMove = 8;
  auto ready = swarm_.Start("trainer", TrainerArgs(100'000), "warn", test::HangGuard(120s));
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  const std::vector<std::string> first = {"s0a", "s0b", "s0c"};
  std::string mover;
  json moved;
  int64_t moved_at = -1;
  bool killed = false, stopping = false;
  json done;
  while (done.is_null()) {
    auto e = Next(test::HangGuard(120s));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    const auto& event = (*e)["event"];
    if (event == "done") done = *e;
    if (event != "step") continue;
    const int64_t epoch = (*e)["epoch"].get<int64_t>();
    // The record of the killed peer expires within 4 s, and rounds are 2 s: at this machine's
    // pace (several epochs a second) a move comes within tens of epochs; 400 means none will.
    ASSERT_TRUE(!mover.empty() || epoch < kKillAt + 400) << "no peer moved";
    if (epoch == kKillAt && !killed) {
      swarm_.Kill("s1b");
      killed = true;
    }
    if (epoch > kKillAt && mover.empty()) {
      for (const auto& label : first) {
        auto line = swarm_[label].ReadLine(std::chrono::milliseconds(20));
        if (!line.ok()) continue;
        moved = json::parse(*line, nullptr, false);
        mover = label;
        moved_at = epoch;
        break;
      }
    }
    if (!mover.empty() && epoch >= moved_at + kAfterMove && !stopping) {
      swarm_["trainer"].Signal(SIGTERM);
      stopping = true;
    }
  }
  ASSERT_FALSE(mover.empty()) << "no peer moved";
  EXPECT_EQ(moved["event"], "moved") << moved.dump();
  EXPECT_EQ(moved["from"], json({0, 2})) << moved.dump();
  EXPECT_EQ(moved["to"], json({2, 4})) << moved.dump();
  EXPECT_EQ(moved["ok"], true) << moved.dump();
  std::printf("[swarm] %s moved from stage 0:2 to 2:4 at epoch %lld (the kill at %d)\n",
              mover.c_str(), static_cast<long long>(moved_at), static_cast<int>(kKillAt));
  EXPECT_EQ(done["skipped_batches"], 0) << done.dump();
  auto code = swarm_["trainer"].Wait(test::HangGuard(30s));
  ASSERT_TRUE(code.ok() && *code == 0) << swarm_.Tail("trainer");

  // Every peer's last line is its "done"; only the mover moved, once.
  for (const auto& label : {"s0a", "s0b", "s0c", "s1a"}) {
    swarm_[label].Signal(SIGTERM);
    json last;
    int moves_seen = 0;
    for (;;) {
      auto e = test::NextEvent(swarm_, label, test::HangGuard(30s));
      ASSERT_TRUE(e.ok()) << e.status().ToString();
      if ((*e)["event"] == "done") {
        last = *e;
        break;
      }
      moves_seen += (*e)["event"] == "moved";
    }
    EXPECT_EQ(moves_seen, 0) << label << " moved too";
    if (label == mover) {
      EXPECT_EQ(last["moves"], 1) << last.dump();
      EXPECT_EQ(last["blocks"], json({2, 4})) << last.dump();
      // It took the second stage's state (the stage was past epoch 0) and got microbatches.
      EXPECT_GE(last["state_loads"].get<int64_t>(), 1) << last.dump() << "\n" << swarm_.Tail(label);
      EXPECT_GT(last["backwards"].get<int64_t>(), 0) << last.dump();
    } else {
      EXPECT_EQ(last["moves"], 0) << label << ": " << last.dump();
    }
  }
}

}  // namespace
}  // namespace colony::swarm
