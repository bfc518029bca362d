// Pipeline: a SWARM trainer's model (Ryabinin et al., "SWARM Parallelism"). The trainer holds the
// embeddings, the final norm and the LM head (loaded from the run's initial checkpoint); the
// blocks live on the stage servers (stage.h). Each microbatch goes through one peer per stage,
// drawn in proportion to the throughput this trainer measured of it (stochastic wiring, a new
// peer tried at once), and its backward through one peer per stage again, maybe another one (the
// stages recompute from the inputs they get). A peer that fails or misses its deadline is avoided
// for avoid_failed_for and the call goes to another peer of its stage, so a microbatch is not
// lost while its stage has a live peer. Requests carry the trainer's epoch (SetEpoch).
//
//   auto pipeline = swarm::Pipeline::Create(node, {.run = "run1", .model_dir = "init"});
//   (*pipeline)->SetEpoch(optimizer->local_epoch());
//   auto loss = (*pipeline)->TrainStep(tokens);  // gradients in parameters() and on the stages
#pragma once

#include <ATen/Tensor.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "core/status.h"
#include "dht/node.h"
#include "model/config.h"

namespace colony::serve {
class SequenceManager;
}

namespace colony::swarm {

struct PipelineOptions {
  std::string run;                                     // the stage servers' model name
  std::filesystem::path model_dir;                     // config.json, embeddings, norm and head
  std::chrono::milliseconds request_timeout{120'000};  // one stage's forward or backward
  // How long a failed stage peer is avoided (about its DHT record's lifetime).
  std::chrono::milliseconds avoid_failed_for{20'000};
  int max_attempts = 8;  // calls per stage and microbatch before the microbatch fails
  uint64_t routing_seed = 0;
  // How hidden states and their gradients cross the stage boundaries (serve/wire.h
  // kBoundaryCodecs): kBlockwise8 sends about a quarter of float32's bytes, with an error of at
  // most half a step of 1/127 of each 256 values' largest magnitude.
  compression::Codec boundary_codec = compression::Codec::kNone;
};

class Pipeline {
 public:
  static Result<std::unique_ptr<Pipeline>> Create(dht::Node& node, PipelineOptions options);
  ~Pipeline();

  // tokens [B, T + 1] int64: the next-token loss of the whole model on them, and its backward:
  // the gradients of parameters() accumulate here, the stages' on the stages. An error (a stage
  // with no live peer) leaves parameters()' gradients zero. `microbatch` names it to the stages
  // (NewMicrobatchId()); a microbatch tried again after an error keeps its id, so that a stage
  // that took its gradient in the failed try does not take it again (each stage counts it once).
  Result<double> TrainStep(const at::Tensor& tokens, uint64_t microbatch);
  // TrainStep with a new id.
  Result<double> TrainStep(const at::Tensor& tokens) {
    return TrainStep(tokens, NewMicrobatchId());
  }
  // A random microbatch id (64 bits, never 0).
  static uint64_t NewMicrobatchId();
  // The same loss without gradients.
  Result<double> Loss(const at::Tensor& tokens);
  // The trainer's parameters: embeddings, final norm and the head when it is not tied.
  std::vector<at::Tensor> parameters();
  void SetEpoch(int64_t epoch);
  const model::LlamaConfig& config() const;
  serve::SequenceManager& manager();

  struct Impl;

 private:
  explicit Pipeline(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace colony::swarm
