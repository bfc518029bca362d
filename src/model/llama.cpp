#include "model/llama.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>

namespace colony::model {
namespace {

using nlohmann::json;

constexpr double kInitStd = 0.02;  // HF initializer_range

torch::nn::Linear MakeLinear(int64_t in, int64_t out) {
  torch::nn::Linear linear(torch::nn::LinearOptions(in, out).bias(false));
  torch::NoGradGuard no_grad;
  linear->weight.normal_(0, kInitStd);
  return linear;
}

// HF's rotate_half: (x1, x2) -> (-x2, x1) over the two halves of the last dimension.
torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// cos and sin [T, head_dim] for positions offset..offset+T-1, computed in float32 like HF.
std::pair<torch::Tensor, torch::Tensor> RotaryTables(int64_t length, int64_t offset,
                                                     int64_t head_dim, double theta,
                                                     const torch::TensorOptions& options) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(options.device());
  auto inv_freq =
      1.0 / at::pow(theta, at::arange(0, head_dim, 2, f32) / static_cast<double>(head_dim));
  auto positions = at::arange(offset, offset + length, f32);
  auto freqs = at::outer(positions, inv_freq);
  auto emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(options.dtype()), emb.sin().to(options.dtype())};
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

}  // namespace

// ---------------------------------------------------------------------------------------------
// LlamaConfig

json LlamaConfig::ToJson() const {
  return {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_act", "silu"},
      {"initializer_range", kInitStd},
      {"torch_dtype", "float32"},
      {"attention_bias", false},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_layers},
      {"num_attention_heads", num_heads},
      {"num_key_value_heads", num_kv_heads},
      {"max_position_embeddings", max_seq_len},
      {"rope_theta", rope_theta},
      {"rms_norm_eps", rms_norm_eps},
      {"tie_word_embeddings", tie_word_embeddings},
  };
}

Result<LlamaConfig> LlamaConfig::FromJson(const json& j) {
  if (!j.is_object()) return InvalidArgument("config: not a JSON object");
  if (auto it = j.find("model_type"); it != j.end() && *it != "llama") {
    return Unimplemented(
        fmt::format("config: model_type {} is not supported (only \"llama\")", it->dump()));
  }
  if (auto it = j.find("hidden_act"); it != j.end() && *it != "silu") {
    return Unimplemented(
        fmt::format("config: hidden_act {} is not supported (only \"silu\")", it->dump()));
  }
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    return Unimplemented("config: rope_scaling is not supported");
  }
  if (auto it = j.find("attention_bias"); it != j.end() && *it != false) {
    return Unimplemented("config: attention_bias is not supported");
  }
  if (auto it = j.find("mlp_bias"); it != j.end() && *it != false) {
    return Unimplemented("config: mlp_bias is not supported");
  }
  LlamaConfig c;
  c.max_seq_len = 2048;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000;
  c.tie_word_embeddings = false;
  COLONY_RETURN_IF_ERROR(ReadField(j, "vocab_size", c.vocab_size, true));
  COLONY_RETURN_IF_ERROR(ReadField(j, "hidden_size", c.hidden_size, true));
  COLONY_RETURN_IF_ERROR(ReadField(j, "intermediate_size", c.intermediate_size, true));
  COLONY_RETURN_IF_ERROR(ReadField(j, "num_hidden_layers", c.num_layers, true));
  COLONY_RETURN_IF_ERROR(ReadField(j, "num_attention_heads", c.num_heads, true));
  c.num_kv_heads = c.num_heads;
  COLONY_RETURN_IF_ERROR(ReadField(j, "num_key_value_heads", c.num_kv_heads, false));
  COLONY_RETURN_IF_ERROR(ReadField(j, "max_position_embeddings", c.max_seq_len, false));
  COLONY_RETURN_IF_ERROR(ReadField(j, "rope_theta", c.rope_theta, false));
  COLONY_RETURN_IF_ERROR(ReadField(j, "rms_norm_eps", c.rms_norm_eps, false));
  COLONY_RETURN_IF_ERROR(ReadField(j, "tie_word_embeddings", c.tie_word_embeddings, false));
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
  if (hidden_size % num_heads != 0) {
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
    return InvalidArgument(fmt::format(
        "config: head dimension {} (hidden_size / num_attention_heads) must be even for rotary "
        "embeddings",
        head_dim()));
  }
  if (!std::isfinite(rope_theta) || rope_theta <= 1) {
    return InvalidArgument(fmt::format("config: rope_theta {} must be finite and > 1", rope_theta));
  }
  if (!std::isfinite(rms_norm_eps) || rms_norm_eps <= 0 || rms_norm_eps >= 1) {
    return InvalidArgument(fmt::format("config: rms_norm_eps {} must be in (0, 1)", rms_norm_eps));
  }
  return Status::Ok();
}

int64_t LlamaConfig::NumParameters() const {
  const int64_t kv_dim = num_kv_heads * head_dim();
  const int64_t attention = 2 * hidden_size * hidden_size + 2 * hidden_size * kv_dim;
  const int64_t mlp = 3 * hidden_size * intermediate_size;
  const int64_t block = attention + mlp + 2 * hidden_size;
  const int64_t embed = vocab_size * hidden_size;
  return embed + num_layers * block + hidden_size + (tie_word_embeddings ? 0 : embed);
}

// ---------------------------------------------------------------------------------------------
// KVCache

void KVCache::Reorder(const torch::Tensor& index) {
  if (length == 0 || !k.defined()) return;
  auto idx = index.to(k.device(), at::kLong);
  k = k.index_select(0, idx);
  v = v.index_select(0, idx);
}

void KVCache::Truncate(int64_t new_length) {
  if (new_length >= length) return;
  if (new_length <= 0) {
    Clear();
    return;
  }
  k = k.narrow(2, 0, new_length);
  v = v.narrow(2, 0, new_length);
  length = new_length;
}

void KVCache::Clear() {
  k = torch::Tensor();
  v = torch::Tensor();
  length = 0;
}

// ---------------------------------------------------------------------------------------------
// Modules

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", at::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  auto h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * h.to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& config)
    : num_heads_(config.num_heads),
      num_kv_heads_(config.num_kv_heads),
      head_dim_(config.head_dim()),
      rope_theta_(config.rope_theta) {
  const int64_t h = config.hidden_size;
  q_proj = register_module("q_proj", MakeLinear(h, num_heads_ * head_dim_));
  k_proj = register_module("k_proj", MakeLinear(h, num_kv_heads_ * head_dim_));
  v_proj = register_module("v_proj", MakeLinear(h, num_kv_heads_ * head_dim_));
  o_proj = register_module("o_proj", MakeLinear(num_heads_ * head_dim_, h));
}

LoraAdapter* BlockAdapters::Find(const std::string& name) {
  if (name == "q_proj") return &q_proj;
  if (name == "k_proj") return &k_proj;
  if (name == "v_proj") return &v_proj;
  if (name == "o_proj") return &o_proj;
  if (name == "gate_proj") return &gate_proj;
  if (name == "up_proj") return &up_proj;
  if (name == "down_proj") return &down_proj;
  return nullptr;
}

torch::Tensor Project(torch::nn::Linear& linear, const torch::Tensor& x,
                      const LoraAdapter* adapter) {
  torch::Tensor y;
  if (linear->weight.scalar_type() == at::kChar) {
    const auto buffers = linear->named_buffers(/*recurse=*/false);
    const torch::Tensor scale = *buffers.find("weight_scale");
    y = at::linear(x, linear->weight.to(x.scalar_type()) * scale.to(x.scalar_type()).unsqueeze(1));
  } else {
    y = linear(x);
  }
  if (adapter != nullptr && adapter->defined()) {
    y = y +
        at::linear(at::linear(x, adapter->a.to(x.scalar_type())), adapter->b.to(x.scalar_type())) *
            adapter->scale;
  }
  return y;
}

void QuantizeInt8(torch::nn::Linear& linear) {
  torch::NoGradGuard no_grad;
  const torch::Tensor w = linear->weight.detach().to(at::kFloat);
  const torch::Tensor scale = w.abs().amax(1).clamp_min(1e-12) / 127.0;
  const torch::Tensor codes = (w / scale.unsqueeze(1)).round().clamp(-127, 127).to(at::kChar);
  linear->weight.set_requires_grad(false);
  linear->weight.set_data(codes);
  linear->register_buffer("weight_scale", scale);
}

namespace {
const LoraAdapter* AdapterOf(const BlockAdapters* adapters, LoraAdapter BlockAdapters::*member) {
  return adapters == nullptr ? nullptr : &(adapters->*member);
}
}  // namespace

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, int64_t position_offset,
                                          KVCache* cache, const BlockAdapters* adapters) {
  const int64_t b = x.size(0), t = x.size(1);
  auto q = Project(q_proj, x, AdapterOf(adapters, &BlockAdapters::q_proj))
               .view({b, t, num_heads_, head_dim_})
               .transpose(1, 2);
  auto k = Project(k_proj, x, AdapterOf(adapters, &BlockAdapters::k_proj))
               .view({b, t, num_kv_heads_, head_dim_})
               .transpose(1, 2);
  auto v = Project(v_proj, x, AdapterOf(adapters, &BlockAdapters::v_proj))
               .view({b, t, num_kv_heads_, head_dim_})
               .transpose(1, 2);

  auto [cos, sin] = RotaryTables(t, position_offset, head_dim_, rope_theta_, q.options());
  q = q * cos + RotateHalf(q) * sin;
  k = k * cos + RotateHalf(k) * sin;

  int64_t past = 0;
  if (cache != nullptr) {
    if (cache->length > 0 && cache->k.defined()) {
      past = cache->k.size(2);
      k = at::cat({cache->k, k}, 2);
      v = at::cat({cache->v, v}, 2);
    }
    cache->k = k;
    cache->v = v;
    cache->length = k.size(2);
  }
  const int64_t s = k.size(2);
  // Grouped-query attention: query head i reads kv head i / n_rep (HF's repeat_kv).
  const int64_t n_rep = num_heads_ / num_kv_heads_;
  if (n_rep > 1) {
    k = k.unsqueeze(2)
            .expand({b, num_kv_heads_, n_rep, s, head_dim_})
            .reshape({b, num_heads_, s, head_dim_});
    v = v.unsqueeze(2)
            .expand({b, num_kv_heads_, n_rep, s, head_dim_})
            .reshape({b, num_heads_, s, head_dim_});
  }
  auto scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
  if (t > 1) {
    // Query t (at key index past + t) must not see keys after it.
    auto mask = at::ones({t, s}, x.options().dtype(at::kBool)).triu(past + 1);
    scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  }
  auto probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  auto out = at::matmul(probs, v).transpose(1, 2).reshape({b, t, num_heads_ * head_dim_});
  return Project(o_proj, out, AdapterOf(adapters, &BlockAdapters::o_proj));
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& config) {
  gate_proj =
      register_module("gate_proj", MakeLinear(config.hidden_size, config.intermediate_size));
  up_proj = register_module("up_proj", MakeLinear(config.hidden_size, config.intermediate_size));
  down_proj =
      register_module("down_proj", MakeLinear(config.intermediate_size, config.hidden_size));
}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x, const BlockAdapters* adapters) {
  auto gate = Project(gate_proj, x, AdapterOf(adapters, &BlockAdapters::gate_proj));
  auto up = Project(up_proj, x, AdapterOf(adapters, &BlockAdapters::up_proj));
  return Project(down_proj, at::silu(gate) * up, AdapterOf(adapters, &BlockAdapters::down_proj));
}

LlamaBlockImpl::LlamaBlockImpl(const LlamaConfig& config) {
  // Registered in HF's order so that named_parameters() lists them as HF state dicts do.
  self_attn = register_module("self_attn", LlamaAttention(config));
  mlp = register_module("mlp", LlamaMLP(config));
  input_layernorm =
      register_module("input_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
}

torch::Tensor LlamaBlockImpl::forward(const torch::Tensor& x, int64_t position_offset,
                                      KVCache* cache, const BlockAdapters* adapters) {
  auto h = x + self_attn->forward(input_layernorm(x), position_offset, cache, adapters);
  return h + mlp->forward(post_attention_layernorm(h), adapters);
}

void LlamaBlockImpl::QuantizeInt8() {
  for (auto* l : {&self_attn->q_proj, &self_attn->k_proj, &self_attn->v_proj, &self_attn->o_proj,
                  &mlp->gate_proj, &mlp->up_proj, &mlp->down_proj}) {
    model::QuantizeInt8(*l);
  }
}

NamedTensors BlockParametersHF(LlamaBlock& block, int64_t layer) {
  NamedTensors out;
  const std::string prefix = fmt::format("model.layers.{}.", layer);
  for (const auto& item : block->named_parameters()) {
    out.emplace_back(prefix + item.key(), item.value());
  }
  return out;
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& config) : config_(config) {
  embed_tokens =
      register_module("embed_tokens", torch::nn::Embedding(config.vocab_size, config.hidden_size));
  {
    torch::NoGradGuard no_grad;
    embed_tokens->weight.normal_(0, kInitStd);
  }
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_layers; ++i) {
    blocks_.emplace_back(config);
    layers->push_back(blocks_.back());
  }
  norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  if (!config.tie_word_embeddings) {
    lm_head = register_module("lm_head", MakeLinear(config.hidden_size, config.vocab_size));
  }
}

torch::Tensor LlamaModelImpl::Embed(const torch::Tensor& tokens) { return embed_tokens(tokens); }

torch::Tensor LlamaModelImpl::Head(const torch::Tensor& hidden) {
  auto h = norm(hidden);
  return lm_head ? lm_head(h) : at::linear(h, embed_tokens->weight);
}

torch::Tensor LlamaModelImpl::forward(const torch::Tensor& tokens) {
  auto h = Embed(tokens);
  for (auto& block : blocks_) h = block(h);
  return Head(h);
}

torch::Tensor LlamaModelImpl::ForwardWithCache(const torch::Tensor& tokens,
                                               std::vector<KVCache>& caches) {
  if (caches.empty()) caches.resize(blocks_.size());
  TORCH_CHECK(caches.size() == blocks_.size(), "ForwardWithCache: ", caches.size(), " caches for ",
              blocks_.size(), " blocks");
  const int64_t offset = caches[0].length;
  auto h = Embed(tokens);
  for (size_t i = 0; i < blocks_.size(); ++i) h = blocks_[i](h, offset, &caches[i]);
  return Head(h);
}

NamedTensors LlamaModelImpl::NamedParametersHF() {
  NamedTensors out;
  for (const auto& item : named_parameters()) {
    const std::string& name = item.key();
    out.emplace_back(name.rfind("lm_head.", 0) == 0 ? name : "model." + name, item.value());
  }
  return out;
}

torch::Tensor LanguageModelLoss(const torch::Tensor& logits, const torch::Tensor& targets) {
  const int64_t v = logits.size(-1);
  return at::cross_entropy_loss(logits.reshape({-1, v}).to(at::kFloat), targets.reshape({-1}));
}

// ---------------------------------------------------------------------------------------------
// Sampling

int64_t SampleNextToken(const torch::Tensor& logits, const std::vector<int64_t>& history,
                        const SamplingOptions& options, std::mt19937_64& rng) {
  auto flat = logits.detach().to(at::kCPU, at::kDouble).contiguous().view({-1});
  const double* src = flat.data_ptr<double>();
  const auto n = static_cast<size_t>(flat.numel());
  if (n == 0) return -1;
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  std::vector<double> l(src, src + n);
  for (double& x : l) {
    if (std::isnan(x)) x = kNegInf;
  }

  if (options.repetition_penalty != 1.0 && options.repetition_penalty > 0) {
    std::vector<bool> seen(n, false);
    for (int64_t tok : history) {
      if (tok < 0 || static_cast<size_t>(tok) >= n || seen[static_cast<size_t>(tok)]) continue;
      seen[static_cast<size_t>(tok)] = true;
      double& x = l[static_cast<size_t>(tok)];
      x = x < 0 ? x * options.repetition_penalty : x / options.repetition_penalty;
    }
  }

  if (options.temperature <= 0) {
    return static_cast<int64_t>(std::max_element(l.begin(), l.end()) - l.begin());
  }
  for (double& x : l) x /= options.temperature;

  if (options.top_k > 0 && static_cast<size_t>(options.top_k) < n) {
    std::vector<double> sorted = l;
    std::nth_element(sorted.begin(), sorted.begin() + (options.top_k - 1), sorted.end(),
                     std::greater<>());
    const double threshold = sorted[static_cast<size_t>(options.top_k - 1)];
    for (double& x : l) {
      if (x < threshold) x = kNegInf;
    }
  }

  const double max = *std::max_element(l.begin(), l.end());
  if (max == kNegInf) return 0;  // every logit was -inf or NaN: nothing to prefer
  std::vector<double> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = std::exp(l[i] - max);

  if (options.top_p < 1.0) {
    // HF's TopPLogitsWarper: drop the least likely tokens whose total probability is at most
    // 1 - top_p, always keeping the most likely one.
    const double total = std::accumulate(p.begin(), p.end(), 0.0);
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] < p[b]; });
    double cumulative = 0;
    for (size_t i = 0; i + 1 < n; ++i) {
      cumulative += p[order[i]] / total;
      if (cumulative > 1.0 - options.top_p) break;
      p[order[i]] = 0;
    }
  }

  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  // 53 random bits -> [0, 1): the same on every platform, unlike std::uniform_real_distribution.
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
  double cumulative = 0;
  size_t last_nonzero = 0;
  for (size_t i = 0; i < n; ++i) {
    if (p[i] == 0) continue;
    last_nonzero = i;
    cumulative += p[i];
    if (u < cumulative) return static_cast<int64_t>(i);
  }
  return static_cast<int64_t>(last_nonzero);  // rounding left u at the very top
}

std::vector<int64_t> Generate(LlamaModel& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options, int64_t eos_id) {
  std::vector<int64_t> out;
  if (prompt.empty() || options.max_new_tokens <= 0) return out;
  torch::NoGradGuard no_grad;
  std::mt19937_64 rng(options.seed);
  std::vector<int64_t> history = prompt;
  std::vector<KVCache> caches;
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  auto input = at::tensor(prompt, long_opts).unsqueeze(0);
  const auto max_len = static_cast<size_t>(model->config().max_seq_len);
  while (true) {
    auto logits = model->ForwardWithCache(input, caches);
    const int64_t next = SampleNextToken(logits[0][-1], history, options, rng);
    out.push_back(next);
    history.push_back(next);
    if (next == eos_id || static_cast<int64_t>(out.size()) >= options.max_new_tokens ||
        history.size() >= max_len) {
      break;
    }
    input = at::full({1, 1}, next, long_opts);
  }
  return out;
}

}  // namespace colony::model
