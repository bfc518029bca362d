// A Llama-style decoder in LibTorch, laid out like Hugging Face's LlamaForCausalLM (and its
// relatives Mistral, Qwen2 and Mixtral, config.h) so that their checkpoints load both ways
// (checkpoint.h): RMSNorm pre-norm blocks with grouped-query attention (optional q/k/v/o biases,
// optional sliding window) and rotary embeddings (rotary.h), a SwiGLU MLP or a mixture of experts
// (mixture.h), and an optionally tied lm_head. Blocks are separate modules with a KV cache argument
// so that a server can run a range of blocks for many inference sessions, and a trainer can run the
// whole model.
//
//   torch::manual_seed(0);
//   LlamaModel model(LlamaConfig{.vocab_size = 512, .hidden_size = 64});
//   torch::Tensor logits = model->forward(tokens);          // [B, T] int64 -> [B, T, V]
//   torch::Tensor loss = LanguageModelLoss(logits.narrow(1, 0, T - 1), tokens.narrow(1, 1, T - 1));
//   std::vector<int64_t> out = Generate(model, prompt, {.max_new_tokens = 16});
//
// Modules throw c10::Error (as LibTorch does) on tensors of the wrong shape; validate configs with
// LlamaConfig::Validate() before building models from untrusted input.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "model/mixture.h"
#include "model/projection.h"
#include "model/rotary.h"

namespace colony::model {

// Keys and values of one block for the positions seen so far, after rotary embedding. They live
// in storage with room for more positions, which an append fills in place: a decoding step
// copies its own keys and values, not the whole cache (the room doubles when full, so appends
// cost O(1) amortized; `reserve` sizes it once). Copies of a cache share the storage until one
// of them changes it (append, reorder): that one first moves to storage of its own, so copies
// behave as values.
struct KVCache {
  torch::Tensor k, v;  // [B, num_kv_heads, length, head_dim] views; undefined while empty
  int64_t length = 0;
  // > 0: the first append makes room for this many positions (a server's session max_length,
  // whose memory it reserved): no later append copies the cache while it stays within.
  int64_t reserve = 0;

  // Adds positions: k_new, v_new [B, num_kv_heads, t, head_dim], of the cache's batch, dtype and
  // device once it holds any. With autograd recording them, it concatenates instead (earlier
  // steps' graphs keep their tensors).
  void Append(const torch::Tensor& k_new, const torch::Tensor& v_new);
  // Keeps batch rows `index` ([B'] int64), in that order (beam search).
  void Reorder(const torch::Tensor& index);
  // Keeps the first `new_length` positions (<= length): rolls a session back.
  void Truncate(int64_t new_length);
  void Clear();
  // Positions the storage holds without growing (0 while empty).
  int64_t capacity() const { return k_room_.defined() ? k_room_.size(2) : 0; }

 private:
  // Moves the positions held to new storage of `room` positions for `batch` rows.
  void Rehome(int64_t room, int64_t batch);
  // Whether no copy of this cache shares its storage.
  bool OwnsRoom() const { return room_owner_.use_count() == 1; }
  torch::Tensor k_room_, v_room_;          // [B, num_kv_heads, capacity, head_dim]
  std::shared_ptr<const int> room_owner_;  // one per storage, shared by the copies using it
};

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  // Normalizes in float32 (as HF does) and returns x's dtype.
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const LlamaConfig& config);
  // rope (optional): the tables for x's positions (Rotary::Tables), shared by the blocks of one
  // pass; built here when absent or not in q's length, dtype and device.
  torch::Tensor forward(const torch::Tensor& x, int64_t position_offset, KVCache* cache,
                        const BlockAdapters* adapters = nullptr, const RopeTables* rope = nullptr);
  const Rotary& rotary() const { return rotary_; }

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  Rotary rotary_;
  int64_t num_heads_, num_kv_heads_, head_dim_;
  int64_t sliding_window_;  // 0: none
};
TORCH_MODULE(LlamaAttention);

class LlamaMLPImpl : public torch::nn::Module {
 public:
  explicit LlamaMLPImpl(const LlamaConfig& config);
  // down(silu(gate(x)) * up(x))
  torch::Tensor forward(const torch::Tensor& x, const BlockAdapters* adapters = nullptr);

  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

// One decoder layer: h = x + attn(norm(x)); out = h + mlp(norm(h)), where mlp is a dense SwiGLU
// MLP or, for a mixture-of-experts config, Mixtral's block_sparse_moe.
class LlamaBlockImpl : public torch::nn::Module {
 public:
  explicit LlamaBlockImpl(const LlamaConfig& config);
  // x: [B, T, hidden]; x[:, t] is at position position_offset + t (rotary phase). Without a
  // cache, attention is causal within x. With a cache, x's keys and values are appended to it
  // and x attends to all cached positions plus its own causal prefix; position_offset should then
  // be cache->length. Appending copies the cache (torch::cat), fine for the lengths served here.
  // Adapters (optional) add LoRA terms to the projections; a mixture-of-experts block takes
  // none on its MLP (c10::Error). rope (optional): Rope(T, position_offset, x.options()) of any
  // block of the model, computed once for all the blocks of a pass (its ~5 kernels per block are
  // a tenth of a decode step's launches on a GPU).
  torch::Tensor forward(const torch::Tensor& x, int64_t position_offset = 0,
                        KVCache* cache = nullptr, const BlockAdapters* adapters = nullptr,
                        const RopeTables* rope = nullptr);
  // The rotary tables for `length` positions from `offset`, in options' dtype and device.
  RopeTables Rope(int64_t length, int64_t offset, const at::TensorOptions& options) const;
  // Quantizes every projection (model::Quantize); norms and the router stay in their dtype.
  void Quantize(WeightQuantization q);

  // Parameters under their HF names within a layer: "self_attn.q_proj.weight", ...
  RMSNorm input_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  RMSNorm post_attention_layernorm{nullptr};
  LlamaMLP mlp{nullptr};                // null in a mixture-of-experts block
  SparseMoE block_sparse_moe{nullptr};  // null in a dense block
};
TORCH_MODULE(LlamaBlock);

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// The HF names of block `layer`'s parameters ("model.layers.3.mlp.up_proj.weight", ...).
NamedTensors BlockParametersHF(LlamaBlock& block, int64_t layer);

class LlamaModelImpl : public torch::nn::Module {
 public:
  // Config must be Validate()d. Weights ~ normal(0, 0.02) (norms 1), deterministic under
  // torch::manual_seed.
  explicit LlamaModelImpl(const LlamaConfig& config);

  const LlamaConfig& config() const { return config_; }
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  LlamaBlock block(int64_t i) const { return blocks_.at(static_cast<size_t>(i)); }

  // tokens [B, T] int64 -> logits [B, T, vocab] (positions 0..T-1, causal).
  torch::Tensor forward(const torch::Tensor& tokens);
  // tokens [B, T] -> hidden [B, T, H].
  torch::Tensor Embed(const torch::Tensor& tokens);
  // hidden [..., H] -> logits [..., V]: final norm, then lm_head.
  torch::Tensor Head(const torch::Tensor& hidden);
  // Incremental decoding: runs tokens [B, T] at positions caches[0].length.. and appends to the
  // caches (resized to num_blocks() when empty). Returns logits [B, T, V], or with last_only
  // those of the last position [B, 1, V] (what a decoding step reads: the head is not run on
  // the other positions, which for a long prompt and a large vocabulary is most of the step).
  torch::Tensor ForwardWithCache(const torch::Tensor& tokens, std::vector<KVCache>& caches,
                                 bool last_only = false);

  // All parameters under Hugging Face LlamaForCausalLM names, in HF order; "lm_head.weight" is
  // omitted when the embeddings are tied. The tensors alias the parameters.
  NamedTensors NamedParametersHF();

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tied

 private:
  // Hidden states through every block at positions offset.., with the blocks' caches if given;
  // the rotary tables are built once for all of them.
  torch::Tensor RunBlocks(torch::Tensor h, int64_t offset, std::vector<KVCache>* caches);

  LlamaConfig config_;
  std::vector<LlamaBlock> blocks_;
};
TORCH_MODULE(LlamaModel);

// Mean cross-entropy of logits [..., V] against int64 targets [...]; targets of -100 are
// ignored (the HF convention for padding).
torch::Tensor LanguageModelLoss(const torch::Tensor& logits, const torch::Tensor& targets);

struct SamplingOptions {
  int64_t max_new_tokens = 32;
  double temperature = 0;  // 0: greedy
  int64_t top_k = 0;       // 0: off
  double top_p = 1.0;      // 1: off (nucleus sampling)
  double repetition_penalty =
      1.0;  // 1: off (HF/CTRL rule: divide positive logits, multiply negative)
  uint64_t seed = 0;
};

// Picks the next token from logits [V] (any float dtype), given every token so far (for the
// repetition penalty): penalty, then greedy argmax (temperature 0; lowest index on ties) or
// temperature, top-k, top-p (as HF's warpers) and a draw from `rng`. Runs in float64 on the CPU
// with the standard's mt19937_64, so a seed gives the same tokens on every machine; a remote
// client reuses this to sample from logits computed by a swarm.
int64_t SampleNextToken(const torch::Tensor& logits, const std::vector<int64_t>& history,
                        const SamplingOptions& options, std::mt19937_64& rng);

// Generates up to max_new_tokens after `prompt` (non-empty) with the KV cache, stopping after
// eos_id (included in the result) or at max_seq_len total tokens. Returns the new tokens only.
// The RNG is seeded with options.seed.
std::vector<int64_t> Generate(LlamaModel& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options, int64_t eos_id = -1);

}  // namespace colony::model
