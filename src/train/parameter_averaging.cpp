// Averaging the parameters themselves with the peers at an epoch (internal.h,
// ParameterAveraging): what local updates do at every epoch, and what realigns peers of gradient
// rounds every average_state_every epochs.
#include "core/log.h"
#include "train/internal.h"

namespace colony::train {

Result<std::unique_ptr<ParameterAveraging>> ParameterAveraging::Create(
    CollaborativeOptimizer::Impl& peer) {
  std::unique_ptr<ParameterAveraging> p(new ParameterAveraging(peer));
  auto a = peer.AveragerDefaults();
  a.prefix = peer.options_.run_id + ".params";
  a.codec = peer.options_.state_codec;
  a.testing.fault = averaging::Fault::kNone;
  a.testing.wrong_result = false;
  p->values_.assign(peer.total_, 0.0f);
  COLONY_ASSIGN_OR_RETURN(p->averager_, averaging::Averager::Create(peer.node_, {p->values_}, a));
  return p;
}

bool ParameterAveraging::Average(int64_t samples, int64_t epoch, size_t expected,
                                 StepReport& report) {
  if (expected <= 1) return false;
  averaging::StepOptions so;
  so.weight = static_cast<double>(samples);
  so.gather = GatherMetadata(samples, peer_.sps_);
  so.timeout = peer_.options_.averaging_timeout;
  so.allow_retries = false;  // the group of an epoch forms once; a retry would wait alone
  so.expected_group_size = expected;
  so.group_bits = EpochBits(epoch);
  {
    std::lock_guard lock(peer_.state_mu_);
    peer_.CopyParamsTo(values_.data());
  }
  auto r = averager_->StepSync(so);
  if (!r.ok()) {
    report.note = r.status().ToString();
    COLONY_LOG_WARN("train: parameter averaging at epoch {} failed: {}", epoch, report.note);
    return false;
  }
  const Membership m = CountMembers(*r);
  if (peer_.options_.local_updates) peer_.tracker_->NoteRoundEnd(epoch + 1, m.rates);
  report.averaged = true;
  report.group_size = m.group;
  report.group = ShortGroupId(*r);
  report.realized_batch = m.realized;
  report.averaging_seconds = r->matchmaking_seconds + r->allreduce_seconds;
  // Guard against a round that went wrong in a way the averager could not see.
  if (!AllFinite(std::span<const float>(values_))) {
    COLONY_LOG_WARN("train: averaged parameters are not finite; keeping the local ones");
    return false;
  }
  std::lock_guard lock(peer_.state_mu_);
  peer_.CopyToParams(values_.data());
  return true;
}

}  // namespace colony::train
