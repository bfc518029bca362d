// Fine-tuning through a swarm of frozen remote blocks (Petals' prompt tuning), trained on the
// client: trainable prompt embeddings prepended to the input ("shallow"), or also added to the
// first positions before every remote block ("deep"; the servers return their gradients).
//
//   PromptTuned model(head, remote, {.prompt_length = 8, .deep = true});
//   torch::optim::Adam opt(model->TrainableParameters(), 1e-2);
//   at::Tensor loss = model->Loss(tokens);  // next-token loss on tokens [B, T]
//   loss.backward(); opt.step();
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "serve/client.h"
#include "serve/generation.h"

namespace colony::serve {

struct PromptTuningOptions {
  int64_t prompt_length = 8;
  bool deep = false;
  double init_std = 0.02;
};

class PromptTunedImpl : public torch::nn::Module {
 public:
  PromptTunedImpl(ClientModel head, std::shared_ptr<RemoteSequential> remote,
                  PromptTuningOptions options);
  // tokens [B, T] -> logits [B, T, V] at the tokens' positions (the prompt's are dropped).
  at::Tensor forward(const at::Tensor& tokens);
  // Mean next-token cross-entropy over tokens [B, T].
  at::Tensor Loss(const at::Tensor& tokens);
  std::vector<at::Tensor> TrainableParameters();

  at::Tensor prompts;       // [P, H]
  at::Tensor deep_prompts;  // [blocks, P, H] (deep tuning only)

 private:
  ClientModel head_;
  std::shared_ptr<RemoteSequential> remote_;
  PromptTuningOptions options_;
};
TORCH_MODULE(PromptTuned);

struct LoraTuningOptions {
  int64_t rank = 4;
  std::vector<std::string> targets = {"q_proj", "v_proj"};
  double scale = 1.0;
};

// LoRA adapters for every remote block, held and trained by the client; the servers apply them
// to their frozen weights for each request and return their gradients (Petals cannot: its
// adapters must live on the servers).
class LoraTunedImpl : public torch::nn::Module {
 public:
  LoraTunedImpl(ClientModel head, std::shared_ptr<RemoteSequential> remote,
                LoraTuningOptions options);
  at::Tensor forward(const at::Tensor& tokens);  // [B, T] -> logits [B, T, V]
  at::Tensor Loss(const at::Tensor& tokens);
  std::vector<at::Tensor> TrainableParameters() { return adapters; }
  // The adapters of block `block` (absolute index) as model::BlockAdapters (for a local model).
  model::BlockAdapters AdaptersOf(int64_t block) const;

  LoraSpec spec;
  std::vector<at::Tensor> adapters;  // flat: block, target, (A [rank, in], B [out, rank])

 private:
  ClientModel head_;
  std::shared_ptr<RemoteSequential> remote_;
};
TORCH_MODULE(LoraTuned);

// What `colony finetune --save` writes (safetensors, metadata "colony.tuning" = "prompt",
// "deep-prompt" or "lora"): a tuned model's trained tensors, usable for generation through an
// inference session (deep prompts and adapters: SessionOptions; shallow prompts: RemoteBackend).
struct TunedWeights {
  at::Tensor prompts;       // shallow [P, H] (prompt tuning)
  at::Tensor deep_prompts;  // [blocks, P, H] (deep prompt tuning)
  LoraSpec lora;
  std::vector<at::Tensor> adapters;  // flat (see LoraSpec), for every block of the remote range
  // Session options carrying the deep prompts (broadcast to every row) and the adapters.
  SessionOptions Session(int64_t max_length, int64_t batch_size) const;
};
// Trained for blocks [remote.start(), remote.end()) of the model the remote sequence serves.
Status SaveTuned(const std::filesystem::path& file, PromptTunedImpl& tuned);
Status SaveTuned(const std::filesystem::path& file, LoraTunedImpl& tuned);
// Reads a file written by SaveTuned (or by earlier versions, without metadata) for a model of
// this configuration whose blocks are all remote, checking every shape.
Result<TunedWeights> LoadTuned(const std::filesystem::path& file, const model::LlamaConfig& config);

}  // namespace colony::serve
