// The readiness loop of the ways of stepping that step when the swarm has the target batch
// (gradient rounds, local updates). After every batch a peer asks DecideEpoch
// (progress_record.h) what the swarm's progress means for it: compute on; stop and poll until
// the *reported* samples confirm the target (then average) or refute it (then compute on, with
// a share of the shortfall when every peer stopped short); or catch up when the swarm averaged
// this epoch without it. Extrapolation only decides when to stop, never that the target is
// reached, so the realized batch cannot undershoot it (docs/training.md).
#include "core/log.h"
#include "train/internal.h"

namespace colony::train {

void TargetBatchStepping::Counted(int64_t batch_size) {
  peer_.local_samples_ += batch_size;
  peer_.counters_.local_samples += batch_size;
  quota_left_ = std::max<int64_t>(0, quota_left_ - batch_size);
}

void TargetBatchStepping::DropEpoch() {
  quota_active_ = false;
  quota_left_ = 0;
}

Status TargetBatchStepping::Advance(StepReport& report) {
  bool waiting = false;
  GlobalProgress g;
  if (quota_active_) {
    // Computing its share of a gap: compute on without re-estimating (but join the round or
    // catch up when the swarm moves), then wait.
    if (quota_left_ > 0) {
      peer_.Publish(Phase::kTrain);
      g = peer_.tracker_->Global();
      const EpochAction a = DecideEpoch(g, peer_.epoch_, Lag(), Standing::kComputing).action;
      if (a == EpochAction::kCatchUp) return peer_.CatchUp(report, /*quiet=*/true);
      if (a != EpochAction::kAverage) return Status::Ok();
      quota_active_ = false;
      quota_left_ = 0;
      peer_.Publish(Phase::kRound);
      return Average(report);
    }
    quota_active_ = false;
    waiting = true;
    peer_.Publish(Phase::kWait);
    g = peer_.Poll();
  } else {
    peer_.Publish(Phase::kTrain);
    g = peer_.tracker_->Global();
  }
  const auto wait_start = Clock::now();
  for (;;) {
    const Standing standing = !waiting                        ? Standing::kComputing
                              : shared_epoch_ == peer_.epoch_ ? Standing::kWaitingAfterShare
                                                              : Standing::kWaiting;
    const EpochDecision d = DecideEpoch(g, peer_.epoch_, Lag(), standing);
    switch (d.action) {
      case EpochAction::kCatchUp:
        return peer_.CatchUp(report, /*quiet=*/true);
      case EpochAction::kAverage:
        quota_active_ = false;
        quota_left_ = 0;
        peer_.Publish(Phase::kRound);
        return Average(report);
      case EpochAction::kTrain:
        if (waiting) {
          if (d.quota > 0) {
            quota_active_ = true;
            quota_left_ = d.quota;
            shared_epoch_ = peer_.epoch_;
          }
          peer_.Publish(Phase::kTrain);
        }
        return Status::Ok();
      case EpochAction::kWait:
        if (!waiting) {
          waiting = true;
          peer_.Publish(Phase::kWait);
        }
        if (peer_.Interrupted()) return Status::Ok();
        if (Clock::now() - wait_start > peer_.options_.averaging_timeout) {
          COLONY_LOG_WARN(
              "train: waited {:.0f} s at epoch {} for the swarm's reports to reach the target "
              "batch ({} of {} reported, {} expected); computing on",
              Seconds(Clock::now() - wait_start), peer_.epoch_, g.samples_reported,
              g.target_batch_size, g.samples_expected);
          peer_.Publish(Phase::kTrain);
          return Status::Ok();
        }
        g = peer_.Poll(Clock::now() - wait_start);
        break;
    }
  }
}

Status TargetBatchStepping::EndEpochNow(StepReport& report) {
  quota_active_ = false;
  quota_left_ = 0;
  peer_.Publish(Phase::kRound);
  return Average(report);
}

void TargetBatchStepping::NextEpoch(StepReport& report) {
  ++peer_.epoch_;
  peer_.local_samples_ = 0;
  peer_.counters_.global_steps++;
  report.stepped = true;
}

Status TargetBatchStepping::AfterRound(StepReport& report) {
  peer_.Publish(Phase::kTrain);
  peer_.UpdatePriority();
  return peer_.Resync(report);
}

}  // namespace colony::train
