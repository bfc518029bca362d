// The training loop of one peer (trainer.h).
#include "train/trainer.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "averaging/key_families.h"
#include "core/log.h"
#include "core/multiaddr.h"
#include "dht/node.h"
#include "model/device.h"
#include "train/audit.h"
#include "train/device_mirror.h"
#include "train/progress.h"

namespace colony::train {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

Json Number(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

}  // namespace

std::string ParamsHash(const std::vector<at::Tensor>& params) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& p : params) {
    const at::Tensor c = p.detach().contiguous();
    const auto* bytes = static_cast<const uint8_t*>(c.data_ptr());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

class Trainer::Impl {
 public:
  Impl(TrainerOptions options, EventSink events)
      : o_(std::move(options)), events_(std::move(events)) {}

  Status Init() {
    at::set_num_threads(o_.threads);
    const auto mode = o_.collaborative.mode;
    if (mode != averaging::Mode::kNode && o_.initial_peers.empty()) {
      return InvalidArgument(
          "client-mode and auxiliary peers join an existing swarm: give "
          "initial peers");
    }
    const auto t0 = Clock::now();
    COLONY_ASSIGN_OR_RETURN(o_.task.device, model::ParseDevice(o_.device));
    auto task = o_.make_task ? o_.make_task(o_.task) : Task::Create(o_.task);
    if (!task.ok()) return task.status().WithContext("preparing the task");
    task_ = std::move(*task);
    const double prepare_seconds = Since(t0);

    dht::NodeOptions node_options;
    node_options.initial_peers = o_.initial_peers;
    node_options.relays = o_.relays;
    for (const std::string& text : o_.announce) {
      COLONY_ASSIGN_OR_RETURN(auto announced, Multiaddr::Parse(text));
      node_options.announce.push_back(std::move(announced));
    }
    node_options.validators = o_.dht_validators;
    if (node_options.validators.empty()) {
      std::vector<dht::KeyFamily> families = averaging::AveragingKeyFamilies();
      families.push_back(ProgressFamily());
      families.push_back(RunsFamily());
      node_options.validators = {std::make_shared<dht::KeyFamilyValidator>(std::move(families))};
    }
    if (mode == averaging::Mode::kClient || !o_.relays.empty()) {
      node_options.dht.client_mode = true;
    } else {
      COLONY_ASSIGN_OR_RETURN(auto listen, Multiaddr::Parse(o_.listen));
      node_options.listen = {listen};
    }
    node_options.host.access = o_.access;
    auto node =
        dht::Node::Start(o_.identity ? std::move(*o_.identity) : KeyPair::Generate(), node_options);
    if (!node.ok()) return node.status().WithContext("joining the DHT");
    node_ = std::move(*node);

    COLONY_RETURN_IF_ERROR(task_->Connect(*node_));
    // With offload_optimizer, the optimizer steps host copies of a GPU model's parameters
    // (device_mirror.h); else the parameters themselves, wherever they are.
    std::vector<at::Tensor> task_params = task_->Parameters();
    COLONY_RETURN_IF_ERROR(DeviceMirror::Check(task_params).WithContext("the task's model"));
    mirror_ = std::make_unique<DeviceMirror>(std::move(task_params), o_.offload_optimizer);
    params_ = mirror_->master();
    COLONY_ASSIGN_OR_RETURN(auto inner, MakeOptimizer(o_.optimizer, params_, o_.optimizer_config));
    std::shared_ptr<torch::optim::Optimizer> optimizer = std::move(inner);
    CollaborativeOptions co = o_.collaborative;
    co.interrupt = o_.stop;
    if (o_.testing.nan_gradients_every > 0) co.testing.unchecked_local_gradients = true;
    if (co.audit_targets > 0) {
      if (!task_->NextBatchIndex()) {
        return InvalidArgument(
            fmt::format("audits recompute other peers' batches, which the {} task cannot "
                        "(fashion-mnist and lm can)",
                        o_.task.task));
      }
      // The run, not the peer, picks its data (audit.h).
      task_->DrawDataByEpoch([run = o_.collaborative.run_id, peer = node_->peer_id()](
                                 int64_t epoch) { return AuditDataSeed(run, peer, epoch); });
      co.audit_data.batch_size = o_.task.batch_size;
      // On the averager's compute pool, while this peer's Step() waits for its round.
      co.audit_data.compute_batch = [this](uint64_t seed, int64_t batch_size,
                                           int64_t index) -> Result<int64_t> {
        COLONY_ASSIGN_OR_RETURN(int64_t n, task_->ComputeBatchOf(seed, batch_size, index));
        mirror_->PullGradients();
        return n;
      };
    }
    COLONY_ASSIGN_OR_RETURN(opt_, CollaborativeOptimizer::Create(*node_, params_, optimizer, co));

    Json ready = {{"event", "ready"},
                  {"peer", node_->peer_id().ToString()},
                  {"prepare_seconds", prepare_seconds},
                  {"device", o_.task.device.str()},
                  {"offload_optimizer", mirror_->offloaded()},
                  {"model", task_->Describe()}};
    Json addrs = Json::array();
    for (const auto& m : node_->VisibleAddresses()) addrs.push_back(m.ToString());
    ready["addrs"] = addrs;
    events_(ready);
    COLONY_LOG_INFO("train: peer {} ready ({} parameters, prepared in {:.1f} s){}",
                    node_->peer_id().ToString(), ready["model"]["parameters"].dump(),
                    prepare_seconds, addrs.empty() ? "" : "; listening on " + addrs[0].dump());
    return Status::Ok();
  }

  bool Stopping() const { return o_.stop != nullptr && o_.stop->load(); }

  Result<Json> Run() {
    // Resume: a local checkpoint first, then the swarm's state if the swarm is ahead.
    if (!o_.checkpoint.empty() && std::filesystem::exists(o_.checkpoint)) {
      Status st = opt_->LoadCheckpoint(o_.checkpoint);
      if (!st.ok()) return st.WithContext("loading checkpoint " + o_.checkpoint);
      mirror_->PushParameters();
      COLONY_LOG_INFO("train: resumed from {} at epoch {}", o_.checkpoint, opt_->local_epoch());
    }
    if (!o_.metrics.empty()) {
      metrics_.open(o_.metrics, std::ios::app);
      if (!metrics_) return InvalidArgument("could not open the metrics file " + o_.metrics);
    }
    if (o_.collaborative.mode == averaging::Mode::kAux) return RunAuxiliary();
    COLONY_RETURN_IF_ERROR(Join());
    mirror_->PushParameters();  // Join may have downloaded the swarm's state
    return Train();
  }

  CollaborativeOptimizer& optimizer() { return *opt_; }
  Task& task() { return *task_; }
  dht::Node& node() { return *node_; }

 private:
  Result<Json> RunAuxiliary() {
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                           o_.max_seconds > 0 ? o_.max_seconds : 1e9));
    Status st = opt_->RunAuxiliary([&] { return Stopping() || Clock::now() >= deadline; });
    if (!st.ok()) return st;
    Json done = {{"event", "done"}, {"ok", true}};
    events_(done);
    return done;
  }

  // Start together (min_peers), stand by (join_at_epoch), or catch up with a running swarm.
  Status Join() {
    if (o_.min_peers > 1) {
      Status st = opt_->WaitForPeers(o_.min_peers, std::chrono::seconds(120));
      if (!st.ok() && !Stopping()) {
        return st.WithContext(
            "waiting 120 s for the peers the run starts with; check that the "
            "others use the same run id and initial peers");
      }
    }
    if (o_.join_at_epoch > 0) {
      const auto deadline = Clock::now() + std::chrono::minutes(30);
      while (opt_->global().epoch < o_.join_at_epoch && !Stopping() && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the tracker refreshes
      }
      if (opt_->global().epoch < o_.join_at_epoch && !Stopping()) {
        return DeadlineExceeded(fmt::format("run '{}' did not reach epoch {} within 30 min",
                                            o_.collaborative.run_id, o_.join_at_epoch));
      }
    }
    // Join a run in progress: wait briefly for the swarm's view, then catch up.
    GlobalProgress g = opt_->global();
    for (int i = 0; i < 3 && g.fetched_at == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the tracker's first fetch
      g = opt_->global();
    }
    if (g.epoch > opt_->local_epoch()) {
      Status st = opt_->LoadStateFromPeers();
      if (!st.ok()) {
        COLONY_LOG_WARN(
            "train: the swarm is at epoch {} but its state could not be downloaded ({}); "
            "starting from epoch {}",
            g.epoch, st.ToString(), opt_->local_epoch());
      }
    }
    return Status::Ok();
  }

  bool Done() const {
    return Stopping() || (o_.max_epochs > 0 && opt_->local_epoch() >= o_.max_epochs) ||
           (o_.max_seconds > 0 && Since(start_) >= o_.max_seconds) ||
           (o_.stop_at > 0 && dht::Now() >= o_.stop_at);
  }

  // The task's held-out loss at the optimizer's epoch.
  double Evaluate() {
    task_->SetEpoch(opt_->local_epoch());
    return task_->Evaluate();
  }

  Result<Json> Train() {
    if (o_.eval_every > 0) {
      events_({{"event", "eval"}, {"epoch", opt_->local_epoch()}, {"eval_loss", Evaluate()}});
    }
    start_ = Clock::now();
    last_progress_ = start_;
    epoch_start_ = start_;
    const int64_t first_epoch = opt_->local_epoch();
    while (!Done()) {
      task_->SetEpoch(opt_->local_epoch());
      const int64_t data_index = task_->NextBatchIndex().value_or(-1);
      const Result<Task::Batch> batch = task_->TrainBatch();
      if (!batch.ok()) {
        // The swarm could not compute this batch (moe-lm: no expert answered): try the next
        // one after a pause, and give up after kMaxFailedBatches in a row.
        if (++failed_batches_ >= kMaxFailedBatches) {
          return batch.status().WithContext(
              fmt::format("{} batches in a row failed; the last", failed_batches_));
        }
        COLONY_LOG_WARN("train: batch failed ({} in a row): {}", failed_batches_,
                        batch.status().ToString());
        std::this_thread::sleep_for(std::chrono::seconds(1));
        continue;
      }
      failed_batches_ = 0;
      mirror_->PullGradients();
      const Task::Batch& b = *batch;
      ++batches_;
      if (o_.batch_delay_ms > 0) {
        std::this_thread::sleep_for(
            std::chrono::microseconds(static_cast<int64_t>(o_.batch_delay_ms * 1000)));
      }
      if (o_.testing.nan_gradients_every > 0 && batches_ % o_.testing.nan_gradients_every == 0) {
        for (auto& p : params_) {
          if (p.grad().defined()) p.mutable_grad().fill_(std::numeric_limits<float>::quiet_NaN());
        }
      }
      if (std::isfinite(b.loss)) {
        loss_sum_ += b.loss;
        ++loss_count_;
        // What monitors show: the mean over this epoch's batches so far.
        opt_->ReportLoss(loss_sum_ / static_cast<double>(loss_count_));
      }
      COLONY_ASSIGN_OR_RETURN(StepReport r, opt_->Step(b.samples, data_index));
      if (opt_->ParametersChanged(r)) mirror_->PushParameters();
      if (r.stepped || r.loaded_state) OnStep(r);
      if (o_.progress_interval > 0 && Since(last_progress_) >= o_.progress_interval) {
        last_progress_ = Clock::now();
        Progress();
      }
    }
    return Finish(first_epoch);
  }

  void OnStep(const StepReport& r) {
    const double took = Since(epoch_start_);
    epoch_start_ = Clock::now();
    epoch_seconds_ = epoch_seconds_ == 0 ? took : 0.7 * epoch_seconds_ + 0.3 * took;
    last_loss_ = loss_count_ > 0 ? loss_sum_ / static_cast<double>(loss_count_) : std::nan("");
    loss_sum_ = 0;
    loss_count_ = 0;
    const bool eval = o_.eval_every > 0 && opt_->local_epoch() % o_.eval_every == 0;
    const auto g = opt_->global();
    const auto c = opt_->counters();
    Json j = {
        {"event", "step"},
        {"time", dht::Now()},
        {"elapsed", Since(start_)},
        {"epoch", opt_->local_epoch()},
        {"loss", Number(last_loss_)},
        // The rate of the next step (the inner optimizer's with DiLoCo).
        {"lr", o_.optimizer_config.lr * o_.collaborative.lr_schedule.Factor(opt_->local_epoch())},
        {"realized_batch", r.realized_batch},
        {"group_size", r.group_size},
        {"averaged", r.averaged},
        {"loaded_state", r.loaded_state},
        {"samples", c.local_samples},
        {"samples_per_second", opt_->samples_per_second()},
        {"swarm_samples_per_second", g.samples_per_second},
        {"peers", g.num_peers},
        {"skipped_batches", c.skipped_batches},
        {"missed_rounds", c.missed_rounds},
        {"state_loads", c.state_loads},
        {"bytes_sent", c.bytes_sent},
        {"bytes_received", c.bytes_received}};
    if (eval) j["eval_loss"] = Evaluate();
    if (!r.note.empty()) j["note"] = r.note;
    if (!r.banned.empty()) j["banned"] = r.banned;
    events_(j);
    if (metrics_)
      metrics_ << j.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n" << std::flush;
    if (!o_.checkpoint.empty() && o_.checkpoint_every > 0 &&
        opt_->local_epoch() % o_.checkpoint_every == 0) {
      Status st = opt_->SaveCheckpoint(o_.checkpoint);
      if (!st.ok()) COLONY_LOG_WARN("train: checkpoint failed: {}", st.ToString());
      mirror_->PushParameters();  // saving applies a delayed round still in flight
    }
  }

  void Progress() {
    const auto g = opt_->global();
    const auto c = opt_->counters();
    Json j = {{"event", "progress"},
              {"epoch", opt_->local_epoch()},
              {"swarm_epoch", g.epoch},
              {"loss",
               Number(loss_count_ > 0 ? loss_sum_ / static_cast<double>(loss_count_) : last_loss_)},
              {"samples_per_second", opt_->samples_per_second()},
              {"swarm_samples_per_second", g.samples_per_second},
              {"peers", g.num_peers},
              {"eta_seconds", Number(g.eta_seconds)},
              {"bytes_sent", c.bytes_sent},
              {"bytes_received", c.bytes_received}};
    if (o_.max_epochs > 0 && epoch_seconds_ > 0) {
      j["done_in_seconds"] =
          epoch_seconds_ * static_cast<double>(o_.max_epochs - opt_->local_epoch());
    }
    events_(j);
  }

  Result<Json> Finish(int64_t first_epoch) {
    // A delayed round still in flight belongs to the final model (what the report's hash, the
    // evaluation, the checkpoint and the saved model all show), on its device too.
    opt_->FinishPendingStep();
    mirror_->PushParameters();
    const double final_eval = Evaluate();
    const auto c = opt_->counters();
    Json done = {{"event", "done"},
                 {"ok", true},
                 {"epoch", opt_->local_epoch()},
                 {"epochs_trained", opt_->local_epoch() - first_epoch},
                 {"batches", batches_},
                 {"samples", c.local_samples},
                 {"seconds", Since(start_)},
                 {"final_loss", Number(last_loss_)},
                 {"eval_loss", final_eval},
                 {"skipped_batches", c.skipped_batches},
                 {"failed_rounds", c.failed_rounds},
                 {"missed_rounds", c.missed_rounds},
                 {"dropped_samples", c.dropped_samples},
                 {"state_loads", c.state_loads},
                 {"bytes_sent", c.bytes_sent},
                 {"bytes_received", c.bytes_received},
                 {"params_hash", ParamsHash(params_)},
                 {"model", task_->Describe()}};
    if (!o_.checkpoint.empty()) {
      Status st = opt_->SaveCheckpoint(o_.checkpoint);
      if (!st.ok()) COLONY_LOG_WARN("train: checkpoint failed: {}", st.ToString());
    }
    if (!o_.save_model.empty()) {
      Status st = task_->Save(o_.save_model);
      if (!st.ok()) return st.WithContext("saving the model to " + o_.save_model);
      done["saved_model"] = o_.save_model;
    }
    if (!o_.sample_prompt.empty()) {
      COLONY_ASSIGN_OR_RETURN(done["sample"], task_->Sample(o_.sample_prompt, o_.sample_tokens));
    }
    events_(done);
    return done;
  }

  TrainerOptions o_;
  EventSink events_;
  std::unique_ptr<Task> task_;
  std::unique_ptr<dht::Node> node_;
  std::unique_ptr<DeviceMirror> mirror_;
  std::vector<at::Tensor> params_;  // what the optimizer steps: mirror_->master()
  std::unique_ptr<CollaborativeOptimizer> opt_;
  std::ofstream metrics_;
  Clock::time_point start_, last_progress_, epoch_start_;
  double loss_sum_ = 0;
  int64_t loss_count_ = 0;
  double last_loss_ = std::nan("");
  int64_t batches_ = 0;
  static constexpr int kMaxFailedBatches = 10;
  int failed_batches_ = 0;    // in a row
  double epoch_seconds_ = 0;  // moving average of the time per global step
};

Result<std::unique_ptr<Trainer>> Trainer::Create(TrainerOptions options, EventSink events) {
  if (!events) events = [](const Json&) {};
  auto impl = std::make_unique<Impl>(std::move(options), std::move(events));
  COLONY_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;
Result<Json> Trainer::Run() { return impl_->Run(); }
CollaborativeOptimizer& Trainer::optimizer() { return impl_->optimizer(); }
Task& Trainer::task() { return impl_->task(); }
dht::Node& Trainer::node() { return impl_->node(); }

}  // namespace colony::train
