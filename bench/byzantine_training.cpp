// The training experiment of scripts/bench byzantine (byzantine_training.h).
//
// Every run: N `colony train --task fashion-mnist --classifier linear` processes (batches of 32,
// the swarm's target N x 32 samples per step, Adam with a rate that decays linearly to 0 at the
// last epoch, 1 thread each), started together
// (--min-peers N) and stopped at the same epoch; accuracy is measured by every peer on the
// whole held-out set (10,000 images) at the end, and a run's is the median of its honest peers'.
// Attackers are the last K peers, attacking from --attack-from on (colony train --attack).
// Protected runs reduce with CenteredClip (--centered-clip-tau), verify every round
// (--verify-rounds) and audit --audit-targets members a round; plain runs average with the mean. An
// attacker counts as banned when every honest peer banned it within 50 epochs of the attack's start
// (their step events name the peers banned).
#include "byzantine_training.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "bench_support.h"
#include "core/subprocess.h"

namespace colony::bench {
namespace {

constexpr int64_t kBanWithin = 50;  // epochs after the attack's start (the goal)
constexpr double kLearned = 0.5;    // every clean run's accuracy must pass it

struct TrainPeer {
  bool attacker = false;
  std::string id;
  std::string stderr_path;
  bool done = false;
  double accuracy = std::nan("");
  int64_t epoch = 0;
  std::map<std::string, int64_t> banned_at;  // peer id -> the epoch this peer banned it
};

struct TrainRun {
  std::string problem;  // empty: every peer finished
  std::vector<TrainPeer> peers;
  double seconds = 0;
  double accuracy = std::nan("");  // the median of the honest peers'
};

void ParseLine(TrainPeer& p, const std::string& line) {
  auto j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("event")) return;
  const auto& event = j["event"];
  if (event == "ready") p.id = j.value("peer", "");
  if (event == "step") {
    p.epoch = j.value("epoch", int64_t{0});
    if (j.contains("banned")) {
      for (const auto& b : j["banned"]) p.banned_at.emplace(b.get<std::string>(), p.epoch);
    }
  }
  if (event == "done") {
    p.done = true;
    if (j.contains("model")) p.accuracy = j["model"].value("accuracy", std::nan(""));
  }
}

TrainRun RunTraining(const TrainingConfig& c, const std::string& tag, const std::string& attack,
                     bool protect) {
  TrainRun run;
  const int n = c.peers;
  const std::string run_id = "bench-byzantine-train-" + std::to_string(::getpid()) + "-" + tag;
  std::vector<Subprocess> procs;
  run.peers.assign(static_cast<size_t>(n), {});
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    TrainPeer& p = run.peers[static_cast<size_t>(i)];
    p.attacker = attack != "none" && i >= n - c.attackers;
    p.stderr_path = c.dir + "/" + tag + "-" + std::to_string(i) + ".err";
    std::vector<std::string> args{ColonyBinary(),
                                  "--log-level",
                                  "error",
                                  "train",
                                  "--task",
                                  "fashion-mnist",
                                  "--classifier",
                                  "linear",
                                  "--batch-size",
                                  "32",
                                  "--target-batch-size",
                                  std::to_string(32 * n),
                                  "--eval-batch-size",
                                  "1250",  // x 8: the whole held-out set
                                  "--lr",
                                  Fixed(c.lr, 6),
                                  "--lr-schedule",
                                  c.lr_schedule,
                                  "--max-epochs",
                                  std::to_string(c.epochs),
                                  "--min-peers",
                                  std::to_string(n),
                                  "--initial-peers",
                                  c.bootstrap,
                                  "--run-id",
                                  run_id,
                                  "--matchmaking-time",
                                  "10",
                                  "--threads",
                                  "1",
                                  "--json"};
    if (protect) {
      // The run gives each audited peer its data (audit.h).
      args.insert(args.end(), {"--verify-rounds", "--centered-clip-tau", Fixed(c.tau, 6),
                               "--audit-targets", std::to_string(c.audit_targets)});
    } else {
      args.insert(args.end(), {"--seed", std::to_string(i + 1)});
    }
    if (p.attacker) {
      args.insert(args.end(), {"--attack", attack, "--attack-from", std::to_string(c.attack_from)});
    }
    auto proc = Subprocess::Spawn(args, p.stderr_path);
    if (!proc.ok()) {
      run.problem = proc.status().ToString();
      return run;
    }
    procs.push_back(std::move(*proc));
  }
  // Generous: startup, then seconds per epoch on a shared 2-core machine. An attacker is read
  // until it says who it is (banned, it trains on alone at its own pace; it is killed at the
  // end), an honest peer until it is done.
  const auto deadline = started + Millis(60 + 10.0 * c.epochs);
  std::vector<std::thread> readers;
  for (size_t i = 0; i < procs.size(); ++i) {
    readers.emplace_back([&, i] {
      TrainPeer& p = run.peers[i];
      (void)ReadUntil(procs[i], deadline, [&](const std::string& line) {
        ParseLine(p, line);
        return p.done || (p.attacker && !p.id.empty());
      });
    });
  }
  for (auto& t : readers) t.join();
  run.seconds = SecondsSince(started);
  std::vector<double> honest;
  for (size_t i = 0; i < run.peers.size(); ++i) {
    const TrainPeer& p = run.peers[i];
    if (p.attacker && p.id.empty()) {
      run.problem +=
          "\n  attacker " + std::to_string(i) + " did not start" + Tail(p.stderr_path, 4);
    } else if (!p.attacker && !p.done) {
      run.problem += "\n  peer " + std::to_string(i) + " did not finish (at epoch " +
                     std::to_string(p.epoch) + ")" + Tail(p.stderr_path, 4);
    } else if (!p.attacker && !(p.accuracy >= 0 && p.accuracy <= 1)) {
      run.problem += "\n  peer " + std::to_string(i) + " reported no accuracy in [0, 1]";
    } else if (!p.attacker) {
      honest.push_back(p.accuracy);
    }
  }
  if (!honest.empty()) {
    std::sort(honest.begin(), honest.end());
    run.accuracy = honest[honest.size() / 2];
  }
  return run;
}

// Attackers that every honest peer banned within kBanWithin epochs of the attack's start (with
// the latest of those epochs), and the bans of honest peers by honest peers.
struct Bans {
  std::map<std::string, int64_t> attackers_banned_at;
  int attackers = 0;
  int honest_banned = 0;
};

Bans CountBans(const TrainingConfig& c, const TrainRun& run) {
  Bans b;
  std::set<std::string> attackers, honest;
  for (const TrainPeer& p : run.peers) (p.attacker ? attackers : honest).insert(p.id);
  b.attackers = static_cast<int>(attackers.size());
  for (const std::string& a : attackers) {
    int64_t latest = -1;
    bool by_all = true;
    for (const TrainPeer& p : run.peers) {
      if (p.attacker) continue;
      auto it = p.banned_at.find(a);
      if (it == p.banned_at.end() || it->second > c.attack_from + kBanWithin) {
        by_all = false;
        break;
      }
      latest = std::max(latest, it->second);
    }
    if (by_all) b.attackers_banned_at[a] = latest;
  }
  for (const TrainPeer& p : run.peers) {
    if (p.attacker) continue;
    for (const auto& [id, epoch] : p.banned_at) b.honest_banned += honest.contains(id);
  }
  return b;
}

std::string Points(double accuracy) {
  return std::isfinite(accuracy) ? Fixed(100 * accuracy, 1) : std::string("n/a");
}

}  // namespace

TrainingOutcome RunTrainingExperiment(const TrainingConfig& c) {
  TrainingOutcome out;
  std::printf(
      "training: %d peers (fashion-mnist, linear classifier, %d samples a step, lr %g %s), %d "
      "epochs; %d attackers from epoch %d; protection: CenteredClip (tau %g), verification and "
      "%d audits a round\n",
      c.peers, 32 * c.peers, c.lr, c.lr_schedule.c_str(), c.epochs, c.attackers, c.attack_from,
      c.tau, c.audit_targets);
  std::vector<double> clean_accuracies;
  std::string each;
  double clean_seconds = 0;
  for (int r = 0; r < std::max(c.clean_runs, 1); ++r) {
    TrainRun run = RunTraining(c, "clean" + std::to_string(r + 1), "none", false);
    if (!run.problem.empty()) {
      std::printf("FAIL: clean run %d:%s\n", r + 1, run.problem.c_str());
      out.failed = true;
      return out;
    }
    clean_accuracies.push_back(run.accuracy);
    each += (each.empty() ? "" : ", ") + Points(run.accuracy) + "%";
    clean_seconds += run.seconds;
  }
  const double clean_accuracy = Median(clean_accuracies);
  std::printf("  no attacker: accuracy %s%% (the median of %zu runs: %s; %.0f s)\n",
              Points(clean_accuracy).c_str(), clean_accuracies.size(), each.c_str(), clean_seconds);
  // The reference must have learned (chance is 10%; a linear classifier passes 75% within 15
  // epochs): a broken task or swarm would make every gap meaningless.
  if (!(*std::min_element(clean_accuracies.begin(), clean_accuracies.end()) > kLearned)) {
    std::printf("FAIL: a clean run did not learn (accuracy at most %.0f%%)\n", 100 * kLearned);
    out.failed = true;
    return out;
  }
  std::fflush(stdout);
  for (const std::string& attack : c.attacks) {
    // A false accuser lies in verification's checks: without verification it does nothing.
    std::string plain_accuracy = "n/a";
    if (attack != "false-accusation") {
      TrainRun plain = RunTraining(c, attack + "-plain", attack, false);
      if (!plain.problem.empty()) {
        std::printf("FAIL: %s, plain averaging:%s\n", attack.c_str(), plain.problem.c_str());
        out.failed = true;
        continue;
      }
      plain_accuracy = Points(plain.accuracy) + "%";
    }
    TrainRun prot = RunTraining(c, attack + "-protected", attack, true);
    if (!prot.problem.empty()) {
      std::printf("FAIL: %s, protected:%s\n", attack.c_str(), prot.problem.c_str());
      out.failed = true;
      continue;
    }
    const Bans bans = CountBans(c, prot);
    const double gap = 100 * (clean_accuracy - prot.accuracy);
    out.accuracy_gap = std::max(out.accuracy_gap, std::isfinite(gap) ? gap : 100.0);
    out.attackers += c.attackers;
    out.attackers_banned += static_cast<int>(bans.attackers_banned_at.size());
    out.honest_banned += bans.honest_banned;
    std::string at;
    for (const auto& [id, epoch] : bans.attackers_banned_at) {
      at += (at.empty() ? "" : ", ") + std::to_string(epoch);
    }
    std::printf(
        "  %-16s accuracy %s plain, %s%% protected (%.1f points below the clean runs'); "
        "attackers banned by every honest peer within %lld epochs: %zu of %d%s; honest peers "
        "banned: %d (%.0f s)\n",
        attack.c_str(), plain_accuracy.c_str(), Points(prot.accuracy).c_str(), gap,
        static_cast<long long>(kBanWithin), bans.attackers_banned_at.size(), c.attackers,
        at.empty() ? "" : (" (at epochs " + at + ")").c_str(), bans.honest_banned, prot.seconds);
    std::fflush(stdout);
    if (bans.honest_banned > 0) {
      std::printf("FAIL: %s: an honest peer banned an honest peer\n", attack.c_str());
      out.failed = true;
    }
    // What verification exists to catch must be caught: a cheating reducer, a false accuser.
    const bool caught_by_verification = attack == "wrong-result" || attack == "false-accusation";
    if (caught_by_verification &&
        static_cast<int>(bans.attackers_banned_at.size()) != c.attackers) {
      std::printf("FAIL: %s: verification did not ban every attacker\n", attack.c_str());
      out.failed = true;
    }
  }
  return out;
}

}  // namespace colony::bench
