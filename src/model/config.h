// The configuration of a Llama-style decoder and of the families that share its layout (Llama
// 2/3, Mistral, Qwen2, Mixtral), read from and written as Hugging Face config.json files.
//
//   COLONY_ASSIGN_OR_RETURN(LlamaConfig c, LlamaConfig::FromJson(json));   // either layout
//   nlohmann::json out = c.ToJson();                                       // transformers-5 layout
//
// FromJson accepts both config layouts transformers writes: version 4 (`rope_theta` and
// `rope_scaling` at the top level) and version 5 (`rope_parameters`). Every field of the file is
// either understood, or known not to change what the model computes (token ids, dropout of 0,
// transformers_version, ...), or loading fails with an error that names the field and its value:
// Colony never runs a model it would compute differently from transformers.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <utility>

#include "core/status.h"

namespace colony::model {

// The standard deviation of the weights of models Colony creates (transformers'
// initializer_range).
inline constexpr double kInitializerRange = 0.02;

// The architectures Colony runs; all are pre-norm decoders with rotary attention.
enum class ModelFamily {
  kLlama,    // LlamaForCausalLM (Llama 2, 3, 3.1+)
  kMistral,  // MistralForCausalLM (optionally sliding-window attention)
  kQwen2,    // Qwen2ForCausalLM (biases on the q/k/v projections)
  kMixtral,  // MixtralForCausalLM (top-k routed experts in every block)
};
const char* ModelTypeName(ModelFamily family);  // "llama", "mistral", ...

// How rotary frequencies are derived (transformers' rope_type).
enum class RopeType { kDefault, kLinear, kDynamic, kLlama3, kYarn };
const char* RopeTypeName(RopeType type);

struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 1;  // linear, dynamic, llama3, yarn
  // The context length the model was pre-trained for (llama3, yarn); 0: max_position_embeddings.
  int64_t original_max_position_embeddings = 0;
  double low_freq_factor = 1, high_freq_factor = 4;  // llama3
  double beta_fast = 32, beta_slow = 1;              // yarn
  double attention_factor = 0;                       // yarn; 0: 0.1 ln(factor) + 1

  friend bool operator==(const RopeScaling&, const RopeScaling&) = default;
};

struct LlamaConfig {
  ModelFamily family = ModelFamily::kLlama;
  int64_t vocab_size = 4096;
  int64_t hidden_size = 256;
  int64_t intermediate_size = 704;
  int64_t num_layers = 4;
  int64_t num_heads = 8;
  int64_t num_kv_heads = 4;
  int64_t explicit_head_dim = 0;  // config.json's head_dim; 0: hidden_size / num_heads
  int64_t max_seq_len = 512;
  double rope_theta = 10000;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = true;
  bool qkv_bias = false;       // biases on q/k/v_proj (Qwen2; Llama's attention_bias)
  bool o_bias = false;         // a bias on o_proj (Llama's attention_bias)
  bool mlp_bias = false;       // biases on gate/up/down_proj (Llama's mlp_bias)
  int64_t sliding_window = 0;  // keys further back than this are not attended to; 0: none
  int64_t num_experts = 0;     // Mixtral: experts per block (num_local_experts); 0: a dense MLP
  int64_t num_experts_per_tok = 0;  // Mixtral: experts each token is routed to
  // Not in config.json: the mixture-of-experts blocks hold their routers only, and their experts
  // are computed elsewhere (SparseMoE::set_expert_fn; moe/checkpoint_experts.h loads such a
  // model, reading no expert weights). Such a model cannot be saved.
  bool remote_experts = false;

  int64_t head_dim() const {
    return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_heads;
  }
  bool mixture_of_experts() const { return num_experts > 0; }
  // The input and output sizes of a block projection by name ("q_proj", ..., "down_proj"), as
  // the LoRA adapters for it must have them; nullopt for a name that is not a projection.
  std::optional<std::pair<int64_t, int64_t>> ProjectionShape(const std::string& name) const;

  // Hugging Face config.json in the transformers-5 layout (`rope_parameters`).
  nlohmann::json ToJson() const;
  // Reads an HF config.json of either layout. Optional fields take transformers' defaults for
  // the model_type. The result is Validate()d.
  static Result<LlamaConfig> FromJson(const nlohmann::json& json);
  Status Validate() const;
  int64_t NumParameters() const;

  friend bool operator==(const LlamaConfig&, const LlamaConfig&) = default;
};

}  // namespace colony::model
