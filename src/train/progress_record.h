// Progress records of collaborative training and what a peer makes of them, torch-free and
// I/O-free (the tracker that publishes and fetches them is progress.h; the monitor reads them too).
//
// A record is a small JSON object under "<run_id>.progress", subkey = the peer's owner marker:
//   {"epoch":12,"samples":480,"sps":1530.5,"batch":16,"time":1795321820.16,
//    "client":false,"aux":false,"phase":"train",
//    "loss":4.31,"version":"0.1.0","round":{"epoch":11,"group":"9f2c01ab","size":4,"ok":true}}
// The first eight fields are required; loss, version and round (what monitors show) are
// optional. Every field is checked (ranges, types); an unknown field or phase is an error that
// names it.
//
// Training peers also list their run under kRunsKey (subkey: owner marker), so that a monitor
// finds runs without knowing their ids: {"run":"run1","target_batch_size":4096}.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "core/identity.h"
#include "core/status.h"

namespace colony::train {

// What a peer is doing with its current epoch.
enum class Phase : uint8_t {
  kIdle,   // not computing yet (preparing, standing by): its count does not grow
  kTrain,  // computing batches: its count grows
  kWait,   // stopped computing: its count is final unless the target turns out to be missed
  kRound,  // averaging this epoch: its count is final
  kLoad,   // downloading the swarm's state to join at this epoch: no samples, expected in its round
};
std::string_view PhaseName(Phase phase);

// A peer's last averaging round, as it reports it.
struct RoundSummary {
  int64_t epoch = -1;      // the epoch the round averaged; -1: none yet
  std::string group = {};  // the group's id, shortened (8 hex digits): members of one group agree
  int64_t size = 0;        // peers whose data the round averaged (1: alone)
  bool ok = false;         // it averaged with others
};
inline constexpr int64_t kMaxReportedGroup = 4096;

struct PeerProgress {
  PeerId peer;
  int64_t epoch = 0;
  int64_t samples = 0;  // accumulated in that epoch when reported
  double samples_per_second = 0;
  int64_t batch = 0;  // its last batch's size: with the rate, how often it reports while training
  double time = 0;    // wall clock of the report (the reporter's clock)
  bool client = false;
  bool aux = false;
  Phase phase = Phase::kTrain;
  double loss = std::numeric_limits<double>::quiet_NaN();  // its recent training loss; NaN: none
  std::string version = {};                                // its Colony version; empty: unknown
  RoundSummary round = {};
};

struct GlobalProgress {
  // The newest epoch any live peer trains at (peers still loading the state are not counted:
  // they announce the epoch they are joining, not one they reached).
  int64_t epoch = 0;
  // At `epoch`: the samples reported (this peer's count is exact), and that plus what the peers
  // still computing have added since their reports, extrapolated from their rates (bounded by
  // their report period; a peer that missed its reports is not extrapolated).
  int64_t samples_reported = 0;
  int64_t samples_expected = 0;
  int64_t target_batch_size = 0;
  size_t num_peers = 0;           // live peers, any epoch, this one included
  size_t num_peers_at_epoch = 0;  // live peers at `epoch` (trainers, auxiliaries, loading peers)
  size_t num_clients = 0;
  // Other peers at `epoch` whose counts still grow (computing, and reporting on time).
  size_t num_growing_at_epoch = 0;
  bool round_started = false;              // another peer at `epoch` is averaging it
  double samples_per_second = 0;           // the swarm's throughput
  double samples_per_second_at_epoch = 0;  // of the trainers at `epoch`, this one included
  double own_samples_per_second = 0;       // this peer's, as it last reported
  int64_t own_batch = 0;                   // this peer's last batch size
  double eta_seconds = 0;  // until samples_expected reaches the target at the epoch's throughput
  double fetched_at = 0;   // wall clock of the DHT read behind this view
  std::vector<PeerProgress> peers;  // this peer first
};

// Parses and validates one peer's record value (untrusted: it comes from the DHT); ProtocolError on
// anything malformed.
Result<PeerProgress> ParseProgressRecord(const PeerId& peer, std::string_view value);
std::string EncodeProgressRecord(const PeerProgress& p);

// What a peer accumulating samples for `local_epoch` does next.
enum class EpochAction : uint8_t {
  kTrain,    // compute another batch
  kWait,     // stop computing and poll: the swarm has probably reached the target
  kAverage,  // the target is reached (or the swarm's round has begun): join the round
  kCatchUp,  // the swarm finished this epoch's round without this peer: load its state
};
struct EpochDecision {
  EpochAction action = EpochAction::kTrain;
  // With kTrain for a waiting peer: the samples it computes (its share of the gap, by
  // throughput) before it waits again without re-estimating.
  int64_t quota = 0;
};
// Where a peer accumulating samples stands when it decides.
enum class Standing : uint8_t {
  kComputing,  // between batches: it re-estimates after every one
  kWaiting,    // stopped on its estimate (phase kWait), polling
  // Stopped again after computing a share of a gap at this epoch: the others may still be
  // computing theirs, unseen, so only exact reports (nobody computing) make it resume.
  kWaitingAfterShare,
};
// `lag`: how far the swarm's epoch may be ahead while its round for `local_epoch` still runs (1
// with delayed averaging, where peers report the next epoch as their round starts; else 0).
// The rules, in order:
//   swarm ahead by more than lag          -> kCatchUp
//   swarm ahead, or a round at the epoch began, or reported samples >= target -> kAverage
//   no other peer at the epoch computes   -> kTrain (waiting: with a quota, its share of the
//                                            reported shortfall)
//   expected + half a batch >= target     -> kWait (reported < target: confirm first)
//   computing                             -> kTrain
//   waiting                               -> kTrain with a quota, its share of the estimated gap
//   waiting after a share                 -> kWait
// The swarm's list of training runs.
inline constexpr std::string_view kRunsKey = "colony.runs";
struct RunAnnouncement {
  std::string run = {};  // the run id: 1-128 printable ASCII characters
  int64_t target_batch_size = 0;
};
std::string EncodeRunAnnouncement(const RunAnnouncement& a);
Result<RunAnnouncement> ParseRunAnnouncement(std::string_view value);

EpochDecision DecideEpoch(const GlobalProgress& g, int64_t local_epoch, int64_t lag,
                          Standing standing);

}  // namespace colony::train
