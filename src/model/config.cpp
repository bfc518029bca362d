// Hugging Face config.json <-> LlamaConfig: the field schema of both transformers layouts, the
// defaults of each model_type, and the checks that keep a config from meaning something Colony
// would compute differently.
#include "model/config.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

namespace colony::model {
namespace {

using nlohmann::json;

Status Refuse(std::string_view field, const json& value, std::string_view why) {
  return Unimplemented(fmt::format("config: \"{}\" = {} {}", field, value.dump(), why));
}

template <typename T>
Status ReadField(const json& j, const char* name, T& out, bool required) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) {
    if (required) return InvalidArgument(fmt::format("config: missing field \"{}\"", name));
    return Status::Ok();
  }
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) {
      return InvalidArgument(fmt::format("config: \"{}\" must be a boolean", name));
    }
    out = it->get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) {
      return InvalidArgument(fmt::format("config: \"{}\" must be an integer", name));
    }
    out = it->get<T>();
  } else {
    if (!it->is_number()) {
      return InvalidArgument(fmt::format("config: \"{}\" must be a number", name));
    }
    out = it->get<T>();
  }
  return Status::Ok();
}

// Fields that do not change what the model computes from token ids: bookkeeping, token ids
// (the tokenizer and generation settings own them), initialisation, caching.
const std::set<std::string_view>& IrrelevantFields() {
  static const std::set<std::string_view> fields = {
      "transformers_version",
      "_name_or_path",
      "architectures",
      "bos_token_id",
      "eos_token_id",
      "pad_token_id",
      "use_cache",
      "initializer_range",
      "pretraining_tp",
      "return_dict",
      "output_attentions",
      "output_hidden_states",
      "torchscript",
      "tokenizer_class",
      "id2label",
      "label2id",
      "max_window_layers",
      "model_type",
      "dtype",
      "torch_dtype",
      "router_aux_loss_coef",
  };
  return fields;
}

// Fields that change nothing at the value Colony supports, and would otherwise.
Status CheckFixedFields(const json& j) {
  struct Fixed {
    const char* name;
    json value;
    const char* why;
  };
  const Fixed fixed[] = {
      {"hidden_act", "silu", "is not supported (only \"silu\")"},
      {"attention_dropout", 0.0, "is not supported (Colony trains without dropout)"},
      {"output_router_logits", false,
       "is not supported (Colony's loss has no router auxiliary term)"},
      {"router_jitter_noise", 0.0, "is not supported (Colony routes without jitter)"},
      {"use_sliding_window", false, "is not supported for Qwen2 (per-layer sliding windows)"},
      {"partial_rotary_factor", 1.0, "is not supported (rotary embeddings span the whole head)"},
      {"is_decoder", true, "is not supported"},
      {"add_cross_attention", false, "is not supported"},
      {"quantization_config", nullptr, "is not supported: load an unquantized checkpoint"},
  };
  for (const Fixed& f : fixed) {
    auto it = j.find(f.name);
    if (it == j.end() || it->is_null()) continue;
    const bool same = it->is_number() && f.value.is_number()
                          ? it->get<double>() == f.value.get<double>()
                          : *it == f.value;
    if (!same) return Refuse(f.name, *it, f.why);
  }
  // Qwen2 writes the layer kinds out; Colony runs full attention in every layer.
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return InvalidArgument("config: \"layer_types\" must be an array");
    for (const json& kind : *it) {
      if (kind != "full_attention") {
        return Refuse("layer_types", *it, "is not supported (only \"full_attention\" layers)");
      }
    }
  }
  if (auto it = j.find("dtype"); it != j.end() && !it->is_null()) {
    static const std::set<std::string> kFloat = {"float32", "float16", "bfloat16", "float64"};
    if (!it->is_string() || kFloat.count(it->get<std::string>()) == 0) {
      return Refuse("dtype", *it, "is not a floating-point dtype Colony loads");
    }
  }
  return Status::Ok();
}

// Reads a rope dict (transformers 4's rope_scaling, 5's rope_parameters) into `c`.
Status ReadRope(const json& rope, const char* field, LlamaConfig& c) {
  if (!rope.is_object())
    return InvalidArgument(fmt::format("config: \"{}\" must be an object", field));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (auto it = rope.find(key); it != rope.end()) {
      if (!it->is_string()) {
        return InvalidArgument(fmt::format("config: \"{}.{}\" must be a string", field, key));
      }
      type = it->get<std::string>();
    }
  }
  std::set<std::string_view> allowed = {"rope_type", "type", "rope_theta"};
  RopeScaling& s = c.rope_scaling;
  s = RopeScaling{};
  auto read = [&](const char* key, auto& out, bool required) {
    allowed.insert(key);
    Status st = ReadField(rope, key, out, required);
    return st.ok() ? st : st.WithContext(field);
  };
  if (type == "default") {
    s.type = RopeType::kDefault;
  } else if (type == "linear") {
    s.type = RopeType::kLinear;
    COLONY_RETURN_IF_ERROR(read("factor", s.factor, true));
  } else if (type == "dynamic") {
    s.type = RopeType::kDynamic;
    COLONY_RETURN_IF_ERROR(read("factor", s.factor, true));
    COLONY_RETURN_IF_ERROR(
        read("original_max_position_embeddings", s.original_max_position_embeddings, false));
  } else if (type == "llama3") {
    s.type = RopeType::kLlama3;
    COLONY_RETURN_IF_ERROR(read("factor", s.factor, true));
    COLONY_RETURN_IF_ERROR(read("low_freq_factor", s.low_freq_factor, true));
    COLONY_RETURN_IF_ERROR(read("high_freq_factor", s.high_freq_factor, true));
    COLONY_RETURN_IF_ERROR(
        read("original_max_position_embeddings", s.original_max_position_embeddings, true));
  } else if (type == "yarn") {
    s.type = RopeType::kYarn;
    COLONY_RETURN_IF_ERROR(read("factor", s.factor, true));
    COLONY_RETURN_IF_ERROR(
        read("original_max_position_embeddings", s.original_max_position_embeddings, false));
    COLONY_RETURN_IF_ERROR(read("beta_fast", s.beta_fast, false));
    COLONY_RETURN_IF_ERROR(read("beta_slow", s.beta_slow, false));
    COLONY_RETURN_IF_ERROR(read("attention_factor", s.attention_factor, false));
    bool truncate = true;
    COLONY_RETURN_IF_ERROR(read("truncate", truncate, false));
    if (!truncate) {
      return Refuse(fmt::format("{}.truncate", field), false, "is not supported");
    }
  } else {
    return Refuse(fmt::format("{}.rope_type", field), type,
                  "is not supported (default, linear, dynamic, llama3 or yarn)");
  }
  for (const auto& [key, value] : rope.items()) {
    if (allowed.count(key) == 0) {
      return Refuse(fmt::format("{}.{}", field, key), value,
                    fmt::format("is not understood for rope_type \"{}\"", type));
    }
  }
  if (auto it = rope.find("rope_theta"); it != rope.end()) {
    if (!it->is_number()) {
      return InvalidArgument(fmt::format("config: \"{}.rope_theta\" must be a number", field));
    }
    c.rope_theta = it->get<double>();
  }
  return Status::Ok();
}

struct FamilyDefaults {
  ModelFamily family;
  const char* model_type;
  const char* architecture;
  int64_t max_position_embeddings;
  double rms_norm_eps, rope_theta;
};
constexpr FamilyDefaults kFamilies[] = {
    {ModelFamily::kLlama, "llama", "LlamaForCausalLM", 2048, 1e-6, 10000},
    {ModelFamily::kMistral, "mistral", "MistralForCausalLM", 4096 * 32, 1e-6, 10000},
    {ModelFamily::kQwen2, "qwen2", "Qwen2ForCausalLM", 32768, 1e-6, 10000},
    {ModelFamily::kMixtral, "mixtral", "MixtralForCausalLM", 4096 * 32, 1e-5, 1e6},
};

const FamilyDefaults& DefaultsOf(ModelFamily family) {
  for (const FamilyDefaults& f : kFamilies) {
    if (f.family == family) return f;
  }
  return kFamilies[0];
}

}  // namespace

const char* ModelTypeName(ModelFamily family) { return DefaultsOf(family).model_type; }

const char* RopeTypeName(RopeType type) {
  switch (type) {
    case RopeType::kDefault:
      return "default";
    case RopeType::kLinear:
      return "linear";
    case RopeType::kDynamic:
      return "dynamic";
    case RopeType::kLlama3:
      return "llama3";
    case RopeType::kYarn:
      return "yarn";
  }
  return "?";
}

std::optional<std::pair<int64_t, int64_t>> LlamaConfig::ProjectionShape(
    const std::string& name) const {
  const int64_t h = hidden_size, q = num_heads * head_dim(), kv = num_kv_heads * head_dim();
  if (name == "q_proj") return std::make_pair(h, q);
  if (name == "k_proj" || name == "v_proj") return std::make_pair(h, kv);
  if (name == "o_proj") return std::make_pair(q, h);
  if (mixture_of_experts()) return std::nullopt;  // the experts' MLPs take no adapters
  if (name == "gate_proj" || name == "up_proj") return std::make_pair(h, intermediate_size);
  if (name == "down_proj") return std::make_pair(intermediate_size, h);
  return std::nullopt;
}

json LlamaConfig::ToJson() const {
  const FamilyDefaults& f = DefaultsOf(family);
  json rope = {{"rope_type", RopeTypeName(rope_scaling.type)}, {"rope_theta", rope_theta}};
  const RopeScaling& s = rope_scaling;
  if (s.type != RopeType::kDefault) rope["factor"] = s.factor;
  if (s.original_max_position_embeddings > 0) {
    rope["original_max_position_embeddings"] = s.original_max_position_embeddings;
  }
  if (s.type == RopeType::kLlama3) {
    rope["low_freq_factor"] = s.low_freq_factor;
    rope["high_freq_factor"] = s.high_freq_factor;
  }
  if (s.type == RopeType::kYarn) {
    rope["beta_fast"] = s.beta_fast;
    rope["beta_slow"] = s.beta_slow;
    if (s.attention_factor > 0) rope["attention_factor"] = s.attention_factor;
  }
  json j = {
      {"architectures", {f.architecture}},
      {"model_type", f.model_type},
      {"hidden_act", "silu"},
      {"initializer_range", kInitializerRange},
      {"dtype", "float32"},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_layers},
      {"num_attention_heads", num_heads},
      {"num_key_value_heads", num_kv_heads},
      {"max_position_embeddings", max_seq_len},
      {"rope_parameters", rope},
      {"rms_norm_eps", rms_norm_eps},
      {"tie_word_embeddings", tie_word_embeddings},
  };
  if (explicit_head_dim > 0) j["head_dim"] = explicit_head_dim;
  if (family == ModelFamily::kLlama) {
    j["attention_bias"] = qkv_bias;
    j["mlp_bias"] = mlp_bias;
  }
  if (family == ModelFamily::kMistral || family == ModelFamily::kMixtral) {
    j["sliding_window"] = sliding_window > 0 ? json(sliding_window) : json(nullptr);
  }
  if (family == ModelFamily::kQwen2) j["use_sliding_window"] = false;
  if (family == ModelFamily::kMixtral) {
    j["num_local_experts"] = num_experts;
    j["num_experts_per_tok"] = num_experts_per_tok;
  }
  return j;
}

Result<LlamaConfig> LlamaConfig::FromJson(const json& j) {
  if (!j.is_object()) return InvalidArgument("config: not a JSON object");
  LlamaConfig c;
  c.family = ModelFamily::kLlama;
  if (auto it = j.find("model_type"); it != j.end()) {
    const FamilyDefaults* found = nullptr;
    for (const FamilyDefaults& f : kFamilies) {
      if (*it == f.model_type) found = &f;
    }
    if (found == nullptr) {
      return Refuse("model_type", *it, "is not supported (llama, mistral, qwen2 or mixtral)");
    }
    c.family = found->family;
  }
  const FamilyDefaults& defaults = DefaultsOf(c.family);
  COLONY_RETURN_IF_ERROR(CheckFixedFields(j));

  // Every field is read below, checked above, or known to be irrelevant; anything else is an
  // error, so that a feature Colony lacks is never silently ignored.
  std::set<std::string_view> understood = {
      "vocab_size",
      "hidden_size",
      "intermediate_size",
      "num_hidden_layers",
      "num_attention_heads",
      "num_key_value_heads",
      "head_dim",
      "max_position_embeddings",
      "rope_theta",
      "rope_scaling",
      "rope_parameters",
      "rms_norm_eps",
      "tie_word_embeddings",
      "attention_bias",
      "mlp_bias",
      "sliding_window",
      "num_local_experts",
      "num_experts_per_tok",
      "hidden_act",
      "attention_dropout",
      "output_router_logits",
      "router_jitter_noise",
      "use_sliding_window",
      "partial_rotary_factor",
      "is_decoder",
      "add_cross_attention",
      "quantization_config",
      "layer_types",
  };
  for (const auto& [key, value] : j.items()) {
    if (understood.count(key) == 0 && IrrelevantFields().count(key) == 0) {
      return Refuse(key, value, "is not understood by Colony");
    }
  }

  c.max_seq_len = defaults.max_position_embeddings;
  c.rms_norm_eps = defaults.rms_norm_eps;
  c.rope_theta = defaults.rope_theta;
  c.tie_word_embeddings = false;
  COLONY_RETURN_IF_ERROR(ReadField(j, "vocab_size", c.vocab_size, true));
  COLONY_RETURN_IF_ERROR(ReadField(j, "hidden_size", c.hidden_size, true));
  COLONY_RETURN_IF_ERROR(ReadField(j, "intermediate_size", c.intermediate_size, true));
  COLONY_RETURN_IF_ERROR(ReadField(j, "num_hidden_layers", c.num_layers, true));
  COLONY_RETURN_IF_ERROR(ReadField(j, "num_attention_heads", c.num_heads, true));
  c.num_kv_heads = c.num_heads;
  // Only Llama's default (= num_attention_heads) is taken; the others' defaults are odd enough
  // (8 or 32 regardless of the model) that a config without the field is refused.
  COLONY_RETURN_IF_ERROR(
      ReadField(j, "num_key_value_heads", c.num_kv_heads, c.family != ModelFamily::kLlama));
  COLONY_RETURN_IF_ERROR(ReadField(j, "head_dim", c.explicit_head_dim, false));
  if (c.explicit_head_dim > 0 && c.explicit_head_dim * c.num_heads == c.hidden_size) {
    c.explicit_head_dim = 0;  // the default, written out
  }
  COLONY_RETURN_IF_ERROR(ReadField(j, "max_position_embeddings", c.max_seq_len, false));
  COLONY_RETURN_IF_ERROR(ReadField(j, "rms_norm_eps", c.rms_norm_eps, false));
  COLONY_RETURN_IF_ERROR(ReadField(j, "tie_word_embeddings", c.tie_word_embeddings, false));

  // Rotary embeddings: transformers 4 keeps rope_theta at the top level and the scaling in
  // rope_scaling; transformers 5 keeps both in rope_parameters. Where both layouts appear they
  // must agree.
  COLONY_RETURN_IF_ERROR(ReadField(j, "rope_theta", c.rope_theta, false));
  const double top_level_theta = c.rope_theta;
  auto scaling = j.find("rope_scaling");
  auto parameters = j.find("rope_parameters");
  const bool has_scaling = scaling != j.end() && !scaling->is_null();
  const bool has_parameters = parameters != j.end() && !parameters->is_null();
  if (has_parameters) {
    COLONY_RETURN_IF_ERROR(ReadRope(*parameters, "rope_parameters", c));
    if (j.contains("rope_theta") && top_level_theta != c.rope_theta) {
      return InvalidArgument(fmt::format(
          "config: \"rope_theta\" = {} disagrees with \"rope_parameters.rope_theta\" = {}",
          top_level_theta, c.rope_theta));
    }
    if (has_scaling) {
      LlamaConfig other = c;
      COLONY_RETURN_IF_ERROR(ReadRope(*scaling, "rope_scaling", other));
      if (!(other.rope_scaling == c.rope_scaling)) {
        return InvalidArgument("config: \"rope_scaling\" disagrees with \"rope_parameters\"");
      }
    }
  } else if (has_scaling) {
    if (scaling->contains("rope_theta")) {
      return Refuse("rope_scaling.rope_theta", (*scaling)["rope_theta"],
                    "belongs at the top level in this layout");
    }
    COLONY_RETURN_IF_ERROR(ReadRope(*scaling, "rope_scaling", c));
  }

  // Biases: Llama's attention_bias covers q, k, v and o; Qwen2 always has q/k/v biases.
  bool attention_bias = false;
  COLONY_RETURN_IF_ERROR(ReadField(j, "attention_bias", attention_bias, false));
  COLONY_RETURN_IF_ERROR(ReadField(j, "mlp_bias", c.mlp_bias, false));
  if (c.family != ModelFamily::kLlama && (attention_bias || c.mlp_bias)) {
    return Refuse(attention_bias ? "attention_bias" : "mlp_bias", true,
                  fmt::format("is not supported for model_type \"{}\"", defaults.model_type));
  }
  c.qkv_bias = attention_bias || c.family == ModelFamily::kQwen2;
  c.o_bias = attention_bias;

  // Sliding-window attention: Mistral and Mixtral apply sliding_window in every layer (Mistral's
  // default is 4096 when the field is missing); Qwen2 only with use_sliding_window, refused above.
  if (c.family == ModelFamily::kMistral || c.family == ModelFamily::kMixtral) {
    if (c.family == ModelFamily::kMistral && !j.contains("sliding_window")) c.sliding_window = 4096;
    COLONY_RETURN_IF_ERROR(ReadField(j, "sliding_window", c.sliding_window, false));
    if (c.sliding_window >= c.max_seq_len) c.sliding_window = 0;  // never reached
  }

  if (c.family == ModelFamily::kMixtral) {
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    COLONY_RETURN_IF_ERROR(ReadField(j, "num_local_experts", c.num_experts, false));
    COLONY_RETURN_IF_ERROR(ReadField(j, "num_experts_per_tok", c.num_experts_per_tok, false));
  } else {
    for (const char* key : {"num_local_experts", "num_experts_per_tok"}) {
      if (auto it = j.find(key); it != j.end() && !it->is_null()) {
        return Refuse(key, *it,
                      fmt::format("is not supported for model_type \"{}\"", defaults.model_type));
      }
    }
  }
  COLONY_RETURN_IF_ERROR(c.Validate());
  return c;
}

Status LlamaConfig::Validate() const {
  struct Limit {
    const char* name;
    int64_t value, max;
  };
  // Upper bounds far above any real model, so that a hostile config cannot make us allocate
  // absurd tensors or overflow size arithmetic.
  const Limit limits[] = {
      {"vocab_size", vocab_size, 1 << 22},
      {"hidden_size", hidden_size, 1 << 16},
      {"intermediate_size", intermediate_size, 1 << 18},
      {"num_hidden_layers", num_layers, 1 << 10},
      {"num_attention_heads", num_heads, 1 << 10},
      {"num_key_value_heads", num_kv_heads, 1 << 10},
      {"max_position_embeddings", max_seq_len, 1 << 22},
  };
  for (const Limit& l : limits) {
    if (l.value <= 0 || l.value > l.max) {
      return InvalidArgument(
          fmt::format("config: {} = {} is out of range [1, {}]", l.name, l.value, l.max));
    }
  }
  if (explicit_head_dim < 0 || explicit_head_dim > 1 << 12) {
    return InvalidArgument(
        fmt::format("config: head_dim = {} is out of range [1, 4096]", explicit_head_dim));
  }
  if (explicit_head_dim == 0 && hidden_size % num_heads != 0) {
    return InvalidArgument(
        fmt::format("config: hidden_size {} is not divisible by num_attention_heads {}",
                    hidden_size, num_heads));
  }
  if (num_heads % num_kv_heads != 0) {
    return InvalidArgument(
        fmt::format("config: num_attention_heads {} is not divisible by num_key_value_heads {}",
                    num_heads, num_kv_heads));
  }
  if (head_dim() % 2 != 0) {
    return InvalidArgument(
        fmt::format("config: head dimension {} must be even for rotary embeddings", head_dim()));
  }
  if (!std::isfinite(rope_theta) || rope_theta <= 1) {
    return InvalidArgument(fmt::format("config: rope_theta {} must be finite and > 1", rope_theta));
  }
  if (!std::isfinite(rms_norm_eps) || rms_norm_eps <= 0 || rms_norm_eps >= 1) {
    return InvalidArgument(fmt::format("config: rms_norm_eps {} must be in (0, 1)", rms_norm_eps));
  }
  const RopeScaling& s = rope_scaling;
  if (s.type != RopeType::kDefault &&
      (!std::isfinite(s.factor) || s.factor < 1 || s.factor > 1e4)) {
    return InvalidArgument(fmt::format("config: rope factor {} must be in [1, 10000]", s.factor));
  }
  if (s.original_max_position_embeddings < 0 || s.original_max_position_embeddings > 1 << 22) {
    return InvalidArgument(
        fmt::format("config: original_max_position_embeddings {} is out of range",
                    s.original_max_position_embeddings));
  }
  if (s.type == RopeType::kLlama3 &&
      (s.original_max_position_embeddings <= 0 || !std::isfinite(s.low_freq_factor) ||
       !std::isfinite(s.high_freq_factor) || s.low_freq_factor <= 0 ||
       s.high_freq_factor <= s.low_freq_factor)) {
    return InvalidArgument(fmt::format(
        "config: llama3 rope scaling needs original_max_position_embeddings > 0 and 0 < "
        "low_freq_factor < high_freq_factor (got {}, {}, {})",
        s.original_max_position_embeddings, s.low_freq_factor, s.high_freq_factor));
  }
  if (s.type == RopeType::kDynamic && s.original_max_position_embeddings != 0 &&
      s.original_max_position_embeddings != max_seq_len) {
    // transformers versions disagree on which length dynamic scaling starts from here.
    return Unimplemented(
        fmt::format("config: dynamic rope scaling with original_max_position_embeddings {} != "
                    "max_position_embeddings {} is not supported",
                    s.original_max_position_embeddings, max_seq_len));
  }
  if (s.type == RopeType::kYarn) {
    if (!std::isfinite(s.beta_fast) || !std::isfinite(s.beta_slow) || s.beta_slow <= 0 ||
        s.beta_fast <= s.beta_slow || !std::isfinite(s.attention_factor) ||
        s.attention_factor < 0) {
      return InvalidArgument(fmt::format(
          "config: yarn rope scaling needs 0 < beta_slow < beta_fast and attention_factor >= 0 "
          "(got {}, {}, {})",
          s.beta_slow, s.beta_fast, s.attention_factor));
    }
    if (s.original_max_position_embeddings > 0 &&
        static_cast<double>(s.original_max_position_embeddings) * s.factor !=
            static_cast<double>(max_seq_len)) {
      // transformers versions disagree on the factor then (the given one, or the ratio of the
      // two lengths): refuse rather than pick one.
      return Unimplemented(
          fmt::format("config: yarn rope scaling with factor {} but max_position_embeddings {} / "
                      "original_max_position_embeddings {} != factor is not supported",
                      s.factor, max_seq_len, s.original_max_position_embeddings));
    }
  }
  if (sliding_window < 0) {
    return InvalidArgument(fmt::format("config: sliding_window {} must be >= 0", sliding_window));
  }
  if (num_experts < 0 || num_experts > 1 << 10 ||
      (num_experts > 0 && (num_experts_per_tok < 1 || num_experts_per_tok > num_experts))) {
    return InvalidArgument(
        fmt::format("config: num_local_experts {} and num_experts_per_tok {} must satisfy 1 <= "
                    "num_experts_per_tok <= num_local_experts <= 1024",
                    num_experts, num_experts_per_tok));
  }
  if (family == ModelFamily::kMixtral && num_experts == 0) {
    return InvalidArgument("config: a mixtral model needs num_local_experts >= 1");
  }
  return Status::Ok();
}

int64_t LlamaConfig::NumParameters() const {
  const int64_t q_dim = num_heads * head_dim(), kv_dim = num_kv_heads * head_dim();
  const int64_t attention = 2 * hidden_size * q_dim + 2 * hidden_size * kv_dim +
                            (qkv_bias ? q_dim + 2 * kv_dim : 0) + (o_bias ? hidden_size : 0);
  const int64_t dense =
      3 * hidden_size * intermediate_size + (mlp_bias ? 2 * intermediate_size + hidden_size : 0);
  const int64_t mlp =
      mixture_of_experts() ? num_experts * dense + num_experts * hidden_size : dense;
  const int64_t block = attention + mlp + 2 * hidden_size;
  const int64_t embed = vocab_size * hidden_size;
  return embed + num_layers * block + hidden_size + (tie_word_embeddings ? 0 : embed);
}

}  // namespace colony::model
