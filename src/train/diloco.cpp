// DiLoCo (Douillard et al.): every peer takes H steps of its inner optimizer on its own data,
// then the peers average their pseudo-gradients (the parameters at the last sync minus the
// current ones), compressed to 8 or 4 bits, and apply an outer SGD step with Nesterov momentum
// to the synced parameters. With diloco_fragments = F the parameters are cut into F fragments of
// whole tensors synced in turn, every H/F inner steps (streaming DiLoCo), which spreads the
// traffic over time. An epoch is H inner steps.
#include <fmt/format.h>

#include <cstring>

#include "core/log.h"
#include "train/internal.h"

namespace colony::train {
namespace {

class Diloco final : public Stepping {
 public:
  explicit Diloco(CollaborativeOptimizer::Impl& peer) : peer_(peer) {}

  Status Init() {
    const size_t total = peer_.total_;
    delta_.assign(total, 0.0f);
    outer_.resize(total);
    momentum_.assign(total, 0.0f);
    peer_.CopyParamsTo(outer_.data());
    // Fragments: contiguous runs of whole parameters with about total/F values each.
    const int f_count = peer_.options_.diloco_fragments;
    const auto& offsets = peer_.offsets_;
    size_t begin = 0;
    for (int f = 0; f < f_count; ++f) {
      const size_t goal = total * static_cast<size_t>(f + 1) / static_cast<size_t>(f_count);
      size_t end = begin;
      for (size_t i = 0; i + 1 < offsets.size(); ++i) {
        if (offsets[i] >= begin && offsets[i + 1] <= goal) end = offsets[i + 1];
      }
      if (f == f_count - 1) end = total;
      if (end <= begin) {
        return InvalidArgument(fmt::format(
            "cannot cut the parameters into {} DiLoCo fragments: some parameter holds more "
            "than 1/{} of the values; use fewer fragments",
            f_count, f_count));
      }
      fragments_.push_back({begin, end});
      begin = end;
    }
    auto a = peer_.AveragerDefaults();
    a.codec = peer_.options_.diloco_codec;
    for (size_t f = 0; f < fragments_.size(); ++f) {
      a.prefix = fmt::format("{}.diloco{}", peer_.options_.run_id, f);
      std::span<float> span(delta_.data() + fragments_[f].first,
                            fragments_[f].second - fragments_[f].first);
      COLONY_ASSIGN_OR_RETURN(auto avg, averaging::Averager::Create(peer_.node_, {span}, a));
      averagers_.push_back(std::move(avg));
    }
    return Status::Ok();
  }

  Status Contribute(int64_t batch_size, StepReport& report) override {
    {
      std::lock_guard lock(peer_.state_mu_);
      peer_.StepOptimizer(peer_.epoch_);
    }
    peer_.ZeroGrads();
    {
      std::lock_guard lock(peer_.state_mu_);  // ProvideState reads the inner step
      ++inner_step_;
    }
    peer_.local_samples_ += batch_size;
    peer_.counters_.local_samples += batch_size;
    const int64_t h = peer_.options_.diloco_inner_steps;
    const int64_t f_count = static_cast<int64_t>(fragments_.size());
    peer_.Publish(Phase::kTrain);
    for (int64_t f = 0; f < f_count; ++f) {
      // Fragment f syncs at inner steps h * (k + 1) - f * h / F: staggered evenly.
      const int64_t offset = f * h / f_count;
      if ((inner_step_ + offset) % h != 0) continue;
      SyncFragment(static_cast<size_t>(f), report);
    }
    if (inner_step_ % h != 0) return Status::Ok();
    peer_.epoch_ = inner_step_ / h;
    {
      std::lock_guard lock(peer_.state_mu_);
      peer_.params_epoch_ = peer_.epoch_;
    }
    peer_.counters_.global_steps++;
    report.stepped = true;
    peer_.Publish(Phase::kTrain);
    peer_.UpdatePriority();
    return peer_.Resync(report);
  }

  // Syncs happen at fixed inner steps, in Contribute().
  Status Advance(StepReport&) override { return Status::Ok(); }

  void CollectExtraState(NamedTensors& out) override {
    const auto n = static_cast<int64_t>(outer_.size());
    out.emplace_back("outer.params", at::from_blob(outer_.data(), {n}, at::kFloat).clone());
    out.emplace_back("outer.momentum", at::from_blob(momentum_.data(), {n}, at::kFloat).clone());
  }

  int64_t InnerStep() const override { return inner_step_; }

  Status CheckExtraState(const NamedTensors& extra) const override {
    for (const auto& [name, t] : extra) {
      if (name != "outer.params" && name != "outer.momentum") {
        return InvalidArgument(fmt::format("state tensor '{}' is unexpected", name));
      }
      if (t.numel() != static_cast<int64_t>(outer_.size())) {
        return InvalidArgument(fmt::format("state tensor '{}' has the wrong size", name));
      }
    }
    return Status::Ok();
  }

  // Called with the state lock held, after the parameters were installed.
  void InstallState(const NamedTensors& extra, int64_t epoch, int64_t inner_step) override {
    bool have_outer = false;
    for (const auto& [name, t] : extra) {
      const at::Tensor f = t.to(at::kFloat).contiguous();
      auto& dst = name == "outer.params" ? outer_ : momentum_;
      std::memcpy(dst.data(), f.data_ptr<float>(), dst.size() * sizeof(float));
      have_outer |= name == "outer.params";
    }
    if (!have_outer) peer_.CopyParamsTo(outer_.data());
    inner_step_ = std::max(inner_step, epoch * peer_.options_.diloco_inner_steps);
  }

  averaging::Averager& Sharing() override { return *averagers_.front(); }

  void Shutdown() override {
    for (auto& a : averagers_) a->Shutdown();
  }

 private:
  void SyncFragment(size_t f, StepReport& report) {
    const auto [begin, end] = fragments_[f];
    const int64_t round = inner_step_ / peer_.options_.diloco_inner_steps;
    {
      std::lock_guard lock(peer_.state_mu_);
      peer_.CopyParamsTo(delta_.data(), begin, end);
    }
    // Pseudo-gradient: where the parameters started minus where the inner steps took them.
    for (size_t i = begin; i < end; ++i) delta_[i] = outer_[i] - delta_[i];
    const size_t expected = peer_.PeersAtEpoch(peer_.epoch_);
    bool averaged = false;
    if (expected > 1) {
      averaging::StepOptions so;
      so.weight = static_cast<double>(std::max<int64_t>(peer_.local_samples_, 1));
      so.timeout = peer_.options_.averaging_timeout;
      so.allow_retries = false;  // the group of an epoch forms once; a retry would wait alone
      so.expected_group_size = expected;
      so.group_bits = EpochBits(round, static_cast<int>(f));
      std::vector<float> local(delta_.begin() + static_cast<std::ptrdiff_t>(begin),
                               delta_.begin() + static_cast<std::ptrdiff_t>(end));
      auto r = averagers_[f]->StepSync(so);
      if (r.ok()) {
        averaged = true;
        report.group_size = r->members.size();
        report.group = ShortGroupId(*r);
        report.averaging_seconds += r->matchmaking_seconds + r->allreduce_seconds;
      } else {
        peer_.counters_.failed_rounds++;
        report.note = r.status().ToString();
        COLONY_LOG_WARN("train: DiLoCo sync of fragment {} failed, using the local update: {}", f,
                        report.note);
        std::copy(local.begin(), local.end(), delta_.begin() + static_cast<std::ptrdiff_t>(begin));
      }
    }
    report.averaged = averaged;
    if (!AllFinite(std::span<const float>(delta_.data() + begin, end - begin))) {
      peer_.counters_.skipped_batches++;
      report.skipped_nonfinite = true;
      COLONY_LOG_WARN("train: the averaged pseudo-gradient is not finite; outer step skipped");
      for (size_t i = begin; i < end; ++i) delta_[i] = 0;
    }
    // Outer Nesterov SGD on the pseudo-gradient (under the state lock: ProvideState reads the
    // outer parameters and momentum).
    const float mu = static_cast<float>(peer_.options_.outer_momentum);
    const float lr = static_cast<float>(peer_.options_.outer_lr);
    std::lock_guard lock(peer_.state_mu_);
    for (size_t i = begin; i < end; ++i) {
      momentum_[i] = mu * momentum_[i] + delta_[i];
      const float step =
          peer_.options_.outer_nesterov ? delta_[i] + mu * momentum_[i] : momentum_[i];
      outer_[i] -= lr * step;
    }
    peer_.CopyToParams(outer_.data(), begin, end);
    if (f == 0) peer_.local_samples_ = 0;
  }

  CollaborativeOptimizer::Impl& peer_;
  std::vector<float> delta_;             // what the fragment averagers average
  std::vector<float> outer_, momentum_;  // parameters at the last sync, outer momentum
  std::vector<std::pair<size_t, size_t>> fragments_;
  std::vector<std::unique_ptr<averaging::Averager>> averagers_;
  int64_t inner_step_ = 0;
};

}  // namespace

std::unique_ptr<Stepping> MakeDiloco(CollaborativeOptimizer::Impl& peer, Status& status) {
  auto s = std::make_unique<Diloco>(peer);
  status = s->Init();
  return s;
}

}  // namespace colony::train
