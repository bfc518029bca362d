// The collaborative optimizer's facade and the state every way of stepping shares
// (CollaborativeOptimizer::Impl, internal.h): creation, Step(), reporting progress, polling the
// swarm, the start barrier, flat access to the parameters. The ways of stepping are in
// rounds.cpp, local_updates.cpp and diloco.cpp; state for newcomers in state_sync.cpp.
#include "train/collaborative.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <bitset>
#include <cmath>
#include <cstring>
#include <thread>

#include "core/bytes.h"
#include "core/log.h"
#include "train/internal.h"
#include "train/powersgd.h"

namespace colony::train {

std::string EpochBits(int64_t epoch, int fragment) {
  const uint32_t v =
      static_cast<uint32_t>(epoch & 0xffff) | (static_cast<uint32_t>(fragment) << 16);
  return std::bitset<20>(v).to_string();
}

std::string GatherMetadata(int64_t samples, double samples_per_second) {
  return Json{{"samples", samples}, {"sps", samples_per_second}}.dump();
}

std::string ShortGroupId(const averaging::StepResult& r) {
  return HexEncode(AsBytes(r.group_id)).substr(0, 8);
}

Membership CountMembers(const averaging::StepResult& r) {
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
    int64_t samples = -1;  // unknown
    if (j.is_object() && j.contains("samples") && j["samples"].is_number_integer()) {
      samples = std::clamp<int64_t>(j["samples"].get<int64_t>(), 0, int64_t{1} << 40);
      m.realized += samples;
    }
    // A member without samples (it joined with weight 1e-30, rounds.cpp) brought no data.
    if (samples != 0) ++m.group;
  }
  return m;
}

Status Stepping::CheckExtraState(const NamedTensors& extra) const {
  if (extra.empty()) return Status::Ok();
  return InvalidArgument(fmt::format("state tensor '{}' is unexpected", extra.front().first));
}

Status Stepping::RunAuxiliary(const std::function<bool()>&) {
  return FailedPrecondition("auxiliary peers lend bandwidth to gradient rounds only");
}

// ---- the peer's shared state ------------------------------------------------------------------

CollaborativeOptimizer::Impl::Impl(dht::Node& node, std::vector<at::Tensor> params,
                                   std::shared_ptr<torch::optim::Optimizer> optimizer,
                                   CollaborativeOptions options)
    : node_(node),
      params_(std::move(params)),
      device_(params_.front().device()),
      optimizer_(std::move(optimizer)),
      base_lrs_(LearningRates(*optimizer_)),
      options_(std::move(options)) {
  for (const auto& p : params_) {
    offsets_.push_back(total_);
    total_ += static_cast<size_t>(p.numel());
  }
  offsets_.push_back(total_);
  if (!device_.is_cpu()) grads_ = std::make_unique<FlatGradients>(params_);
}

Status CollaborativeOptimizer::Impl::Init() {
  const bool diloco = options_.diloco_inner_steps > 0;
  Status st = Status::Ok();
  stepping_ = diloco                   ? MakeDiloco(*this, st)
              : options_.local_updates ? MakeLocalUpdates(*this, st)
                                       : MakeGradientRounds(*this, st);
  COLONY_RETURN_IF_ERROR(st);
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
    stepping_->Sharing().ShareState([this] { return ProvideState(); }, 0);
  }
  return Status::Ok();
}

CollaborativeOptimizer::Impl::~Impl() {
  if (stepping_) {
    if (stepping_->HasPending()) stepping_->FinishPending(nullptr);
    stepping_->Shutdown();
  }
  tracker_.reset();
}

Result<StepReport> CollaborativeOptimizer::Impl::Step(int64_t batch_size, int64_t data_index) {
  if (batch_size <= 0) return InvalidArgument("Step() needs the batch's (positive) sample count");
  if (options_.mode == averaging::Mode::kAux) {
    return FailedPrecondition("an auxiliary peer trains nothing: call RunAuxiliary()");
  }
  StepReport report;
  data_index_ = data_index;
  COLONY_RETURN_IF_ERROR(TakeBatch(batch_size, report));
  COLONY_RETURN_IF_ERROR(stepping_->Advance(report));
  AfterStep(report);
  return report;
}

Status CollaborativeOptimizer::Impl::TakeBatch(int64_t batch_size, StepReport& report) {
  UpdateThroughput(batch_size);
  last_batch_ = batch_size;
  const bool finite = options_.testing.unchecked_local_gradients || GradsFinite();
  counters_.local_batches++;
  if (finite) {
    NoteClaimedBatch(data_index_);
    return stepping_->Contribute(batch_size, report);
  }
  counters_.skipped_batches++;
  report.skipped_nonfinite = true;
  COLONY_LOG_WARN("train: skipped a batch with non-finite gradients (epoch {}, {} so far)", epoch_,
                  counters_.skipped_batches);
  ZeroGrads();
  return Status::Ok();
}

void CollaborativeOptimizer::Impl::AfterStep(StepReport& report) {
  report.epoch = epoch_;
  if (report.stepped) {
    last_round_ = {.epoch = epoch_ - 1,
                   .group = report.group,
                   .size = static_cast<int64_t>(std::max<size_t>(report.group_size, 1)),
                   .ok = report.averaged};
  }
  last_step_end_ = Clock::now();  // the next batch's compute time starts now
}

averaging::AveragerOptions CollaborativeOptimizer::Impl::AveragerDefaults() const {
  averaging::AveragerOptions a;
  a.mode = options_.mode;
  a.target_group_size = options_.target_group_size;
  a.min_group_size = options_.min_group_size;
  a.matchmaking_time = options_.matchmaking_time;
  a.moshpit = false;
  a.bandwidth = options_.bandwidth;
  a.max_send_rate = options_.max_send_rate;
  a.testing.fault = options_.testing.fault;
  a.testing.wrong_result = options_.testing.wrong_result;
  a.testing.wrong_projections = options_.testing.wrong_projections;
  a.testing.lying = [this] {
    return attack_epoch_.load(std::memory_order_relaxed) >= options_.testing.attack_from_epoch;
  };
  return a;
}

void CollaborativeOptimizer::Impl::Attack(at::Tensor& mean, int64_t epoch) {
  attack_epoch_.store(epoch, std::memory_order_relaxed);
  const auto attack = options_.testing.gradient_attack;
  if (attack == GradientAttack::kNone || epoch < options_.testing.attack_from_epoch) return;
  at::NoGradGuard no_grad;
  switch (attack) {
    case GradientAttack::kSignFlip:
      mean.neg_();
      break;
    case GradientAttack::kConstant: {
      const double norm = mean.norm().item<double>();
      mean.fill_(100.0 * std::max(norm, 1e-3) / std::sqrt(static_cast<double>(mean.numel())));
      break;
    }
    case GradientAttack::kStale:
      if (!stale_.defined()) stale_ = mean.clone();
      mean.copy_(stale_);
      break;
    case GradientAttack::kNone:
      break;
  }
}

bool CollaborativeOptimizer::Impl::Interrupted() const {
  return options_.interrupt != nullptr && options_.interrupt->load(std::memory_order_relaxed);
}

void CollaborativeOptimizer::Impl::Publish(Phase phase) {
  phase_ = phase;
  tracker_->Report({.epoch = epoch_,
                    .samples = local_samples_,
                    .samples_per_second = sps_,
                    .batch = last_batch_,
                    .phase = phase,
                    .loss = loss_.load(std::memory_order_relaxed),
                    .round = last_round_});
}

// Waiting peers poll the DHT, and a swarm of them must not flood it: polls are the tracker's
// PollSpacing() apart at first, then a tenth of the time waited so far (a long wait is a wait
// for something slow), at most min_refresh.
GlobalProgress CollaborativeOptimizer::Impl::Poll(Clock::duration waited) {
  const Clock::duration least = tracker_->PollSpacing();
  const auto gap = std::clamp<Clock::duration>(
      waited / 10, least, std::max<Clock::duration>(least, options_.progress_min_refresh));
  const auto since = Clock::now() - last_poll_;
  if (since < gap) std::this_thread::sleep_for(gap - since);
  last_poll_ = Clock::now();
  return tracker_->Refresh(kPollTimeout);
}

size_t CollaborativeOptimizer::Impl::PeersAtEpoch(int64_t epoch) {
  size_t n = CountPeersAtEpoch(epoch, tracker_->Global());
  // Before concluding that it is alone (and stepping without a group), a peer makes sure its
  // view is current: right after start-up it may not have seen anyone yet.
  if (n <= 1) n = CountPeersAtEpoch(epoch, tracker_->Refresh(kPollTimeout));
  return n;
}

size_t CollaborativeOptimizer::Impl::CountPeersAtEpoch(int64_t epoch,
                                                       const GlobalProgress& g) const {
  const int64_t lag = stepping_->Lag();
  size_t n = 0;
  for (const auto& p : g.peers) n += p.epoch >= epoch && p.epoch <= epoch + lag;
  return n;
}

void CollaborativeOptimizer::Impl::UpdatePriority() {
  int64_t e;
  {
    std::lock_guard lock(state_mu_);
    e = params_epoch_;
  }
  // Among donors at the same epoch, those that averaged with the swarm come first.
  stepping_->Sharing().SetStatePriority(static_cast<double>(e) + (diverged_ ? 0.0 : 0.5));
}

bool CollaborativeOptimizer::Impl::GradsFinite() const {
  if (device_.is_cpu()) {
    for (const auto& p : params_) {
      const at::Tensor& g = p.grad();
      if (!g.defined()) continue;
      if (!model::AllFinite(g)) return false;
    }
    return true;
  }
  // On a GPU: one check over all gradients and one synchronization, not one per parameter.
  return grads_->AllFinite();
}

void CollaborativeOptimizer::Impl::ZeroGrads() {
  if (grads_) {
    grads_->Zero();
    return;
  }
  for (auto& p : params_) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

void CollaborativeOptimizer::Impl::AddGradsTo(at::Tensor& acc, double weight) {
  at::NoGradGuard no_grad;
  if (grads_) {
    acc.add_(grads_->Bind(), weight);
    return;
  }
  const auto w = static_cast<float>(weight);
  float* out = acc.data_ptr<float>();
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& g = params_[i].grad();
    if (!g.defined()) continue;
    const at::Tensor c = g.contiguous();
    const float* src = c.data_ptr<float>();
    float* dst = out + offsets_[i];
    const auto n = static_cast<size_t>(c.numel());
    for (size_t k = 0; k < n; ++k) dst[k] += w * src[k];
  }
}

void CollaborativeOptimizer::Impl::CopyParamsTo(float* out, size_t begin, size_t end) const {
  end = std::min(end, total_);
  for (size_t i = 0; i < params_.size(); ++i) {
    const size_t lo = std::max(begin, offsets_[i]), hi = std::min(end, offsets_[i + 1]);
    if (lo >= hi) continue;
    if (device_.is_cpu()) {
      std::memcpy(out + lo, params_[i].data_ptr<float>() + (lo - offsets_[i]),
                  (hi - lo) * sizeof(float));
    } else {
      const auto n = static_cast<int64_t>(hi - lo);
      at::from_blob(out + lo, {n}, at::kFloat)
          .copy_(
              params_[i].detach().view({-1}).narrow(0, static_cast<int64_t>(lo - offsets_[i]), n));
    }
  }
}

void CollaborativeOptimizer::Impl::CopyToParams(const float* in, size_t begin, size_t end) {
  end = std::min(end, total_);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const size_t lo = std::max(begin, offsets_[i]), hi = std::min(end, offsets_[i + 1]);
    if (lo >= hi) continue;
    if (device_.is_cpu()) {
      std::memcpy(params_[i].data_ptr<float>() + (lo - offsets_[i]), in + lo,
                  (hi - lo) * sizeof(float));
    } else {
      const auto n = static_cast<int64_t>(hi - lo);
      params_[i]
          .detach()
          .view({-1})
          .narrow(0, static_cast<int64_t>(lo - offsets_[i]), n)
          .copy_(at::from_blob(const_cast<float*>(in) + lo, {n}, at::kFloat));
    }
  }
}

void CollaborativeOptimizer::Impl::StepOptimizer(int64_t epoch) {
  if (options_.lr_schedule.Active()) {
    SetLearningRates(*optimizer_, base_lrs_, options_.lr_schedule.Factor(epoch));
  }
  optimizer_->step();
}

void CollaborativeOptimizer::Impl::StepOptimizerWith(const at::Tensor& gradient, int64_t epoch) {
  if (grads_) {
    at::NoGradGuard no_grad;
    grads_->Bind().copy_(gradient);
    StepOptimizer(epoch);
    ZeroGrads();
    return;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    at::Tensor g = gradient.narrow(0, static_cast<int64_t>(offsets_[i]), p.numel()).view(p.sizes());
    if (p.grad().defined()) {
      p.mutable_grad().copy_(g);
    } else {
      p.mutable_grad() = g.clone();
    }
  }
  StepOptimizer(epoch);
  ZeroGrads();
}

at::Tensor CollaborativeOptimizer::Impl::FlatZeros() const {
  return at::zeros({static_cast<int64_t>(total_)}, at::TensorOptions(at::kFloat).device(device_));
}

at::Tensor CollaborativeOptimizer::Impl::FlatOver(std::vector<float>& host) const {
  if (device_.is_cpu()) {
    return at::from_blob(host.data(), {static_cast<int64_t>(host.size())}, at::kFloat);
  }
  return FlatZeros();
}

// Samples/s while computing: the time between the end of one Step() and the next call, so that
// waiting and averaging inside Step() do not count (the first batch's start is unknown).
void CollaborativeOptimizer::Impl::UpdateThroughput(int64_t batch_size) {
  const auto now = Clock::now();
  if (last_step_end_ == Clock::time_point{}) return;
  const double dt = Seconds(now - last_step_end_);
  if (dt <= 0) return;
  const double rate = static_cast<double>(batch_size) / dt;
  sps_ = sps_ == 0 ? rate : 0.8 * sps_ + 0.2 * rate;
}

// A start barrier in two stages. First every peer that sees `n` peers reports itself ready
// (phase kWait, no samples); once `n` peers are ready (or training already), each waits for the
// same wall-clock moment, a grace period after the last of them became ready. Then each reports
// kTrain and computes only once its view shows the others computing too: a peer that starts
// while it still sees others as ready-but-waiting would not extrapolate their growth, and the
// swarm would overshoot its first target by however long that view lasts (a whole epoch on a
// loaded machine or a fast device). A peer that waits longer than the others here is seen
// computing early, which makes them stop a little early and wait for its reports: safe.
Status CollaborativeOptimizer::Impl::WaitForPeers(size_t n, std::chrono::milliseconds timeout) {
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
  // The last ready report reaches every peer within a few polls; the wait is bounded in case a
  // peer's clock runs ahead.
  const auto grace = 2 * options_.progress_min_refresh + 3 * tracker_->PollSpacing();
  const double start_at = *std::max_element(times.begin(), times.end()) + Seconds(grace);
  const double wait = std::clamp(start_at - dht::Now(), 0.0, 2 * Seconds(grace));
  std::this_thread::sleep_for(std::chrono::duration<double>(wait));

  // Second stage: computing, as soon as the view shows `n` peers computing (or past the start:
  // with samples, or a later epoch). Bounded by another grace period: a peer that died between
  // the stages must not hold the others.
  Publish(Phase::kTrain);
  auto computing = [&](const GlobalProgress& v) {
    size_t k = 0;
    for (const auto& p : v.peers) {
      k += !p.aux && (p.phase == Phase::kTrain || p.samples > 0 || p.epoch > epoch_);
    }
    return k;
  };
  const auto started = Clock::now();
  g = tracker_->Refresh(kPollTimeout);
  while (computing(g) < n && Clock::now() - started < 2 * grace && time_left()) {
    g = Poll(Clock::now() - started);
  }
  if (computing(g) < n) {
    COLONY_LOG_DEBUG("train: {} of {} peers seen computing at the start; starting anyway",
                     computing(g), n);
  }
  return Status::Ok();
}

// ---- the facade -------------------------------------------------------------------------------

Result<std::unique_ptr<CollaborativeOptimizer>> CollaborativeOptimizer::Create(
    dht::Node& node, std::vector<at::Tensor> params,
    std::shared_ptr<torch::optim::Optimizer> optimizer, CollaborativeOptions options) {
  if (options.run_id.empty()) return InvalidArgument("a collaborative run needs a run id");
  if (!optimizer) return InvalidArgument("no optimizer given");
  if (params.empty()) return InvalidArgument("no parameters given");
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (!p.defined() || p.scalar_type() != at::kFloat || !p.is_contiguous()) {
      return InvalidArgument(fmt::format("parameter {} must be a contiguous float32 tensor", i));
    }
    if (p.device() != params.front().device()) {
      return InvalidArgument(fmt::format("parameter {} is on {}, parameter 0 on {}", i,
                                         p.device().str(), params.front().device().str()));
    }
  }
  if (options.diloco_inner_steps < 0 || options.diloco_fragments < 1 ||
      (options.diloco_inner_steps > 0 && options.diloco_fragments > options.diloco_inner_steps)) {
    return InvalidArgument("DiLoCo needs inner steps >= fragments >= 1");
  }
  if (options.diloco_inner_steps > 0 && options.local_updates) {
    return InvalidArgument("DiLoCo and local_updates are exclusive (DiLoCo already steps locally)");
  }
  if (options.delay_grad_averaging && (options.diloco_inner_steps > 0 || options.local_updates)) {
    return InvalidArgument(
        "delay_grad_averaging (--delay-averaging) overlaps gradient rounds with the next batch; "
        "DiLoCo and local_updates average parameters, which it does not delay");
  }
  if (options.powersgd_rank < 0 || options.powersgd_rank > kMaxPowerSgdRank) {
    return InvalidArgument(fmt::format("powersgd_rank must be 0 (off) to {}, got {}",
                                       kMaxPowerSgdRank, options.powersgd_rank));
  }
  if (options.powersgd_rank > 0 &&
      (options.diloco_inner_steps > 0 || options.local_updates || options.verify_rounds ||
       options.centered_clip_tau > 0 || options.audit_targets > 0)) {
    return InvalidArgument(
        "PowerSGD (powersgd_rank) compresses synchronous gradient rounds: not DiLoCo or local "
        "updates (they average parameters), and not CenteredClip, verified rounds or audits "
        "(they would act on the low-rank factors, not on the gradients)");
  }
  // Named as the options' fields.
  COLONY_RETURN_IF_ERROR(options.lr_schedule.Check({.kind = "lr_schedule",
                                                    .warmup = "lr_schedule.warmup_epochs",
                                                    .total = "lr_schedule.total_epochs"}));
  if (options.mode == averaging::Mode::kAux &&
      (options.diloco_inner_steps > 0 || options.local_updates || options.delay_grad_averaging)) {
    return InvalidArgument(
        "an auxiliary peer lends bandwidth to synchronous gradient rounds only (not to DiLoCo, "
        "local updates or delayed averaging)");
  }
  if (!(options.outer_lr > 0) || !(options.outer_momentum >= 0 && options.outer_momentum < 1)) {
    return InvalidArgument("DiLoCo needs outer_lr > 0 and 0 <= outer_momentum < 1");
  }
  if (!(options.centered_clip_tau >= 0) || !std::isfinite(options.centered_clip_tau)) {
    return InvalidArgument("centered_clip_tau must be finite and not negative (0: the mean)");
  }
  if ((options.centered_clip_tau > 0 || options.verify_rounds) &&
      (options.diloco_inner_steps > 0 || options.local_updates)) {
    return InvalidArgument(
        "CenteredClip and verified rounds apply to gradient rounds, not to DiLoCo or local "
        "updates (which average parameters)");
  }
  if (options.audit_targets > 0 &&
      (!options.verify_rounds || options.delay_grad_averaging ||
       !options.audit_data.compute_batch || options.audit_data.batch_size < 1)) {
    return InvalidArgument(
        "audits need verified rounds, no delayed averaging (they recompute gradients with the "
        "model between batches) and a task that recomputes another peer's batches");
  }
  auto impl =
      std::make_unique<Impl>(node, std::move(params), std::move(optimizer), std::move(options));
  COLONY_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<CollaborativeOptimizer>(new CollaborativeOptimizer(std::move(impl)));
}

CollaborativeOptimizer::CollaborativeOptimizer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
CollaborativeOptimizer::~CollaborativeOptimizer() = default;

Result<StepReport> CollaborativeOptimizer::Step(int64_t batch_size, int64_t data_index) {
  return impl_->Step(batch_size, data_index);
}
void CollaborativeOptimizer::ReportLoss(double loss) {
  if (std::isfinite(loss)) impl_->loss_.store(loss, std::memory_order_relaxed);
}
Status CollaborativeOptimizer::LoadStateFromPeers() { return impl_->LoadStateFromPeers(); }
void CollaborativeOptimizer::FinishPendingStep() {
  if (impl_->stepping_->HasPending()) impl_->stepping_->FinishPending(nullptr);
}
Status CollaborativeOptimizer::WaitForPeers(size_t n, std::chrono::milliseconds timeout) {
  return impl_->WaitForPeers(n, timeout);
}
Status CollaborativeOptimizer::RunAuxiliary(const std::function<bool()>& stop) {
  if (impl_->options_.mode != averaging::Mode::kAux) {
    return FailedPrecondition("RunAuxiliary() needs mode kAux");
  }
  return impl_->stepping_->RunAuxiliary(stop);
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
bool CollaborativeOptimizer::ParametersChanged(const StepReport& r) const {
  const CollaborativeOptions& o = impl_->options_;
  return r.stepped || r.loaded_state || o.local_updates || o.diloco_inner_steps > 0 ||
         o.delay_grad_averaging;
}

}  // namespace colony::train
