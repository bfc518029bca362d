// Collaborative training between real `colony train --task fashion-mnist` processes on loopback:
// a 4-peer swarm against one process with the same global batch; swarms whose epochs last ~10 ms,
// ~0.3 s and ~1 s, and one whose peers differ 10x in speed; a peer SIGKILLed mid-run; peers
// joining a run in progress early and near its end; DiLoCo's traffic against synchronous
// training; and a peer that sends NaN gradients. Every wait is for a JSON event of the processes
// (--json), with a deadline. Paces are set by the tests (--batch-delay, --classifier linear), not
// by how fast this machine trains; every synchronous step's realized batch must be within
// [1.0, 1.2] x the target, and peers that end a run together must hold bit-identical models.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "core/subprocess.h"
#include "test_support.h"

namespace colony::train {
namespace {

using namespace std::chrono_literals;
using colony::test::ColonyBinary;
using colony::test::HangGuard;
using colony::test::ScratchPath;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// The last `max_chars` characters of a file (a peer's stderr), for failure messages.
std::string Tail(const std::string& path, size_t max_chars = 3000) {
  const std::string text = colony::test::ReadFile(path);
  return text.size() <= max_chars ? text : text.substr(text.size() - max_chars);
}

std::string RunId(const std::string& test) {
  return "train-process-" + test + "-" + std::to_string(::getpid());
}

// TRAIN_PROCESS_TEST_VERBOSE=1 prints every event of every trainer.
bool Verbose() {
  const char* v = std::getenv("TRAIN_PROCESS_TEST_VERBOSE");
  return v != nullptr && *v != '\0' && *v != '0';
}

struct Trainer {
  std::string label;
  std::string stderr_path;
  std::optional<Subprocess> process;
  json ready;
  std::optional<double> initial_eval;  // the "eval" event printed before training
  std::vector<json> steps;             // every "step" event read so far
  std::optional<json> done;
};

// A DHT bootstrap (`colony dht`) and trainers that join through it, all on loopback.
class TrainSwarm {
 public:
  explicit TrainSwarm(std::string run_id) : run_id_(std::move(run_id)) {
    boot_err_ = ScratchPath("boot.err");
    auto boot = Subprocess::Spawn(
        {ColonyBinary(), "--log-level", "warn", "dht", "--listen", "/ip4/127.0.0.1/tcp/0"},
        boot_err_);
    EXPECT_TRUE(boot.ok()) << boot.status().ToString();
    if (!boot.ok()) return;
    bootstrap_.emplace(std::move(*boot));
    auto line = bootstrap_->ReadLine(20s);
    EXPECT_TRUE(line.ok()) << line.status().ToString() << "\n" << Tail(boot_err_);
    if (line.ok()) bootstrap_addr_ = *line;
  }

  bool ok() const { return !bootstrap_addr_.empty(); }

  // Arguments every trainer of these tests shares; `args` adds to (and may repeat) them.
  std::vector<std::string> Argv(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {ColonyBinary(), "--log-level", "warn", "train", "--task",
                                     "fashion-mnist", "--json", "--threads", "1", "--run-id",
                                     run_id_, "--initial-peers", bootstrap_addr_, "--init-seed",
                                     "7", "--eval-batch-size",
                                     "64",  // 512 test images
                                     "--eval-every",
                                     "1000000",  // only the initial evaluation
                                     "--matchmaking-time", "2",
                                     // A failed round costs at most this (default: 60 s).
                                     "--averaging-timeout", "20", "--progress-interval", "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  // Starts a trainer without waiting for it (see WaitReady); returns its index.
  size_t Spawn(const std::string& label, const std::vector<std::string>& args) {
    Trainer t;
    t.label = label;
    t.stderr_path = ScratchPath(label + ".err");
    auto p = Subprocess::Spawn(Argv(args), t.stderr_path);
    EXPECT_TRUE(p.ok()) << label << ": " << p.status().ToString();
    if (p.ok()) t.process.emplace(std::move(*p));
    trainers_.push_back(std::move(t));
    return trainers_.size() - 1;
  }

  // Reads trainer i's events until one satisfies `pred`, recording what it reads; an error at
  // the deadline or when the process exits first.
  Result<json> WaitFor(size_t i, const std::function<bool(const json&)>& pred,
                       std::chrono::milliseconds timeout) {
    Trainer& t = trainers_[i];
    if (!t.process) return FailedPrecondition(t.label + " was not started");
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left <= 0ms) return DeadlineExceeded(t.label + ": no such event in time");
      auto line = t.process->ReadLine(left);
      if (!line.ok()) return line.status().WithContext(t.label);
      if (Verbose()) std::printf("[%s] %s\n", t.label.c_str(), line->c_str());
      json j = json::parse(*line, nullptr, false);
      if (!j.is_object() || !j.contains("event") || !j["event"].is_string()) continue;
      const std::string event = j["event"];
      if (event == "ready") t.ready = j;
      if (event == "eval" && !t.initial_eval) t.initial_eval = j["eval_loss"].get<double>();
      if (event == "step") t.steps.push_back(j);
      if (event == "done") t.done = j;
      if (pred(j)) return j;
    }
  }

  Status WaitReady(size_t i, std::chrono::milliseconds timeout = HangGuard(60s)) {
    auto r = WaitFor(
        i, [](const json& j) { return j["event"] == "ready"; }, timeout);
    return r.ok() ? Status::Ok() : r.status();
  }

  // The first "step" event of trainer i at `epoch` or later.
  Result<json> WaitEpoch(size_t i, int64_t epoch, std::chrono::milliseconds timeout) {
    return WaitFor(
        i,
        [epoch](const json& j) {
          return j["event"] == "step" && j["epoch"].get<int64_t>() >= epoch;
        },
        timeout);
  }

  // Waits for trainer i's "done" event and its exit; returns the event (the exit code is checked
  // to be 0).
  Result<json> WaitDone(size_t i, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    auto done = WaitFor(
        i, [](const json& j) { return j["event"] == "done"; }, timeout);
    if (!done.ok()) return done.status();
    const auto left = std::max<std::chrono::milliseconds>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()), 5s);
    auto code = trainers_[i].process->Wait(left);
    if (!code.ok()) return code.status().WithContext(trainers_[i].label + " did not exit");
    if (*code != 0) {
      return Internal(trainers_[i].label + " exited with code " + std::to_string(*code));
    }
    return done;
  }

  Trainer& trainer(size_t i) { return trainers_[i]; }
  size_t size() const { return trainers_.size(); }

  // Stderr of every trainer, for failure messages.
  std::string Logs() const {
    std::string out;
    for (const auto& t : trainers_) out += "---- " + t.label + " stderr:\n" + Tail(t.stderr_path);
    return out;
  }

 private:
  std::string run_id_;
  std::string boot_err_;
  std::optional<Subprocess> bootstrap_;
  std::string bootstrap_addr_;
  std::vector<Trainer> trainers_;
};

double EvalLoss(const json& done) { return done["eval_loss"].get<double>(); }

// Checks every step event of a trainer: the realized global batch of each averaged step is within
// [1.0, 1.2] x the target (hivemind's bound), and every step was averaged by a group whose size
// `group(epoch)` gives (the epoch after the step). Events of a peer catching up (state loaded, no
// step) are skipped. Returns the number of averaged steps.
int64_t ExpectStepsTogether(const Trainer& t, int64_t target,
                            const std::function<size_t(int64_t)>& group) {
  int64_t averaged = 0;
  for (const auto& s : t.steps) {
    if (s["loaded_state"].get<bool>() && !s["averaged"].get<bool>()) continue;
    const int64_t epoch = s["epoch"].get<int64_t>();
    const int64_t realized = s["realized_batch"].get<int64_t>();
    EXPECT_TRUE(s["averaged"].get<bool>()) << t.label << " stepped alone: " << s.dump();
    EXPECT_EQ(s["group_size"].get<size_t>(), group(epoch)) << t.label << ": " << s.dump();
    EXPECT_GE(realized, target) << t.label << " at epoch " << epoch;
    EXPECT_LE(static_cast<double>(realized), 1.2 * static_cast<double>(target))
        << t.label << " at epoch " << epoch;
    ++averaged;
  }
  return averaged;
}

// The realized batches of a trainer's averaged steps, for the log.
std::string RealizedBatches(const Trainer& t) {
  std::string out;
  for (const auto& s : t.steps) {
    if (!s["averaged"].get<bool>()) continue;
    out += (out.empty() ? "" : " ") + std::to_string(s["realized_batch"].get<int64_t>());
  }
  return out;
}

// The CNN runs: local batches of 16 and a global batch of 2048, so 32 local batches per peer per
// epoch in a swarm of 4 (0.2-0.4 s here). A batch is atomic, so a step can overshoot the target
// by up to one batch per peer: 4 x 16 is 3% of 2048, leaving the [1.0, 1.2] bound to the
// readiness protocol. The paces below cover epochs much shorter and much longer than that.
constexpr int64_t kBatch = 16;
constexpr int64_t kTarget = 2048;

std::vector<std::string> SyncArgs(int64_t epochs) {
  return {"--batch-size",          std::to_string(kBatch), "--target-batch-size",
          std::to_string(kTarget), "--max-epochs",         std::to_string(epochs)};
}

// Starts `n` peers at once (so that none trains long alone before the others are up), each with
// `args` plus its own --seed (first_seed + i), and waits until all are ready.
void StartPeers(TrainSwarm& swarm, int n, const std::vector<std::string>& args,
                uint64_t first_seed = 1) {
  for (int i = 0; i < n; ++i) {
    auto a = args;
    a.insert(a.end(), {"--seed", std::to_string(first_seed + static_cast<uint64_t>(i)),
                       "--min-peers", std::to_string(n)});
    swarm.Spawn("peer" + std::to_string(swarm.size()), a);
  }
  for (size_t i = swarm.size() - static_cast<size_t>(n); i < swarm.size(); ++i) {
    Status st = swarm.WaitReady(i);
    ASSERT_TRUE(st.ok()) << st.ToString() << "\n" << swarm.Logs();
  }
}

// Waits for every trainer in [begin, end) to finish; their "done" events.
std::vector<json> AllDone(TrainSwarm& swarm, size_t begin, size_t end,
                          std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<json> out;
  for (size_t i = begin; i < end; ++i) {
    const auto left = std::max<std::chrono::milliseconds>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()), 1s);
    auto d = swarm.WaitDone(i, left);
    EXPECT_TRUE(d.ok()) << d.status().ToString() << "\n" << swarm.Logs();
    if (!d.ok()) return {};
    out.push_back(*d);
  }
  return out;
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// ---- 1. four peers train like one process with the same global batch ---------------------------

TEST(TrainProcesses, FourPeersMatchOneProcessWithTheSameGlobalBatch) {
  const auto t0 = Clock::now();
  constexpr int kEpochs = 20;
  std::vector<json> swarm_done;
  TrainSwarm swarm(RunId("parity-swarm"));
  ASSERT_TRUE(swarm.ok());
  ASSERT_NO_FATAL_FAILURE(StartPeers(swarm, 4, SyncArgs(kEpochs)));
  swarm_done = AllDone(swarm, 0, 4, HangGuard(60s));
  ASSERT_EQ(swarm_done.size(), 4u);
  const double swarm_seconds = Seconds(t0);

  TrainSwarm single(RunId("parity-single"));
  ASSERT_TRUE(single.ok());
  ASSERT_NO_FATAL_FAILURE(
      StartPeers(single, 1,
                 {"--batch-size", std::to_string(kTarget), "--target-batch-size",
                  std::to_string(kTarget), "--max-epochs", std::to_string(kEpochs)},
                 /*first_seed=*/100));
  auto single_done = AllDone(single, 0, 1, HangGuard(30s));
  ASSERT_EQ(single_done.size(), 1u);

  // Every peer applied the same averaged gradients to the same initial weights: the same model,
  // bit for bit. The peers start together (--min-peers), so every step has all 4, and its
  // realized batch is within [1.0, 1.2] x the target.
  for (size_t i = 0; i < 4; ++i) {
    const auto& t = swarm.trainer(i);
    EXPECT_EQ(swarm_done[i]["epoch"], kEpochs) << t.label;
    EXPECT_EQ(swarm_done[i]["params_hash"], swarm_done[0]["params_hash"])
        << t.label << " diverged from peer0";
    EXPECT_EQ(ExpectStepsTogether(t, kTarget, [](int64_t) { return 4; }), kEpochs) << t.label;
    std::printf("[parity] %s: realized batches %s; eval loss %.6f\n", t.label.c_str(),
                RealizedBatches(t).c_str(), EvalLoss(swarm_done[i]));
  }

  // Tolerance. Single processes (batch 512, 40 epochs, init seed 7) differing only in --seed
  // ended at eval losses 0.689, 0.700, 0.684, 0.701, 0.702, 0.694, 0.680, 0.668, 0.702, 0.686
  // (mean 0.691, standard deviation 0.011, range 0.035). The swarm's data order is one more
  // such draw, so the two runs differ by about the range at worst; 0.1 is about 2.9x that. A
  // swarm that averaged wrongly (a sum, an unweighted mean, local gradients only, no step) lands
  // far outside: the initial loss is 2.31.
  constexpr double kTolerance = 0.1;
  const double swarm_loss = EvalLoss(swarm_done[0]);
  const double single_loss = EvalLoss(single_done[0]);
  std::printf(
      "[parity] swarm eval loss %.4f in %.1f s, single process %.4f, |diff| %.4f "
      "(tolerance %.2f)\n",
      swarm_loss, swarm_seconds, single_loss, std::fabs(swarm_loss - single_loss), kTolerance);
  RecordProperty("swarm_eval_loss", std::to_string(swarm_loss));
  RecordProperty("single_eval_loss", std::to_string(single_loss));
  EXPECT_NEAR(swarm_loss, single_loss, kTolerance);
  EXPECT_TRUE(std::isfinite(swarm_loss));
}

// ---- 2. the same promises at other paces --------------------------------------------------------

// A swarm of 4 whose pace the test sets, whatever this machine's speed: the model, local batch,
// target, and per-peer --batch-delay (a slower device). Each case keeps 4 local batches within a
// tenth of the target (a batch is atomic), so that the [1.0, 1.2] bound tests the protocol.
struct Pace {
  std::string name;
  std::vector<std::string> args;  // shared by the 4 peers
  std::vector<double> delays_ms;  // --batch-delay of each peer
  int64_t target = 0;
  int epochs = 0;
};

void PrintTo(const Pace& pace, std::ostream* os) { *os << pace.name; }

class TrainPaces : public ::testing::TestWithParam<Pace> {};

TEST_P(TrainPaces, EveryStepMeetsTheTargetAndThePeersEndWithOneModel) {
  const Pace& pace = GetParam();
  TrainSwarm swarm(RunId("pace-" + pace.name));
  ASSERT_TRUE(swarm.ok());
  for (size_t i = 0; i < pace.delays_ms.size(); ++i) {
    auto a = pace.args;
    a.insert(a.end(), {"--target-batch-size", std::to_string(pace.target), "--max-epochs",
                       std::to_string(pace.epochs), "--batch-delay",
                       std::to_string(pace.delays_ms[i]), "--seed", std::to_string(i + 1),
                       "--min-peers", std::to_string(pace.delays_ms.size())});
    swarm.Spawn("peer" + std::to_string(i), a);
  }
  const size_t n = pace.delays_ms.size();
  for (size_t i = 0; i < n; ++i) {
    Status st = swarm.WaitReady(i);
    ASSERT_TRUE(st.ok()) << st.ToString() << "\n" << swarm.Logs();
  }
  auto done = AllDone(swarm, 0, n, HangGuard(120s));
  ASSERT_EQ(done.size(), n);
  for (size_t i = 0; i < n; ++i) {
    const auto& t = swarm.trainer(i);
    const auto& steps = t.steps;
    const double seconds =
        steps.size() > 1
            ? (steps.back()["elapsed"].get<double>() - steps.front()["elapsed"].get<double>()) /
                  static_cast<double>(steps.size() - 1)
            : 0;
    std::printf("[%s] %s: %zu steps, %.0f ms per epoch, %.0f samples/s; realized batches %s\n",
                pace.name.c_str(), t.label.c_str(), steps.size(), seconds * 1000,
                steps.empty() ? 0.0 : steps.back()["samples_per_second"].get<double>(),
                RealizedBatches(t).c_str());
    EXPECT_EQ(done[i]["epoch"], pace.epochs) << t.label;
    EXPECT_EQ(done[i]["params_hash"], done[0]["params_hash"]) << t.label << " differs from peer0";
    EXPECT_EQ(done[i]["state_loads"], 0) << t.label;
    EXPECT_EQ(ExpectStepsTogether(t, pace.target, [n](int64_t) { return n; }), pace.epochs)
        << t.label;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Speeds, TrainPaces,
    ::testing::Values(
        // Logistic regression, batches of 8 every ~0.5 ms: the computing part of an epoch lasts
        // ~20-40 ms, under half the progress refresh period (GPUs step this fast). Peers stop at
        // the target by extrapolating each other's reports, so the overshoot grows with how long
        // a peer computes unlike its reported rate (descheduled or resumed on a loaded machine);
        // the bound allows a fifth of the epoch's compute time. At a target of 512 that was a few
        // ms, and a run of the suite on 2 loaded cores once overshot it (616 of 614.4); at 1024
        // the largest of 120 epochs under two busy loops here was 1048.
        Pace{"tiny",
             {"--classifier", "linear", "--batch-size", "8"},
             {0.5, 0.5, 0.5, 0.5},
             1024,
             20},
        // The CNN slowed to ~50 ms per batch: epochs of ~0.8 s, each peer's report period (a
        // batch) longer than the refresh period.
        Pace{"throttled", {"--batch-size", "16"}, {50, 50, 50, 50}, 1024, 6},
        // PowerSGD (rank 2) on the CNN, ~20 ms per batch: the peers must still step together
        // and end with one model, bit for bit (each applies the same low-rank product).
        Pace{"powersgd", {"--batch-size", "16", "--powersgd-rank", "2"}, {20, 20, 20, 20}, 512, 6},
        // One peer 10x faster than the other three (1 ms vs 10 ms per batch of 8).
        Pace{"heterogeneous",
             {"--classifier", "linear", "--batch-size", "8"},
             {1, 10, 10, 10},
             1024,
             20}),
    [](const ::testing::TestParamInfo<Pace>& p) { return p.param.name; });

// ---- 3. a peer SIGKILLed mid-run ---------------------------------------------------------------

TEST(TrainProcesses, SurvivorsFinishAfterAPeerIsKilled) {
  constexpr int kEpochs = 30;
  TrainSwarm swarm(RunId("sigkill"));
  ASSERT_TRUE(swarm.ok());
  ASSERT_NO_FATAL_FAILURE(StartPeers(swarm, 4, SyncArgs(kEpochs)));
  const size_t victim = 3;  // the bootstrap is the separate `colony dht` process
  auto at5 = swarm.WaitEpoch(victim, 5, HangGuard(60s));
  ASSERT_TRUE(at5.ok()) << at5.status().ToString() << "\n" << swarm.Logs();
  ASSERT_TRUE(swarm.trainer(victim).process->running());
  swarm.trainer(victim).process->Signal(SIGKILL);
  const auto killed_at = Clock::now();
  const int64_t kill_epoch = (*at5)["epoch"].get<int64_t>();
  std::printf("[sigkill] killed %s at epoch %lld\n", swarm.trainer(victim).label.c_str(),
              static_cast<long long>(kill_epoch));
  auto code = swarm.trainer(victim).process->Wait(10s);
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 128 + SIGKILL);

  auto done = AllDone(swarm, 0, 3, HangGuard(60s));
  ASSERT_EQ(done.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const auto& t = swarm.trainer(i);
    ASSERT_TRUE(t.initial_eval.has_value()) << t.label;
    const double loss = EvalLoss(done[i]);
    std::printf(
        "[sigkill] %s: epoch %lld, eval loss %.4f (initial %.4f), %lld failed rounds, "
        "%lld state loads, finished %.1f s after the kill\n",
        t.label.c_str(), static_cast<long long>(done[i]["epoch"].get<int64_t>()), loss,
        *t.initial_eval, static_cast<long long>(done[i]["failed_rounds"].get<int64_t>()),
        static_cast<long long>(done[i]["state_loads"].get<int64_t>()), Seconds(killed_at));
    EXPECT_EQ(done[i]["epoch"], kEpochs) << t.label;
    EXPECT_TRUE(std::isfinite(loss)) << t.label;
    EXPECT_LT(loss, *t.initial_eval) << t.label;
    // The survivors went on training together: after the round that lost the victim, (nearly)
    // every step averaged the three of them (not a peer stepping alone to max-epochs).
    int64_t together = 0, later = 0;
    for (const auto& s : t.steps) {
      if (s["epoch"].get<int64_t>() <= kill_epoch + 1) continue;
      ++later;
      if (s["averaged"].get<bool>() && s["group_size"].get<int64_t>() == 3) ++together;
    }
    std::printf(
        "[sigkill] %s: %lld of its %lld steps after epoch %lld averaged by the 3 "
        "survivors\n",
        t.label.c_str(), static_cast<long long>(together), static_cast<long long>(later),
        static_cast<long long>(kill_epoch + 1));
    EXPECT_GE(together, (kEpochs - kill_epoch - 1) * 3 / 4) << t.label;
  }
}

// ---- 4. a peer joins a run in progress --------------------------------------------------------

// Three peers train 30 epochs; a fourth starts with them but stands by (--join-at-epoch) until the
// swarm reaches epoch 10 (early) or 28 (two epochs before the end), then joins.
class LatePeer : public ::testing::TestWithParam<int64_t> {};

TEST_P(LatePeer, DownloadsTheStateOnceTrainsWithTheSwarmAndEndsWithTheSameModel) {
  constexpr int kEpochs = 30;
  const int64_t join_at = GetParam();
  const std::vector<std::string> args = SyncArgs(kEpochs);
  TrainSwarm swarm(RunId("join" + std::to_string(join_at)));
  ASSERT_TRUE(swarm.ok());
  auto late_args = args;
  late_args.insert(late_args.end(), {"--seed", "4", "--join-at-epoch", std::to_string(join_at)});
  const size_t late = swarm.Spawn("late", late_args);
  ASSERT_NO_FATAL_FAILURE(StartPeers(swarm, 3, args));
  ASSERT_TRUE(swarm.WaitReady(late).ok()) << swarm.Logs();
  auto done = AllDone(swarm, 0, 4, HangGuard(90s));
  ASSERT_EQ(done.size(), 4u);
  const Trainer& l = swarm.trainer(late);
  auto averaged = std::find_if(l.steps.begin(), l.steps.end(),
                               [](const json& s) { return s["averaged"].get<bool>(); });
  ASSERT_NE(averaged, l.steps.end()) << "the late peer never averaged\n" << swarm.Logs();
  const int64_t first = (*averaged)["epoch"].get<int64_t>();
  std::printf("[join %lld] the late peer's first averaged step: %s\n",
              static_cast<long long>(join_at), averaged->dump().c_str());
  for (size_t i = 0; i < 4; ++i) {
    const auto& t = swarm.trainer(i);
    std::printf(
        "[join %lld] %s: epoch %lld, %zu steps, %lld state loads, %lld samples dropped, "
        "realized batches %s\n",
        static_cast<long long>(join_at), t.label.c_str(),
        static_cast<long long>(done[i]["epoch"].get<int64_t>()), t.steps.size(),
        static_cast<long long>(done[i]["state_loads"].get<int64_t>()),
        static_cast<long long>(done[i]["dropped_samples"].get<int64_t>()),
        RealizedBatches(t).c_str());
    EXPECT_EQ(done[i]["epoch"], kEpochs) << t.label;
    EXPECT_EQ(done[i]["params_hash"], done[0]["params_hash"]) << t.label << " differs from peer0";
  }
  // Catching up cost one download, and from then on the late peer took every step with the
  // swarm: groups of 3 before it arrived, of 4 from its first step on.
  EXPECT_EQ(done[late]["state_loads"], 1);
  EXPECT_GE(first, join_at + 1);
  EXPECT_LE(first, join_at + 3) << "the late peer took long to join";
  auto group = [first](int64_t epoch) -> size_t { return epoch < first ? 3 : 4; };
  EXPECT_EQ(ExpectStepsTogether(l, kTarget, group), kEpochs - first + 1);
  for (size_t i = 0; i < 4; ++i) {
    if (i == late) continue;
    EXPECT_EQ(ExpectStepsTogether(swarm.trainer(i), kTarget, group), kEpochs)
        << swarm.trainer(i).label;
    EXPECT_EQ(done[i]["state_loads"], 0) << swarm.trainer(i).label;
  }
}

INSTANTIATE_TEST_SUITE_P(Epochs, LatePeer, ::testing::Values(10, 28),
                         [](const ::testing::TestParamInfo<int64_t>& p) {
                           return "AtEpoch" + std::to_string(p.param);
                         });

// ---- 5. DiLoCo sends far less than synchronous training ---------------------------------------

struct RunSummary {
  uint64_t bytes_sent = 0;
  double eval_loss = 0;  // peer 0's
  double max_loss_spread = 0;
  int64_t samples = 0;  // summed over peers
  double seconds = 0;
  int64_t failed_rounds = 0;  // summed over peers
  // The fewest steps any peer took that all four peers averaged (a failed round sends fewer
  // bytes, so the byte counts only compare runs whose rounds averaged).
  int64_t min_steps_averaged_by_all = 0;
};

void RunFourPeers(const std::string& name, const std::vector<std::string>& args, RunSummary& out) {
  const auto t0 = Clock::now();
  TrainSwarm swarm(RunId(name));
  ASSERT_TRUE(swarm.ok());
  ASSERT_NO_FATAL_FAILURE(StartPeers(swarm, 4, args));
  auto done = AllDone(swarm, 0, 4, HangGuard(60s));
  ASSERT_EQ(done.size(), 4u);
  out.seconds = Seconds(t0);
  out.eval_loss = EvalLoss(done[0]);
  out.min_steps_averaged_by_all = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < 4; ++i) {
    int64_t by_all = 0;
    for (const auto& s : swarm.trainer(i).steps) {
      by_all += s["averaged"].get<bool>() && s["group_size"].get<size_t>() == 4 ? 1 : 0;
    }
    out.min_steps_averaged_by_all = std::min(out.min_steps_averaged_by_all, by_all);
    out.failed_rounds += done[i]["failed_rounds"].get<int64_t>();
    out.bytes_sent += done[i]["bytes_sent"].get<uint64_t>();
    out.samples += done[i]["samples"].get<int64_t>();
    out.max_loss_spread =
        std::max(out.max_loss_spread, std::fabs(EvalLoss(done[i]) - out.eval_loss));
    std::printf(
        "[%s] %s: epoch %lld, %lld samples, sent %llu bytes, eval loss %.4f, %lld failed "
        "rounds, %lld state loads\n",
        name.c_str(), swarm.trainer(i).label.c_str(),
        static_cast<long long>(done[i]["epoch"].get<int64_t>()),
        static_cast<long long>(done[i]["samples"].get<int64_t>()),
        static_cast<unsigned long long>(done[i]["bytes_sent"].get<uint64_t>()), EvalLoss(done[i]),
        static_cast<long long>(done[i]["failed_rounds"].get<int64_t>()),
        static_cast<long long>(done[i]["state_loads"].get<int64_t>()));
  }
}

TEST(TrainProcesses, DilocoSendsTenTimesLessForTheSameSamples) {
  // Synchronous: 20 global steps of 512 samples (batches of 32; the target of 128 would
  // be one batch per peer per epoch, too fast for the progress tracker, see kSyncTarget), about
  // 20 x 512 / 4 = 2560 samples per peer. DiLoCo: an epoch is 40 inner steps of 32 samples per
  // peer (1280 samples), so 2 epochs give each peer the same 2560 samples. 10x fewer rounds and
  // 8-bit codes instead of fp32 leave room for the traffic that does not shrink (DHT, progress
  // records, matchmaking; about 130 KB per peer and run): with 20 inner steps (5x fewer rounds)
  // the ratio was 10.6 when every synchronous round succeeded and 9.8 when one failed.
  constexpr int kPeers = 4;
  constexpr int64_t kSyncTarget = 512;
  constexpr int64_t kDilocoBatch = 32;
  constexpr int kSyncEpochs = 20;
  constexpr int kInner = 40;
  constexpr int kDilocoEpochs =
      static_cast<int>(kSyncEpochs * kSyncTarget / kPeers / (kInner * kDilocoBatch));
  static_assert(kDilocoEpochs == 2);
  RunSummary sync, diloco;
  ASSERT_NO_FATAL_FAILURE(
      RunFourPeers("sync",
                   {"--batch-size", std::to_string(kDilocoBatch), "--target-batch-size",
                    std::to_string(kSyncTarget), "--max-epochs", std::to_string(kSyncEpochs)},
                   sync));
  ASSERT_NO_FATAL_FAILURE(
      RunFourPeers("diloco",
                   {"--batch-size", std::to_string(kDilocoBatch), "--target-batch-size",
                    std::to_string(kSyncTarget), "--max-epochs", std::to_string(kDilocoEpochs),
                    "--diloco-inner-steps", std::to_string(kInner), "--diloco-codec", "blockwise8"},
                   diloco));
  const double ratio = static_cast<double>(sync.bytes_sent) /
                       static_cast<double>(std::max<uint64_t>(diloco.bytes_sent, 1));
  for (const auto* r : {&sync, &diloco}) {
    std::printf(
        "[diloco] %-11s %llu bytes sent, %lld samples, eval loss %.4f (peers within %.1e), "
        "%.1f s\n",
        r == &sync ? "synchronous" : "DiLoCo", static_cast<unsigned long long>(r->bytes_sent),
        static_cast<long long>(r->samples), r->eval_loss, r->max_loss_spread, r->seconds);
  }
  std::printf("[diloco] %.1fx fewer bytes with DiLoCo\n", ratio);
  std::printf(
      "[diloco] failed rounds: synchronous %lld, DiLoCo %lld; steps averaged by all 4 peers (the "
      "fewest of any peer): synchronous %lld of %d, DiLoCo %lld of %d\n",
      static_cast<long long>(sync.failed_rounds), static_cast<long long>(diloco.failed_rounds),
      static_cast<long long>(sync.min_steps_averaged_by_all), kSyncEpochs,
      static_cast<long long>(diloco.min_steps_averaged_by_all), kDilocoEpochs);
  // The ratio is honest only when DiLoCo's rounds all averaged: a failed one sends less. A
  // synchronous round that fails lowers the ratio, so a few are tolerated (one in 80 was seen).
  EXPECT_EQ(diloco.failed_rounds, 0);
  EXPECT_EQ(diloco.min_steps_averaged_by_all, kDilocoEpochs);
  EXPECT_LE(sync.failed_rounds, 4);
  EXPECT_GE(sync.min_steps_averaged_by_all, kSyncEpochs - 2);
  // Peers that averaged every round end (nearly) equal: synchronous peers apply the same averaged
  // gradients, DiLoCo peers the same 8-bit-coded pseudo-gradients (measured within 1e-3).
  EXPECT_LE(sync.max_loss_spread, 1e-2);
  EXPECT_LE(diloco.max_loss_spread, 1e-2);
  RecordProperty("sync_bytes_sent", std::to_string(sync.bytes_sent));
  RecordProperty("diloco_bytes_sent", std::to_string(diloco.bytes_sent));
  RecordProperty("bytes_ratio", std::to_string(ratio));
  RecordProperty("sync_eval_loss", std::to_string(sync.eval_loss));
  RecordProperty("diloco_eval_loss", std::to_string(diloco.eval_loss));
  // Both runs saw about the same data (more for the synchronous run when its realized batch
  // overshoots the target).
  const double sample_ratio =
      static_cast<double>(sync.samples) / static_cast<double>(std::max<int64_t>(diloco.samples, 1));
  std::printf("[diloco] the synchronous run trained on %.2fx the samples of the DiLoCo run\n",
              sample_ratio);
  EXPECT_GT(sample_ratio, 0.5);
  EXPECT_LT(sample_ratio, 3.0);  // loose: the realized batch is checked by the parity test
  EXPECT_GE(ratio, 10.0);
  // Tolerance. Measured: synchronous 1.005, 1.034 and 1.015, DiLoCo 0.766, 0.765 and 0.765 (peer
  // 0, three runs each; the DiLoCo peers agree within 1e-3, its averaging is lossy); single
  // processes with batch 512 differ by up to 0.035 across data orders. DiLoCo takes 4x more
  // optimizer steps in all and lands far below the synchronous run; 0.05 (about 1.5x the data-order
  // range) only absorbs noise if both ever end close together.
  constexpr double kTolerance = 0.05;
  EXPECT_LE(diloco.eval_loss, sync.eval_loss + kTolerance);
  EXPECT_TRUE(std::isfinite(diloco.eval_loss));
}

// ---- 6. a peer that sends NaN gradients --------------------------------------------------------

TEST(TrainProcesses, HonestPeersIgnoreAPeerSendingNanGradients) {
  constexpr int kEpochs = 30;
  const std::vector<std::string> args = SyncArgs(kEpochs);
  TrainSwarm swarm(RunId("nan"));
  ASSERT_TRUE(swarm.ok());
  for (int i = 0; i < 4; ++i) {
    auto a = args;
    a.insert(a.end(), {"--seed", std::to_string(i + 1)});
    if (i == 3) a.insert(a.end(), {"--nan-gradients-every", "1"});
    swarm.Spawn(i == 3 ? "nan-peer" : "peer" + std::to_string(i), a);
  }
  for (size_t i = 0; i < 4; ++i) {
    Status st = swarm.WaitReady(i);
    ASSERT_TRUE(st.ok()) << st.ToString() << "\n" << swarm.Logs();
  }
  auto done = AllDone(swarm, 0, 3, HangGuard(60s));
  ASSERT_EQ(done.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const auto& t = swarm.trainer(i);
    ASSERT_TRUE(t.initial_eval.has_value()) << t.label;
    const double loss = EvalLoss(done[i]);
    std::printf(
        "[nan] %s: epoch %lld, eval loss %.6f (initial %.4f), %lld skipped batches, %lld "
        "failed rounds, %lld state loads\n",
        t.label.c_str(), static_cast<long long>(done[i]["epoch"].get<int64_t>()), loss,
        *t.initial_eval, static_cast<long long>(done[i]["skipped_batches"].get<int64_t>()),
        static_cast<long long>(done[i]["failed_rounds"].get<int64_t>()),
        static_cast<long long>(done[i]["state_loads"].get<int64_t>()));
    EXPECT_EQ(done[i]["epoch"], kEpochs) << t.label;
    EXPECT_TRUE(std::isfinite(loss)) << t.label;
    EXPECT_LT(loss, *t.initial_eval) << t.label;
    EXPECT_NEAR(loss, EvalLoss(done[0]), 1e-5) << t.label << " differs from peer0";
  }
  // The broken peer's own end, for the log (it is not required to finish).
  auto nan_done = swarm.WaitDone(3, HangGuard(20s));
  if (nan_done.ok()) {
    std::printf("[nan] nan-peer: %s\n", nan_done->dump().c_str());
  } else {
    std::printf("[nan] nan-peer did not finish: %s\n", nan_done.status().ToString().c_str());
  }
}

// ---- BTARD's audits: Byzantine peers are banned by every honest peer --------------------------

// Three honest peers and two attackers from epoch 2 on, one sending its gradient's negation and
// one training on wrong labels, both claiming their true data. With everyone audited every round
// (--audit-targets 5), every honest peer bans both in the round of epoch 2 (the step to epoch 3),
// bans nobody else, and the honest peers end with one model. The attackers' gradients of epochs
// 0 and 1 are honest and pass their audits.
TEST(TrainProcesses, AuditsBanASignFlipperAndALabelFlipperAndNoHonestPeer) {
  constexpr int kEpochs = 5;
  TrainSwarm swarm(RunId("audits"));
  ASSERT_TRUE(swarm.ok());
  const std::vector<std::string> attacks = {"", "", "", "sign-flip", "label-flip"};
  for (size_t i = 0; i < attacks.size(); ++i) {
    std::vector<std::string> a = {"--classifier",
                                  "linear",
                                  "--batch-size",
                                  "32",
                                  "--target-batch-size",
                                  "320",
                                  "--max-epochs",
                                  std::to_string(kEpochs),
                                  "--min-peers",
                                  "5",
                                  "--verify-rounds",
                                  "--centered-clip-tau",
                                  "1",
                                  "--audit-targets",
                                  "5"};
    if (!attacks[i].empty()) a.insert(a.end(), {"--attack", attacks[i], "--attack-from", "2"});
    swarm.Spawn(attacks[i].empty() ? "peer" + std::to_string(i) : attacks[i], a);
  }
  for (size_t i = 0; i < attacks.size(); ++i) {
    Status st = swarm.WaitReady(i);
    ASSERT_TRUE(st.ok()) << st.ToString() << "\n" << swarm.Logs();
  }
  const std::set<std::string> attackers = {swarm.trainer(3).ready["peer"].get<std::string>(),
                                           swarm.trainer(4).ready["peer"].get<std::string>()};
  auto done = AllDone(swarm, 0, 3, HangGuard(120s));
  ASSERT_EQ(done.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const auto& t = swarm.trainer(i);
    EXPECT_EQ(done[i]["epoch"], kEpochs) << t.label;
    for (const json& step : t.steps) {
      const int64_t epoch = step["epoch"].get<int64_t>();
      std::set<std::string> banned;
      if (step.contains("banned")) {
        for (const auto& b : step["banned"]) banned.insert(b.get<std::string>());
      }
      EXPECT_EQ(banned, epoch == 3 ? attackers : std::set<std::string>{})
          << t.label << " at epoch " << epoch << ": " << step.dump();
    }
    EXPECT_EQ(done[i]["params_hash"], done[0]["params_hash"]) << t.label << " differs from peer0";
  }
}

}  // namespace
}  // namespace colony::train
