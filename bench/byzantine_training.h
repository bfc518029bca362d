// The training experiment of scripts/bench byzantine (BTARD's, issue 16): N `colony train`
// peers on Fashion-MNIST, K of them attacking from a stated epoch, once with no attacker and, for
// every attack, with plain averaging and with the protection (CenteredClip, verification and
// audits).
#pragma once

#include <string>
#include <vector>

namespace colony::bench {

struct TrainingConfig {
  int peers = 16;
  int attackers = 7;
  int epochs = 60;
  int attack_from = 5;
  double lr = 0.01;
  // colony train --lr-schedule of every run (it decays to 0 at the last epoch): with a
  // constant rate, the last steps' noise moves the final model's accuracy by a point or two.
  std::string lr_schedule = "linear";
  double tau = 0.3;       // --centered-clip-tau of the protected runs
  int audit_targets = 2;  // --audit-targets of the protected runs
  // Runs with no attacker; their median accuracy is the reference (one run's accuracy moves by
  // about a point with the timing that decides which batches make each step).
  int clean_runs = 3;
  // sign-flip, label-flip, constant, stale, wrong-result, false-accusation
  std::vector<std::string> attacks;
  std::string dir;        // for the peers' logs
  std::string bootstrap;  // a DHT node's multiaddr
};

// What the experiment found, over every attack.
struct TrainingOutcome {
  bool failed = false;       // a run did not finish, or a check failed (printed)
  double accuracy_gap = 0;   // the worst protected run's accuracy below the clean run's (points)
  int attackers_banned = 0;  // by every honest peer within 50 epochs of the attack's start
  int attackers = 0;         // over every attack
  int honest_banned = 0;     // bans of honest peers by honest peers
};

TrainingOutcome RunTrainingExperiment(const TrainingConfig& config);

}  // namespace colony::bench
