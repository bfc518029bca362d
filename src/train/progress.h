// ProgressTracker: how far the swarm is towards its next global step (DeDLOC/hivemind's
// progress tracking), over owner-signed DHT records (progress_record.h: the record, the view of
// the swarm, and DecideEpoch(): what a peer does next).
//
// Every training peer publishes {epoch, samples accumulated in this epoch, samples/s, batch size,
// phase} under "<run_id>.progress" with its own owner-signed subkey (nobody can speak for it), and
// reads everyone's. The global epoch is the newest epoch any live peer trains at; the swarm is
// ready for its next step when the samples *reported* at that epoch reach the target batch size.
// Records expire a few seconds after a peer stops refreshing them, so crashed peers drop out by
// themselves.
//
// Readiness never rests on a guess. Others' counts are extrapolated from their rates only to
// decide when to *get ready*: a peer whose estimate of the swarm's samples reaches the target
// stops computing (phase kWait), publishes its exact count and polls until the reports confirm
// the target (then it averages) or refute it (then it computes again). So the realized batch
// cannot undershoot the target, and overshoots by about one batch per peer, however short an
// epoch is compared with a DHT round trip (docs/training.md).
//
//   auto tracker = train::ProgressTracker::Create(node, {.run_id = "run1",
//                                                        .target_batch_size = 4096});
//   tracker->Report({.epoch = e, .samples = n, .samples_per_second = sps, .batch = 32});
//   switch (DecideEpoch(tracker->Global(), e, 0, standing).action) { ... }
//
// Publishing and fetching run on the tracker's own thread; Report() and Global() never block on
// the network.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "dht/node.h"
#include "train/progress_record.h"

namespace colony::train {

// The DHT's rule for "<run_id>.progress": each peer writes only its own entry (owner-signed
// subkey), and the entry must parse as a progress record.
dht::KeyFamily ProgressFamily();
// The DHT's rule for kRunsKey: each training peer lists its run under its own owner-signed subkey.
dht::KeyFamily RunsFamily();

struct ProgressOptions {
  std::string run_id = {};
  int64_t target_batch_size = 0;
  // Fetch period: half the time the swarm needs to reach the target, within these bounds.
  // min_refresh also spaces this peer's reports while it computes.
  std::chrono::milliseconds min_refresh{100};
  std::chrono::milliseconds max_refresh{3'000};
  // A record lives this long unless refreshed (it is refreshed at a third of it).
  double record_ttl_seconds = 15;
  // A peer that has seen no other peer for this long bootstraps its DHT node again (its
  // initial peers may have restarted, or it joined while they were unreachable); 0: never.
  std::chrono::milliseconds rejoin_after{30'000};
  // Report and fetch more often as the swarm nears the target (the target batch decides steps);
  // off for DiLoCo, whose syncs come every H local steps.
  bool follow_target = true;
  bool client = false;  // reported, so others know this peer cannot lead a group
  bool aux = false;     // an auxiliary peer: averages, trains nothing
};

// This peer's own progress, as Report() takes it.
struct LocalProgress {
  int64_t epoch = 0;
  int64_t samples = 0;
  double samples_per_second = 0;
  int64_t batch = 0;
  Phase phase = Phase::kTrain;
  double loss = std::numeric_limits<double>::quiet_NaN();  // NaN: keep the last one reported
  RoundSummary round = {};                                 // epoch -1: keep the last one
};

class ProgressTracker {
 public:
  // The node must outlive the tracker.
  static Result<std::unique_ptr<ProgressTracker>> Create(dht::Node& node, ProgressOptions options);
  ~ProgressTracker();  // stops the thread and withdraws this peer's record
  ProgressTracker(const ProgressTracker&) = delete;
  ProgressTracker& operator=(const ProgressTracker&) = delete;

  // This peer's progress; published soon after (at once when the epoch or the phase changed,
  // otherwise at most every min_refresh).
  void Report(const LocalProgress& progress);
  // The latest view of the swarm, with this peer's own report merged in exactly.
  GlobalProgress Global() const;
  // Fetches now and waits (at most `timeout`) for a view newer than the call.
  GlobalProgress Refresh(std::chrono::milliseconds timeout);
  // The least time between two fetches of one peer (10 ms plus 1 ms per live peer): peers that
  // poll (waiting for the swarm) space their Refresh() calls by at least this.
  std::chrono::milliseconds PollSpacing() const;
  // For `period`, other peers' reports of `epoch` or later do not move the global epoch: a peer
  // that could not find any donor of such an epoch (a record far ahead of the swarm, from a
  // confused or hostile peer) goes on with the swarm it can join instead of trying to catch up.
  void DistrustEpochsFrom(int64_t epoch, std::chrono::milliseconds period);
  // A round at `epoch` - 1 just ended with these peers (and their samples/s): count them at
  // `epoch` from now on, without waiting for their next records. Lets every member extrapolate
  // the swarm's progress right after a step, even when steps are faster than a DHT fetch.
  void NoteRoundEnd(int64_t epoch, const std::vector<std::pair<PeerId, double>>& members);
  // This peer's round at `epoch` averaged with `members` (none: it averaged with nobody), in a
  // group that had room for more. The other peers whose records at `epoch` counted samples (or a
  // wait or a round) towards that round and who did not come are set aside: their records count
  // for nothing (samples, group size, a round begun) for the next 2^(k-1) epochs, k being how
  // many such rounds they missed (at most 64 epochs). Their epochs still say whether the swarm
  // moved on. A peer seen in a round counts again at once. So a record that claims the target
  // and never averages (a hostile or broken peer) stalls one epoch, not every epoch.
  void NoteRound(int64_t epoch, const std::vector<PeerId>& members);
  // A peer that verification banned (averaging::AveragerOptions::verify): its records count for
  // nothing from now on, not even its epoch (at most 4,096 such peers are remembered).
  void Ignore(const PeerId& peer);

  class Impl;

 private:
  explicit ProgressTracker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace colony::train
