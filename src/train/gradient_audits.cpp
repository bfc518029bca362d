// BTARD's audits of gradient rounds (CollaborativeOptions::audit_targets): the claim a peer
// sends with its round's mean gradient, and the recomputation of another member's.
//
// A claim names this peer's data stream, the batches of it summed into the round's gradient and
// a digest of the parameters they were computed at (audit.h). An auditor at other parameters
// (it stepped alone, or loaded another state) cannot reproduce it and gives no verdict; one at
// the same parameters computes the same batches as Step() did (each batch's gradient weighted
// by its samples, summed, divided by the samples), so an honest claim gives the values sent up
// to rounding.
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include "core/log.h"
#include "train/internal.h"

namespace colony::train {

void CollaborativeOptimizer::Impl::NoteClaimedBatch(int64_t index) {
  if (options_.audit_targets == 0) return;
  if (claim_epoch_ < 0) claim_epoch_ = epoch_;
  if (index < 0 || claim_epoch_ != epoch_ || !claim_.Add(index)) claim_broken_ = true;
}

std::string CollaborativeOptimizer::Impl::TakeClaim() {
  AuditClaim claim = std::move(claim_);
  const bool broken = claim_broken_ || (!claim.runs.empty() && claim_epoch_ != epoch_);
  DropClaim();
  // The epoch and parameters of this round, which its audits of others compare their claims
  // with.
  round_epoch_ = epoch_;
  std::vector<float> flat(total_);
  CopyParamsTo(flat.data());
  round_params_ = ParamsDigest(flat);
  if (broken) {
    COLONY_LOG_WARN(
        "train: this round's gradient has batches that cannot be named (of unknown index or "
        "epoch, or in more than {} runs): it cannot be audited, and an audit that picks it bans "
        "this peer",
        kMaxAuditRuns);
    return {};
  }
  const auto& t = options_.testing;
  claim.seed = t.chosen_data_seed && epoch_ >= t.attack_from_epoch
                   ? *t.chosen_data_seed
                   : AuditDataSeed(options_.run_id, node_.peer_id(), epoch_);
  claim.batch_size = options_.audit_data.batch_size;
  claim.params = round_params_;
  return EncodeAuditClaim(claim);
}

void CollaborativeOptimizer::Impl::DropClaim() {
  claim_ = {};
  claim_epoch_ = -1;
  claim_broken_ = false;
}

Status CollaborativeOptimizer::Impl::Recompute(const PeerId& member, std::string_view bytes,
                                               double weight, std::span<float> out) {
  COLONY_ASSIGN_OR_RETURN(AuditClaim claim, DecodeAuditClaim(bytes));
  if (out.size() != total_) return Internal("an audit's output does not match the parameters");
  // The weight the member declared is its samples (a member without samples declares ~0).
  const int64_t batches = claim.Batches();
  const int64_t end = claim.runs.empty() ? 0 : claim.runs.back().first + claim.runs.back().second;
  if (end > std::numeric_limits<int64_t>::max() / claim.batch_size) {
    return InvalidArgument("the claim names more samples than can be counted");
  }
  const int64_t samples = batches * claim.batch_size;
  const int64_t declared = weight < 0.5 ? 0 : static_cast<int64_t>(std::llround(weight));
  if (samples != declared) {
    return InvalidArgument(
        fmt::format("it claims {} samples and declared a weight of {:g} samples", samples, weight));
  }
  // A bound on the work a claim may ask of its auditors, batches left out included: a few of
  // the swarm's steps.
  if (end * claim.batch_size > 4 * options_.target_batch_size + kMaxAuditBatchSize) {
    return InvalidArgument(
        fmt::format("it claims the first {} samples of its data, more than 4 of the run's steps "
                    "of {}",
                    end * claim.batch_size, options_.target_batch_size));
  }
  if (round_params_ != claim.params) {
    return FailedPrecondition("its claim was made at other parameters than this peer's");
  }
  // Its data is not its choice: the stream the run gives it at this epoch (audit.h).
  const uint64_t stream = AuditDataSeed(options_.run_id, member, round_epoch_);
  if (claim.seed != stream) {
    return InvalidArgument(
        fmt::format("it claims to have trained on data stream {:016x}; at epoch {} the run "
                    "gives it stream {:016x}",
                    claim.seed, round_epoch_, stream));
  }
  std::fill(out.begin(), out.end(), 0.0f);
  if (samples == 0) return Status::Ok();
  at::Tensor acc = FlatZeros();
  ZeroGrads();
  // The epoch's batches in order: those it claims summed, those it left out checked to give
  // a gradient that is not finite (the only batches an honest peer skips).
  int64_t index = 0;
  for (const auto& [first, count] : claim.runs) {
    for (; index < first + count; ++index) {
      auto n = options_.audit_data.compute_batch(claim.seed, claim.batch_size, index);
      if (!n.ok()) {
        ZeroGrads();
        return FailedPrecondition(
            fmt::format("this peer could not compute batch {}: {}", index, n.status().message()));
      }
      const bool claimed = index >= first;
      if (!claimed && GradsFinite()) {
        ZeroGrads();
        return InvalidArgument(
            fmt::format("it left out batch {} of its data at epoch {}, whose gradient is finite",
                        index, round_epoch_));
      }
      if (claimed) AddGradsTo(acc, static_cast<double>(*n));
      ZeroGrads();
    }
  }
  acc.mul_(1.0f / static_cast<float>(samples));
  at::from_blob(out.data(), {static_cast<int64_t>(out.size())}, at::kFloat).copy_(acc);
  return Status::Ok();
}

}  // namespace colony::train
