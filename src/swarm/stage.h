// A SWARM stage server (`colony swarm-train stage`): a BlockServer (serve/server.h) that hosts
// blocks [first, last) of the model being trained and trains them (stage_training.h). Stage
// servers announce themselves like Petals' block servers, under the run's name, so trainers
// find and route through them (swarm/pipeline.h); the peers of one block range form the stage
// and average under "<run>.stage<first>".
//
//   auto stage = swarm::Stage::Start(node, {.run = "run1", .model_dir = "init",
//                                           .first_block = 0, .last_block = 2});
//
// At start a peer takes the stage's state (parameters, optimizer state and epoch) from a peer of
// the stage that is ahead of the checkpoint it loaded, so that a peer joining a running swarm
// trains from where the stage is.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "core/status.h"
#include "dht/node.h"
#include "serve/server.h"
#include "swarm/stage_training.h"

namespace colony::swarm {

struct StageOptions {
  std::string run;                  // the training run (the servers' model name)
  std::filesystem::path model_dir;  // the model's initial checkpoint (Hugging Face format)
  int64_t first_block = 0, last_block = 0;
  // The server's limits, throughput announcements and compute threads (model_dir, model_name,
  // blocks and training are set from the fields above).
  serve::ServerOptions server = {};
  // The stage's training: collaborative.run_id is set to StageRunId(run, first_block) and
  // trainers_run to run.
  StageTrainingOptions training = {};
};

// "<run>.stage<first>": the run of a stage's peers.
std::string StageRunId(const std::string& run, int64_t first_block);

class Stage {
 public:
  static Result<std::unique_ptr<Stage>> Start(dht::Node& node, StageOptions options);
  ~Stage();  // Shutdown()
  // Announces the server offline and leaves the stage. Idempotent.
  void Shutdown();
  serve::ServerStats server_stats() const;
  StageTrainingStats training_stats() const;
  // The stage's parameters (the live tensors; read them only while no request runs).
  const std::vector<at::Tensor>& parameters() const;

 private:
  Stage() = default;
  std::shared_ptr<StageTraining> training_;
  std::unique_ptr<serve::BlockServer> server_;
};

}  // namespace colony::swarm
