// StageTraining: what a SWARM stage server does with the blocks it trains (serve::BlockTraining).
// A backward accumulates the blocks' gradients (weighted by the microbatch's sequences) in a
// CollaborativeOptimizer whose run is the stage's ("<run>.stage<first>"), driven by the trainers'
// epochs: when the trainers have stepped past the stage's epoch e, the stage ends e: its peers
// average what they accumulated (those that got none of e's microbatches join with weight 1e-30)
// and all apply the same optimizer step. So every peer of a stage that took part in every round
// holds the same parameters, and a backward may run on another peer than its forward.
//
// When the trainers have stepped past e is read from their owner-signed progress records
// ("<run>.progress", fetched by a refresher thread every refresh_period, at once when asked):
// more than half of the live trainers must report a later epoch. Nothing else moves a stage's
// epoch: not a request's tag (a tag ahead of the stage only makes it look again, waiting up to
// boundary_wait for the records, so that the first microbatch of an epoch meets the parameters
// of that epoch; tags the records refuted are not waited for again for a while, doubling up to
// 5 min), nor records in the stage's own run (a peer of the stage joins a round or takes the
// stage's state only once the trainers' records say the epoch ended). A watcher thread ends
// epochs for peers that get no request and keeps this peer's record alive.
//
//   auto training = StageTraining::Create(node, params, {.trainers_run = "r",
//                                         .collaborative = {.run_id = "r.stage0"}});
//   (*training)->Run({.epoch = e, .samples = b, .backward = true}, compute);
//
// A backward's gradient is taken once per microbatch id (microbatch_ledger.h): a repeat of a
// microbatch this peer took, a try it fenced (serve.fence: the trainer tried it again), and a
// replay (the trainer knows another peer took it) are computed but their gradients dropped.
//
// A backward without a tag is refused, and so is a request more than max_staleness epochs behind
// the stage (FailedPrecondition): its trainer fell behind and catches up with its own swarm.
// Trainers are trusted with their gradients, as in any collaborative run (Byzantine-tolerant
// aggregation is not applied to stages yet), and with their number (a private swarm's access
// tokens keep strangers from adding trainers, docs/private-swarms.md).
#pragma once

#include <ATen/Tensor.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "dht/node.h"
#include "serve/server.h"
#include "swarm/microbatch_ledger.h"
#include "train/collaborative.h"
#include "train/optimizers.h"

namespace colony::swarm {

struct StageTrainingOptions {
  // The trainers' run: their progress records decide when the stage's epochs end.
  std::string trainers_run = {};
  // run_id: the stage's run (its peers' progress and averaging keys). Synchronous gradient
  // rounds; target_batch_size should be the trainers' (it only paces the progress records).
  train::CollaborativeOptions collaborative = {};
  std::string optimizer = "adam";  // train/optimizers.h names
  train::OptimizerConfig optimizer_config = {};
  // How often the watcher looks at the trainers' view (ending epochs, joining rounds), and how
  // often the refresher fetches the trainers' records when nothing asks for it sooner.
  std::chrono::milliseconds watch_period{100};
  std::chrono::milliseconds refresh_period{1'000};
  // How long a request tagged with a later epoch waits for the trainers' records to confirm it
  // (then it is computed with the stage's parameters as they are).
  std::chrono::milliseconds boundary_wait{2'000};
  int64_t max_staleness = 1;
};

struct StageTrainingStats {
  int64_t epoch = 0;
  uint64_t forwards = 0, backwards = 0;
  int64_t samples = 0;        // of the backwards accumulated
  uint64_t stale = 0;         // requests computed with parameters of another epoch than theirs
  uint64_t refused = 0;       // requests too stale, or whose compute failed
  uint64_t dropped = 0;       // backwards of microbatches taken here or elsewhere before
  uint64_t rounds = 0;        // epochs ended here
  uint64_t averaged = 0;      // of them, those averaged with other peers of the stage
  uint64_t state_loads = 0;   // catching up with the stage
  uint64_t view_fetches = 0;  // reads of the trainers' progress records
};

class StageTraining final : public serve::BlockTraining {
 public:
  // `params` are the blocks' parameters (float32, contiguous, CPU); the node must outlive this.
  static Result<std::shared_ptr<StageTraining>> Create(dht::Node& node,
                                                       std::vector<at::Tensor> params,
                                                       StageTrainingOptions options);
  ~StageTraining() override;  // Shutdown()
  Status Run(const serve::TrainingCall& call, const std::function<Status()>& compute) override;
  bool Fence(uint64_t microbatch, int64_t start, int64_t end, uint32_t attempt) override;
  // Takes the stage's state from a peer of the stage if the stage is ahead (a peer that joins).
  Status LoadStateFromPeers();
  // Stops the watcher and withdraws from the stage's rounds. Idempotent.
  void Shutdown();
  StageTrainingStats stats() const;
  const std::vector<at::Tensor>& parameters() const { return params_; }

 private:
  StageTraining(dht::Node& node, std::vector<at::Tensor> params, StageTrainingOptions options);
  void Watch();
  void RefreshLoop();
  // Ends the stage's epoch `epoch`, or takes the stage's state when the stage ended it without
  // this peer (mu_ held; only once the trainers are past it).
  void EndEpochLocked(int64_t epoch, const char* why);
  // Whether more than half of the live trainers report an epoch past `epoch` (the last fetch).
  bool TrainersPast(int64_t epoch);
  // A request tagged past `local`: asks for a fresh view and waits (at most boundary_wait) for
  // one that confirms it, unless tags were refuted lately. Called without mu_.
  void AwaitTrainers(int64_t local);

  std::vector<at::Tensor> params_;
  StageTrainingOptions options_;
  dht::Node& node_;
  MicrobatchLedger ledger_;             // its own lock: serve.fence reads it while a compute runs
  std::atomic<bool> interrupt_{false};  // ends the optimizer's waits at shutdown
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<train::CollaborativeOptimizer> opt_;
  mutable std::mutex mu_;  // the optimizer and the parameters' gradients
  StageTrainingStats stats_;
  std::atomic<int64_t> epoch_{0};  // opt_->local_epoch(), readable without mu_

  mutable std::mutex view_mu_;  // the trainers' epochs, as last fetched
  std::condition_variable view_cv_;
  std::vector<int64_t> trainer_epochs_;
  uint64_t view_version_ = 0;
  bool refresh_asked_ = false;
  std::chrono::steady_clock::time_point refuted_until_{};  // no waiting for a tag before then
  std::chrono::milliseconds refuted_for_{5'000};

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread watcher_, refresher_;
};

}  // namespace colony::swarm
