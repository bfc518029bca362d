// Averaging between real `colony average` processes on loopback: each fault kind injected into
// one peer (SIGKILL, SIGSTOP or a self-cancel at a precise moment) while the survivors must
// finish with a result that is exactly the weighted mean of the peers whose data they report;
// Moshpit rounds of 16 peers reaching the global mean; state download surviving a killed donor.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "averaging/averager.h"
#include "core/subprocess.h"
#include "dht/node.h"
#include "test_support.h"

namespace colony::averaging {
namespace {

using namespace std::chrono_literals;
using colony::test::ColonyBinary;
using colony::test::ReadFloats;
using colony::test::ScratchPath;
using nlohmann::json;

struct PeerProcess {
  std::optional<Subprocess> process;
  std::string output;
  std::string err;  // its stderr
  uint64_t seed = 0;
  double weight = 1;
};

class ProcessSwarm {
 public:
  ProcessSwarm() {
    auto boot = Subprocess::Spawn(
        {ColonyBinary(), "--log-level", "warn", "dht", "--listen", "/ip4/127.0.0.1/tcp/0"});
    EXPECT_TRUE(boot.ok());
    bootstrap_ = std::make_unique<Subprocess>(std::move(*boot));
    auto line = bootstrap_->ReadLine(20s);
    EXPECT_TRUE(line.ok()) << line.status().ToString();
    bootstrap_addr_ = line.ok() ? *line : "";
  }

  // Starts a peer; `seed` names its data (SyntheticValues) and is sent as its gathered metadata.
  // With `wait`, returns once it is ready; else WaitReady(i) must follow.
  void Add(uint64_t seed, std::vector<std::string> args, double weight = 1.0, bool wait = true) {
    PeerProcess p;
    p.seed = seed;
    p.weight = weight;
    p.output = ScratchPath("peer" + std::to_string(seed) + ".bin");
    std::vector<std::string> argv = {ColonyBinary(),
                                     "--log-level",
                                     "warn",
                                     "average",
                                     "--initial-peers",
                                     bootstrap_addr_,
                                     "--seed",
                                     std::to_string(seed),
                                     "--gather",
                                     std::to_string(seed),
                                     "--weight",
                                     std::to_string(weight),
                                     "--output",
                                     p.output};
    argv.insert(argv.end(), args.begin(), args.end());
    p.err = ScratchPath("peer" + std::to_string(seed) + ".err");
    auto proc = Subprocess::Spawn(argv, p.err);
    ASSERT_TRUE(proc.ok()) << proc.status().ToString();
    p.process.emplace(std::move(*proc));
    peers_.push_back(std::move(p));
    if (wait) {
      ASSERT_NO_FATAL_FAILURE(WaitReady(peers_.size() - 1));
    }
  }

  void WaitReady(size_t i) {
    auto ready = peers_[i].process->ReadLine(60s);
    ASSERT_TRUE(ready.ok()) << "peer " << peers_[i].seed << ": " << ready.status().ToString();
    ASSERT_EQ(json::parse(*ready)["event"], "ready") << *ready;
  }

  // Starts the first round of every peer added with --start-on-signal, all at once.
  void StartRounds() {
    for (auto& p : peers_) p.process->Signal(SIGUSR1);
  }

  // The next "round" (or "state") line of peer i.
  Result<json> NextEvent(size_t i, std::chrono::milliseconds timeout = 90s) {
    for (;;) {
      auto line = peers_[i].process->ReadLine(timeout);
      if (!line.ok()) return line.status();
      auto j = json::parse(*line, nullptr, false);
      if (j.is_discarded()) continue;
      if (j["event"] == "round" || j["event"] == "state") return j;
    }
  }

  // Checks that peer i's output equals, part by part, the weighted mean of the data of the
  // members its round reports as contributors.
  void ExpectConsistent(size_t i, const json& round, size_t values, float atol = 1e-5f) {
    ASSERT_TRUE(round["ok"].get<bool>()) << round.dump();
    const auto out = ReadFloats(peers_[i].output);
    ASSERT_EQ(out.size(), values);
    std::vector<uint64_t> member_seed;
    for (const auto& m : round["members"])
      member_seed.push_back(std::stoull(m["gathered"].get<std::string>()));
    std::map<uint64_t, double> weight_of;
    for (const auto& p : peers_) weight_of[p.seed] = p.weight;
    uint64_t covered = 0;
    for (const auto& part : round["parts"]) {
      const uint64_t b = part[0], e = part[1];
      ASSERT_EQ(b, covered);
      covered = e;
      std::vector<double> expect(e - b, 0.0);
      double total = 0;
      std::vector<float> v(e - b);
      for (uint32_t c : part[2]) {
        const uint64_t seed = member_seed.at(c);
        SyntheticValues(seed, b, v);
        for (size_t k = 0; k < v.size(); ++k) expect[k] += weight_of[seed] * v[k];
        total += weight_of[seed];
      }
      ASSERT_GT(total, 0) << "a part with no contributors: " << part.dump();
      for (size_t k = 0; k < v.size(); ++k) {
        ASSERT_NEAR(out[b + k], expect[k] / total, atol)
            << "peer " << peers_[i].seed << " value " << b + k << " contributors " << part[2];
      }
    }
    EXPECT_EQ(covered, values);
  }

  PeerProcess& peer(size_t i) { return peers_[i]; }
  size_t size() const { return peers_.size(); }

 private:
  std::unique_ptr<Subprocess> bootstrap_;
  std::string bootstrap_addr_;
  std::vector<PeerProcess> peers_;
};

std::string StartAt(double seconds_from_now) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3f", dht::Now() + seconds_from_now);
  return buf;
}

constexpr size_t kValues = 200'000;

// The peers wait for StartRounds(): their processes may take seconds to start on a loaded
// machine, and one that started late would find the others already averaging without it.
std::vector<std::string> FaultArgs() {
  // min 3: when the faulty peer is the leader and dies before its followers read BEGIN, the
  // other three form a group of their own. A wide matchmaking window (a leader starts as soon
  // as all four are there): with the default 5 s, a peer slowed down by a loaded machine was
  // once left out while the other three averaged at the window's end. Three peers (the faulty
  // one gone or banned) wait out the window: the step's timeout leaves room for that.
  return {"--values",
          std::to_string(kValues),
          "--target-group-size",
          "4",
          "--min-group-size",
          "3",
          "--part-size-kib",
          "64",
          "--part-timeout",
          "2",
          "--matchmaking-time",
          "20",
          "--timeout",
          "60",
          "--start-on-signal"};
}

// Runs 4 peers where peer 3 injects `fault` and checks the survivors' rounds.
void RunFault(const std::string& fault, bool faulty_reports, bool faulty_absent) {
  ProcessSwarm swarm;
  const std::vector<double> weights = {1, 2, 3, 4};
  for (uint64_t i = 0; i < 4; ++i) {
    auto args = FaultArgs();
    if (i == 3) {
      args.push_back("--inject-fault");
      args.push_back(fault);
    }
    swarm.Add(i, args, weights[i], /*wait=*/false);
  }
  for (size_t i = 0; i < 4; ++i) ASSERT_NO_FATAL_FAILURE(swarm.WaitReady(i));
  swarm.StartRounds();
  for (size_t i = 0; i < 3; ++i) {
    auto round = swarm.NextEvent(i);
    ASSERT_TRUE(round.ok()) << "peer " << i << ": " << round.status().ToString();
    ASSERT_TRUE((*round)["ok"].get<bool>()) << "peer " << i << ": " << round->dump();
    // Survivors finish well before the step's deadline.
    EXPECT_LT((*round)["allreduce_s"].get<double>(), 20.0);
    swarm.ExpectConsistent(i, *round, kValues);
    if (faulty_absent) {
      for (const auto& part : (*round)["parts"]) {
        for (uint32_t c : part[2]) {
          EXPECT_NE((*round)["members"][c]["gathered"], "3") << "the faulty peer's data was used";
        }
      }
    }
  }
  auto faulty = swarm.NextEvent(3, faulty_reports ? 60s : 2s);
  if (faulty_reports) {
    ASSERT_TRUE(faulty.ok()) << faulty.status().ToString();
    EXPECT_FALSE((*faulty)["ok"].get<bool>());
    EXPECT_NE((*faulty)["error"].get<std::string>().find("cancel"), std::string::npos);
  } else {
    EXPECT_FALSE(faulty.ok());
  }
}

TEST(AveragingFaults, AReducerReturningAWrongResultIsBannedAndLeftOut) {
  // Four `colony average --verify` processes; one returns its own values as every part it
  // reduces. The honest three ban it after the first round (their values for its span are
  // their own, every other part the exact mean of all four), and average without it next.
  ProcessSwarm swarm;
  std::string liar_id;
  for (uint64_t i = 0; i < 4; ++i) {
    auto args = FaultArgs();
    args.insert(args.end(), {"--verify", "--rounds", "2"});
    if (i == 3) args.insert(args.end(), {"--lie", "wrong-result"});
    swarm.Add(i, args, 1.0, /*wait=*/false);
  }
  for (size_t i = 0; i < 4; ++i) ASSERT_NO_FATAL_FAILURE(swarm.WaitReady(i));
  swarm.StartRounds();
  for (size_t i = 0; i < 3; ++i) {
    auto round = swarm.NextEvent(i);
    ASSERT_TRUE(round.ok()) << "peer " << i << ": " << round.status().ToString();
    ASSERT_TRUE((*round)["ok"].get<bool>()) << round->dump();
    swarm.ExpectConsistent(i, *round, kValues);
    const json& members = (*round)["members"];
    for (const auto& m : members) {
      if (m["gathered"] == "3") liar_id = m["peer"];
    }
    ASSERT_FALSE(liar_id.empty()) << round->dump();
    const json& v = (*round)["verification"];
    EXPECT_EQ(v["banned"], json::array({liar_id})) << round->dump();
    EXPECT_EQ(v["discarded"], json::array({liar_id})) << round->dump();
  }
  for (size_t i = 0; i < 3; ++i) {
    auto round = swarm.NextEvent(i);
    ASSERT_TRUE(round.ok()) << "peer " << i << ": " << round.status().ToString();
    ASSERT_TRUE((*round)["ok"].get<bool>()) << round->dump();
    EXPECT_EQ((*round)["group_size"], 3) << round->dump();
    for (const auto& m : (*round)["members"]) EXPECT_NE(m["peer"], liar_id);
    EXPECT_TRUE((*round)["verification"]["banned"].empty()) << round->dump();
  }
}

TEST(AveragingFaults, ARoundThatAveragedWithNobodyIsNotOk) {
  // A pair whose other member dies once the group is formed: the survivor excludes it after the
  // part timeout and its result holds only its own data. That is not a round of two that
  // succeeded (it used to say ok with group_size 2).
  ProcessSwarm swarm;
  for (uint64_t i = 0; i < 2; ++i) {
    auto args = FaultArgs();
    for (size_t k = 0; k + 1 < args.size(); ++k) {
      if (args[k] == "--target-group-size" || args[k] == "--min-group-size") args[k + 1] = "2";
      if (args[k] == "--matchmaking-time") args[k + 1] = i == 0 ? "20" : "25";
    }
    // The pair must form its group even when a slow build starts the second process late. The
    // faulty peer declares a later expiration, so it is the follower: it dies after it has read
    // BEGIN. (As the leader it could die before its BEGIN left its process, and the survivor
    // would see no group at all, not a group that averaged with nobody.)
    if (i == 1) {
      args.push_back("--inject-fault");
      args.push_back("kill-before-sending");
    }
    swarm.Add(i, args, 1.0);
  }
  swarm.StartRounds();
  auto round = swarm.NextEvent(0);
  ASSERT_TRUE(round.ok()) << round.status().ToString();
  EXPECT_FALSE((*round)["ok"].get<bool>()) << round->dump();
  ASSERT_TRUE(round->contains("error")) << round->dump();
  EXPECT_NE((*round)["error"].get<std::string>().find("averaged with nobody"), std::string::npos)
      << round->dump();
}

TEST(AveragingFaults, PeerKilledBeforeSending) { RunFault("kill-before-sending", false, true); }
TEST(AveragingFaults, PeerKilledWhileSending) { RunFault("kill-while-sending", false, false); }
TEST(AveragingFaults, PeerFrozenWhileSending) { RunFault("stop-while-sending", false, false); }
TEST(AveragingFaults, PeerKilledWhileReducing) { RunFault("kill-while-reducing", false, false); }
TEST(AveragingFaults, PeerFrozenWhileReducing) { RunFault("stop-while-reducing", false, false); }
TEST(AveragingFaults, PeerCancelsWhileSending) { RunFault("cancel-while-sending", true, false); }

TEST(AveragingProcesses, SixteenPeersReachTheGlobalMeanInTwoMoshpitRounds) {
  ProcessSwarm swarm;
  const size_t n = 20'000;
  // A peer whose group does not form keeps its bits and lands in the wrong bucket next round,
  // so every group must form. The 16 processes start their rounds together once all are ready,
  // and a wide matchmaking window absorbs a slow one (sanitizers, a loaded machine); it costs
  // nothing otherwise, since a group starts as soon as it has 4.
  for (uint64_t i = 0; i < 16; ++i) {
    const std::string bits = std::string(1, '0' + static_cast<char>((i >> 1) & 1)) +
                             std::string(1, '0' + static_cast<char>(i & 1));
    ASSERT_NO_FATAL_FAILURE(
        swarm.Add(i,
                  {"--values", std::to_string(n), "--target-group-size", "4", "--min-group-size",
                   "4", "--group-bits", bits, "--rounds", "2", "--matchmaking-time", "60",
                   "--timeout", "120", "--part-size-kib", "16", "--start-on-signal"},
                  1.0, /*wait=*/false));
  }
  for (size_t i = 0; i < 16; ++i) ASSERT_NO_FATAL_FAILURE(swarm.WaitReady(i));
  swarm.StartRounds();
  std::vector<double> mean(n, 0.0);
  std::vector<float> v(n);
  for (uint64_t i = 0; i < 16; ++i) {
    SyntheticValues(i, 0, v);
    for (size_t k = 0; k < n; ++k) mean[k] += v[k] / 16.0;
  }
  for (size_t i = 0; i < 16; ++i) {
    for (int r = 0; r < 2; ++r) {
      auto round = swarm.NextEvent(i);
      ASSERT_TRUE(round.ok()) << "peer " << i << ": " << round.status().ToString();
      ASSERT_TRUE((*round)["ok"].get<bool>()) << round->dump();
      EXPECT_EQ((*round)["group_size"], 4) << "peer " << i << " round " << r;
    }
  }
  for (size_t i = 0; i < 16; ++i) {
    ASSERT_TRUE(swarm.peer(i).process->Wait(30s).ok());
    const auto out = ReadFloats(swarm.peer(i).output);
    ASSERT_EQ(out.size(), n);
    for (size_t k = 0; k < n; ++k) ASSERT_NEAR(out[k], mean[k], 1e-6) << "peer " << i;
  }
}

TEST(AveragingProcesses, APeerWaitingForItsStartSignalGivesUpAtItsTimeout) {
  ProcessSwarm swarm;
  swarm.Add(0, {"--values", "1000", "--start-on-signal", "--timeout", "1"});
  auto code = swarm.peer(0).process->Wait(60s);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 1);
  const std::string err = colony::test::ReadFile(swarm.peer(0).err);
  EXPECT_NE(err.find("--start-on-signal: no SIGUSR1 within --timeout (1 s)"), std::string::npos)
      << err;
}

TEST(AveragingProcesses, StateDownloadSurvivesADonorKilledMidTransfer) {
  ProcessSwarm swarm;
  // Two donors with the same 8 MB of data. The preferred one (priority 10) uploads at 4 MB/s,
  // so its transfer takes ~2 s; it is SIGKILLed as soon as it starts serving the newcomer.
  const std::string values = "2000000";
  swarm.Add(7, {"--values", values, "--share-state", "10", "--max-send-mbps", "32", "--rounds", "0",
                "--linger", "120"});
  swarm.Add(7, {"--values", values, "--share-state", "1", "--rounds", "0", "--linger", "120"});
  swarm.Add(7, {"--values", values, "--load-state", "--rounds", "0", "--timeout", "60",
                "--start-at", StartAt(2)});  // adverts reach the DHT meanwhile
  bool killed = false;
  for (;;) {
    auto line = swarm.peer(0).process->ReadLine(30s);
    ASSERT_TRUE(line.ok()) << "the preferred donor never served: " << line.status().ToString();
    if (json::parse(*line)["event"] == "serving_state") {
      swarm.peer(0).process->Signal(SIGKILL);
      killed = true;
      break;
    }
  }
  ASSERT_TRUE(killed);
  auto state = swarm.NextEvent(2);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  ASSERT_TRUE((*state)["ok"].get<bool>()) << state->dump();
  EXPECT_EQ((*state)["values"], 2'000'000);
  EXPECT_TRUE((*state)["matches_seed"].get<bool>());
}

}  // namespace
}  // namespace colony::averaging
