// The collaborative optimizer (see collaborative.h). The only translation unit of the train
// layer that includes LibTorch's optimizer headers.
#include "train/collaborative.h"

#include <ATen/ATen.h>
#include <fmt/ranges.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <atomic>
#include <bitset>
#include <cmath>
#include <cstring>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>

#include "core/log.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "train/optimizers.h"

namespace colony::train {
namespace {

using Json = nlohmann::json;
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
using Clock = std::chrono::steady_clock;

constexpr auto kPollTimeout = std::chrono::seconds(2);
// Attempts at an epoch's round before a peer whose group never formed steps alone.
constexpr int kRoundAttempts = 2;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Only peers at the same epoch meet: the epoch picks the group key bits.
std::string EpochBits(int64_t epoch, int fragment = 0) {
  const uint32_t v =
      static_cast<uint32_t>(epoch & 0xffff) | (static_cast<uint32_t>(fragment) << 16);
  return std::bitset<20>(v).to_string();
}

bool AllFinite(const float* p, size_t n) {
  // x * 0 is 0 for every finite x and NaN for inf and NaN: one branch-free pass.
  float s = 0;
  for (size_t i = 0; i < n; ++i) s += p[i] * 0.0f;
  return s == 0.0f;
}

Result<at::ScalarType> ParseScalarType(const std::string& name) {
  for (auto t : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong, at::kInt, at::kShort,
                 at::kChar, at::kByte, at::kBool}) {
    if (name == at::toString(t)) return t;
  }
  return InvalidArgument(fmt::format("unknown tensor dtype '{}'", name));
}

}  // namespace

class CollaborativeOptimizer::Impl {
 public:
  Impl(dht::Node& node, std::vector<at::Tensor> params,
       std::shared_ptr<torch::optim::Optimizer> optimizer, CollaborativeOptions options)
      : node_(node),
        params_(std::move(params)),
        optimizer_(std::move(optimizer)),
        options_(std::move(options)) {
    for (const auto& p : params_) {
      offsets_.push_back(total_);
      total_ += static_cast<size_t>(p.numel());
    }
    offsets_.push_back(total_);
  }

  Status Init() {
    const bool diloco = options_.diloco_inner_steps > 0;
    if (!diloco) acc_.assign(total_, 0.0f);
    buf_.assign(total_, 0.0f);
    if (diloco) {
      outer_.resize(total_);
      momentum_.assign(total_, 0.0f);
      CopyParamsTo(outer_.data());
    }
    // Fragments: contiguous runs of whole parameters with about total/F values each.
    const int f_count = diloco ? options_.diloco_fragments : 1;
    fragments_.clear();
    size_t begin = 0;
    for (int f = 0; f < f_count; ++f) {
      const size_t goal = total_ * static_cast<size_t>(f + 1) / static_cast<size_t>(f_count);
      size_t end = begin;
      for (size_t i = 0; i + 1 < offsets_.size(); ++i) {
        if (offsets_[i] >= begin && offsets_[i + 1] <= goal) end = offsets_[i + 1];
      }
      if (f == f_count - 1) end = total_;
      if (end <= begin) {
        return InvalidArgument(fmt::format(
            "cannot cut the parameters into {} DiLoCo fragments: some parameter holds more "
            "than 1/{} of the values; use fewer fragments",
            f_count, f_count));
      }
      fragments_.push_back({begin, end});
      begin = end;
    }

    averaging::AveragerOptions a;
    a.mode = options_.mode;
    a.target_group_size = options_.target_group_size;
    a.min_group_size = options_.min_group_size;
    a.matchmaking_time = options_.matchmaking_time;
    a.moshpit = false;
    a.bandwidth = options_.bandwidth;
    a.max_send_rate = options_.max_send_rate;
    a.fault = options_.fault;
    for (size_t f = 0; f < fragments_.size(); ++f) {
      a.prefix =
          diloco ? fmt::format("{}.diloco{}", options_.run_id, f) : options_.run_id + ".grads";
      a.codec = diloco ? options_.diloco_codec : options_.grad_codec;
      std::span<float> span(buf_.data() + fragments_[f].first,
                            fragments_[f].second - fragments_[f].first);
      COLONY_ASSIGN_OR_RETURN(auto avg, averaging::Averager::Create(node_, {span}, a));
      grad_avg_.push_back(std::move(avg));
    }
    if (options_.average_state_every > 0 || options_.local_updates) {
      a.prefix = options_.run_id + ".params";
      a.codec = options_.state_codec;
      a.fault = averaging::Fault::kNone;
      // A copy of the parameters is averaged, so that the state lock is not held during a round
      // (the state provider runs on the compute pool that the round needs).
      pbuf_.assign(total_, 0.0f);
      COLONY_ASSIGN_OR_RETURN(state_avg_, averaging::Averager::Create(node_, {pbuf_}, a));
    }
    ProgressOptions po;
    po.run_id = options_.run_id;
    po.target_batch_size = options_.target_batch_size;
    po.min_refresh = options_.progress_min_refresh;
    if (diloco) {
      // Syncs are H steps apart and a lone peer refreshes before deciding: no need to poll the
      // DHT ten times a second (that traffic would rival the compressed syncs).
      po.min_refresh = std::max<std::chrono::milliseconds>(po.min_refresh, std::chrono::seconds(1));
    }
    po.max_refresh = std::max(options_.progress_max_refresh, po.min_refresh);
    po.rejoin_after = options_.rejoin_after;
    po.follow_target = !diloco;
    po.client = options_.mode == averaging::Mode::kClient;
    po.aux = options_.mode == averaging::Mode::kAux;
    COLONY_ASSIGN_OR_RETURN(tracker_, ProgressTracker::Create(node_, po));
    // Every peer that trains can give the state to newcomers; the epoch is its priority.
    if (options_.mode != averaging::Mode::kAux) {
      grad_avg_[0]->ShareState([this] { return ProvideState(); }, 0);
    }
    return Status::Ok();
  }

  ~Impl() {
    if (pending_.valid()) pending_.wait();
    for (auto& a : grad_avg_) a->Shutdown();
    if (state_avg_) state_avg_->Shutdown();
    tracker_.reset();
  }

  // ---- the training step -------------------------------------------------------------------

  Result<StepReport> Step(int64_t batch_size) {
    if (batch_size <= 0) return InvalidArgument("Step() needs the batch's (positive) sample count");
    if (options_.mode == averaging::Mode::kAux) {
      return FailedPrecondition("an auxiliary peer trains nothing: call RunAuxiliary()");
    }
    UpdateThroughput(batch_size);
    last_batch_ = batch_size;
    StepReport report;
    const bool finite = options_.unchecked_local_gradients || GradsFinite();
    counters_.local_batches++;
    if (!finite) {
      counters_.skipped_batches++;
      report.skipped_nonfinite = true;
      COLONY_LOG_WARN("train: skipped a batch with non-finite gradients (epoch {}, {} so far)",
                      epoch_, counters_.skipped_batches);
      ZeroGrads();
    } else if (options_.diloco_inner_steps > 0) {
      COLONY_RETURN_IF_ERROR(DilocoStep(batch_size, report));
    } else if (options_.local_updates) {
      {
        std::lock_guard lock(state_mu_);
        optimizer_->step();
      }
      ZeroGrads();
      local_samples_ += batch_size;
      counters_.local_samples += batch_size;
    } else {
      Accumulate(batch_size);
      local_samples_ += batch_size;
      counters_.local_samples += batch_size;
    }
    if (options_.diloco_inner_steps == 0) {
      if (pending_.valid() &&
          pending_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
        ApplyPending(report);
      }
      quota_left_ = std::max<int64_t>(0, quota_left_ - batch_size);
      COLONY_RETURN_IF_ERROR(Advance(report));
    }
    report.epoch = epoch_;
    last_step_end_ = Clock::now();  // the next batch's compute time starts now
    return report;
  }

  // With delayed averaging the swarm reports the next epoch while its round for this one runs.
  int64_t Lag() const {
    return options_.delay_grad_averaging && options_.diloco_inner_steps == 0 ? 1 : 0;
  }

  bool Interrupted() const {
    return options_.interrupt != nullptr && options_.interrupt->load(std::memory_order_relaxed);
  }

  // The phase of a peer between batches: kIdle until it first calls Step(), then kTrain.
  Phase Active() const { return phase_ == Phase::kIdle ? Phase::kIdle : Phase::kTrain; }

  void Publish(Phase phase) {
    phase_ = phase;
    tracker_->Report({.epoch = epoch_,
                      .samples = local_samples_,
                      .samples_per_second = sps_,
                      .batch = last_batch_,
                      .phase = phase});
  }

  // A fresh view of the swarm. Waiting peers poll the DHT, and a swarm of them must not flood
  // it: polls are the tracker's PollSpacing() apart at first, then a tenth of the time waited so
  // far (a long wait is a wait for something slow), at most min_refresh.
  GlobalProgress Poll(Clock::duration waited = {}) {
    const Clock::duration least = tracker_->PollSpacing();
    const auto gap = std::clamp<Clock::duration>(
        waited / 10, least, std::max<Clock::duration>(least, options_.progress_min_refresh));
    const auto since = Clock::now() - last_poll_;
    if (since < gap) std::this_thread::sleep_for(gap - since);
    last_poll_ = Clock::now();
    return tracker_->Refresh(kPollTimeout);
  }

  // After a batch (synchronous and local-updates modes): what the swarm's progress means for
  // this peer (progress.h, DecideEpoch). It computes on, or stops and polls until the reports
  // confirm that the swarm has the target batch (then it averages) or refute it (then it
  // computes on), or it catches up when the swarm averaged this epoch without it.
  Status Advance(StepReport& report) {
    bool waiting = false;
    GlobalProgress g;
    if (quota_active_) {
      // Filling its share of a shortfall: compute on without re-estimating, then wait.
      if (quota_left_ > 0) {
        Publish(Phase::kTrain);
        return Status::Ok();
      }
      quota_active_ = false;
      waiting = true;
      Publish(Phase::kWait);
      g = Poll();
    } else {
      Publish(Phase::kTrain);
      g = tracker_->Global();
    }
    const auto wait_start = Clock::now();
    for (;;) {
      const EpochDecision d = DecideEpoch(g, epoch_, Lag(), waiting);
      switch (d.action) {
        case EpochAction::kCatchUp:
          return CatchUp(report, /*quiet=*/true);
        case EpochAction::kAverage:
          return Round(report);
        case EpochAction::kTrain:
          if (waiting) {
            if (d.quota > 0) {
              quota_active_ = true;
              quota_left_ = d.quota;
            }
            Publish(Phase::kTrain);
          }
          return Status::Ok();
        case EpochAction::kWait:
          if (!waiting) {
            waiting = true;
            Publish(Phase::kWait);
          }
          if (Interrupted()) return Status::Ok();
          if (Clock::now() - wait_start > options_.averaging_timeout) {
            COLONY_LOG_WARN(
                "train: waited {:.0f} s at epoch {} for the swarm's reports to reach the target "
                "batch ({} of {} reported, {} expected); computing on",
                Seconds(Clock::now() - wait_start), epoch_, g.samples_reported, g.target_batch_size,
                g.samples_expected);
            Publish(Phase::kTrain);
            return Status::Ok();
          }
          g = Poll(Clock::now() - wait_start);
          break;
      }
    }
  }

  // One global step in synchronous or local-updates mode: the peers at this epoch average their
  // contributions and every one of them steps.
  Status Round(StepReport& report) {
    const int64_t samples = local_samples_;
    const int64_t round_epoch = epoch_;
    quota_active_ = false;
    quota_left_ = 0;
    Publish(Phase::kRound);
    const size_t expected = PeersAtEpoch(round_epoch);
    if (options_.local_updates) {
      report.realized_batch = samples;
      if (!AverageParams(samples, expected, report) && expected > 1) {
        diverged_ = true;  // stepped on its own batches only: take the swarm's parameters
        counters_.failed_rounds++;
      }
      std::lock_guard lock(state_mu_);
      params_epoch_ = round_epoch + 1;  // stepped on every batch; now averaged (or alone)
    } else {
      if (pending_.valid()) ApplyPending(report);  // one round in flight at a time
      const float inv = samples > 0 ? 1.0f / static_cast<float>(samples) : 0.0f;
      for (size_t i = 0; i < total_; ++i) buf_[i] = acc_[i] * inv;
      std::fill(acc_.begin(), acc_.end(), 0.0f);
      if (options_.delay_grad_averaging && expected > 1) {
        pending_samples_ = samples;
        pending_ = std::async(std::launch::async, [this, samples, round_epoch, expected] {
          return AverageGrads(samples, round_epoch, expected);
        });
      } else {
        Outcome outcome = expected > 1 ? AverageGrads(samples, round_epoch, expected)
                                       : Outcome{.epoch = round_epoch,
                                                 .averaged = false,
                                                 .realized = samples,
                                                 .group = 1,
                                                 .seconds = 0,
                                                 .note = {}};
        // A round that failed (nobody came in time, or the all-reduce broke for everyone): if
        // the swarm stepped without this peer, take its state; if peers are still at this
        // epoch, they failed too, so try once more together before anyone steps alone.
        for (int attempt = 1; !outcome.averaged && expected > 1 && attempt < kRoundAttempts;
             ++attempt) {
          const GlobalProgress g = tracker_->Refresh(kPollTimeout);
          if (g.epoch > round_epoch) {
            counters_.missed_rounds++;
            COLONY_LOG_INFO(
                "train: the swarm averaged epoch {} without this peer ({}); "
                "catching up",
                round_epoch, outcome.note);
            return CatchUp(report, /*quiet=*/true);
          }
          const size_t again = CountPeersAtEpoch(round_epoch, g);
          if (again <= 1) break;
          outcome = AverageGrads(samples, round_epoch, again);
        }
        ApplyOutcome(outcome, report);
      }
    }
    ++epoch_;
    local_samples_ = 0;
    counters_.global_steps++;
    report.stepped = true;
    if (options_.average_state_every > 0 && !options_.local_updates &&
        epoch_ % options_.average_state_every == 0) {
      StepReport ignored;
      AverageParams(1, PeersAtEpoch(round_epoch), ignored);
    }
    Publish(Phase::kTrain);
    UpdatePriority();
    return Resync(report);
  }

  // Donors are ranked by how recent their parameters are.
  void UpdatePriority() {
    int64_t e;
    {
      std::lock_guard lock(state_mu_);
      e = params_epoch_;
    }
    // Among donors at the same epoch, those that averaged with the swarm come first.
    grad_avg_[0]->SetStatePriority(static_cast<double>(e) + (diverged_ ? 0.0 : 0.5));
  }

  struct Outcome {
    int64_t epoch = 0;  // of the round
    bool averaged = false;
    int64_t realized = 0;
    size_t group = 1;
    double seconds = 0;
    std::string note;
  };

  // Averages buf_ (this peer's mean gradient) with the peers at `epoch`.
  Outcome AverageGrads(int64_t samples, int64_t epoch, size_t expected) {
    Outcome out;
    out.epoch = epoch;
    out.realized = samples;
    averaging::StepOptions so;
    so.weight = static_cast<double>(samples);
    so.gather = Json{{"samples", samples}, {"sps", sps_}}.dump();
    so.timeout = options_.averaging_timeout;
    so.allow_retries = false;  // the group of an epoch forms once; a retry would wait alone
    so.expected_group_size = expected;
    so.group_bits = EpochBits(epoch);
    std::vector<float> local(buf_);  // restored if the round fails before the all-reduce
    auto r = grad_avg_[0]->StepSync(so);
    if (!r.ok()) {
      out.note = r.status().ToString();
      std::copy(local.begin(), local.end(), buf_.begin());
      return out;
    }
    out.averaged = true;
    out.seconds = r->matchmaking_seconds + r->allreduce_seconds;
    const Membership m = CountMembers(*r);
    out.realized = m.realized;
    out.group = m.group;
    tracker_->NoteRoundEnd(epoch + 1, m.rates);
    return out;
  }

  struct Membership {
    int64_t realized = 0;  // samples of the members whose data is in every part of the result
    size_t group = 0;      // those members (auxiliary peers excluded)
    std::vector<std::pair<PeerId, double>> rates;  // every member's samples/s
  };
  // Reads a round's members from its result (their gathered metadata is untrusted).
  static Membership CountMembers(const averaging::StepResult& r) {
    std::vector<int> in_all(r.members.size(), 1);
    for (const auto& part : r.parts) {
      std::vector<int> here(r.members.size(), 0);
      for (uint32_t c : part.contributors) {
        if (c < here.size()) here[c] = 1;
      }
      for (size_t i = 0; i < in_all.size(); ++i) in_all[i] &= here[i];
    }
    Membership m;
    for (size_t i = 0; i < r.members.size(); ++i) {
      auto j = Json::parse(r.members[i].gathered, nullptr, false);
      if (j.is_object() && j.contains("sps") && j["sps"].is_number()) {
        const double sps = j["sps"].get<double>();
        if (std::isfinite(sps) && sps >= 0 && sps < 1e12)
          m.rates.emplace_back(r.members[i].peer, sps);
      }
      if (!in_all[i] || r.members[i].mode == averaging::Mode::kAux) continue;
      if (j.is_object() && j.contains("samples") && j["samples"].is_number_integer()) {
        m.realized += std::clamp<int64_t>(j["samples"].get<int64_t>(), 0, int64_t{1} << 40);
      }
      ++m.group;
    }
    return m;
  }

  void ApplyPending(StepReport& report) {
    Outcome outcome = pending_.get();
    ApplyOutcome(outcome, report);
    UpdatePriority();
  }

  // Writes buf_ into the gradients and steps the optimizer (unless buf_ is not finite).
  void ApplyOutcome(const Outcome& o, StepReport& report) {
    report.averaged = o.averaged;
    report.realized_batch = o.realized;
    report.group_size = o.group;
    report.averaging_seconds = o.seconds;
    report.note = o.note;
    if (!o.averaged && o.realized == 0) {  // nothing to apply: no samples, no group
      std::lock_guard lock(state_mu_);
      params_epoch_ = o.epoch + 1;
      return;
    }
    if (!o.averaged && !o.note.empty()) {
      // Others stepped without this peer: after stepping alone it differs from the swarm and
      // takes the swarm's state at the next opportunity.
      diverged_ = true;
      counters_.failed_rounds++;
      COLONY_LOG_WARN("train: averaging at epoch {} failed, stepping with local gradients: {}",
                      epoch_, o.note);
    }
    if (!AllFinite(buf_.data(), buf_.size())) {
      counters_.skipped_batches++;
      report.skipped_nonfinite = true;
      COLONY_LOG_WARN("train: the averaged gradients are not finite; step skipped");
      return;
    }
    if (options_.max_grad_norm > 0) {
      double sq = 0;
      for (float v : buf_) sq += static_cast<double>(v) * v;
      const double norm = std::sqrt(sq);
      if (norm > options_.max_grad_norm) {
        const float scale = static_cast<float>(options_.max_grad_norm / norm);
        for (float& v : buf_) v *= scale;
      }
    }
    std::lock_guard lock(state_mu_);
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      at::Tensor g = at::from_blob(buf_.data() + offsets_[i], p.sizes(), at::kFloat);
      if (p.grad().defined()) {
        p.mutable_grad().copy_(g);
      } else {
        p.mutable_grad() = g.clone();
      }
    }
    optimizer_->step();
    params_epoch_ = o.epoch + 1;
    for (auto& p : params_) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
  }

  // Averages the parameters with the peers at this epoch, weighted by `weight`; true when a
  // group averaged them.
  bool AverageParams(int64_t weight, size_t expected, StepReport& report) {
    if (!state_avg_ || expected <= 1) return false;
    averaging::StepOptions so;
    so.weight = static_cast<double>(weight);
    so.gather = Json{{"samples", weight}, {"sps", sps_}}.dump();
    so.timeout = options_.averaging_timeout;
    so.allow_retries = false;  // the group of an epoch forms once; a retry would wait alone
    so.expected_group_size = expected;
    so.group_bits = EpochBits(epoch_);
    {
      std::lock_guard lock(state_mu_);
      CopyParamsTo(pbuf_.data());
    }
    auto r = state_avg_->StepSync(so);
    if (!r.ok()) {
      report.note = r.status().ToString();
      COLONY_LOG_WARN("train: parameter averaging at epoch {} failed: {}", epoch_, report.note);
      return false;
    }
    const Membership m = CountMembers(*r);
    if (options_.local_updates) tracker_->NoteRoundEnd(epoch_ + 1, m.rates);
    report.averaged = true;
    report.group_size = m.group;
    report.realized_batch = m.realized;
    report.averaging_seconds = r->matchmaking_seconds + r->allreduce_seconds;
    // Guard against a round that went wrong in a way the averager could not see.
    if (!AllFinite(pbuf_.data(), pbuf_.size())) {
      COLONY_LOG_WARN("train: averaged parameters are not finite; keeping the local ones");
      return false;
    }
    std::lock_guard lock(state_mu_);
    CopyToParams(pbuf_.data());
    return true;
  }

  // ---- DiLoCo ------------------------------------------------------------------------------

  Status DilocoStep(int64_t batch_size, StepReport& report) {
    {
      std::lock_guard lock(state_mu_);
      optimizer_->step();
    }
    ZeroGrads();
    ++inner_step_;
    local_samples_ += batch_size;
    counters_.local_samples += batch_size;
    const int64_t h = options_.diloco_inner_steps;
    const int64_t f_count = static_cast<int64_t>(fragments_.size());
    Publish(Phase::kTrain);
    for (int64_t f = 0; f < f_count; ++f) {
      // Fragment f syncs at inner steps h * (k + 1) - f * h / F: staggered evenly.
      const int64_t offset = f * h / f_count;
      if ((inner_step_ + offset) % h != 0) continue;
      SyncFragment(static_cast<size_t>(f), report);
    }
    if (inner_step_ % h == 0) {
      epoch_ = inner_step_ / h;
      {
        std::lock_guard lock(state_mu_);
        params_epoch_ = epoch_;
      }
      counters_.global_steps++;
      report.stepped = true;
      Publish(Phase::kTrain);
      UpdatePriority();
      return Resync(report);
    }
    return Status::Ok();
  }

  void SyncFragment(size_t f, StepReport& report) {
    const auto [begin, end] = fragments_[f];
    const int64_t round = inner_step_ / options_.diloco_inner_steps;
    {
      std::lock_guard lock(state_mu_);
      CopyParamsTo(buf_.data(), begin, end);
    }
    // Pseudo-gradient: where the parameters started minus where the inner steps took them.
    for (size_t i = begin; i < end; ++i) buf_[i] = outer_[i] - buf_[i];
    const size_t expected = PeersAtEpoch(epoch_);
    bool averaged = false;
    if (expected > 1) {
      averaging::StepOptions so;
      so.weight = static_cast<double>(std::max<int64_t>(local_samples_, 1));
      so.timeout = options_.averaging_timeout;
      so.allow_retries = false;  // the group of an epoch forms once; a retry would wait alone
      so.expected_group_size = expected;
      so.group_bits = EpochBits(round, static_cast<int>(f));
      std::vector<float> local(buf_.begin() + static_cast<std::ptrdiff_t>(begin),
                               buf_.begin() + static_cast<std::ptrdiff_t>(end));
      auto r = grad_avg_[f]->StepSync(so);
      if (r.ok()) {
        averaged = true;
        report.group_size = r->members.size();
        report.averaging_seconds += r->matchmaking_seconds + r->allreduce_seconds;
      } else {
        counters_.failed_rounds++;
        report.note = r.status().ToString();
        COLONY_LOG_WARN("train: DiLoCo sync of fragment {} failed, using the local update: {}", f,
                        report.note);
        std::copy(local.begin(), local.end(), buf_.begin() + static_cast<std::ptrdiff_t>(begin));
      }
    }
    report.averaged = averaged;
    if (!AllFinite(buf_.data() + begin, end - begin)) {
      counters_.skipped_batches++;
      report.skipped_nonfinite = true;
      COLONY_LOG_WARN("train: the averaged pseudo-gradient is not finite; outer step skipped");
      for (size_t i = begin; i < end; ++i) buf_[i] = 0;
    }
    // Outer Nesterov SGD on the pseudo-gradient.
    const float mu = static_cast<float>(options_.outer_momentum);
    const float lr = static_cast<float>(options_.outer_lr);
    for (size_t i = begin; i < end; ++i) {
      momentum_[i] = mu * momentum_[i] + buf_[i];
      const float step = options_.outer_nesterov ? buf_[i] + mu * momentum_[i] : momentum_[i];
      outer_[i] -= lr * step;
    }
    std::lock_guard lock(state_mu_);
    CopyToParams(outer_.data(), begin, end);
    if (f == 0) local_samples_ = 0;
  }

  // ---- catching up, state sharing, checkpoints ----------------------------------------------

  // This peer missed the swarm's round for its epoch (it joined late, fell behind, or the group
  // formed without it): its samples are dropped and it takes the swarm's state. It first
  // announces itself at the swarm's epoch (phase kLoad), so that the swarm counts it in that
  // epoch's round, and asks only donors whose parameters are at that epoch or newer, so one
  // download normally suffices; it downloads again only if the swarm moved on meanwhile. Gives
  // up after load_state_timeout (an error unless `quiet`; the next Step tries again later).
  Status CatchUp(StepReport& report, bool quiet) {
    FinishPendingStep();
    DropAccumulated();
    if (Clock::now() < next_catch_up_) {
      Publish(Active());
      return quiet ? Status::Ok() : Unavailable("catching up was tried moments ago");
    }
    const auto deadline = Clock::now() + options_.load_state_timeout;
    auto backoff = std::chrono::milliseconds(50);
    Status last = Status::Ok();
    for (int downloads = 0;;) {
      const GlobalProgress g = tracker_->Refresh(kPollTimeout);
      if (DecideEpoch(g, epoch_, Lag(), false).action != EpochAction::kCatchUp) break;
      const int64_t want = g.epoch - Lag();  // the epoch of the parameters to take
      if (downloads > 0 || !last.ok()) {
        COLONY_LOG_INFO("train: the swarm is at epoch {}, this peer at {}; loading again", g.epoch,
                        epoch_);
      }
      tracker_->Report({.epoch = g.epoch,
                        .samples = 0,
                        .samples_per_second = sps_,
                        .batch = last_batch_,
                        .phase = Phase::kLoad});
      last = DownloadState(static_cast<double>(want));
      if (last.ok()) {
        ++downloads;
        report.loaded_state = true;
        continue;
      }
      if (Interrupted() || Clock::now() + backoff >= deadline) {
        next_catch_up_ = Clock::now() + std::chrono::seconds(1);
        Publish(Active());
        last = last.WithContext(
            fmt::format("this peer is at epoch {} and the swarm at {}, and no peer gave its state",
                        epoch_, g.epoch));
        if (quiet) {
          COLONY_LOG_WARN("train: {}; trying again later", last.ToString());
          return Status::Ok();
        }
        return last;
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
  Status Resync(StepReport& report) {
    const GlobalProgress g = tracker_->Global();
    if (DecideEpoch(g, epoch_, Lag(), false).action == EpochAction::kCatchUp) {
      return CatchUp(report, /*quiet=*/true);
    }
    int64_t params_epoch;
    {
      std::lock_guard lock(state_mu_);
      params_epoch = params_epoch_;
    }
    const bool stale = params_epoch < epoch_ - (pending_.valid() ? 1 : 0);
    if (!stale && !(diverged_ && g.num_peers > 1)) return Status::Ok();
    COLONY_LOG_INFO(
        "train: this peer's parameters (epoch {}) differ from the swarm's; downloading its state",
        params_epoch);
    // A donor that averaged this epoch advertises epoch + 0.5 (UpdatePriority).
    Status st = DownloadState(static_cast<double>(epoch_ - (pending_.valid() ? 1 : 0)) + 0.5);
    if (st.ok()) {
      report.loaded_state = true;
    } else {
      COLONY_LOG_WARN("train: could not download the swarm's state ({}); continuing at epoch {}",
                      st.ToString(), epoch_);
    }
    return Status::Ok();
  }

  // This epoch's samples did not make it into the swarm's step: forget them.
  void DropAccumulated() {
    if (local_samples_ > 0) counters_.dropped_samples += local_samples_;
    local_samples_ = 0;
    quota_active_ = false;
    quota_left_ = 0;
    if (!acc_.empty()) std::fill(acc_.begin(), acc_.end(), 0.0f);
  }

  // Everything a peer needs to continue where the swarm is, as named tensors (clones).
  NamedTensors CollectState() {
    NamedTensors named;
    for (size_t i = 0; i < params_.size(); ++i) {
      named.emplace_back(fmt::format("param.{}", i), params_[i].detach().clone());
    }
    for (auto& [name, t] : ExportOptimizerState(*optimizer_)) {
      named.emplace_back("opt." + name, t.detach().contiguous().clone());
    }
    if (options_.diloco_inner_steps > 0) {
      named.emplace_back(
          "outer.params",
          at::from_blob(outer_.data(), {static_cast<int64_t>(total_)}, at::kFloat).clone());
      named.emplace_back(
          "outer.momentum",
          at::from_blob(momentum_.data(), {static_cast<int64_t>(total_)}, at::kFloat).clone());
    }
    return named;
  }

  Json StateMetadata(const NamedTensors& named) const {
    Json tensors = Json::array();
    for (const auto& [name, t] : named) {
      tensors.push_back(
          {{"name", name}, {"dtype", at::toString(t.scalar_type())}, {"shape", t.sizes().vec()}});
    }
    return Json{{"epoch", params_epoch_},
                {"inner_step", inner_step_},
                {"run_id", options_.run_id},
                {"tensors", tensors}};
  }

  Result<averaging::SharedState> ProvideState() {
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

  // Installs a state (from a peer or a checkpoint); validates everything first.
  Status ApplyState(const NamedTensors& named, int64_t epoch, int64_t inner_step) {
    if (epoch < 0 || inner_step < 0) return InvalidArgument("the state's epoch is negative");
    std::vector<at::Tensor> params(params_.size());
    NamedTensors opt;
    at::Tensor outer, momentum;
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
          return InvalidArgument(fmt::format("state tensor '{}' has shape [{}] instead of [{}]",
                                             name, fmt::join(t.sizes().vec(), ","),
                                             fmt::join(params_[i].sizes().vec(), ",")));
        }
        params[i] = t.to(at::kFloat);
      } else if (name.rfind("opt.", 0) == 0) {
        opt.emplace_back(name.substr(4), t);
      } else if (name == "outer.params" || name == "outer.momentum") {
        if (t.numel() != static_cast<int64_t>(total_)) {
          return InvalidArgument(fmt::format("state tensor '{}' has the wrong size", name));
        }
        (name == "outer.params" ? outer : momentum) = t.to(at::kFloat).contiguous();
      } else {
        return InvalidArgument(fmt::format("state tensor '{}' is unexpected", name));
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].defined()) return InvalidArgument(fmt::format("the state lacks param.{}", i));
      if (!AllFinite(params[i].data_ptr<float>(), static_cast<size_t>(params[i].numel()))) {
        return InvalidArgument(fmt::format("the state's param.{} is not finite", i));
      }
    }
    std::lock_guard lock(state_mu_);
    COLONY_RETURN_IF_ERROR(ImportOptimizerState(*optimizer_, opt));
    for (size_t i = 0; i < params.size(); ++i) {
      at::NoGradGuard no_grad;
      params_[i].copy_(params[i]);
    }
    if (options_.diloco_inner_steps > 0) {
      if (outer.defined()) {
        std::memcpy(outer_.data(), outer.data_ptr<float>(), total_ * sizeof(float));
      } else {
        CopyParamsTo(outer_.data());
      }
      if (momentum.defined()) {
        std::memcpy(momentum_.data(), momentum.data_ptr<float>(), total_ * sizeof(float));
      }
    }
    epoch_ = epoch;
    params_epoch_ = epoch;
    diverged_ = false;
    inner_step_ = options_.diloco_inner_steps > 0
                      ? std::max(inner_step, epoch * options_.diloco_inner_steps)
                      : inner_step;
    local_samples_ = 0;
    if (!acc_.empty()) std::fill(acc_.begin(), acc_.end(), 0.0f);
    return Status::Ok();
  }

  // Downloads and installs the state of a donor whose priority (parameter epoch, + 0.5 when it
  // averaged with the swarm) is at least `min_priority`.
  Status DownloadState(std::optional<double> min_priority) {
    FinishPendingStep();
    auto s = grad_avg_[0]->LoadStateFromPeersSync(
        {.timeout = options_.load_state_timeout, .min_priority = min_priority});
    if (!s.ok()) return s.status();
    auto meta = Json::parse(s->metadata, nullptr, false);
    if (!meta.is_object() || !meta.contains("tensors") || !meta["tensors"].is_array() ||
        !meta.contains("epoch") || !meta["epoch"].is_number_integer()) {
      return ProtocolError("the donor's state metadata is malformed");
    }
    const auto& list = meta["tensors"];
    if (list.size() != s->tensors.size()) {
      return ProtocolError("the donor's state metadata does not match its tensors");
    }
    NamedTensors named;
    for (size_t i = 0; i < list.size(); ++i) {
      const auto& e = list[i];
      if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("dtype") ||
          !e["dtype"].is_string() || !e.contains("shape") || !e["shape"].is_array()) {
        return ProtocolError("the donor's state metadata is malformed");
      }
      std::vector<int64_t> shape;
      int64_t numel = 1;
      for (const auto& d : e["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (1ll << 40)) {
          return ProtocolError("the donor's state has a bad shape");
        }
        shape.push_back(d.get<int64_t>());
        numel *= shape.back();
        if (numel > (1ll << 40)) return ProtocolError("the donor's state has a bad shape");
      }
      if (static_cast<size_t>(numel) != s->tensors[i].size()) {
        return ProtocolError(fmt::format("the donor's state tensor '{}' has {} values, not {}",
                                         e["name"].get<std::string>(), s->tensors[i].size(),
                                         numel));
      }
      COLONY_ASSIGN_OR_RETURN(auto dtype, ParseScalarType(e["dtype"].get<std::string>()));
      at::Tensor t = at::from_blob(s->tensors[i].data(), shape, at::kFloat).to(dtype).clone();
      named.emplace_back(e["name"].get<std::string>(), std::move(t));
    }
    const int64_t inner = meta.contains("inner_step") && meta["inner_step"].is_number_integer()
                              ? meta["inner_step"].get<int64_t>()
                              : 0;
    const int64_t donor_epoch = meta["epoch"].get<int64_t>();
    {
      std::lock_guard lock(state_mu_);
      if (donor_epoch < params_epoch_) {
        return FailedPrecondition(fmt::format(
            "the best donor's state is at epoch {}, older than this peer's ({}); keeping ours",
            donor_epoch, params_epoch_));
      }
    }
    COLONY_RETURN_IF_ERROR(ApplyState(named, donor_epoch, inner));
    counters_.state_loads++;
    Publish(Active());
    UpdatePriority();
    COLONY_LOG_INFO("train: loaded the swarm's state at epoch {}", epoch_);
    return Status::Ok();
  }

  Status LoadStateFromPeers() {
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

  void FinishPendingStep() {
    if (!pending_.valid()) return;
    StepReport ignored;
    ApplyPending(ignored);
  }

  Status SaveCheckpoint(const std::filesystem::path& file) {
    FinishPendingStep();
    NamedTensors named;
    Json meta;
    {
      std::lock_guard lock(state_mu_);
      named = CollectState();
      meta = StateMetadata(named);
    }
    std::vector<std::pair<model::TensorInfo, std::span<const uint8_t>>> items;
    for (auto& [name, t] : named) {
      t = t.contiguous();
      model::TensorInfo info;
      info.name = name;
      const auto dtype = model::ToDType(t.scalar_type());
      if (!dtype) {
        return InvalidArgument(
            fmt::format("no safetensors dtype for {}", at::toString(t.scalar_type())));
      }
      info.dtype = *dtype;
      info.shape = t.sizes().vec();
      items.emplace_back(
          info, std::span<const uint8_t>(static_cast<const uint8_t*>(t.data_ptr()), t.nbytes()));
    }
    std::map<std::string, std::string> metadata = {{"format", "colony-train-state"},
                                                   {"epoch", std::to_string(params_epoch_)},
                                                   {"inner_step", std::to_string(inner_step_)},
                                                   {"run_id", options_.run_id}};
    return model::WriteSafetensors(file, items, metadata);
  }

  Status LoadCheckpoint(const std::filesystem::path& file) {
    COLONY_ASSIGN_OR_RETURN(auto f, model::SafetensorsFile::Open(file));
    const auto& h = f.header();
    auto meta_int = [&](const std::string& k) -> Result<int64_t> {
      auto it = h.metadata.find(k);
      if (it == h.metadata.end())
        return InvalidArgument(fmt::format("{} lacks '{}'", file.string(), k));
      try {
        return static_cast<int64_t>(std::stoll(it->second));
      } catch (...) {
        return InvalidArgument(fmt::format("{} has a bad '{}'", file.string(), k));
      }
    };
    auto fmt_it = h.metadata.find("format");
    if (fmt_it == h.metadata.end() || fmt_it->second != "colony-train-state") {
      return InvalidArgument(fmt::format("{} is not a colony training checkpoint", file.string()));
    }
    COLONY_ASSIGN_OR_RETURN(int64_t epoch, meta_int("epoch"));
    COLONY_ASSIGN_OR_RETURN(int64_t inner, meta_int("inner_step"));
    NamedTensors named;
    for (const auto& info : h.tensors) {
      COLONY_ASSIGN_OR_RETURN(auto raw, f.ReadRaw(info.name));
      at::Tensor t =
          at::empty(info.shape, at::TensorOptions().dtype(model::ToScalarType(info.dtype)));
      if (static_cast<size_t>(t.nbytes()) != raw.size()) {
        return DataLoss(fmt::format("{}: tensor {} has the wrong size", file.string(), info.name));
      }
      std::memcpy(t.data_ptr(), raw.data(), raw.size());
      named.emplace_back(info.name, std::move(t));
    }
    COLONY_RETURN_IF_ERROR(ApplyState(named, epoch, inner));
    Publish(Active());
    UpdatePriority();
    return Status::Ok();
  }

  // ---- auxiliary peers -----------------------------------------------------------------------

  // A start barrier: every peer that sees `n` peers reports itself ready (phase kWait, no
  // samples); once `n` peers are ready (or training already), each starts at the same wall-clock
  // moment, a grace period after the last of them became ready, so that the first epoch begins
  // together rather than staggered by each peer's polling.
  Status WaitForPeers(size_t n, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    auto time_left = [&] { return Clock::now() < deadline && !Interrupted(); };
    GlobalProgress g = tracker_->Global();
    while (g.num_peers < n && time_left()) g = Poll(std::chrono::milliseconds(200));
    if (g.num_peers < n) {
      return DeadlineExceeded(fmt::format("only {} of the {} peers asked for joined run '{}'",
                                          g.num_peers, n, options_.run_id));
    }
    Publish(Phase::kWait);  // ready: this peer sees them all
    auto ready = [](const GlobalProgress& v) {
      std::vector<double> times;
      for (const auto& p : v.peers) {
        if (p.phase != Phase::kIdle) times.push_back(p.time);
      }
      return times;
    };
    std::vector<double> times = ready(g);
    while (times.size() < n && time_left()) {
      g = Poll(std::chrono::milliseconds(200));
      times = ready(g);
    }
    if (times.size() < n) {
      return DeadlineExceeded(fmt::format("only {} of the {} peers of run '{}' became ready",
                                          times.size(), n, options_.run_id));
    }
    // The last ready report reaches every peer within a few polls; the wait is bounded in case
    // a peer's clock runs ahead.
    const auto grace = 2 * options_.progress_min_refresh + 3 * tracker_->PollSpacing();
    const double start_at = *std::max_element(times.begin(), times.end()) + Seconds(grace);
    const double wait = std::clamp(start_at - dht::Now(), 0.0, 2 * Seconds(grace));
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    return Status::Ok();
  }

  Status RunAuxiliary(const std::function<bool()>& stop) {
    if (options_.mode != averaging::Mode::kAux) {
      return FailedPrecondition("RunAuxiliary() needs mode kAux");
    }
    int64_t last_round = -1;
    auto idle_since = Clock::now();
    while (!stop() && !Interrupted()) {
      const GlobalProgress g = Poll(Clock::now() - idle_since);
      epoch_ = g.epoch;
      tracker_->Report({.epoch = epoch_, .phase = Phase::kWait});
      if (g.epoch == last_round || g.num_peers_at_epoch <= 1 ||
          DecideEpoch(g, g.epoch, 0, true).action != EpochAction::kAverage) {
        continue;
      }
      averaging::StepOptions so;
      so.weight = 0;
      so.timeout = options_.averaging_timeout;
      so.allow_retries = false;  // the group of an epoch forms once; a retry would wait alone
      so.expected_group_size = g.num_peers_at_epoch;
      so.group_bits = EpochBits(g.epoch);
      tracker_->Report({.epoch = epoch_, .phase = Phase::kRound});
      auto r = grad_avg_[0]->StepSync(so);
      last_round = g.epoch;
      idle_since = Clock::now();
      if (r.ok()) {
        counters_.global_steps++;
      } else {
        COLONY_LOG_INFO("train: auxiliary round at epoch {} failed: {}", g.epoch,
                        r.status().ToString());
      }
    }
    return Status::Ok();
  }

  // ---- helpers -------------------------------------------------------------------------------

  // The group to expect at `epoch`: the live peers there (all of them join the round; those
  // without samples join with weight 0).
  size_t PeersAtEpoch(int64_t epoch) const {
    size_t n = CountPeersAtEpoch(epoch, tracker_->Global());
    // Before concluding that it is alone (and stepping without a group), a peer makes sure its
    // view is current: right after start-up it may not have seen anyone yet.
    if (n <= 1) n = CountPeersAtEpoch(epoch, tracker_->Refresh(std::chrono::seconds(2)));
    return n;
  }

  size_t CountPeersAtEpoch(int64_t epoch, const GlobalProgress& g) const {
    // With delayed averaging a peer reports the next epoch as soon as its round starts, so the
    // peers one epoch ahead may still be in this epoch's round.
    const bool delayed = options_.delay_grad_averaging && options_.diloco_inner_steps == 0;
    size_t n = 0;
    for (const auto& p : g.peers) n += p.epoch == epoch || (delayed && p.epoch == epoch + 1);
    return n;
  }

  bool GradsFinite() {
    for (auto& p : params_) {
      const at::Tensor& g = p.grad();
      if (!g.defined()) continue;
      at::Tensor c = g.contiguous();
      if (!AllFinite(c.data_ptr<float>(), static_cast<size_t>(c.numel()))) return false;
    }
    return true;
  }

  void Accumulate(int64_t batch_size) {
    const float w = static_cast<float>(batch_size);
    for (size_t i = 0; i < params_.size(); ++i) {
      const at::Tensor& g = params_[i].grad();
      if (!g.defined()) continue;
      at::Tensor c = g.contiguous();
      const float* src = c.data_ptr<float>();
      float* dst = acc_.data() + offsets_[i];
      const size_t n = static_cast<size_t>(c.numel());
      for (size_t k = 0; k < n; ++k) dst[k] += w * src[k];
    }
    ZeroGrads();
  }

  void ZeroGrads() {
    for (auto& p : params_) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
  }

  void CopyParamsTo(float* out, size_t begin = 0, size_t end = SIZE_MAX) {
    end = std::min(end, total_);
    for (size_t i = 0; i < params_.size(); ++i) {
      const size_t lo = std::max(begin, offsets_[i]), hi = std::min(end, offsets_[i + 1]);
      if (lo >= hi) continue;
      std::memcpy(out + lo, params_[i].data_ptr<float>() + (lo - offsets_[i]),
                  (hi - lo) * sizeof(float));
    }
  }

  void CopyToParams(const float* in, size_t begin = 0, size_t end = SIZE_MAX) {
    end = std::min(end, total_);
    for (size_t i = 0; i < params_.size(); ++i) {
      const size_t lo = std::max(begin, offsets_[i]), hi = std::min(end, offsets_[i + 1]);
      if (lo >= hi) continue;
      std::memcpy(params_[i].data_ptr<float>() + (lo - offsets_[i]), in + lo,
                  (hi - lo) * sizeof(float));
    }
  }

  // Samples/s while computing: the time between the end of one Step() and the next call, so
  // that waiting and averaging inside Step() do not count (the first batch's start is unknown).
  void UpdateThroughput(int64_t batch_size) {
    const auto now = Clock::now();
    if (last_step_end_ == Clock::time_point{}) return;
    const double dt = Seconds(now - last_step_end_);
    if (dt <= 0) return;
    const double rate = static_cast<double>(batch_size) / dt;
    sps_ = sps_ == 0 ? rate : 0.8 * sps_ + 0.2 * rate;
  }

  dht::Node& node_;
  std::vector<at::Tensor> params_;
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  const CollaborativeOptions options_;
  std::vector<size_t> offsets_;
  size_t total_ = 0;
  std::vector<float> acc_;   // sum over this epoch's batches of batch_size * gradient
  std::vector<float> buf_;   // what the gradient averagers average (mean grads or deltas)
  std::vector<float> pbuf_;  // what the parameter averager averages
  std::vector<float> outer_, momentum_;  // DiLoCo: parameters at the last sync, outer momentum
  std::vector<std::pair<size_t, size_t>> fragments_;
  std::vector<std::unique_ptr<averaging::Averager>> grad_avg_;
  std::unique_ptr<averaging::Averager> state_avg_;
  std::unique_ptr<ProgressTracker> tracker_;
  std::mutex state_mu_;  // parameters and optimizer state vs. the state provider
  std::future<Outcome> pending_;
  int64_t pending_samples_ = 0;
  int64_t epoch_ = 0;         // rounds this peer has been through (what it reports)
  int64_t params_epoch_ = 0;  // the epoch its parameters are at (guarded by state_mu_)
  bool diverged_ = false;     // stepped alone while others stepped together
  int64_t inner_step_ = 0;
  int64_t local_samples_ = 0;
  double sps_ = 0;
  Clock::time_point last_step_end_{};  // when Step() last returned
  Clock::time_point last_poll_{};
  Clock::time_point next_catch_up_{};
  Phase phase_ = Phase::kIdle;  // what this peer last reported (kIdle: not computing yet)
  int64_t last_batch_ = 0;
  bool quota_active_ = false;  // computing a share of a shortfall (DecideEpoch's quota)
  int64_t quota_left_ = 0;
  TrainingCounters counters_;

  friend class CollaborativeOptimizer;
};

Result<std::unique_ptr<CollaborativeOptimizer>> CollaborativeOptimizer::Create(
    dht::Node& node, std::vector<at::Tensor> params,
    std::shared_ptr<torch::optim::Optimizer> optimizer, CollaborativeOptions options) {
  if (options.run_id.empty()) return InvalidArgument("a collaborative run needs a run id");
  if (!optimizer) return InvalidArgument("no optimizer given");
  if (params.empty()) return InvalidArgument("no parameters given");
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (!p.defined() || p.scalar_type() != at::kFloat || !p.is_contiguous() ||
        !p.device().is_cpu()) {
      return InvalidArgument(fmt::format(
          "parameter {} must be a contiguous float32 CPU tensor (keep a CPU master copy)", i));
    }
  }
  if (options.diloco_inner_steps < 0 || options.diloco_fragments < 1 ||
      (options.diloco_inner_steps > 0 && options.diloco_fragments > options.diloco_inner_steps)) {
    return InvalidArgument("DiLoCo needs inner steps >= fragments >= 1");
  }
  if (options.diloco_inner_steps > 0 && options.local_updates) {
    return InvalidArgument("DiLoCo and local_updates are exclusive (DiLoCo already steps locally)");
  }
  if (!(options.outer_lr > 0) || !(options.outer_momentum >= 0 && options.outer_momentum < 1)) {
    return InvalidArgument("DiLoCo needs outer_lr > 0 and 0 <= outer_momentum < 1");
  }
  auto impl =
      std::make_unique<Impl>(node, std::move(params), std::move(optimizer), std::move(options));
  COLONY_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<CollaborativeOptimizer>(new CollaborativeOptimizer(std::move(impl)));
}

CollaborativeOptimizer::CollaborativeOptimizer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
CollaborativeOptimizer::~CollaborativeOptimizer() = default;

Result<StepReport> CollaborativeOptimizer::Step(int64_t batch_size) {
  return impl_->Step(batch_size);
}
Status CollaborativeOptimizer::LoadStateFromPeers() { return impl_->LoadStateFromPeers(); }
void CollaborativeOptimizer::FinishPendingStep() { impl_->FinishPendingStep(); }
Status CollaborativeOptimizer::WaitForPeers(size_t n, std::chrono::milliseconds timeout) {
  return impl_->WaitForPeers(n, timeout);
}
Status CollaborativeOptimizer::RunAuxiliary(const std::function<bool()>& stop) {
  return impl_->RunAuxiliary(stop);
}
Status CollaborativeOptimizer::SaveCheckpoint(const std::filesystem::path& file) {
  return impl_->SaveCheckpoint(file);
}
Status CollaborativeOptimizer::LoadCheckpoint(const std::filesystem::path& file) {
  return impl_->LoadCheckpoint(file);
}
int64_t CollaborativeOptimizer::local_epoch() const { return impl_->epoch_; }
GlobalProgress CollaborativeOptimizer::global() const { return impl_->tracker_->Global(); }
TrainingCounters CollaborativeOptimizer::counters() const {
  TrainingCounters c = impl_->counters_;
  const auto stats = impl_->node_.host().TotalStats();
  c.bytes_sent = stats.bytes_sent;
  c.bytes_received = stats.bytes_received;
  return c;
}
double CollaborativeOptimizer::samples_per_second() const { return impl_->sps_; }

}  // namespace colony::train
