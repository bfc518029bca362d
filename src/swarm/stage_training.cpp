// A SWARM stage's training (stage_training.h): epochs driven by the trainers' tags, rounds with
// the stage's other peers, and a watcher that joins rounds this peer got no request for.
#include "swarm/stage_training.h"

#include <fmt/format.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <thread>

#include "core/log.h"
#include "dht/validation.h"
#include "train/progress_record.h"

namespace colony::swarm {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

// After the trainers' records refuted a tag, requests do not wait for them again for this long:
// a peer sending tags ahead of the trainers costs the stage one wait per period at most.
constexpr auto kRefutedFor = 5s;
constexpr auto kPollGap = 50ms;

}  // namespace

Result<std::shared_ptr<StageTraining>> StageTraining::Create(dht::Node& node,
                                                             std::vector<at::Tensor> params,
                                                             StageTrainingOptions options) {
  if (options.max_staleness < 0) return InvalidArgument("max_staleness must be at least 0");
  if (options.watch_period.count() <= 0) return InvalidArgument("watch_period must be positive");
  if (options.trainers_run.empty()) return InvalidArgument("a stage needs the trainers' run");
  auto t = std::shared_ptr<StageTraining>(
      new StageTraining(node, std::move(params), std::move(options)));
  COLONY_ASSIGN_OR_RETURN(auto inner, train::MakeOptimizer(t->options_.optimizer, t->params_,
                                                           t->options_.optimizer_config));
  t->optimizer_ = std::move(inner);
  COLONY_ASSIGN_OR_RETURN(t->opt_, train::CollaborativeOptimizer::Create(
                                       node, t->params_, t->optimizer_, t->options_.collaborative));
  t->opt_->KeepAlive();
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
  stop_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  std::lock_guard lock(mu_);
  opt_.reset();  // withdraws this peer's progress record and averagers
}

Status StageTraining::Run(int64_t epoch, int64_t samples, bool backward,
                          const std::function<Status()>& compute) {
  std::lock_guard lock(mu_);
  if (!opt_) return Unavailable("this stage is shutting down");
  if (epoch < 0 && backward) {
    ++stats_.refused;
    return InvalidArgument(
        "this server trains its blocks (a SWARM stage): a backward must carry its trainer's "
        "epoch");
  }
  int64_t local = opt_->local_epoch();
  if (epoch > local) {
    // This request's trainer says the trainers stepped past `local`: once their records confirm
    // it, end `local` here first, so that the microbatch meets the parameters of its epoch.
    bool past = TrainersPast(local, kPollGap);
    if (!past && Clock::now() >= refuted_until_) {
      const auto deadline = Clock::now() + options_.boundary_wait;
      while (!past && Clock::now() < deadline) {
        std::this_thread::sleep_for(kPollGap);
        past = TrainersPast(local, 0ms);
      }
      if (!past) refuted_until_ = Clock::now() + kRefutedFor;
    }
    if (past) EndEpochLocked(local, "the trainers moved on");
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
  Status st = compute();
  if (!st.ok()) {
    for (auto& p : params_) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    ++stats_.refused;
    return st;
  }
  if (!backward) {
    ++stats_.forwards;
    return Status::Ok();
  }
  COLONY_ASSIGN_OR_RETURN(bool finite, opt_->Accumulate(samples));
  ++stats_.backwards;
  if (finite) stats_.samples += samples;
  return Status::Ok();
}

void StageTraining::EndEpochLocked(int64_t epoch, const char* why) {
  auto r = opt_->EndEpoch(epoch);
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
  COLONY_RETURN_IF_ERROR(opt_->LoadStateFromPeers());
  if (opt_->local_epoch() != before) ++stats_.state_loads;
  return Status::Ok();
}

// Joins the rounds that other peers of the stage start, ends epochs that the trainers' records
// show past (when no request came to say so), takes the stage's state when it stepped without
// this peer, and keeps this peer's progress record alive (its peers expect it in their rounds).
void StageTraining::Watch() {
  std::unique_lock stop(stop_mu_);
  for (uint64_t pass = 1;
       !stop_cv_.wait_for(stop, options_.watch_period, [this] { return stopping_; }); ++pass) {
    stop.unlock();
    {
      std::lock_guard lock(mu_);
      const int64_t local = opt_->local_epoch();
      const train::GlobalProgress g = opt_->global();
      if (g.epoch == local && g.round_started) {
        EndEpochLocked(local, "another peer of the stage ended it");
      } else if (pass % 3 == 0 && TrainersPast(local, 3 * options_.watch_period)) {
        EndEpochLocked(local, "the trainers moved on");
      } else if (g.epoch > local) {
        const int64_t before = local;
        Status st = opt_->LoadStateFromPeers();
        if (!st.ok()) {
          COLONY_LOG_INFO("swarm: {} is at epoch {}, behind its stage ({}): {}",
                          options_.collaborative.run_id, before, g.epoch, st.ToString());
        } else if (opt_->local_epoch() != before) {
          ++stats_.state_loads;
        }
      } else {
        opt_->KeepAlive();
      }
    }
    stop.lock();
  }
}

bool StageTraining::TrainersPast(int64_t epoch, std::chrono::milliseconds max_age) {
  auto decide = [epoch](const std::vector<int64_t>& epochs) {
    const auto past =
        std::count_if(epochs.begin(), epochs.end(), [epoch](int64_t e) { return e > epoch; });
    return !epochs.empty() && 2 * static_cast<size_t>(past) > epochs.size();
  };
  {
    std::lock_guard lock(view_mu_);
    if (fetched_ != Clock::time_point{} && Clock::now() - fetched_ <= max_age) {
      return decide(trainer_epochs_);
    }
  }
  auto record = node_.GetSync(options_.trainers_run + ".progress", dht::Freshness::kLatest);
  std::vector<int64_t> epochs;
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
    std::lock_guard lock(view_mu_);
    return decide(trainer_epochs_);
  }
  std::lock_guard lock(view_mu_);
  trainer_epochs_ = std::move(epochs);
  fetched_ = Clock::now();
  return decide(trainer_epochs_);
}

StageTrainingStats StageTraining::stats() const {
  std::lock_guard lock(mu_);
  StageTrainingStats s = stats_;
  s.epoch = opt_ ? opt_->local_epoch() : 0;
  return s;
}

}  // namespace colony::swarm
