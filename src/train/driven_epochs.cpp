// Driven epochs (collaborative.h): the caller says when an epoch ends. A SWARM stage server
// (swarm/stage_training.h) accumulates the gradients of the microbatches that pass through it
// and ends an epoch when the trainers have moved past it, averaging with the other peers of its
// stage, which may have received none of that epoch's microbatches (they join with weight
// 1e-30, rounds.cpp).
#include <fmt/format.h>

#include "core/log.h"
#include "train/internal.h"

namespace colony::train {

Status Stepping::EndEpochNow(StepReport&) {
  return FailedPrecondition("driven epochs need synchronous gradient rounds");
}

namespace {

Status CheckDriven(const CollaborativeOptions& o) {
  if (o.diloco_inner_steps > 0 || o.local_updates || o.delay_grad_averaging ||
      o.mode == averaging::Mode::kAux) {
    return FailedPrecondition(
        "driven epochs (Accumulate/EndEpoch) need synchronous gradient rounds: no DiLoCo, local "
        "updates, delayed averaging or auxiliary mode");
  }
  return Status::Ok();
}

}  // namespace

Result<bool> CollaborativeOptimizer::Impl::Accumulate(int64_t batch_size) {
  COLONY_RETURN_IF_ERROR(CheckDriven(options_));
  if (batch_size <= 0) {
    return InvalidArgument("Accumulate() needs the batch's (positive) sample count");
  }
  StepReport report;
  COLONY_RETURN_IF_ERROR(TakeBatch(batch_size, report));
  Publish(Phase::kTrain);
  last_step_end_ = Clock::now();
  return !report.skipped_nonfinite;
}

Result<StepReport> CollaborativeOptimizer::Impl::EndEpoch(int64_t epoch) {
  COLONY_RETURN_IF_ERROR(CheckDriven(options_));
  StepReport report;
  if (epoch < epoch_) {
    report.epoch = epoch_;
    return report;
  }
  if (epoch > epoch_) {
    // Rounds went by without this peer: take the state of a peer of the run that is ahead, if
    // there is one; then end its own epoch if it is still behind `epoch` (never jumping: the
    // epochs a caller names may come from elsewhere, and a peer's epoch moves by rounds).
    Status st = CatchUp(report, /*quiet=*/true);
    if (!st.ok()) COLONY_LOG_INFO("train: catching up to epoch {}: {}", epoch, st.ToString());
    if (epoch_ > epoch) {
      report.epoch = epoch_;
      return report;
    }
  }
  COLONY_RETURN_IF_ERROR(stepping_->EndEpochNow(report));
  AfterStep(report);
  return report;
}

Result<bool> CollaborativeOptimizer::Accumulate(int64_t batch_size) {
  return impl_->Accumulate(batch_size);
}
Result<StepReport> CollaborativeOptimizer::EndEpoch(int64_t epoch) {
  return impl_->EndEpoch(epoch);
}
void CollaborativeOptimizer::KeepAlive() { impl_->Publish(impl_->Active()); }

}  // namespace colony::train
