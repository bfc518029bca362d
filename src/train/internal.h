// Internals shared by the collaborative optimizer's files. Not part of the public API.
//
//   collaborative.cpp   the facade, the peer's shared state and procedures
//   (CollaborativeOptimizer::Impl) target_batch.cpp    the readiness loop of the target-batch ways
//   of stepping (DecideEpoch) rounds.cpp          synchronous gradient rounds (and delayed ones),
//   auxiliary peers local_updates.cpp   local steps, parameters averaged at each global epoch
//   parameter_averaging.cpp  averaging the parameters (local updates; gradient rounds every k)
//   diloco.cpp          DiLoCo: H inner steps, then an outer Nesterov step on averaged deltas
//   state_sync.cpp      state for newcomers: providing, downloading, catching up, re-syncing
//   checkpoints.cpp     saving and resuming from safetensors files
//
// A peer steps in exactly one way (Stepping), chosen at creation from the options; everything a
// way of stepping needs from the peer (parameters, epoch, tracker, counters, catching up) is in
// Impl, which the Stepping holds a reference to.
#pragma once

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "averaging/averager.h"
#include "core/finite.h"
#include "model/finite.h"
#include "train/audit.h"
#include "train/collaborative.h"
#include "train/flat_grads.h"
#include "train/progress.h"

namespace colony::train {

using Json = nlohmann::json;
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A fresh view of the swarm waits at most this long for its DHT fetch.
inline constexpr auto kPollTimeout = std::chrono::seconds(2);

// Only peers at the same epoch meet: the epoch (and a DiLoCo fragment) picks the group key bits.
std::string EpochBits(int64_t epoch, int fragment = 0);

// Who took part in a round and what they brought, read from the round's result (the members'
// gathered metadata is untrusted).
struct Membership {
  int64_t realized = 0;  // samples of the members whose data is in every part of the result
  size_t group = 0;      // those members (auxiliary peers excluded)
  std::vector<std::pair<PeerId, double>> rates;  // every member's samples/s
};
Membership CountMembers(const averaging::StepResult& r);
// The round's group id shortened to 8 hex digits (what progress records report).
std::string ShortGroupId(const averaging::StepResult& r);
// The metadata each peer gathers into a round: its samples and samples/s.
std::string GatherMetadata(int64_t samples, double samples_per_second);

// One way of stepping with the swarm. Step() calls Contribute() with every batch whose gradients
// are finite, then Advance() after every batch.
class Stepping {
 public:
  virtual ~Stepping() = default;
  // Takes in a batch's gradients (in the parameters' .grad): accumulates them or steps on them.
  virtual Status Contribute(int64_t batch_size, StepReport& report) = 0;
  // After every batch, also a skipped one: takes part in the swarm's step when it is time.
  virtual Status Advance(StepReport& report) = 0;
  // How many epochs the swarm's reports may run ahead while its round for this peer's epoch still
  // runs: 1 with delayed averaging (peers report the next epoch as their round starts), else 0.
  virtual int64_t Lag() const { return 0; }
  // A round running in the background (delayed averaging): wait for it and apply it.
  virtual bool HasPending() const { return false; }
  virtual void FinishPending(StepReport* /*report*/) {}
  // The swarm stepped without this peer: forget what this epoch accumulated.
  virtual void DropEpoch() {}
  // State beyond parameters and optimizer that a newcomer needs (DiLoCo's outer parameters and
  // momentum), its inner step, and installing them: CheckExtraState validates everything before
  // InstallState changes anything.
  virtual void CollectExtraState(NamedTensors& /*out*/) {}
  virtual int64_t InnerStep() const { return 0; }
  virtual Status CheckExtraState(const NamedTensors& extra) const;
  virtual void InstallState(const NamedTensors& /*extra*/, int64_t /*epoch*/,
                            int64_t /*inner_step*/) {}
  // The averager through which this peer serves its state to newcomers.
  virtual averaging::Averager& Sharing() = 0;
  // Whether peers that averaged every epoch so far hold the same state bit for bit at an epoch
  // (they apply the same averaged gradients), so that a newcomer can cross-check one donor's
  // state with another's digest.
  virtual bool StatesAgreeAcrossPeers() const { return false; }
  // Driven epochs (CollaborativeOptimizer::EndEpoch): averages and steps now, at this epoch.
  virtual Status EndEpochNow(StepReport& report);
  // Auxiliary peers: join every round of the swarm, lending bandwidth, until `stop`.
  virtual Status RunAuxiliary(const std::function<bool()>& stop);
  virtual void Shutdown() = 0;
};

// Averages a copy of the parameters with the peers at an epoch, under "<run>.params": local
// updates do it at every epoch, gradient rounds every average_state_every epochs
// (parameter_averaging.cpp). A copy is averaged so that the state lock is not held during a round
// (the state provider runs on the compute pool that the round needs).
class ParameterAveraging {
 public:
  static Result<std::unique_ptr<ParameterAveraging>> Create(CollaborativeOptimizer::Impl& peer);
  // Averages with the `expected` peers at `epoch`, weighted by `samples`; fills the report's
  // group, realized batch and note. True when a group averaged the parameters (they are then
  // installed).
  bool Average(int64_t samples, int64_t epoch, size_t expected, StepReport& report);
  void Shutdown() { averager_->Shutdown(); }

 private:
  explicit ParameterAveraging(CollaborativeOptimizer::Impl& peer) : peer_(peer) {}
  CollaborativeOptimizer::Impl& peer_;
  std::vector<float> values_;
  std::unique_ptr<averaging::Averager> averager_;
};

// The ways of stepping whose steps come when the swarm has the target batch (gradient rounds,
// local updates): the readiness loop around DecideEpoch (target_batch.cpp).
class TargetBatchStepping : public Stepping {
 public:
  explicit TargetBatchStepping(CollaborativeOptimizer::Impl& peer) : peer_(peer) {}
  // Computes on, or stops and polls until the reports confirm that the swarm has the target
  // batch (then averages) or refute it (then computes on), or catches up when the swarm
  // averaged this epoch without this peer.
  Status Advance(StepReport& report) override;
  Status EndEpochNow(StepReport& report) override;
  void DropEpoch() override;

 protected:
  // Averages this epoch's contribution with the peers at the epoch and steps.
  virtual Status Average(StepReport& report) = 0;
  // Counts a contributed batch: this epoch's samples, and the quota of a shortfall.
  void Counted(int64_t batch_size);
  // What every round ends with: NextEpoch() moves to the next epoch (this one's samples are
  // spent); AfterRound() reports it, updates the donor priority and re-syncs if needed.
  void NextEpoch(StepReport& report);
  Status AfterRound(StepReport& report);

  CollaborativeOptimizer::Impl& peer_;
  bool quota_active_ = false;  // computing a share of a gap (DecideEpoch's quota)
  int64_t quota_left_ = 0;
  int64_t shared_epoch_ = -1;  // the last epoch at which this peer was given a share
};

std::unique_ptr<Stepping> MakeGradientRounds(CollaborativeOptimizer::Impl& peer, Status& status);
std::unique_ptr<Stepping> MakeLocalUpdates(CollaborativeOptimizer::Impl& peer, Status& status);
std::unique_ptr<Stepping> MakeDiloco(CollaborativeOptimizer::Impl& peer, Status& status);

// A peer of a run: its parameters (and flat views of them), optimizer, epoch, progress tracker
// and counters, and the procedures every way of stepping shares. Step() runs on the caller's
// thread; the state provider runs on the averagers' compute pool and takes state_mu_.
class CollaborativeOptimizer::Impl {
 public:
  Impl(dht::Node& node, std::vector<at::Tensor> params,
       std::shared_ptr<torch::optim::Optimizer> optimizer, CollaborativeOptions options);
  Status Init();
  ~Impl();

  // ---- collaborative.cpp
  Result<StepReport> Step(int64_t batch_size, int64_t data_index = -1);
  // A batch's gradients into the way of stepping (skipped, and the report says so, when they
  // are not finite); and what every call that may step ends with (the report's epoch, the last
  // round's summary, the compute clock).
  Status TakeBatch(int64_t batch_size, StepReport& report);
  void AfterStep(StepReport& report);
  Result<bool> Accumulate(int64_t batch_size);
  Result<StepReport> EndEpoch(int64_t epoch);
  Status WaitForPeers(size_t n, std::chrono::milliseconds timeout);
  // The options every averager of this peer shares (prefix and codec are the caller's).
  averaging::AveragerOptions AveragerDefaults() const;
  bool Interrupted() const;
  // The phase of a peer between batches: kIdle until it first calls Step(), then kTrain.
  Phase Active() const { return phase_ == Phase::kIdle ? Phase::kIdle : Phase::kTrain; }
  // Reports this peer's progress (epoch, samples this epoch, rate, batch) in `phase`.
  void Publish(Phase phase);
  // A fresh view of the swarm, spaced out for waiting peers (see collaborative.cpp).
  GlobalProgress Poll(Clock::duration waited = {});
  // The group to expect at `epoch`: the live peers there (with delayed averaging, also those one
  // epoch ahead, whose round for `epoch` may still run). Refreshes the view before concluding
  // that this peer is alone.
  size_t PeersAtEpoch(int64_t epoch);
  size_t CountPeersAtEpoch(int64_t epoch, const GlobalProgress& g) const;
  // Donors are ranked by the epoch of their parameters, those that averaged with the swarm first.
  void UpdatePriority();
  bool GradsFinite() const;
  void ZeroGrads();
  // acc (total_ values on the parameters' device) += weight x the gradients (none: zeros).
  void AddGradsTo(at::Tensor& acc, double weight);
  // The parameters as one flat float32 vector in host memory, or a range [begin, end) of it
  // (copied from the device when the parameters live on a GPU).
  void CopyParamsTo(float* out, size_t begin = 0, size_t end = SIZE_MAX) const;
  void CopyToParams(const float* in, size_t begin = 0, size_t end = SIZE_MAX);
  // Steps the optimizer at global epoch `epoch`, at the rate options_.lr_schedule gives it
  // there (state_mu_ held by the caller).
  void StepOptimizer(int64_t epoch);
  // Writes a flat gradient (total_ values, on the parameters' device) into the parameters'
  // .grad and steps the optimizer at `epoch` (state_mu_ held by the caller).
  void StepOptimizerWith(const at::Tensor& gradient, int64_t epoch);
  // A flat float32 tensor of total_ values on the parameters' device: zeros, or a view of
  // `host` when the parameters are in host memory (then writes to either are seen by both).
  at::Tensor FlatZeros() const;
  at::Tensor FlatOver(std::vector<float>& host) const;
  void UpdateThroughput(int64_t batch_size);
  // A Byzantine peer's gradient attack (options_.testing) on its mean gradient of `epoch`; and
  // the epoch its lies as a reducer or in its checks go by.
  void Attack(at::Tensor& mean, int64_t epoch);

  // ---- gradient_audits.cpp (CollaborativeOptions::audit_targets)
  // A contributed batch's index in this peer's data stream of this epoch, into this round's
  // claim.
  void NoteClaimedBatch(int64_t index);
  // This round's claim (what its mean gradient is recomputed from); empty when it cannot be
  // made (a batch of unknown index). Starts the next round's, and notes this round's epoch and
  // parameters, which Recompute() compares others' claims with.
  std::string TakeClaim();
  void DropClaim();  // the round's sum was dropped (a state load)
  // averaging::AveragerOptions::recompute: another member's mean gradient from its claim.
  Status Recompute(const PeerId& member, std::string_view claim, double weight,
                   std::span<float> out);

  // ---- state_sync.cpp
  Status LoadStateFromPeers();
  // This peer missed the swarm's step for its epoch: take the swarm's state (see the file).
  Status CatchUp(StepReport& report, bool quiet);
  // After a step: catch up if behind; re-sync parameters that left the swarm's.
  Status Resync(StepReport& report);
  Status DownloadState(std::optional<double> min_priority);
  NamedTensors CollectState();
  Json StateMetadata(const NamedTensors& named) const;
  Result<averaging::SharedState> ProvideState();
  // Installs a state (from a peer or a checkpoint); validates everything first. `diverged`: the
  // state's parameters left the swarm's (its donor stepped alone).
  Status ApplyState(const NamedTensors& named, int64_t epoch, int64_t inner_step,
                    bool diverged = false);

  // ---- checkpoints.cpp
  Status SaveCheckpoint(const std::filesystem::path& file);
  Status LoadCheckpoint(const std::filesystem::path& file);

  dht::Node& node_;
  // On one device: the CPU, or a GPU whose optimizer state and accumulated gradients stay
  // there too (host copies are made only for the network and for checkpoints).
  std::vector<at::Tensor> params_;
  at::Device device_;
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<double> base_lrs_;  // each parameter group's rate as it came in (lr_schedule.h)
  // On a GPU, the parameters' .grad as views of one buffer (one kernel per check, sum or zeroing
  // instead of one per parameter); null on the CPU, whose loops read each .grad directly.
  std::unique_ptr<FlatGradients> grads_;
  const CollaborativeOptions options_;
  std::vector<size_t> offsets_;  // where each parameter starts in the flat vector; then total_
  size_t total_ = 0;
  std::unique_ptr<ProgressTracker> tracker_;
  std::unique_ptr<Stepping> stepping_;
  std::mutex state_mu_;        // parameters and optimizer state vs. the state provider
  int64_t epoch_ = 0;          // rounds this peer has been through (what it reports)
  int64_t params_epoch_ = 0;   // the epoch its parameters are at (guarded by state_mu_)
  bool diverged_ = false;      // stepped alone while others stepped together
  int64_t local_samples_ = 0;  // this epoch's (or this DiLoCo sync's) samples
  double sps_ = 0;
  int64_t last_batch_ = 0;
  Phase phase_ = Phase::kIdle;  // what this peer last reported
  std::atomic<double> loss_{std::numeric_limits<double>::quiet_NaN()};  // ReportLoss()
  RoundSummary last_round_;            // reported with its progress (Step()'s thread)
  Clock::time_point last_step_end_{};  // when Step() last returned
  Clock::time_point last_poll_{};
  Clock::time_point next_catch_up_{};
  int failed_catch_ups_ = 0;  // in a row, for want of a donor
  TrainingCounters counters_;
  std::atomic<int64_t> attack_epoch_{0};  // the round the averagers are in (Attack())
  int64_t data_index_ = -1;               // Step()'s
  AuditClaim claim_;                      // this round's batches (NoteClaimedBatch())
  int64_t claim_epoch_ = -1;              // the epoch of claim_'s batches
  bool claim_broken_ = false;             // a batch of unknown index or epoch, or too many runs
  int64_t round_epoch_ = -1;              // the epoch of this round (TakeClaim()) ...
  std::string round_params_;              // ... and ParamsDigest() of its parameters
  at::Tensor stale_;                      // GradientAttack::kStale's gradient
};

}  // namespace colony::train
