// A SWARM stage server (stage.h): a block server whose blocks train.
#include "swarm/stage.h"

#include <fmt/format.h>

#include "core/log.h"

namespace colony::swarm {

std::string StageRunId(const std::string& run, int64_t first_block) {
  return fmt::format("{}.stage{}", run, first_block);
}

Result<std::unique_ptr<Stage>> Stage::Start(dht::Node& node, StageOptions options) {
  if (options.run.empty()) return InvalidArgument("a stage needs the run's name");
  auto stage = std::unique_ptr<Stage>(new Stage());
  serve::ServerOptions so = options.server;
  so.model_dir = options.model_dir;
  so.model_name = options.run;
  so.first_block = options.first_block;
  so.last_block = options.last_block;
  StageTrainingOptions to = options.training;
  to.collaborative.run_id = StageRunId(options.run, options.first_block);
  to.trainers_run = options.run;
  Stage* raw = stage.get();
  so.make_training =
      [raw, &node,
       to](std::vector<at::Tensor> params) -> Result<std::shared_ptr<serve::BlockTraining>> {
    COLONY_ASSIGN_OR_RETURN(raw->training_, StageTraining::Create(node, std::move(params), to));
    // A peer that joins a running stage trains from where the stage is.
    Status st = raw->training_->LoadStateFromPeers();
    if (!st.ok()) COLONY_LOG_INFO("swarm: no state taken from the stage: {}", st.ToString());
    return std::shared_ptr<serve::BlockTraining>(raw->training_);
  };
  COLONY_ASSIGN_OR_RETURN(stage->server_, serve::BlockServer::Start(node, std::move(so)));
  return stage;
}

Stage::~Stage() { Shutdown(); }

void Stage::Shutdown() {
  // The training first: its interrupt ends a round or state download that a request on the
  // compute thread may be waiting for, which the server's shutdown would otherwise wait out.
  if (training_) training_->Shutdown();
  if (server_) server_->Shutdown();
}

serve::ServerStats Stage::server_stats() const { return server_->Stats(); }
StageTrainingStats Stage::training_stats() const { return training_->stats(); }
const std::vector<at::Tensor>& Stage::parameters() const { return training_->parameters(); }

}  // namespace colony::swarm
