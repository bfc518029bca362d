// Trainer: one peer of a collaborative training run, end to end, as `colony train` runs it: a task
// (task.h), a DHT node, an optimizer wrapped in a CollaborativeOptimizer, and the loop that feeds
// it batches, evaluates, checkpoints and reports — so that commands, benchmarks and tests share
// one loop rather than each writing their own.
//
//   train::TrainerOptions o;
//   o.task = {.task = "fashion-mnist", .batch_size = 32, .seed = 1};
//   o.collaborative = {.run_id = "run1", .target_batch_size = 512};
//   o.initial_peers = {"/ip4/10.0.0.5/tcp/31337/p2p/12D3KooW..."};
//   o.max_epochs = 20;
//   auto trainer = train::Trainer::Create(o, [](const nlohmann::json& event) { ... });
//   auto done = (*trainer)->Run();  // the "done" event
//
// Events (JSON objects with an "event" field), in order: "ready" (peer id, addresses, model),
// "eval" (the initial held-out loss, with eval_every), one "step" per global step or state load
// (epoch, loss, realized batch, group, counters, traffic; the held-out loss every eval_every
// epochs), "progress" every progress_interval seconds (for people), and "done" (final loss,
// counters, a hash of the parameters that is equal exactly when peers hold the same model).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "dht/validation.h"
#include "net/access_control.h"
#include "train/collaborative.h"
#include "train/optimizers.h"
#include "train/task.h"

namespace colony::train {

struct TrainerOptions {
  TaskOptions task;
  // Builds the task; unset: Task::Create. Tasks of higher layers (moe::MakeMoeLmTask) come in
  // this way, so that train links none of them.
  std::function<Result<std::unique_ptr<Task>>(const TaskOptions&)> make_task = {};
  int threads = 1;  // LibTorch intra-op threads
  // Where the model computes: cpu, cuda, cuda:N or auto (model/device.h). On a GPU the
  // collaborative optimizer accumulates, checks and steps there; with offload_optimizer it steps
  // float32 host copies of the parameters instead (train/device_mirror.h), which leaves the
  // GPU's memory to the model at the price of two copies over the bus per batch and step.
  std::string device = "cpu";
  bool offload_optimizer = false;
  // The swarm. Client and auxiliary peers (collaborative.mode) join an existing swarm.
  std::vector<std::string> initial_peers = {};  // multiaddrs; none: start a new swarm
  std::string listen = "/ip4/127.0.0.1/tcp/0";
  std::vector<std::string> announce = {};  // multiaddrs where others should dial it instead
  std::vector<std::string> relays = {};    // behind NAT: accept connections through these
  // The peer's identity (null: a new random one; taken, moved from, when the trainer joins the
  // swarm) and, in a private swarm, the access policy its host checks every connection against
  // (net/access_control.h; the command builds both from its flags, and keeps the token fresh on
  // node() once the trainer is created).
  std::shared_ptr<KeyPair> identity = nullptr;
  std::shared_ptr<net::AccessControl> access = nullptr;
  // The record rules the peer's DHT node enforces for every layer sharing the swarm (the
  // `colony` commands pass all of them); empty: those of training and averaging only.
  std::vector<std::shared_ptr<const dht::RecordValidator>> dht_validators = {};
  // Optimization: the inner optimizer (optimizers.h names) and the collaborative options.
  std::string optimizer = "adam";
  OptimizerConfig optimizer_config = {};
  CollaborativeOptions collaborative = {};
  // The run.
  size_t min_peers = 0;            // > 1: wait for this many peers and start together
  int64_t join_at_epoch = 0;       // > 0: stand by until the swarm reaches this epoch, then join
  int64_t max_epochs = 0;          // 0: no limit
  double max_seconds = 0;          // 0: no limit
  double stop_at = 0;              // wall clock (Unix seconds); 0: none
  int eval_every = 0;              // epochs between held-out evaluations; 0: only the final one
  std::string metrics = {};        // append one JSON line per step here
  std::string checkpoint = {};     // resume from this file when it exists; save to it at the end
  int checkpoint_every = 0;        // also save every this many epochs
  std::string save_model = {};     // lm: write the trained model here
  std::string sample_prompt = {};  // lm: sample text from this prompt at the end
  int64_t sample_tokens = 48;
  double progress_interval = 5;  // seconds between "progress" events; 0: none
  // Milliseconds to pause after each batch, as a slower device would.
  double batch_delay_ms = 0;
  // Set by a signal handler: the run stops at the next batch (or wait) and reports "done".
  const std::atomic<bool>* stop = nullptr;

  struct Testing {
    // Every Nth batch, overwrite the gradients with NaN before Step() (a broken peer; with it,
    // the collaborative optimizer sends them unchecked).
    int64_t nan_gradients_every = 0;
  } testing = {};
};

class Trainer {
 public:
  using EventSink = std::function<void(const nlohmann::json&)>;
  // Prepares the task, joins the DHT and creates the optimizers; emits "ready".
  static Result<std::unique_ptr<Trainer>> Create(TrainerOptions options, EventSink events);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains until a stop condition; returns the "done" event (also emitted).
  Result<nlohmann::json> Run();

  CollaborativeOptimizer& optimizer();
  Task& task();
  // The peer's DHT node (and host), alive as long as the trainer.
  dht::Node& node();

  class Impl;

 private:
  explicit Trainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// FNV-1a over the parameters' bytes, as 16 hex digits.
std::string ParamsHash(const std::vector<at::Tensor>& params);

}  // namespace colony::train
