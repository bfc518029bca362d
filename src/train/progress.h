// ProgressTracker: how far the swarm is towards its next global step (DeDLOC/hivemind's
// progress tracking), over owner-signed DHT records.
//
// Every training peer publishes {epoch, samples accumulated in this epoch, samples/s} under
// "<run_id>.progress" with its own owner-signed subkey (nobody can speak for it), and reads
// everyone's. The global epoch is the newest epoch any live peer reports; the swarm is ready for
// its next step when the samples reported at that epoch reach the target batch size. Records
// expire a few seconds after a peer stops refreshing them, so crashed peers drop out by
// themselves.
//
//   auto tracker = train::ProgressTracker::Create(node, {.run_id = "run1",
//                                                        .target_batch_size = 4096});
//   (*tracker)->Report(epoch, samples_this_epoch, samples_per_second);
//   if ((*tracker)->ReadyToUpdateEpoch(epoch, samples_this_epoch)) { ... average and step ... }
//
// Publishing and fetching run on the tracker's own thread; Report() and Global() never block on
// the network.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/identity.h"
#include "core/status.h"
#include "dht/node.h"

namespace colony::train {

struct PeerProgress {
  PeerId peer;
  int64_t epoch = 0;
  int64_t samples = 0;  // accumulated in that epoch when reported
  double samples_per_second = 0;
  double time = 0;  // wall clock of the report
  bool client = false;
  bool aux = false;
  bool in_round = false;  // averaging this epoch's samples: its count no longer grows
};

struct GlobalProgress {
  int64_t epoch = 0;                // the newest epoch any live peer reports
  int64_t samples_accumulated = 0;  // reported at that epoch (this peer's count is exact)
  int64_t target_batch_size = 0;
  size_t num_peers = 0;           // live peers, any epoch, this one included
  size_t num_peers_at_epoch = 0;  // live peers at `epoch` (trainers and auxiliaries)
  size_t num_clients = 0;
  double samples_per_second = 0;  // the swarm's throughput
  double eta_seconds = 0;         // until the target is reached at that throughput
  double fetched_at = 0;          // wall clock of the DHT read behind this view
  std::vector<PeerProgress> peers;
};

struct ProgressOptions {
  std::string run_id;
  int64_t target_batch_size = 0;
  // Fetch period: half the time the swarm needs to reach the target, within these bounds.
  std::chrono::milliseconds min_refresh{100};
  std::chrono::milliseconds max_refresh{3'000};
  // A record lives this long unless refreshed (it is refreshed at a third of it).
  double record_ttl_seconds = 15;
  bool client = false;  // reported, so others know this peer cannot lead a group
  bool aux = false;     // an auxiliary peer: averages, trains nothing
};

class ProgressTracker {
 public:
  // The node must outlive the tracker.
  static Result<std::unique_ptr<ProgressTracker>> Create(dht::Node& node, ProgressOptions options);
  ~ProgressTracker();  // stops the thread and withdraws this peer's record
  ProgressTracker(const ProgressTracker&) = delete;
  ProgressTracker& operator=(const ProgressTracker&) = delete;

  // This peer's progress; published soon after (at once when the epoch changed, or when it
  // enters a round: others stop extrapolating its count then).
  void Report(int64_t epoch, int64_t samples_accumulated, double samples_per_second,
              bool in_round = false);
  // The latest view of the swarm, with this peer's own report merged in exactly.
  GlobalProgress Global() const;
  // Fetches now and waits (at most `timeout`) for a view newer than the call.
  GlobalProgress Refresh(std::chrono::milliseconds timeout);
  // A round at `epoch` - 1 just ended with these peers (and their samples/s): count them at
  // `epoch` from now on, without waiting for their next records. Lets every member extrapolate
  // the swarm's progress right after a step, even when steps are faster than a DHT fetch.
  void NoteRoundEnd(int64_t epoch, const std::vector<std::pair<PeerId, double>>& members);
  // True when the swarm has accumulated the target batch at `local_epoch`, or has moved past it.
  bool ReadyToUpdateEpoch(int64_t local_epoch) const;

  // Parses and validates one peer's record value (untrusted: it comes from the DHT).
  static Result<PeerProgress> ParseRecord(const PeerId& peer, std::string_view value);
  static std::string EncodeRecord(const PeerProgress& p);

  class Impl;

 private:
  explicit ProgressTracker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace colony::train
