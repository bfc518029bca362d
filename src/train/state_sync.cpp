// State for newcomers and for peers that fell behind: what a peer provides to others (its
// parameters, optimizer state and whatever its way of stepping adds, e.g. DiLoCo's outer
// parameters), how it downloads and installs a peer's state (validating everything: it comes
// from the network), and when it does: catching up after the swarm stepped without it, and
// re-syncing after its parameters left the swarm's.
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <thread>

#include "core/log.h"
#include "train/donor_state.h"
#include "train/internal.h"
#include "train/optimizer_state.h"

namespace colony::train {
namespace {

// A peer that catches up downloads at most this many states in one go (each time finding the
// swarm moved on); then it computes a batch and tries again.
constexpr int kMaxDownloadsPerCatchUp = 3;

Result<at::ScalarType> ParseScalarType(const std::string& name) {
  for (auto t : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong, at::kInt, at::kShort,
                 at::kChar, at::kByte, at::kBool}) {
    if (name == at::toString(t)) return t;
  }
  return InvalidArgument(fmt::format("unknown tensor dtype '{}'", name));
}

}  // namespace

Status CollaborativeOptimizer::Impl::LoadStateFromPeers() {
  StepReport ignored;
  if (options_.mode == averaging::Mode::kAux) return Status::Ok();
  if (options_.diloco_inner_steps > 0) {
    // DiLoCo peers sync every H steps: the newest state is the one to take.
    const GlobalProgress g = tracker_->Refresh(kPollTimeout);
    if (g.epoch <= epoch_) return Status::Ok();
    return DownloadState(static_cast<double>(g.epoch));
  }
  return CatchUp(ignored, /*quiet=*/false);
}

// This peer missed the swarm's round for its epoch (it joined late, fell behind, or the group
// formed without it): its samples are dropped and it takes the swarm's state. It first
// announces itself at the swarm's epoch (phase kLoad), so that the swarm counts it in that
// epoch's round, and asks only donors whose parameters are at that epoch or newer, so one
// download normally suffices; it downloads again only if the swarm moved on meanwhile. Gives
// up after load_state_timeout (an error unless `quiet`; the next Step tries again later).
Status CollaborativeOptimizer::Impl::CatchUp(StepReport& report, bool quiet) {
  if (stepping_->HasPending()) stepping_->FinishPending(nullptr);
  // This epoch's samples did not make it into the swarm's step: forget them.
  if (local_samples_ > 0) counters_.dropped_samples += local_samples_;
  local_samples_ = 0;
  stepping_->DropEpoch();
  if (Clock::now() < next_catch_up_) {
    Publish(Active());
    return quiet ? Status::Ok() : Unavailable("catching up was tried moments ago");
  }
  const auto deadline = Clock::now() + options_.load_state_timeout;
  auto backoff = std::chrono::milliseconds(50);
  Status last = Status::Ok();
  for (int downloads = 0;;) {
    const GlobalProgress g = tracker_->Refresh(kPollTimeout);
    if (DecideEpoch(g, epoch_, stepping_->Lag(), Standing::kComputing).action !=
        EpochAction::kCatchUp)
      break;
    // The parameters to take are those of the swarm's epoch, whatever the lag: with delayed
    // averaging a donor's parameters reach that epoch once it applies its round, and a peer
    // that took the epoch before would have to join a round that already formed.
    const int64_t want = g.epoch;
    const bool give_up =
        Interrupted() || Clock::now() + backoff >= deadline || downloads >= kMaxDownloadsPerCatchUp;
    if (give_up) {
      next_catch_up_ = Clock::now() + std::chrono::seconds(1);
      Publish(Active());
      if (downloads >= kMaxDownloadsPerCatchUp) {
        // The swarm moves faster than this peer downloads: go on computing, try at the next
        // batch.
        COLONY_LOG_WARN(
            "train: downloaded the swarm's state {} times and it moved on each time (now epoch "
            "{}); trying again later",
            downloads, g.epoch);
        return Status::Ok();
      }
      // No donor of that epoch for a whole load_state_timeout, twice in a row: the epoch may be
      // a confused or hostile peer's; set it aside for a while rather than chase it.
      if (++failed_catch_ups_ >= 2) {
        failed_catch_ups_ = 0;
        tracker_->DistrustEpochsFrom(g.epoch, options_.load_state_timeout);
      }
      last = last.WithContext(
          fmt::format("this peer is at epoch {} and the swarm at {}, and no peer gave its state",
                      epoch_, g.epoch));
      if (quiet) {
        COLONY_LOG_WARN("train: {}; trying again later", last.ToString());
        return Status::Ok();
      }
      return last;
    }
    if (downloads > 0 || !last.ok()) {
      COLONY_LOG_INFO("train: the swarm is at epoch {}, this peer at {}; loading again", g.epoch,
                      epoch_);
    }
    tracker_->Report({.epoch = g.epoch,
                      .samples = 0,
                      .samples_per_second = sps_,
                      .batch = last_batch_,
                      .phase = Phase::kLoad});
    // A donor that averaged that epoch with the swarm (+0.5, UpdatePriority) if there is one;
    // else any donor of it (its parameters may have left the swarm's: this peer inherits that).
    last = DownloadState(static_cast<double>(want) + 0.5);
    if (!last.ok()) last = DownloadState(static_cast<double>(want));
    if (last.ok()) {
      ++downloads;
      failed_catch_ups_ = 0;
      report.loaded_state = true;
      continue;
    }
    std::this_thread::sleep_for(backoff);  // donors advertise and step; ask again shortly
    backoff = std::min<std::chrono::milliseconds>(2 * backoff, std::chrono::seconds(1));
  }
  Publish(Active());
  return Status::Ok();
}

// After a step: a peer whose parameters left the swarm's (it stepped alone when a round
// failed, or skipped a non-finite step) takes the state of its epoch from a peer that
// averaged it; a peer that is behind catches up.
Status CollaborativeOptimizer::Impl::Resync(StepReport& report) {
  const GlobalProgress g = tracker_->Global();
  if (DecideEpoch(g, epoch_, stepping_->Lag(), Standing::kComputing).action ==
      EpochAction::kCatchUp) {
    return CatchUp(report, /*quiet=*/true);
  }
  int64_t params_epoch;
  {
    std::lock_guard lock(state_mu_);
    params_epoch = params_epoch_;
  }
  const int64_t pending = stepping_->HasPending() ? 1 : 0;
  const bool stale = params_epoch < epoch_ - pending;
  if (!stale && !(diverged_ && g.num_peers > 1)) return Status::Ok();
  COLONY_LOG_INFO(
      "train: this peer's parameters (epoch {}) differ from the swarm's; downloading its state",
      params_epoch);
  // A donor that averaged this epoch advertises epoch + 0.5 (UpdatePriority).
  Status st = DownloadState(static_cast<double>(epoch_ - pending) + 0.5);
  if (st.ok()) {
    report.loaded_state = true;
  } else {
    COLONY_LOG_WARN("train: could not download the swarm's state ({}); continuing at epoch {}",
                    st.ToString(), epoch_);
  }
  return Status::Ok();
}

// Downloads and installs the state of a donor whose priority (parameter epoch, + 0.5 when it
// averaged with the swarm) is at least `min_priority`. The donor's header is checked before
// any tensor data comes: the tensors it announces must be those its metadata describes, its
// parameters must have this model's shapes, the whole state at most kStateValuesPerParameter
// values per parameter (Adam's two moments and DiLoCo's outer parameters and momentum make 5),
// and its epoch at most kMaxDonorEpochLead ahead of the swarm's as this peer's progress tracker
// sees it when the header arrives (the swarm may step while a request is on its way; a donor
// claiming an epoch far ahead would drag this peer, and then the swarm, to it).
Status CollaborativeOptimizer::Impl::DownloadState(std::optional<double> min_priority) {
  constexpr uint64_t kStateValuesPerParameter = 6;
  constexpr int64_t kMaxDonorEpochLead = 16;
  if (stepping_->HasPending()) stepping_->FinishPending(nullptr);
  uint64_t own_values = 0;
  for (const auto& p : params_) own_values += static_cast<uint64_t>(p.numel());
  auto check = [&](const std::string& metadata, std::span<const uint64_t> sizes) -> Status {
    COLONY_ASSIGN_OR_RETURN(DonorState d, ParseDonorState(metadata, options_.run_id));
    const int64_t swarm_epoch = std::max<int64_t>(
        tracker_->Global().epoch, min_priority ? static_cast<int64_t>(*min_priority) : 0);
    if (d.tensors.size() != sizes.size()) {
      return ProtocolError("the donor's state metadata does not match its tensors");
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (static_cast<uint64_t>(d.tensors[i].numel) != sizes[i]) {
        return ProtocolError(
            fmt::format("the donor's state tensor '{}' announces {} values, not {}",
                        d.tensors[i].name, sizes[i], d.tensors[i].numel));
      }
      const std::string& name = d.tensors[i].name;
      if (name.rfind("param.", 0) == 0) {
        size_t p = params_.size();
        try {
          p = std::stoul(name.substr(6));
        } catch (...) {
        }
        if (p >= params_.size() || !params_[p].sizes().equals(d.tensors[i].shape)) {
          return ProtocolError(fmt::format(
              "the donor's state tensor '{}' is not a parameter of this model (shape [{}])", name,
              fmt::join(d.tensors[i].shape, ",")));
        }
      }
    }
    uint64_t values = 0;
    for (uint64_t n : sizes) values += n;
    if (values > kStateValuesPerParameter * own_values + (1u << 20)) {
      return ProtocolError(fmt::format(
          "the donor's state holds {} values; this model has {} parameters", values, own_values));
    }
    if (d.epoch > swarm_epoch + kMaxDonorEpochLead) {
      return ProtocolError(fmt::format("the donor claims epoch {}, but the swarm is at epoch {}",
                                       d.epoch, swarm_epoch));
    }
    return Status::Ok();
  };
  averaging::LoadStateOptions load{
      .timeout = options_.load_state_timeout, .min_priority = min_priority, .check_header = check};
  if (stepping_->StatesAgreeAcrossPeers()) {
    // Cross-check with donors that should hold the very same state: the same epoch and inner
    // step, none having stepped alone.
    load.same_version = [run = options_.run_id](const std::string& a, const std::string& b) {
      auto x = ParseDonorState(a, run);
      auto y = ParseDonorState(b, run);
      return x.ok() && y.ok() && x->epoch == y->epoch && x->inner_step == y->inner_step &&
             !x->diverged && !y->diverged;
    };
  }
  auto s = stepping_->Sharing().LoadStateFromPeersSync(load);
  if (!s.ok()) return s.status();
  // The header passed `check`; the tensors arrived with the announced sizes.
  COLONY_ASSIGN_OR_RETURN(DonorState d, ParseDonorState(s->metadata, options_.run_id));
  if (d.tensors.size() != s->tensors.size()) {
    return ProtocolError("the donor's state metadata does not match its tensors");
  }
  NamedTensors named;
  for (size_t i = 0; i < d.tensors.size(); ++i) {
    const DonorTensor& e = d.tensors[i];
    if (static_cast<size_t>(e.numel) != s->tensors[i].size()) {
      return ProtocolError(fmt::format("the donor's state tensor '{}' has {} values, not {}",
                                       e.name, s->tensors[i].size(), e.numel));
    }
    COLONY_ASSIGN_OR_RETURN(const at::ScalarType dtype, ParseScalarType(e.dtype));
    at::Tensor t = at::from_blob(s->tensors[i].data(), e.shape, at::kFloat).to(dtype).clone();
    named.emplace_back(e.name, std::move(t));
  }
  {
    std::lock_guard lock(state_mu_);
    if (d.epoch < params_epoch_) {
      return FailedPrecondition(fmt::format(
          "the best donor's state is at epoch {}, older than this peer's ({}); keeping ours",
          d.epoch, params_epoch_));
    }
  }
  COLONY_RETURN_IF_ERROR(ApplyState(named, d.epoch, d.inner_step, d.diverged));
  counters_.state_loads++;
  Publish(Active());
  UpdatePriority();
  COLONY_LOG_INFO("train: loaded the swarm's state at epoch {}", epoch_);
  return Status::Ok();
}

// Everything a peer needs to continue where the swarm is, as named tensors (copies in host
// memory, also of a GPU peer's state).
NamedTensors CollaborativeOptimizer::Impl::CollectState() {
  NamedTensors named;
  const auto host = [](const at::Tensor& t) {
    return t.detach()
        .to(at::kCPU, t.scalar_type(), /*non_blocking=*/false, /*copy=*/true)
        .contiguous();
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    named.emplace_back(fmt::format("param.{}", i), host(params_[i]));
  }
  for (auto& [name, t] : ExportOptimizerState(*optimizer_))
    named.emplace_back("opt." + name, host(t));
  stepping_->CollectExtraState(named);
  return named;
}

Json CollaborativeOptimizer::Impl::StateMetadata(const NamedTensors& named) const {
  Json tensors = Json::array();
  for (const auto& [name, t] : named) {
    tensors.push_back(
        {{"name", name}, {"dtype", at::toString(t.scalar_type())}, {"shape", t.sizes().vec()}});
  }
  return Json{{"epoch", params_epoch_},
              {"inner_step", stepping_->InnerStep()},
              {"diverged", diverged_},
              {"run_id", options_.run_id},
              {"tensors", tensors}};
}

Result<averaging::SharedState> CollaborativeOptimizer::Impl::ProvideState() {
  averaging::SharedState s;
  std::lock_guard lock(state_mu_);
  NamedTensors named = CollectState();
  s.metadata = StateMetadata(named).dump();
  for (auto& [name, t] : named) {
    at::Tensor f = t.to(at::kFloat).contiguous();
    s.tensors.emplace_back(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
  }
  return s;
}

Status CollaborativeOptimizer::Impl::ApplyState(const NamedTensors& named, int64_t epoch,
                                                int64_t inner_step, bool diverged) {
  if (epoch < 0 || inner_step < 0) return InvalidArgument("the state's epoch is negative");
  std::vector<at::Tensor> params(params_.size());
  NamedTensors opt, extra;
  for (const auto& [name, t] : named) {
    if (name.rfind("param.", 0) == 0) {
      size_t i = 0;
      try {
        i = std::stoul(name.substr(6));
      } catch (...) {
        return InvalidArgument(fmt::format("state tensor '{}' has a bad index", name));
      }
      if (i >= params_.size() || params[i].defined()) {
        return InvalidArgument(fmt::format("state tensor '{}' is unexpected", name));
      }
      if (!t.sizes().equals(params_[i].sizes())) {
        return InvalidArgument(fmt::format("state tensor '{}' has shape [{}] instead of [{}]", name,
                                           fmt::join(t.sizes().vec(), ","),
                                           fmt::join(params_[i].sizes().vec(), ",")));
      }
      params[i] = t.to(at::kFloat);
    } else if (name.rfind("opt.", 0) == 0) {
      opt.emplace_back(name.substr(4), t);
    } else {
      extra.emplace_back(name, t);
    }
  }
  COLONY_RETURN_IF_ERROR(stepping_->CheckExtraState(extra));
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined()) return InvalidArgument(fmt::format("the state lacks param.{}", i));
    if (!model::AllFinite(params[i])) {
      return InvalidArgument(fmt::format("the state's param.{} is not finite", i));
    }
  }
  std::lock_guard lock(state_mu_);
  COLONY_RETURN_IF_ERROR(ImportOptimizerState(*optimizer_, opt));
  for (size_t i = 0; i < params.size(); ++i) {
    at::NoGradGuard no_grad;
    params_[i].copy_(params[i]);
  }
  stepping_->InstallState(extra, epoch, inner_step);
  epoch_ = epoch;
  params_epoch_ = epoch;
  diverged_ = diverged;
  local_samples_ = 0;
  return Status::Ok();
}

}  // namespace colony::train
