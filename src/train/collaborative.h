// CollaborativeOptimizer: trains one model with a swarm of peers (DeDLOC / hivemind.Optimizer,
// and DiLoCo), wrapping any LibTorch optimizer.
//
// Synchronous mode (default). Each peer computes gradients at its own pace and calls Step() after
// every backward pass; Step() accumulates them (weighted by the batch's sample count) and reports
// progress to the DHT. When the swarm's *reported* samples reach the target global batch, the
// peers at this epoch form a group, average their mean gradients weighted by their sample counts
// (so the result is exactly the gradient of the whole global batch), and every peer applies the
// same optimizer step: the model evolves as if one machine trained with batch = target_batch_size.
// A peer whose estimate of the swarm's samples reaches the target stops computing inside Step()
// until the reports confirm or refute it (train/progress.h, DecideEpoch), so the realized batch
// neither undershoots the target nor overshoots it by more than about a batch per peer, however
// short an epoch is.
//   - delay_grad_averaging: the averaging runs in the background while the next batch is
//     computed, and its result is applied at the following Step() (one batch of staleness).
//   - local_updates: every peer steps its optimizer on each local batch, and parameters are
//     averaged when the swarm reaches the target batch.
//   - average_state_every = k: parameters are also averaged every k epochs, which re-aligns peers
//     that drifted (e.g. after a failed round where they stepped with local gradients).
// DiLoCo mode (diloco_inner_steps = H > 0). Every peer takes H local steps of the inner optimizer,
// then the peers average their pseudo-gradients (the parameters at the last sync minus the
// current ones), compressed to 8 or 4 bits, and apply an outer Nesterov-momentum SGD step. With
// diloco_fragments = F > 1 the parameters are split into F fragments synced in turn, every H/F
// inner steps (streaming DiLoCo), which spreads the traffic over time.
//
// Peers that fall behind the swarm (they joined late, or the swarm averaged an epoch without them)
// announce themselves at the swarm's epoch and download its parameters and optimizer state from
// a peer at that epoch, then take part in its rounds. Non-finite gradients, local or
// averaged, are skipped and logged, never applied.
//
//   auto opt = train::CollaborativeOptimizer::Create(node, model->parameters(),
//       std::make_shared<torch::optim::Adam>(model->parameters(), 1e-3),
//       {.run_id = "run1", .target_batch_size = 4096});
//   for (auto& batch : data) {
//     auto loss = model->forward(batch); loss.backward();
//     auto report = (*opt)->Step(batch.size(0));   // zeroes the gradients
//   }
//
// Threading: call Step() from one thread. The state provider (serving newcomers) and background
// averaging run on other threads and take the state lock while they read the parameters.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "averaging/averager.h"
#include "core/status.h"
#include "dht/node.h"
#include "train/lr_schedule.h"
#include "train/progress.h"

namespace at {
class Tensor;
}
namespace torch::optim {
class Optimizer;
}

namespace colony::train {

// What a Byzantine peer sends as its mean gradient (BTARD's attacks): its negation (kSignFlip),
// every component equal with 100 times the gradient's norm (kConstant), or the gradient of the
// epoch its attack started at, for ever after (kStale).
enum class GradientAttack { kNone, kSignFlip, kConstant, kStale };

struct CollaborativeOptions {
  std::string run_id = {};
  int64_t target_batch_size = 4096;
  // kClient: cannot accept connections (behind NAT); kAux: see RunAuxiliary().
  averaging::Mode mode = averaging::Mode::kNode;

  // Averaging rounds.
  std::chrono::milliseconds matchmaking_time{5'000};
  std::chrono::milliseconds averaging_timeout{60'000};
  size_t target_group_size = 64;
  size_t min_group_size = 2;
  compression::Codec grad_codec = compression::Codec::kNone;
  // PowerSGD (train/powersgd.h): gradient matrices are averaged as two factors of this rank
  // (0: whole). Synchronous gradient rounds only; not with CenteredClip, verification or audits.
  int powersgd_rank = 0;
  compression::Codec state_codec = compression::Codec::kNone;
  double bandwidth = 100e6;     // announced upload bandwidth (bytes/s) for load balancing
  double max_send_rate = 0;     // cap on this peer's sending rate (bytes/s); 0: none
  int average_state_every = 0;  // epochs between parameter averaging; 0: never
  bool delay_grad_averaging = false;
  bool local_updates = false;
  // Clips the averaged gradient's global L2 norm before the optimizer step (0: no clipping).
  double max_grad_norm = 0;
  // Byzantine tolerance for gradient rounds (docs/training.md, "Strangers"): reduce each part
  // with CenteredClip of this radius instead of the sample-weighted mean (0: the mean), and
  // with verify_rounds, check every reducer's result with the group and ban cheaters
  // (averaging::AveragerOptions::verify; needs grad_codec kNone).
  double centered_clip_tau = 0;
  bool verify_rounds = false;
  // BTARD's audits (with verify_rounds; averaging::AveragerOptions::audit_targets): each round
  // the group's shared seed picks this many members, and every reducer recomputes their mean
  // gradients from the batches they claim (each Step()'s data_index in their data stream) at
  // its own parameters, and bans a member whose gradient is not what its data gives (another
  // sign, other labels, a constant, an old gradient). A peer's data is not its choice: at each
  // epoch it trains on the first batches of stream AuditDataSeed(run_id, its id, epoch)
  // (audit.h), and leaves out only batches whose gradient is not finite. Needs compute_batch,
  // and no delayed averaging (the recomputation uses the model between batches).
  size_t audit_targets = 0;
  struct AuditData {
    int64_t batch_size = 0;  // this peer's batches' size
    // Forward and backward of batch `index` of the stream (seed, batch_size), another peer's,
    // at the current parameters: its gradients in the parameters' .grad; returns its samples.
    std::function<Result<int64_t>(uint64_t seed, int64_t batch_size, int64_t index)> compute_batch;
  } audit_data = {};

  // The learning rate by global epoch (lr_schedule.h): before each optimizer step at epoch e
  // (with DiLoCo and local updates, each inner step of epoch e) every parameter group's rate is
  // its rate when the optimizer came in x lr_schedule.Factor(e). Default: left alone.
  LrSchedule lr_schedule = {};

  // DiLoCo.
  int diloco_inner_steps = 0;  // H; 0: synchronous mode
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  bool outer_nesterov = true;
  compression::Codec diloco_codec = compression::Codec::kBlockwise8;
  int diloco_fragments = 1;

  // State sharing and progress.
  std::chrono::milliseconds load_state_timeout{60'000};
  std::chrono::milliseconds progress_min_refresh{100};
  std::chrono::milliseconds progress_max_refresh{3'000};
  // A peer that has seen no other peer of the run for this long bootstraps its DHT node again.
  std::chrono::milliseconds rejoin_after{30'000};
  // When set and true, Step() stops waiting for the swarm and returns (without a step), and
  // RunAuxiliary() returns: e.g. a flag that a signal handler sets.
  const std::atomic<bool>* interrupt = nullptr;

  // Test hooks: how a test makes this peer misbehave.
  struct Testing {
    averaging::Fault fault = averaging::Fault::kNone;  // injected into its averagers
    // A broken peer: it sends its non-finite gradients to the group instead of skipping them.
    bool unchecked_local_gradients = false;
    // A Byzantine peer (docs/training.md, "Among strangers"), from attack_from_epoch on: as a
    // reducer in gradient rounds it returns its own mean gradient as every part's result
    // (averaging::AveragerOptions::Testing::wrong_result); with wrong_projections its checks
    // contradict every honest reducer (a false accuser); its gradient attack changes what it
    // sends as its own gradient.
    int64_t attack_from_epoch = 0;
    bool wrong_result = false;
    bool wrong_projections = false;
    GradientAttack gradient_attack = GradientAttack::kNone;
    // With audits: it trains on a data stream of its choosing and names it in its claims (an
    // honest peer names the one the run gives it, audit.h).
    std::optional<uint64_t> chosen_data_seed = std::nullopt;
  } testing = {};
};

struct StepReport {
  bool stepped = false;        // a global step (epoch) happened in this call
  int64_t epoch = 0;           // local epoch after the call
  int64_t realized_batch = 0;  // samples that went into the step (the group's sum)
  size_t group_size = 0;       // peers whose data was averaged (1: local gradients only)
  std::string group;           // the group's id, 8 hex digits (empty: no group)
  bool averaged = false;       // a group averaged (false: this peer was alone or the round failed)
  bool skipped_nonfinite = false;  // the batch's (or the average's) gradients were not finite
  bool loaded_state = false;       // this peer was behind and downloaded the swarm's state
  double averaging_seconds = 0;
  std::string note;  // why a round failed, when it did
  // Peers that verification (verify_rounds) banned in this round: they cheated as reducers or
  // in their checks, and this peer averages with them no more.
  std::vector<std::string> banned;
};

struct TrainingCounters {
  int64_t local_samples = 0;  // samples this peer trained on
  int64_t local_batches = 0;
  int64_t global_steps = 0;  // epochs this peer took part in
  int64_t skipped_batches = 0;
  int64_t failed_rounds = 0;    // rounds that fell back to local gradients
  int64_t missed_rounds = 0;    // rounds the swarm took without this peer (it then caught up)
  int64_t dropped_samples = 0;  // samples of epochs the swarm stepped without this peer
  int64_t state_loads = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;  // the host's transport counters
};

class CollaborativeOptimizer {
 public:
  // `params` are the model's parameters (float32, contiguous, all on one device: the CPU or a
  // GPU); `optimizer` steps them (its param groups must hold the same tensors). On a GPU the
  // gradients are checked and accumulated there and the optimizer steps there: host memory
  // sees only what goes to the network (a round's mean gradient, the state a newcomer
  // downloads) and checkpoints. The node must outlive the optimizer.
  static Result<std::unique_ptr<CollaborativeOptimizer>> Create(
      dht::Node& node, std::vector<at::Tensor> params,
      std::shared_ptr<torch::optim::Optimizer> optimizer, CollaborativeOptions options);
  ~CollaborativeOptimizer();
  CollaborativeOptimizer(const CollaborativeOptimizer&) = delete;
  CollaborativeOptimizer& operator=(const CollaborativeOptimizer&) = delete;

  // Call after backward() on a batch of `batch_size` samples; consumes and zeroes the gradients.
  // `data_index`: the batch's index in this peer's data stream (audits; -1: unknown).
  Result<StepReport> Step(int64_t batch_size, int64_t data_index = -1);
  // Driven epochs (a SWARM stage, swarm/stage_training.h): the caller, not the swarm's progress,
  // says when an epoch ends. Synchronous gradient rounds only (no DiLoCo, local updates or
  // delayed averaging); use either Step() or these, not both.
  //   Accumulate(n): adds a batch of n samples' gradients (in the parameters' .grad, then zeroed)
  //     to this epoch's sum and reports the samples; false when they were not finite (skipped).
  //   EndEpoch(e): at epoch e, averages this epoch's sum (possibly empty) with the run's peers
  //     at e, steps and moves to e + 1. A peer behind e first takes the state of a peer of the
  //     run that is ahead, if any (dropping its samples), and then ends its own epoch if still
  //     behind e + 1; it never jumps. A peer past e does nothing.
  //   KeepAlive(): publishes this peer's progress again, so that a peer without batches stays
  //     visible to its run (and is expected in its rounds).
  Result<bool> Accumulate(int64_t batch_size);
  Result<StepReport> EndEpoch(int64_t epoch);
  void KeepAlive();
  // Whether the Step() that returned `r` may have changed the parameters: a global step or a
  // state download, or any step when the inner optimizer steps every batch (local updates,
  // DiLoCo) or a delayed round may land. A model kept elsewhere (train/device_mirror.h) copies
  // them again then.
  bool ParametersChanged(const StepReport& r) const;
  // This peer's recent training loss, published with its progress for monitors (a non-finite
  // value is ignored).
  void ReportLoss(double loss);
  // With delay_grad_averaging: waits for the round running in the background and applies it
  // (Step() does this by itself a batch later). Call before reading the parameters at the end.
  void FinishPendingStep();
  // Catches up with the swarm when it is ahead: announces this peer at the swarm's epoch (so
  // that its round expects this peer) and downloads parameters, optimizer state and epoch from
  // a peer at that epoch, again if the swarm moved on meanwhile. OK when this peer is then at
  // the swarm's epoch (or was already). Call it when joining a running swarm; Step() does the
  // same by itself when the swarm averaged an epoch without this peer.
  Status LoadStateFromPeers();
  // An auxiliary peer (mode kAux) trains nothing: it joins every averaging round of the swarm
  // and lends its bandwidth. Runs until `stop` returns true.
  Status RunAuxiliary(const std::function<bool()>& stop);
  // Waits (at most `timeout`) until `n` peers, this one included, take part in the run, and
  // then until a start moment common to them all, so that a run's first epoch starts together.
  Status WaitForPeers(size_t n, std::chrono::milliseconds timeout);

  // Checkpoints (safetensors: parameters, optimizer state and epoch). On resume, call
  // LoadCheckpoint() and then LoadStateFromPeers() only if the swarm is ahead (newest wins).
  Status SaveCheckpoint(const std::filesystem::path& file);
  Status LoadCheckpoint(const std::filesystem::path& file);

  int64_t local_epoch() const;
  GlobalProgress global() const;
  TrainingCounters counters() const;
  double samples_per_second() const;

  class Impl;

 private:
  explicit CollaborativeOptimizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace colony::train
