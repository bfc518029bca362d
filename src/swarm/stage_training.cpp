// A SWARM stage's training (stage_training.h): epochs ended when the trainers' records say so,
// rounds with the stage's other peers, a refresher of the trainers' view and a watcher.
#include "swarm/stage_training.h"

#include <fmt/format.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <exception>

#include "core/log.h"
#include "dht/validation.h"
#include "train/progress_record.h"

namespace colony::swarm {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

// Fetches of the trainers' records are at least this far apart, however often they are asked for.
constexpr auto kMinFetchGap = 50ms;
// After the trainers' records refuted a tag, tags are not waited for again for 5 s, doubling
// while they keep being refuted (a peer tagging ahead of the trainers costs the stage one
// boundary_wait per such period), back to 5 s when the records confirm one.
constexpr std::chrono::milliseconds kRefutedMin = 5s, kRefutedMax = 300s;

}  // namespace

Result<std::shared_ptr<StageTraining>> StageTraining::Create(dht::Node& node,
                                                             std::vector<at::Tensor> params,
                                                             StageTrainingOptions options) {
  if (options.trainers_run.empty()) return InvalidArgument("a stage needs the trainers' run");
  if (options.max_staleness < 0) return InvalidArgument("max_staleness must be at least 0");
  if (options.watch_period.count() <= 0 || options.refresh_period.count() <= 0) {
    return InvalidArgument("watch_period and refresh_period must be positive");
  }
  auto t = std::shared_ptr<StageTraining>(
      new StageTraining(node, std::move(params), std::move(options)));
  t->options_.collaborative.interrupt = &t->interrupt_;
  COLONY_ASSIGN_OR_RETURN(auto inner, train::MakeOptimizer(t->options_.optimizer, t->params_,
                                                           t->options_.optimizer_config));
  t->optimizer_ = std::move(inner);
  COLONY_ASSIGN_OR_RETURN(t->opt_, train::CollaborativeOptimizer::Create(
                                       node, t->params_, t->optimizer_, t->options_.collaborative));
  t->opt_->KeepAlive();
  t->refresher_ = std::thread([raw = t.get()] { raw->RefreshLoop(); });
  t->watcher_ = std::thread([raw = t.get()] { raw->Watch(); });
  return t;
}

StageTraining::StageTraining(dht::Node& node, std::vector<at::Tensor> params,
                             StageTrainingOptions options)
    : params_(std::move(params)), options_(std::move(options)), node_(node) {}

StageTraining::~StageTraining() { Shutdown(); }

void StageTraining::Shutdown() {
  {
    std::lock_guard lock(stop_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  interrupt_ = true;
  stop_cv_.notify_all();
  {
    std::lock_guard lock(view_mu_);
    refresh_asked_ = true;
  }
  view_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  if (refresher_.joinable()) refresher_.join();
  std::lock_guard lock(mu_);
  opt_.reset();  // withdraws this peer's progress record and averagers
}

void StageTraining::AwaitTrainers(int64_t local) {
  std::unique_lock lock(view_mu_);
  if (Clock::now() < refuted_until_) return;
  const uint64_t asked_at = view_version_;
  refresh_asked_ = true;
  view_cv_.notify_all();
  const auto deadline = Clock::now() + options_.boundary_wait;
  bool past = false;
  for (;;) {
    const uint64_t seen = view_version_;
    if (seen > asked_at) {
      const auto n = std::count_if(trainer_epochs_.begin(), trainer_epochs_.end(),
                                   [local](int64_t e) { return e > local; });
      past = !trainer_epochs_.empty() && 2 * static_cast<size_t>(n) > trainer_epochs_.size();
      if (past) break;
      refresh_asked_ = true;  // the trainer's record may not have been stored yet: look again
      view_cv_.notify_all();
    }
    if (view_cv_.wait_until(lock, deadline, [&] { return view_version_ > seen || stopping_; }) ==
            false ||
        stopping_) {
      break;
    }
  }
  if (past) {
    refuted_for_ = kRefutedMin;
  } else {
    refuted_until_ = Clock::now() + refuted_for_;
    refuted_for_ = std::min(2 * refuted_for_, kRefutedMax);
  }
}

bool StageTraining::Fence(uint64_t microbatch, int64_t start, int64_t end, uint32_t attempt) {
  return ledger_.Fence({microbatch, start, end}, attempt);
}

Status StageTraining::Run(const serve::TrainingCall& call, const std::function<Status()>& compute) {
  const int64_t epoch = call.epoch;
  const bool backward = call.backward;
  if (epoch < 0 && backward) {
    std::lock_guard lock(mu_);
    ++stats_.refused;
    return InvalidArgument(
        "this server trains its blocks (a SWARM stage): a backward must carry its trainer's "
        "epoch");
  }
  // A tag past the stage: look at the trainers' records first (without holding the stage).
  if (const int64_t seen = epoch_.load(); epoch > seen && !TrainersPast(seen)) AwaitTrainers(seen);
  std::lock_guard lock(mu_);
  if (!opt_) return Unavailable("this stage is shutting down");
  int64_t local = opt_->local_epoch();
  if (epoch > local && TrainersPast(local)) {
    // The trainers stepped past `local`: end it here first, so that this microbatch meets the
    // parameters of its epoch.
    EndEpochLocked(local, "the trainers moved on");
    local = opt_->local_epoch();
  }
  if (epoch >= 0 && epoch < local - options_.max_staleness) {
    ++stats_.refused;
    return FailedPrecondition(fmt::format(
        "a microbatch of epoch {} is too stale for this stage, at epoch {} (at most {} behind); "
        "the trainer must catch up with its swarm",
        epoch, local, options_.max_staleness));
  }
  if (epoch >= 0 && epoch != local) ++stats_.stale;
  auto zero_grads = [this] {
    for (auto& p : params_) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
  };
  const MicrobatchLedger::Key key{call.microbatch, call.start, call.end};
  bool took = false;  // marked taken in the ledger
  Status st;
  try {
    st = compute();
    if (st.ok() && backward && call.microbatch != 0 && !call.replay)
      took = ledger_.Take(key, call.attempt);
    if (st.ok() && backward && (call.replay || (call.microbatch != 0 && !took))) {
      // Taken here or by another peer of the stage before: the input gradient goes back, the
      // parameters' gradients are dropped.
      zero_grads();
      ++stats_.dropped;
    } else if (st.ok() && backward) {
      auto finite = opt_->Accumulate(call.samples);
      if (!finite.ok()) {
        st = finite.status();
      } else {
        ++stats_.backwards;
        if (*finite) stats_.samples += call.samples;
      }
    } else if (st.ok()) {
      ++stats_.forwards;
    }
  } catch (const std::exception& e) {
    st = Internal(fmt::format("the stage's computation failed: {}", e.what()));
  }
  if (!st.ok()) {
    if (took) ledger_.Forget(key);
    zero_grads();
    ++stats_.refused;
  }
  return st;
}

void StageTraining::EndEpochLocked(int64_t epoch, const char* why) {
  // A stage whose peers ended `epoch` without this one (its records are past it): take their
  // state rather than step alone with a part of the epoch's gradients.
  if (opt_->global().epoch > epoch) {
    const int64_t before = opt_->local_epoch();
    Status st = opt_->LoadStateFromPeers();
    if (opt_->local_epoch() != before) ++stats_.state_loads;
    epoch_ = opt_->local_epoch();
    if (opt_->local_epoch() > epoch) return;
    if (!st.ok()) COLONY_LOG_INFO("swarm: catching up with the stage: {}", st.ToString());
  }
  auto r = opt_->EndEpoch(epoch);
  epoch_ = opt_->local_epoch();
  if (!r.ok()) {
    COLONY_LOG_WARN("swarm: ending epoch {} of {} failed: {}", epoch, options_.collaborative.run_id,
                    r.status().ToString());
    return;
  }
  if (r->loaded_state) ++stats_.state_loads;
  if (!r->stepped) return;
  ++stats_.rounds;
  if (r->averaged) ++stats_.averaged;
  COLONY_LOG_INFO("swarm: {} stepped to epoch {} ({}; {} samples, group of {}{})",
                  options_.collaborative.run_id, r->epoch, why, r->realized_batch, r->group_size,
                  r->note.empty() ? "" : ": " + r->note);
}

Status StageTraining::LoadStateFromPeers() {
  std::lock_guard lock(mu_);
  if (!opt_) return Unavailable("this stage is shutting down");
  const int64_t before = opt_->local_epoch();
  Status st = opt_->LoadStateFromPeers();
  epoch_ = opt_->local_epoch();
  if (opt_->local_epoch() != before) ++stats_.state_loads;
  return st;
}

bool StageTraining::TrainersPast(int64_t epoch) {
  std::lock_guard lock(view_mu_);
  const auto n = std::count_if(trainer_epochs_.begin(), trainer_epochs_.end(),
                               [epoch](int64_t e) { return e > epoch; });
  return !trainer_epochs_.empty() && 2 * static_cast<size_t>(n) > trainer_epochs_.size();
}

// Fetches the trainers' records every refresh_period, or as soon as a request or the watcher
// asks (at least kMinFetchGap apart), outside every lock but its own.
void StageTraining::RefreshLoop() {
  const std::string key = options_.trainers_run + ".progress";
  Clock::time_point last{};
  std::unique_lock lock(view_mu_);
  while (!stopping_) {
    view_cv_.wait_until(lock, last + options_.refresh_period,
                        [&] { return refresh_asked_ || stopping_; });
    if (stopping_) break;
    const auto gap = last + kMinFetchGap - Clock::now();
    if (gap > Clock::duration::zero()) {
      lock.unlock();
      std::this_thread::sleep_for(gap);
      lock.lock();
    }
    refresh_asked_ = false;
    lock.unlock();
    auto record = node_.GetSync(key, dht::Freshness::kLatest);
    std::vector<int64_t> epochs;
    bool ok = true;
    if (record.ok() && record->is_dict) {
      const double now = dht::Now();
      for (const auto& [subkey, entry] : record->subkeys) {
        auto peer = dht::ParseOwnerMarker(subkey);
        if (!peer || entry.expiration < now) continue;
        auto p = train::ParseProgressRecord(*peer, entry.value);
        if (!p.ok() || p->aux) continue;  // auxiliary peers train nothing
        // A loading peer names the epoch it is joining, not one it reached: it counts as a
        // trainer past no epoch (so a liar that sends honest trainers after a far epoch does not
        // become the majority by their absence).
        epochs.push_back(p->phase == train::Phase::kLoad ? -1 : p->epoch);
      }
    } else if (!record.ok() && record.status().code() != StatusCode::kNotFound) {
      COLONY_LOG_DEBUG("swarm: reading the trainers' progress failed: {}",
                       record.status().ToString());
      ok = false;
    }
    lock.lock();
    last = Clock::now();
    if (ok) trainer_epochs_ = std::move(epochs);
    ++view_version_;
    view_cv_.notify_all();
  }
}

// Ends the epochs that the trainers' records show past when no request came to say so (joining
// the round a peer of the stage started, or taking the stage's state if it went on without this
// peer), asks for a fresh view when a peer of the stage starts a round, and keeps this peer's
// progress record alive (its peers expect it in their rounds).
void StageTraining::Watch() {
  std::unique_lock stop(stop_mu_);
  while (!stop_cv_.wait_for(stop, options_.watch_period, [this] { return stopping_; })) {
    stop.unlock();
    {
      std::lock_guard lock(mu_);
      const int64_t local = opt_->local_epoch();
      if (TrainersPast(local)) {
        EndEpochLocked(local, "the trainers moved on");
      } else {
        const train::GlobalProgress g = opt_->global();
        if ((g.epoch == local && g.round_started) || g.epoch > local) {
          std::lock_guard view(view_mu_);
          refresh_asked_ = true;
          view_cv_.notify_all();
        }
        opt_->KeepAlive();
      }
    }
    stop.lock();
  }
}

StageTrainingStats StageTraining::stats() const {
  std::lock_guard lock(mu_);
  StageTrainingStats s = stats_;
  s.epoch = opt_ ? opt_->local_epoch() : 0;
  std::lock_guard view(view_mu_);
  s.view_fetches = view_version_;
  return s;
}

}  // namespace colony::swarm
