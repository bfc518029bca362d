// scripts/bench byzantine [--peers 16 --attackers 7 --values 200000]
//
// Verification (BTARD's check of the reducers, docs/averaging.md) in a group of N `colony
// average --verify` processes of which K attack from the first round: the first half of them
// return their own values as the result of every part they reduce (`--lie wrong-result`), the
// others lie in their checks (`--lie wrong-projections`, which also plays a false accuser: its
// numbers contradict every honest reducer's). Every peer sends its true data. After the round
// every honest peer must have banned every attacker, no honest peer may have banned an honest
// one (what attackers ban does not matter), and every honest peer's values must be, part by
// part, the exact mean of the data of the members its report names (its own values for the
// spans it discarded), computed here.
//
// Reference, in the same run: the same N peers with no attacker, with and without --verify,
// over 3 rounds: verification must ban nobody there and leave the exact mean of all N, and its
// cost is the ratio of the median round times (rounds 1-2; round 0 warms up).
//
// Then the training experiment (byzantine_training.h): the same N peers train Fashion-MNIST with
// K attackers, once per attack, with plain averaging and with the protection, against a clean
// run.
//
// Prints RESULT byzantine_verify_overhead=<ratio> (the verification round), then, over the
// training runs, byzantine_accuracy_gap=<points> (the worst attack's),
// byzantine_attackers_banned=<k>/<n> and byzantine_honest_banned=<n> (with the verification
// round's). Exits non-zero when a check fails (an honest peer banned, a cheating reducer or
// false accuser not banned, values not the exact mean, a run that did not finish, a clean run
// that did not learn); the goals
// (a gap of at most 1.5 points, every attacker banned within 50 epochs) are reported, not
// enforced.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "averaging/averager.h"
#include "bench_support.h"
#include "byzantine_training.h"
#include "core/subprocess.h"

namespace colony::bench {
namespace {

using Steady = std::chrono::steady_clock;

struct Round {
  bool ok = false;
  std::string error;
  double allreduce_s = 0;
  std::vector<std::string> members;  // peer ids
  std::vector<uint64_t> seeds;       // gathered: each member's --seed
  std::vector<std::tuple<uint64_t, uint64_t, std::vector<uint32_t>>> parts;
  std::vector<std::string> banned;  // peer ids this peer banned in the round
};

struct Peer {
  uint64_t seed = 0;
  std::string lie = "none";
  std::string output_path, stderr_path;
  std::map<int, Round> rounds;
  bool done = false;
};

struct Config {
  int peers = 16;
  int attackers = 7;
  size_t values = 200'000;
  std::string part = "all";  // averaging, training or all
  TrainingConfig training;
  std::string dir;
  std::string bootstrap;
};

void Parse(Peer& peer, const std::string& line) {
  auto j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.contains("event")) return;
  if (j["event"] == "done") peer.done = true;
  if (j["event"] != "round") return;
  Round r;
  r.ok = j.value("ok", false);
  r.error = j.value("error", "");
  if (r.ok) {
    r.allreduce_s = j.value("allreduce_s", 0.0);
    for (const auto& m : j["members"]) {
      r.members.push_back(m["peer"]);
      r.seeds.push_back(std::stoull(m["gathered"].get<std::string>()));
    }
    for (const auto& p : j["parts"]) r.parts.emplace_back(p[0], p[1], p[2]);
    if (j.contains("verification")) {
      for (const auto& b : j["verification"]["banned"]) r.banned.push_back(b);
    }
  }
  peer.rounds[j.value("round", -1)] = std::move(r);
}

// Runs the peers (lies[i] for peer i) for `rounds` rounds; empty on success, else the problem.
std::string RunPeers(const Config& c, const std::vector<std::string>& lies, bool verify, int rounds,
                     const std::string& tag, std::vector<Peer>& peers) {
  const int n = static_cast<int>(lies.size());
  const double startup = 3 + 0.5 * n;
  char start_at[64];
  std::snprintf(start_at, sizeof(start_at), "%.3f", WallNow() + startup);
  const std::string prefix = "bench-byzantine-" + std::to_string(::getpid()) + "-" + tag;
  std::vector<Subprocess> procs;
  peers.assign(static_cast<size_t>(n), {});
  for (int i = 0; i < n; ++i) {
    Peer& p = peers[static_cast<size_t>(i)];
    p.seed = static_cast<uint64_t>(i + 1);
    p.lie = lies[static_cast<size_t>(i)];
    p.output_path = c.dir + "/" + tag + "-" + std::to_string(i) + ".bin";
    p.stderr_path = c.dir + "/" + tag + "-" + std::to_string(i) + ".err";
    std::vector<std::string> args{ColonyBinary(),
                                  "--log-level",
                                  "error",
                                  "average",
                                  "--initial-peers",
                                  c.bootstrap,
                                  "--prefix",
                                  prefix,
                                  "--values",
                                  std::to_string(c.values),
                                  "--seed",
                                  std::to_string(p.seed),
                                  "--gather",
                                  std::to_string(p.seed),
                                  "--target-group-size",
                                  std::to_string(n),
                                  "--min-group-size",
                                  std::to_string(n),
                                  "--matchmaking-time",
                                  "30",
                                  "--timeout",
                                  "120",
                                  "--part-size-kib",
                                  "64",
                                  "--rounds",
                                  std::to_string(rounds),
                                  "--start-at",
                                  start_at,
                                  "--output",
                                  p.output_path};
    if (verify) args.push_back("--verify");
    if (p.lie != "none") args.insert(args.end(), {"--lie", p.lie});
    auto proc = Subprocess::Spawn(args, p.stderr_path);
    if (!proc.ok()) return proc.status().ToString();
    procs.push_back(std::move(*proc));
  }
  const auto deadline = Steady::now() + Millis(startup + rounds * 160.0);
  std::vector<std::thread> readers;
  for (size_t i = 0; i < procs.size(); ++i) {
    readers.emplace_back([&, i] {
      (void)ReadUntil(procs[i], deadline, [&](const std::string& line) {
        Parse(peers[i], line);
        return peers[i].done;
      });
    });
  }
  for (auto& t : readers) t.join();
  std::string problems;
  for (size_t i = 0; i < peers.size(); ++i) {
    if (!peers[i].done)
      problems +=
          "\n  peer " + std::to_string(i) + " did not finish" + Tail(peers[i].stderr_path, 4);
  }
  return problems;
}

// Whether peer i's values (its --output after its last round, which must be round `r`) are,
// part by part, the exact mean of its contributors' synthetic data; empty when right.
std::string CheckValues(const Config& c, const Peer& peer, int r) {
  auto it = peer.rounds.find(r);
  if (it == peer.rounds.end() || !it->second.ok) {
    return "round " + std::to_string(r) +
           " failed: " + (it == peer.rounds.end() ? "not reported" : it->second.error);
  }
  const Round& round = it->second;
  std::vector<float> out(c.values);
  std::ifstream in(peer.output_path, std::ios::binary);
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size() * 4));
  if (!in) return "no values written";
  uint64_t covered = 0;
  std::vector<float> v;
  for (const auto& [b, e, contributors] : round.parts) {
    if (b != covered || contributors.empty()) return "its parts do not tile, or one is empty";
    covered = e;
    std::vector<double> mean(e - b, 0.0);
    v.resize(e - b);
    for (uint32_t m : contributors) {
      averaging::SyntheticValues(round.seeds.at(m), b, v);
      for (size_t k = 0; k < v.size(); ++k)
        mean[k] += v[k] / static_cast<double>(contributors.size());
    }
    for (size_t k = 0; k < v.size(); ++k) {
      if (std::abs(out[b + k] - mean[k]) > 1e-5) {
        return "value " + std::to_string(b + k) + " is not the mean of its " +
               std::to_string(contributors.size()) + " contributors";
      }
    }
  }
  return covered == c.values ? "" : "its parts do not cover the values";
}

double MedianRoundTime(const std::vector<Peer>& peers) {
  std::vector<double> t;
  for (const Peer& p : peers) {
    for (const auto& [r, round] : p.rounds) {
      if (r >= 1 && round.ok) t.push_back(round.allreduce_s);
    }
  }
  if (t.empty()) return 0;
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The verification round (see the top); its honest bans are added to `honest_banned`.
int RunAveraging(Config& c, int& honest_banned_total) {
  bool failed = false;
  const int n = c.peers;

  // The attack: K attackers, half lying as reducers, half in their checks.
  std::vector<std::string> lies(static_cast<size_t>(n), "none");
  for (int a = 0; a < c.attackers; ++a) {
    lies[static_cast<size_t>(n - 1 - a)] = a % 2 == 0 ? "wrong-result" : "wrong-projections";
  }
  std::vector<Peer> attacked;
  const auto started = Steady::now();
  std::string problem = RunPeers(c, lies, true, 1, "attacked", attacked);
  std::printf("attacked run: %d peers, %d attackers (%d wrong results, %d lying checks), %.1f s\n",
              n, c.attackers, (c.attackers + 1) / 2, c.attackers / 2, SecondsSince(started));
  if (!problem.empty()) {
    std::printf("FAIL:%s\n", problem.c_str());
    return 1;
  }
  std::set<std::string> attacker_ids, honest_ids;
  for (const Peer& p : attacked) {
    auto it = p.rounds.find(0);
    if (it == p.rounds.end() || !it->second.ok) continue;
    const Round& r = it->second;
    for (size_t m = 0; m < r.members.size(); ++m) {
      (lies.at(r.seeds[m] - 1) == "none" ? honest_ids : attacker_ids).insert(r.members[m]);
    }
  }
  int honest_banned = 0;
  std::map<std::string, int> banned_by;  // attacker id -> honest peers that banned it
  for (size_t i = 0; i < attacked.size(); ++i) {
    for (const auto& [r, round] : attacked[i].rounds) {
      if (lies[i] != "none") continue;  // what attackers ban does not matter
      for (const std::string& b : round.banned) {
        if (honest_ids.contains(b)) {
          ++honest_banned;
          std::printf("FAIL: honest peer %zu banned an honest peer\n", i);
          failed = true;
        }
        if (attacker_ids.contains(b)) ++banned_by[b];
      }
    }
    if (lies[i] != "none") continue;
    const std::string wrong = CheckValues(c, attacked[i], 0);
    if (!wrong.empty()) {
      std::printf("FAIL: honest peer %zu: %s\n", i, wrong.c_str());
      failed = true;
    }
  }
  const int honest = n - c.attackers;
  int banned_by_all = 0;
  for (const std::string& a : attacker_ids) banned_by_all += banned_by[a] == honest;
  std::printf(
      "attackers banned by every honest peer in the first round: %d of %d; bans of "
      "honest peers by honest peers: %d; every honest peer's values are the exact mean "
      "of the members its report names\n",
      banned_by_all, c.attackers, honest_banned);
  if (banned_by_all != c.attackers || static_cast<int>(attacker_ids.size()) != c.attackers) {
    std::printf("FAIL: not every attacker was banned by every honest peer\n");
    failed = true;
  }

  // The reference: no attacker, with and without verification.
  double times[2] = {0, 0};
  for (int verify = 0; verify < 2; ++verify) {
    std::vector<Peer> clean;
    problem = RunPeers(c, std::vector<std::string>(static_cast<size_t>(n), "none"), verify == 1, 3,
                       verify ? "clean-verify" : "clean-plain", clean);
    if (!problem.empty()) {
      std::printf("FAIL:%s\n", problem.c_str());
      return 1;
    }
    for (size_t i = 0; i < clean.size(); ++i) {
      for (const auto& [r, round] : clean[i].rounds) {
        if (!round.banned.empty()) {
          std::printf("FAIL: peer %zu banned a peer of an honest group\n", i);
          failed = true;
        }
        if (!round.ok || round.members.size() != static_cast<size_t>(n)) {
          std::printf("FAIL: peer %zu round %d: %s\n", i, r,
                      round.ok ? "not the whole group" : round.error.c_str());
          failed = true;
        }
      }
      const std::string wrong = CheckValues(c, clean[i], 2);
      if (!wrong.empty()) {
        std::printf("FAIL: peer %zu: %s\n", i, wrong.c_str());
        failed = true;
      }
    }
    times[verify] = MedianRoundTime(clean);
    std::printf("honest group of %d, %s: median round %.3f s\n", n,
                verify ? "verified" : "not verified", times[verify]);
  }
  honest_banned_total += honest_banned;
  // RESULT lines only for runs whose results were right.
  if (!failed && times[0] > 0) {
    std::printf("RESULT byzantine_verify_overhead=%.3f\n", times[1] / times[0]);
  }
  return failed ? 1 : 0;
}

int Run(Config& c) {
  TempDir dir("bench-byzantine");
  c.dir = dir.path();
  auto boot = Subprocess::Spawn(
      {ColonyBinary(), "--log-level", "warn", "dht", "--listen", "/ip4/127.0.0.1/tcp/0"},
      c.dir + "/dht.err");
  if (!boot.ok()) {
    std::printf("FAIL: %s\n", boot.status().ToString().c_str());
    return 1;
  }
  auto line = boot->ReadLine(std::chrono::seconds(30));
  if (!line.ok()) {
    std::printf("FAIL: the bootstrap DHT node printed no address\n");
    return 1;
  }
  c.bootstrap = *line;
  bool failed = false;
  int honest_banned = 0;
  if (c.part != "training" && RunAveraging(c, honest_banned) != 0) failed = true;
  if (c.part == "averaging") {
    if (!failed) std::printf("RESULT byzantine_honest_banned=%d\n", honest_banned);
    return failed ? 1 : 0;
  }
  c.training.peers = c.peers;
  c.training.attackers = c.attackers;
  c.training.dir = c.dir;
  c.training.bootstrap = c.bootstrap;
  const TrainingOutcome t = RunTrainingExperiment(c.training);
  if (failed || t.failed) {
    std::printf("FAIL: see above; no RESULT lines\n");
    return 1;
  }
  std::printf("RESULT byzantine_accuracy_gap=%.2f\n", t.accuracy_gap);
  std::printf("RESULT byzantine_attackers_banned=%d/%d\n", t.attackers_banned, t.attackers);
  std::printf("RESULT byzantine_honest_banned=%d\n", honest_banned + t.honest_banned);
  return 0;
}

}  // namespace
}  // namespace colony::bench

int main(int argc, char** argv) {
  colony::bench::Config c;
  CLI::App app{
      "Byzantine tolerance (BTARD): verification in a group with attackers, then training with "
      "attackers"};
  app.add_option("--peers", c.peers, "peers in the group")->capture_default_str();
  app.add_option("--attackers", c.attackers, "attackers among them")->capture_default_str();
  app.add_option("--values", c.values, "values averaged")->capture_default_str();
  app.add_option("--part", c.part, "averaging (the verification round), training or all")
      ->check(CLI::IsMember({"averaging", "training", "all"}))
      ->capture_default_str();
  auto& t = c.training;
  t.attacks = {"sign-flip", "label-flip", "constant", "stale", "wrong-result", "false-accusation"};
  app.add_option("--attacks", t.attacks, "training: the attacks, each in its own runs")
      ->check(CLI::IsMember(
          {"sign-flip", "label-flip", "constant", "stale", "wrong-result", "false-accusation"}))
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--epochs", t.epochs, "training: epochs of every run")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--attack-from", t.attack_from, "training: the epoch the attacks start at")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--lr", t.lr, "training: Adam's learning rate")->capture_default_str();
  app.add_option("--lr-schedule", t.lr_schedule,
                 "training: colony train --lr-schedule of every run (decaying to 0 at --epochs)")
      ->check(CLI::IsMember({"constant", "linear", "cosine"}))
      ->capture_default_str();
  app.add_option("--tau", t.tau, "training: CenteredClip's radius in the protected runs")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--audit-targets", t.audit_targets, "training: audits a round (protected runs)")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
  app.add_option("--clean-runs", t.clean_runs,
                 "training: runs with no attacker, whose median accuracy is the reference")
      ->check(CLI::Range(1, 9))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (c.attackers < 0 || c.peers < 2 || 2 * c.attackers >= c.peers) {
    std::fprintf(stderr, "need 2 <= peers and 0 <= attackers < peers / 2 (an honest majority)\n");
    return 2;
  }
  return colony::bench::Run(c);
}
