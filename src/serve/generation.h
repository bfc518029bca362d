// Generation over a model whose blocks run locally or in the swarm: the client's local part of a
// model (embeddings, final norm, LM head), a backend interface that steps a decoder with a KV
// cache (local, or a remote InferenceSession), and the decoding algorithms on top of it
// (greedy/sampling as model::Generate does, beam search, rollback).
//
//   auto head = LoadClientModel("llama-dir");             // reads only 3 tensors
//   auto session = remote.OpenSession({.max_length = 256});
//   RemoteBackend backend(*head, *session);
//   auto tokens = GenerateWith(backend, prompt, {.max_new_tokens = 32}, eos,
//                              [](int64_t t) { /* stream it */ });
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/llama.h"
#include "serve/client.h"

namespace colony::serve {

// Embeddings, final norm and LM head of a Llama model (HF parameter names).
class ClientModelImpl : public torch::nn::Module {
 public:
  explicit ClientModelImpl(const model::LlamaConfig& config);
  at::Tensor Embed(const at::Tensor& tokens);  // [B, T] int64 -> [B, T, H]
  at::Tensor Head(const at::Tensor& hidden);   // [..., H] -> logits [..., V]
  const model::LlamaConfig& config() const { return config_; }
  model::NamedTensors NamedParametersHF();

  torch::nn::Embedding embed_tokens{nullptr};
  model::RMSNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tied to the embeddings

 private:
  model::LlamaConfig config_;
};
TORCH_MODULE(ClientModel);

// Reads config.json and only the embedding, norm and LM head tensors of a checkpoint, and puts
// them on `device`.
Result<ClientModel> LoadClientModel(const std::filesystem::path& dir,
                                    c10::Device device = c10::kCPU);

// Which positions of a step the LM head runs on. A decoding step reads only the last one; for a
// long prompt and a large vocabulary the others would be most of the step's time and memory
// (T x V floats: 2 GB for 4,096 tokens of Llama 3's 128,256).
enum class StepLogits {
  kLast,  // logits [B, 1, V]: the last position's
  kAll,   // logits [B, T, V]: every position's (scoring a prompt)
};

// A decoder with a KV cache, stepped by the decoding algorithms.
class DecoderBackend {
 public:
  virtual ~DecoderBackend() = default;
  // Runs tokens [B, T] at positions position.. (position <= this->position(); smaller rolls
  // back), after reordering the cached rows by hypo_ids [B] when defined. Tokens and hypo_ids
  // may be on any device; returns float32 logits on the CPU, where decoding runs, of the
  // positions `logits` names.
  virtual Result<at::Tensor> Step(const at::Tensor& tokens, int64_t position,
                                  const at::Tensor& hypo_ids, StepLogits logits) = 0;
  virtual int64_t position() const = 0;
  virtual int64_t max_length() const = 0;
};

// The whole model in this process, on the model's device (the reference that remote generation
// must equal).
class LocalBackend : public DecoderBackend {
 public:
  explicit LocalBackend(model::LlamaModel model);
  Result<at::Tensor> Step(const at::Tensor& tokens, int64_t position, const at::Tensor& hypo_ids,
                          StepLogits logits) override;
  int64_t position() const override { return position_; }
  int64_t max_length() const override { return model_->config().max_seq_len; }

 private:
  model::LlamaModel model_;
  c10::Device device_;  // the model's, looked up once (not at every step)
  std::vector<model::KVCache> caches_;
  int64_t position_ = 0;
};

// Embeddings and head here (on the head's device), blocks in the swarm through an inference
// session (max_length: the
// session's). Shallow prompts [P, H] (optional, e.g. PromptTuned::prompts) are prepended to the
// tokens of the first step (and of a rollback to 0): the session's positions are the tokens'
// shifted by P, and position(), max_length() and Step() count tokens only, so the decoding
// algorithms run unchanged; the prompt positions' logits are dropped.
class RemoteBackend : public DecoderBackend {
 public:
  RemoteBackend(ClientModel head, InferenceSession& session, int64_t max_length,
                at::Tensor prompts = {});
  Result<at::Tensor> Step(const at::Tensor& tokens, int64_t position, const at::Tensor& hypo_ids,
                          StepLogits logits) override;
  int64_t position() const override {
    return std::max<int64_t>(0, session_.position() - prompt_length());
  }
  int64_t max_length() const override { return max_length_ - prompt_length(); }

 private:
  int64_t prompt_length() const { return prompts_.defined() ? prompts_.size(0) : 0; }

  ClientModel head_;
  c10::Device device_;  // the head's, looked up once (not at every step)
  InferenceSession& session_;
  int64_t max_length_;
  at::Tensor prompts_;
};

// Greedy or seeded sampling, token for token what model::Generate produces for the same model
// and options: the prompt in one step, then one token per step, stopping after eos_id or at the
// backend's max_length. on_token (optional) sees each token as it is chosen; stop_requested
// (optional), asked after each token, ends generation early (stop strings, a client gone).
Result<std::vector<int64_t>> GenerateWith(DecoderBackend& backend,
                                          const std::vector<int64_t>& prompt,
                                          const model::SamplingOptions& options,
                                          int64_t eos_id = -1,
                                          const std::function<void(int64_t)>& on_token = {},
                                          const std::function<bool()>& stop_requested = {});

// Samples rows.size() continuations of one prompt side by side, in the backend's rows (a session
// of rows.size() rows): one step runs every row, so n samples cost one pass through the swarm,
// not n. Row i, with its own options (seed, penalties, max_new_tokens), is token for token what
// GenerateWith(prompt, rows[i]) gives. on_token(row, token) (optional) sees each token as it is
// chosen; stop_requested(row) (optional), asked after each of a row's tokens, ends that row. An
// ended row is stepped with its last token, its logits unread, until every row has ended.
// Returns each row's new tokens.
Result<std::vector<std::vector<int64_t>>> GenerateRows(
    DecoderBackend& backend, const std::vector<int64_t>& prompt,
    std::span<const model::SamplingOptions> rows, int64_t eos_id = -1,
    const std::function<void(int64_t, int64_t)>& on_token = {},
    const std::function<bool(int64_t)>& stop_requested = {});

struct Beam {
  std::vector<int64_t> tokens;  // generated tokens (prompt excluded)
  double log_prob = 0;          // sum of token log-probabilities (penalized: BeamSearch)
  bool finished = false;        // ended with one of the end ids
};
// Beam search with num_beams rows in the backend (reordered with hypo_ids each step). A beam
// that generates any of `end_ids` (the EOS, and e.g. generation_config.json's eos_token_id list
// or a chat template's end-of-turn token, as transformers' beam search takes a list) is finished
// with that token. `repetition_penalty` (1: off) is applied as transformers' beam search applies
// it: to each row's log-probabilities, for the tokens of its prompt and beam, before they are
// added to the beam's score (so log_prob then sums the penalized scores). Returns the final
// beams, best first (ranked by log_prob / length^length_penalty).
Result<std::vector<Beam>> BeamSearch(DecoderBackend& backend, const std::vector<int64_t>& prompt,
                                     int64_t num_beams, int64_t max_new_tokens,
                                     const std::vector<int64_t>& end_ids = {},
                                     double length_penalty = 1.0, double repetition_penalty = 1.0);

}  // namespace colony::serve
