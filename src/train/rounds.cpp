// Synchronous gradient rounds (DeDLOC / hivemind's Optimizer): every peer accumulates
// batch_size x gradient over its batches; when the swarm has the target batch (target_batch.cpp)
// the peers at the epoch average their mean gradients weighted by their sample counts, so that
// the result is the mean gradient of the whole global batch, and every peer applies the same
// optimizer step. With delay_grad_averaging the round runs in the background while the next
// batch is computed and is applied a batch later; with powersgd_rank the matrices go as PowerSGD
// factors (powersgd.h). average_state_every = k also averages the
// parameters every k epochs. Auxiliary peers join every round with weight 0 (RunAuxiliary).
#include <algorithm>
#include <cmath>
#include <future>
#include <thread>

#include "core/log.h"
#include "train/internal.h"
#include "train/powersgd.h"

namespace colony::train {
namespace {

// Attempts at an epoch's round before a peer whose group never formed steps alone.
constexpr int kRoundAttempts = 2;

// The weight a peer without samples at an epoch joins its round with (a SWARM stage peer that
// got none of the epoch's microbatches, train/driven_epochs.cpp). Not 0: the all-reduce counts a
// member of weight 0 as one that brought no data, and a member that averaged only with such
// peers would take its round for one that averaged with nobody. Its values are zeros, so this
// weight moves no float32 value of the mean: sum(w x) is unchanged and total + 1e-30 == total.
constexpr double kNoSamplesWeight = 1e-30;

class GradientRounds final : public TargetBatchStepping {
 public:
  explicit GradientRounds(CollaborativeOptimizer::Impl& peer) : TargetBatchStepping(peer) {}

  Status Init() {
    acc_ = peer_.FlatZeros();
    wire_.assign(peer_.total_, 0.0f);
    mean_ = peer_.FlatOver(wire_);
    auto a = peer_.AveragerDefaults();
    a.prefix = peer_.options_.run_id + ".grads";
    a.codec = peer_.options_.grad_codec;
    if (peer_.options_.centered_clip_tau > 0) {
      a.centered_clip = averaging::CenteredClipOptions{.tau = peer_.options_.centered_clip_tau};
    }
    a.verify = peer_.options_.verify_rounds;
    a.discard_to_zeros = true;  // a gradient span nobody can vouch for is skipped, alike
    a.audit_targets = peer_.options_.audit_targets;
    if (a.audit_targets > 0) {
      a.recompute = [p = &peer_](const PeerId& member, std::string_view claim, double weight,
                                 std::span<float> out) {
        return p->Recompute(member, claim, weight, out);
      };
    }
    if (peer_.options_.powersgd_rank > 0) {
      std::vector<std::vector<int64_t>> shapes;
      for (const auto& p : peer_.params_) shapes.push_back(p.sizes().vec());
      COLONY_ASSIGN_OR_RETURN(
          powersgd_,
          PowerSgd::Create(peer_.node_, PlanLowRank(shapes, peer_.options_.powersgd_rank),
                           peer_.options_.powersgd_rank, a));
    } else {
      COLONY_ASSIGN_OR_RETURN(averager_, averaging::Averager::Create(peer_.node_, {wire_}, a));
    }
    if (peer_.options_.average_state_every > 0) {
      COLONY_ASSIGN_OR_RETURN(params_, ParameterAveraging::Create(peer_));
    }
    return Status::Ok();
  }

  Status Contribute(int64_t batch_size, StepReport&) override {
    peer_.AddGradsTo(acc_, static_cast<double>(batch_size));
    peer_.ZeroGrads();
    Counted(batch_size);
    return Status::Ok();
  }

  Status Advance(StepReport& report) override {
    if (pending_.valid() &&
        pending_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      ApplyPending(&report);
    }
    return TargetBatchStepping::Advance(report);
  }

  int64_t Lag() const override { return peer_.options_.delay_grad_averaging ? 1 : 0; }
  bool HasPending() const override { return pending_.valid(); }
  void FinishPending(StepReport* report) override {
    if (pending_.valid()) ApplyPending(report);
  }

  void DropEpoch() override {
    TargetBatchStepping::DropEpoch();
    acc_.zero_();
    peer_.DropClaim();
  }

  void InstallState(const NamedTensors&, int64_t, int64_t) override {
    acc_.zero_();
    peer_.DropClaim();
    if (powersgd_) powersgd_->ResetErrors();  // it belonged to the parameters replaced
  }

  averaging::Averager& Sharing() override { return powersgd_ ? powersgd_->first() : *averager_; }
  // Every member applies the same averaged gradients (each part's reducer sends the same values
  // to all, itself included), so peers at the same epoch that never stepped alone agree.
  bool StatesAgreeAcrossPeers() const override { return true; }

  Status RunAuxiliary(const std::function<bool()>& stop) override;

  void Shutdown() override {
    if (pending_.valid()) pending_.wait();
    if (averager_) averager_->Shutdown();
    if (powersgd_) powersgd_->Shutdown();
    if (params_) params_->Shutdown();
  }

 private:
  // What a round at an epoch came to.
  struct Outcome {
    int64_t epoch = 0;
    bool averaged = false;
    int64_t realized = 0;
    size_t group = 1;
    std::string group_id = {};
    double seconds = 0;
    std::string note;
    std::vector<std::string> banned = {};  // peers verification banned in the round
  };

  Status Average(StepReport& report) override {
    if (pending_.valid()) ApplyPending(&report);  // one round in flight at a time
    const int64_t samples = peer_.local_samples_;
    const int64_t round_epoch = peer_.epoch_;
    const size_t expected = peer_.PeersAtEpoch(round_epoch);
    const float inv = samples > 0 ? 1.0f / static_cast<float>(samples) : 0.0f;
    mean_.copy_(acc_).mul_(inv);
    acc_.zero_();
    claim_ = peer_.options_.audit_targets > 0 ? peer_.TakeClaim() : std::string();
    peer_.Attack(mean_, round_epoch);
    // A GPU peer's mean goes to host memory only for a round (mean_ is wire_ on the CPU).
    if (expected > 1 && !peer_.device_.is_cpu()) ToWire();
    if (peer_.options_.delay_grad_averaging && expected > 1) {
      const double sps = peer_.sps_;  // the round's thread must not read the optimizer's fields
      pending_ = std::async(std::launch::async, [this, samples, round_epoch, expected, sps] {
        return AverageGrads(samples, round_epoch, expected, sps);
      });
    } else {
      Outcome outcome = expected > 1 ? AverageGrads(samples, round_epoch, expected, peer_.sps_)
                                     : Outcome{.epoch = round_epoch,
                                               .averaged = false,
                                               .realized = samples,
                                               .group = 1,
                                               .seconds = 0,
                                               .note = {}};
      // A round that failed (nobody came in time, or the all-reduce broke for everyone): if the
      // swarm stepped without this peer, take its state; if peers are still at this epoch, they
      // failed too, so try once more together before anyone steps alone.
      for (int attempt = 1; !outcome.averaged && expected > 1 && attempt < kRoundAttempts;
           ++attempt) {
        const GlobalProgress g = peer_.tracker_->Refresh(kPollTimeout);
        if (g.epoch > round_epoch) {
          peer_.counters_.missed_rounds++;
          COLONY_LOG_INFO("train: the swarm averaged epoch {} without this peer ({}); catching up",
                          round_epoch, outcome.note);
          return peer_.CatchUp(report, /*quiet=*/true);
        }
        const size_t again = peer_.CountPeersAtEpoch(round_epoch, g);
        if (again <= 1) break;
        outcome = AverageGrads(samples, round_epoch, again, peer_.sps_);
      }
      if (!outcome.averaged && expected > 1) {
        // The last attempt failed too: if the swarm stepped meanwhile, take its state rather
        // than step alone.
        const GlobalProgress g = peer_.tracker_->Refresh(kPollTimeout);
        if (g.epoch > round_epoch) {
          peer_.counters_.missed_rounds++;
          return peer_.CatchUp(report, /*quiet=*/true);
        }
        // Nobody came, though others claimed samples at this epoch: their claims count for
        // nothing for a while (a record that claims the target and never averages would
        // otherwise stall every epoch).
        peer_.tracker_->NoteRound(round_epoch, {});
      }
      ApplyOutcome(outcome, &report);
    }
    NextEpoch(report);
    const int k = peer_.options_.average_state_every;
    if (params_ && peer_.epoch_ % k == 0) {
      StepReport ignored;
      params_->Average(1, peer_.epoch_, peer_.PeersAtEpoch(round_epoch), ignored);
    }
    return AfterRound(report);
  }

  // Averages wire_ (this peer's mean gradient, in host memory) with the peers at `epoch`.
  Outcome AverageGrads(int64_t samples, int64_t epoch, size_t expected, double sps) {
    Outcome out;
    out.epoch = epoch;
    out.realized = samples;
    averaging::StepOptions so;
    so.weight = samples > 0 ? static_cast<double>(samples) : kNoSamplesWeight;
    so.gather = GatherMetadata(samples, sps);
    so.timeout = peer_.options_.averaging_timeout;
    so.allow_retries = false;  // the group of an epoch forms once; a retry would wait alone
    so.expected_group_size = expected;
    so.group_bits = EpochBits(epoch);
    so.audit_claim = claim_;
    std::vector<float> local(wire_);  // restored if the round fails before the all-reduce
    auto r = powersgd_ ? powersgd_->Average(wire_, so) : averager_->StepSync(so);
    if (!r.ok()) {
      out.note = r.status().ToString();
      std::copy(local.begin(), local.end(), wire_.begin());
      return out;
    }
    out.averaged = true;
    out.seconds = r->matchmaking_seconds + r->allreduce_seconds;
    const Membership m = CountMembers(*r);
    out.realized = m.realized;
    out.group = m.group;
    out.group_id = ShortGroupId(*r);
    for (uint32_t b : r->verification.banned) {
      out.banned.push_back(r->members[b].peer.ToString());
      peer_.tracker_->Ignore(r->members[b].peer);
    }
    if (r->members.size() < peer_.options_.target_group_size) {
      // The group had room for everyone at the epoch: those who claimed samples and did not
      // come are set aside for a while (in a full group, they may have averaged in another).
      std::vector<PeerId> came;
      for (const auto& member : r->members) came.push_back(member.peer);
      peer_.tracker_->NoteRound(epoch, came);
    }
    peer_.tracker_->NoteRoundEnd(epoch + 1, m.rates);
    return out;
  }

  void ApplyPending(StepReport* report) {
    Outcome outcome = pending_.get();
    ApplyOutcome(outcome, report);
    peer_.UpdatePriority();
  }

  // Steps the optimizer with mean_ (unless it is not finite).
  void ApplyOutcome(const Outcome& o, StepReport* report) {
    StepReport ignored;
    StepReport& r = report != nullptr ? *report : ignored;
    r.averaged = o.averaged;
    r.realized_batch = o.realized;
    r.group_size = o.group;
    r.group = o.group_id;
    r.averaging_seconds = o.seconds;
    r.note = o.note;
    r.banned = o.banned;
    if (o.averaged && !peer_.device_.is_cpu()) FromWire();
    // Nothing to apply: no samples and no group, or a group of peers without samples (SWARM
    // stage peers that got none of the epoch's microbatches) whose mean is all zeros.
    if (o.realized == 0 && (!o.averaged || !mean_.ne(0).any().item<bool>())) {
      std::lock_guard lock(peer_.state_mu_);
      peer_.params_epoch_ = o.epoch + 1;
      return;
    }
    if (!o.averaged && !o.note.empty() && peer_.options_.delay_grad_averaging &&
        OthersAtOrAfter(o.epoch)) {
      // A delayed round that failed here while the swarm went on: take the state the others
      // reach with that round (once they apply it) rather than step alone.
      if (peer_.DownloadState(static_cast<double>(o.epoch + 1) + 0.5).ok()) {
        peer_.counters_.missed_rounds++;
        r.loaded_state = true;
        return;
      }
    }
    if (!o.averaged && !o.note.empty()) {
      // Others stepped without this peer: after stepping alone it differs from the swarm and
      // takes the swarm's state at the next opportunity.
      peer_.diverged_ = true;
      peer_.counters_.failed_rounds++;
      COLONY_LOG_WARN("train: averaging at epoch {} failed, stepping with local gradients: {}",
                      o.epoch, o.note);
    } else if (!o.averaged && OthersAtOrAfter(o.epoch)) {
      // Alone by its view while others are at this epoch or later (a partition, a view that
      // missed them): its step is its own.
      peer_.diverged_ = true;
    }
    if (!model::AllFinite(mean_)) {
      peer_.counters_.skipped_batches++;
      r.skipped_nonfinite = true;
      COLONY_LOG_WARN("train: the averaged gradients are not finite; step skipped");
      return;
    }
    if (peer_.options_.max_grad_norm > 0) {
      const double norm = mean_.to(at::kDouble).norm().item<double>();
      if (norm > peer_.options_.max_grad_norm) {
        mean_.mul_(static_cast<float>(peer_.options_.max_grad_norm / norm));
      }
    }
    std::lock_guard lock(peer_.state_mu_);
    peer_.StepOptimizerWith(mean_, o.epoch);
    peer_.params_epoch_ = o.epoch + 1;
  }

  // Another live peer reports `epoch` or a later one.
  bool OthersAtOrAfter(int64_t epoch) const {
    const GlobalProgress g = peer_.tracker_->Global();
    for (size_t i = 1; i < g.peers.size(); ++i) {  // peers[0] is this peer
      if (g.peers[i].epoch >= epoch && !g.peers[i].aux) return true;
    }
    return false;
  }

  // A GPU peer's mean gradient and the host copy that a round averages.
  void ToWire() {
    at::from_blob(wire_.data(), {static_cast<int64_t>(wire_.size())}, at::kFloat).copy_(mean_);
  }
  void FromWire() {
    mean_.copy_(at::from_blob(wire_.data(), {static_cast<int64_t>(wire_.size())}, at::kFloat));
  }

  // On the parameters' device (flat): the sum over this epoch's batches of batch_size x
  // gradient, and this peer's mean gradient (then the round's average). On the CPU mean_ is a
  // view of wire_, which the averager reads and writes; on a GPU wire_ is its host copy, made
  // only for rounds with others.
  at::Tensor acc_, mean_;
  std::vector<float> wire_;
  std::unique_ptr<averaging::Averager> averager_;  // null with PowerSGD, which has its own
  std::unique_ptr<PowerSgd> powersgd_;             // with CollaborativeOptions::powersgd_rank
  std::string claim_;  // this round's audit claim (CollaborativeOptions::audit_targets)
  std::unique_ptr<ParameterAveraging> params_;  // with average_state_every
  std::future<Outcome> pending_;                // a delayed round
};

// An auxiliary peer trains nothing: it joins every round of the swarm with weight 0 and lends
// its bandwidth (it reduces a span).
Status GradientRounds::RunAuxiliary(const std::function<bool()>& stop) {
  int64_t last_round = -1;
  auto idle_since = Clock::now();
  while (!stop() && !peer_.Interrupted()) {
    const GlobalProgress g = peer_.Poll(Clock::now() - idle_since);
    peer_.epoch_ = g.epoch;
    peer_.tracker_->Report({.epoch = g.epoch, .phase = Phase::kWait});
    if (g.epoch == last_round || g.num_peers_at_epoch <= 1 ||
        DecideEpoch(g, g.epoch, 0, Standing::kWaiting).action != EpochAction::kAverage) {
      continue;
    }
    averaging::StepOptions so;
    so.weight = 0;
    so.timeout = peer_.options_.averaging_timeout;
    so.allow_retries = false;  // the group of an epoch forms once; a retry would wait alone
    so.expected_group_size = g.num_peers_at_epoch;
    so.group_bits = EpochBits(g.epoch);
    peer_.tracker_->Report({.epoch = g.epoch, .phase = Phase::kRound});
    auto r = powersgd_ ? powersgd_->Join(so) : averager_->StepSync(so);
    last_round = g.epoch;
    idle_since = Clock::now();
    if (r.ok()) {
      peer_.counters_.global_steps++;
    } else {
      COLONY_LOG_INFO("train: auxiliary round at epoch {} failed: {}", g.epoch,
                      r.status().ToString());
    }
  }
  return Status::Ok();
}

}  // namespace

std::unique_ptr<Stepping> MakeGradientRounds(CollaborativeOptimizer::Impl& peer, Status& status) {
  auto s = std::make_unique<GradientRounds>(peer);
  status = s->Init();
  return s;
}

}  // namespace colony::train
