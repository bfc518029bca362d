// StageTraining: what a SWARM stage server does with the blocks it trains (serve::BlockTraining).
// A backward accumulates the blocks' gradients (weighted by the microbatch's sequences) in a
// CollaborativeOptimizer whose run is the stage's ("<run>.stage<first>"), driven by the trainers'
// epochs: when the trainers have stepped past the stage's epoch e, the stage ends e: its peers
// average what they accumulated (those that got none of e's microbatches join with weight 1e-30)
// and all apply the same optimizer step. So every peer of a stage holds the same parameters, and
// a backward may run on another peer than its forward.
//
// When the trainers have stepped past e is read from their owner-signed progress records
// ("<run>.progress"): more than half of the live trainers must report a later epoch. Requests
// carry their trainer's epoch, but a tag is only a hint that makes the stage look (waiting up to
// boundary_wait for the records to confirm it, so that the first microbatch of an epoch meets the
// parameters of that epoch): one peer cannot move a stage past the other trainers by its tags or
// its own record. Peers that get no request follow the trainers' records and their stage's
// rounds (a watcher thread), and a peer that falls behind its stage takes the stage's state.
//
//   auto training = StageTraining::Create(node, params, {.trainers_run = "r",
//                                         .collaborative = {.run_id = "r.stage0"}});
//   (*training)->Run(epoch, batch, /*backward=*/true, [&] { ...; return Status::Ok(); });
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
  // How often a peer looks at its stage's progress for rounds that others started, and at the
  // trainers' records (every 3 periods) for epochs that ended.
  std::chrono::milliseconds watch_period{100};
  // How long a request tagged with a later epoch waits for the trainers' records to confirm it
  // (then it is computed with the stage's parameters as they are).
  std::chrono::milliseconds boundary_wait{2'000};
  int64_t max_staleness = 1;
};

struct StageTrainingStats {
  int64_t epoch = 0;
  uint64_t forwards = 0, backwards = 0;
  int64_t samples = 0;       // of the backwards accumulated
  uint64_t stale = 0;        // requests computed with parameters of another epoch than theirs
  uint64_t refused = 0;      // requests too stale, or whose compute failed
  uint64_t rounds = 0;       // epochs ended here
  uint64_t averaged = 0;     // of them, those averaged with other peers of the stage
  uint64_t state_loads = 0;  // catching up with the stage
};

class StageTraining final : public serve::BlockTraining {
 public:
  // `params` are the blocks' parameters (float32, contiguous, CPU); the node must outlive this.
  static Result<std::shared_ptr<StageTraining>> Create(dht::Node& node,
                                                       std::vector<at::Tensor> params,
                                                       StageTrainingOptions options);
  ~StageTraining() override;  // Shutdown()
  Status Run(int64_t epoch, int64_t samples, bool backward,
             const std::function<Status()>& compute) override;
  // Takes the stage's state from a peer of the stage if the stage is ahead (a peer that joins).
  Status LoadStateFromPeers();
  // Stops the watcher and withdraws from the stage's rounds. Idempotent.
  void Shutdown();
  StageTrainingStats stats() const;
  const std::vector<at::Tensor>& parameters() const { return params_; }

 private:
  StageTraining(dht::Node& node, std::vector<at::Tensor> params, StageTrainingOptions options);
  void Watch();
  // Ends the stage's epoch `epoch` (mu_ held).
  void EndEpochLocked(int64_t epoch, const char* why);
  // Whether more than half of the live trainers report an epoch past `epoch`, from a fetch of
  // their records at most `max_age` old (fetching again if older).
  bool TrainersPast(int64_t epoch, std::chrono::milliseconds max_age);

  std::vector<at::Tensor> params_;
  StageTrainingOptions options_;
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<train::CollaborativeOptimizer> opt_;
  mutable std::mutex mu_;  // the optimizer and the parameters' gradients
  StageTrainingStats stats_;
  dht::Node& node_;
  std::mutex view_mu_;  // the trainers' epochs, as last fetched
  std::vector<int64_t> trainer_epochs_;
  std::chrono::steady_clock::time_point fetched_{};
  std::chrono::steady_clock::time_point refuted_until_{};  // no waiting for a tag before then
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread watcher_;
};

}  // namespace colony::swarm
