// The "swarm-lm" task (lm_task.h).
#include "swarm/lm_task.h"

#include <fmt/format.h>

#include <limits>
#include <optional>

#include "core/log.h"
#include "model/checkpoint.h"
#include "swarm/pipeline.h"
#include "train/lm_data.h"

namespace colony::swarm {
namespace {

class SwarmLmTask final : public train::Task {
 public:
  static Result<std::unique_ptr<SwarmLmTask>> Create(const train::TaskOptions& a) {
    if (a.swarm_run.empty() || a.swarm_model.empty()) {
      return InvalidArgument(
          "swarm-lm needs the run's name and its initial checkpoint (colony swarm-train init)");
    }
    if (!a.device.is_cpu()) {
      return Unimplemented(fmt::format(
          "swarm-lm trainers compute on the CPU only for now; got --device {}", a.device.str()));
    }
    auto t = std::unique_ptr<SwarmLmTask>(new SwarmLmTask());
    t->options_ = a;
    COLONY_ASSIGN_OR_RETURN(t->data_, train::PrepareLmData(a));
    COLONY_ASSIGN_OR_RETURN(t->config_, model::LoadLlamaConfig(a.swarm_model));
    if (t->config_.vocab_size != t->data_.tokenizer->vocab_size()) {
      return InvalidArgument(fmt::format(
          "the checkpoint {} has a vocabulary of {} tokens but the tokenizer for --vocab {} has "
          "{}: use the vocabulary size the checkpoint was made with",
          a.swarm_model, t->config_.vocab_size, a.vocab_size, t->data_.tokenizer->vocab_size()));
    }
    return t;
  }

  Status Connect(dht::Node& node) override {
    COLONY_ASSIGN_OR_RETURN(auto codec, compression::ParseCodec(options_.swarm_boundary_codec));
    COLONY_ASSIGN_OR_RETURN(pipeline_, Pipeline::Create(node, {.run = options_.swarm_run,
                                                               .model_dir = options_.swarm_model,
                                                               .routing_seed = options_.seed + 1,
                                                               .boundary_codec = codec}));
    return Status::Ok();
  }

  std::vector<at::Tensor> Parameters() override {
    return pipeline_ ? pipeline_->parameters() : std::vector<at::Tensor>{};
  }

  void SetEpoch(int64_t epoch) override {
    if (pipeline_) pipeline_->SetEpoch(epoch);
  }

  Result<Batch> TrainBatch() override {
    if (!pipeline_) return FailedPrecondition("swarm-lm: the task was not connected to the swarm");
    if (!pending_) {
      pending_ = train::TokensToTensor(data_.stream->Next());
      pending_id_ = Pipeline::NewMicrobatchId();
    }
    COLONY_ASSIGN_OR_RETURN(double loss, pipeline_->TrainStep(*pending_, pending_id_));
    const int64_t samples = pending_->size(0);
    pending_.reset();
    return Batch{loss, samples};
  }

  double Evaluate() override {
    if (!pipeline_) return std::numeric_limits<double>::quiet_NaN();
    auto loss = pipeline_->Loss(data_.valid);
    if (!loss.ok()) {
      COLONY_LOG_WARN("swarm-lm: no held-out loss: {}", loss.status().ToString());
      return std::numeric_limits<double>::quiet_NaN();
    }
    return *loss;
  }

  nlohmann::json Describe() override {
    int64_t local = 0;
    for (const auto& p : Parameters()) local += p.numel();
    return {{"task", "swarm-lm"},
            {"parameters", config_.NumParameters()},
            {"trainer_parameters", local},
            {"vocab_size", config_.vocab_size},
            {"hidden_size", config_.hidden_size},
            {"layers", config_.num_layers},
            {"boundary_codec", options_.swarm_boundary_codec},
            {"run", options_.swarm_run}};
  }

 private:
  SwarmLmTask() = default;
  train::TaskOptions options_;
  train::LmData data_;
  model::LlamaConfig config_;
  std::unique_ptr<Pipeline> pipeline_;
  std::optional<at::Tensor> pending_;  // a microbatch that failed, tried again next
  uint64_t pending_id_ = 0;            // its id, the same in every try
};

}  // namespace

Result<std::unique_ptr<train::Task>> MakeSwarmLmTask(const train::TaskOptions& options) {
  COLONY_ASSIGN_OR_RETURN(auto t, SwarmLmTask::Create(options));
  return std::unique_ptr<train::Task>(std::move(t));
}

}  // namespace colony::swarm
