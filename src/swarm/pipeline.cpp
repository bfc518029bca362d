// A SWARM trainer's model (pipeline.h): local embeddings and head around the stages' blocks.
#include "swarm/pipeline.h"

#include <fmt/format.h>
#include <sodium.h>

#include <exception>

#include "model/llama.h"
#include "serve/generation.h"
#include "serve/remote_sequential.h"
#include "serve/routing.h"
#include "serve/wire.h"

namespace colony::swarm {

struct Pipeline::Impl {
  serve::ClientModel head{nullptr};
  std::shared_ptr<serve::SequenceManager> manager;
  std::unique_ptr<serve::RemoteSequential> blocks;

  at::Tensor Logits(const at::Tensor& inputs) {
    return head->Head(blocks->forward(head->Embed(inputs)));
  }
  void ZeroGrads() {
    for (auto& p : head->parameters()) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
  }
};

Result<std::unique_ptr<Pipeline>> Pipeline::Create(dht::Node& node, PipelineOptions options) {
  if (options.run.empty()) return InvalidArgument("a SWARM trainer needs the run's name");
  if (!serve::IsBoundaryCodec(options.boundary_codec)) {
    return InvalidArgument(
        fmt::format("boundary codec {} is not one of none, fp16, bf16 and blockwise8",
                    compression::CodecName(options.boundary_codec)));
  }
  auto impl = std::make_unique<Impl>();
  COLONY_ASSIGN_OR_RETURN(impl->head, serve::LoadClientModel(options.model_dir));
  impl->head->train();
  for (auto& p : impl->head->parameters()) p.set_requires_grad(true);
  serve::ClientOptions co;
  co.model_name = options.run;
  co.num_blocks = impl->head->config().num_layers;
  co.request_timeout = options.request_timeout;
  co.max_attempts = options.max_attempts;
  co.ban_base = options.avoid_failed_for;
  co.ban_max = std::max(options.avoid_failed_for, co.ban_max);
  co.retry_backoff = std::chrono::milliseconds(200);
  co.refresh_period = std::chrono::milliseconds(2'000);  // new stage peers get traffic soon
  co.stochastic_routing = true;
  co.routing_seed = options.routing_seed;
  co.boundary_codec = options.boundary_codec;
  impl->manager = std::make_shared<serve::SequenceManager>(node, co);
  impl->blocks = std::make_unique<serve::RemoteSequential>(impl->manager);
  return std::unique_ptr<Pipeline>(new Pipeline(std::move(impl)));
}

Pipeline::Pipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pipeline::~Pipeline() = default;

uint64_t Pipeline::NewMicrobatchId() {
  uint64_t id = 0;
  while (id == 0) randombytes_buf(&id, sizeof(id));
  return id;
}

Result<double> Pipeline::TrainStep(const at::Tensor& tokens, uint64_t microbatch) {
  if (tokens.dim() != 2 || tokens.size(1) < 2) {
    return InvalidArgument("a microbatch is [batch, tokens + 1] token ids");
  }
  if (microbatch == 0) return InvalidArgument("a microbatch id is not 0 (NewMicrobatchId)");
  impl_->manager->SetMicrobatch(microbatch);
  const at::Tensor inputs = tokens.slice(1, 0, tokens.size(1) - 1);
  const at::Tensor targets = tokens.slice(1, 1, tokens.size(1));
  try {
    at::Tensor loss = model::LanguageModelLoss(impl_->Logits(inputs), targets);
    loss.backward();
    return loss.item<double>();
  } catch (const std::exception& e) {
    impl_->ZeroGrads();
    return Unavailable(fmt::format("the microbatch failed: {}", e.what()));
  }
}

Result<double> Pipeline::Loss(const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  const at::Tensor inputs = tokens.slice(1, 0, tokens.size(1) - 1);
  const at::Tensor targets = tokens.slice(1, 1, tokens.size(1));
  COLONY_ASSIGN_OR_RETURN(at::Tensor hidden, impl_->blocks->Forward(impl_->head->Embed(inputs)));
  return model::LanguageModelLoss(impl_->head->Head(hidden), targets).item<double>();
}

std::vector<at::Tensor> Pipeline::parameters() { return impl_->head->parameters(); }
void Pipeline::SetEpoch(int64_t epoch) { impl_->manager->SetEpoch(epoch); }
const model::LlamaConfig& Pipeline::config() const { return impl_->head->config(); }
serve::SequenceManager& Pipeline::manager() { return *impl_->manager; }

}  // namespace colony::swarm
