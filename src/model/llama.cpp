#include "model/llama.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "model/device.h"

namespace colony::model {
// ---------------------------------------------------------------------------------------------
// KVCache

void KVCache::Rehome(int64_t room, int64_t batch) {
  const auto shape = [&](const torch::Tensor& t) {
    return std::vector<int64_t>{batch, t.size(1), room, t.size(3)};
  };
  torch::Tensor nk = at::empty(shape(k), k.options());
  torch::Tensor nv = at::empty(shape(v), v.options());
  if (length > 0) {
    nk.narrow(2, 0, length).copy_(k);
    nv.narrow(2, 0, length).copy_(v);
  }
  k_room_ = nk;
  v_room_ = nv;
  room_owner_ = std::make_shared<const int>(0);
}

void KVCache::Append(const torch::Tensor& k_new, const torch::Tensor& v_new) {
  const int64_t t = k_new.size(2);
  if (length > 0 && k.defined()) {
    // What the caller steps must continue the cache: a batch of another size would broadcast
    // into it, another dtype or device be converted silently.
    for (const auto& [held, added] : {std::pair{k, k_new}, std::pair{v, v_new}}) {
      TORCH_CHECK(added.dim() == 4 && added.size(0) == held.size(0) &&
                      added.size(1) == held.size(1) && added.size(3) == held.size(3) &&
                      added.scalar_type() == held.scalar_type() && added.device() == held.device(),
                  "KVCache: appending ", added.sizes(), " ", added.scalar_type(), " on ",
                  added.device(), " to a cache of ", held.sizes(), " ", held.scalar_type(), " on ",
                  held.device());
    }
  }
  const bool recorded = k_new.requires_grad() || v_new.requires_grad() ||
                        (k.defined() && (k.requires_grad() || v.requires_grad()));
  if (at::GradMode::is_enabled() && recorded) {
    // Differentiable decoding: writing in place would break the graph of earlier steps.
    k = length > 0 && k.defined() ? at::cat({k, k_new}, 2) : k_new;
    v = length > 0 && v.defined() ? at::cat({v, v_new}, 2) : v_new;
    length += t;
    k_room_ = v_room_ = torch::Tensor();
    room_owner_.reset();
    return;
  }
  if (length == 0 || !k.defined()) {
    // The first positions decide the layout: the new tensors' shape and options.
    Clear();
    k = k_new;
    v = v_new;
    Rehome(std::max(t, reserve), k_new.size(0));
  } else if (!OwnsRoom() || length + t > capacity()) {
    // Doubling, within `reserve` while the positions fit in it.
    int64_t room = std::max(length + t, 2 * capacity());
    if (reserve > 0 && length + t <= reserve) room = std::min(room, reserve);
    Rehome(room, k.size(0));
  }
  k_room_.narrow(2, length, t).copy_(k_new);
  v_room_.narrow(2, length, t).copy_(v_new);
  length += t;
  k = k_room_.narrow(2, 0, length);
  v = v_room_.narrow(2, 0, length);
}

void KVCache::Reorder(const torch::Tensor& index) {
  if (length == 0 || !k.defined()) return;
  auto idx = ToDevice(index, k.device(), at::kLong);
  const torch::Tensor nk = k.index_select(0, idx), nv = v.index_select(0, idx);
  if (OwnsRoom() && nk.size(0) == k_room_.size(0)) {
    k.copy_(nk);
    v.copy_(nv);
    return;
  }
  // Another batch size, or storage a copy shares: the same room, new storage.
  k = nk;
  v = nv;
  Rehome(std::max(capacity(), length), nk.size(0));
  k = k_room_.narrow(2, 0, length);
  v = v_room_.narrow(2, 0, length);
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
  k = v = k_room_ = v_room_ = torch::Tensor();
  room_owner_.reset();
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
    : rotary_(config),
      num_heads_(config.num_heads),
      num_kv_heads_(config.num_kv_heads),
      head_dim_(config.head_dim()),
      sliding_window_(config.sliding_window) {
  const int64_t h = config.hidden_size;
  q_proj = register_module("q_proj", MakeLinear(h, num_heads_ * head_dim_, config.qkv_bias));
  k_proj = register_module("k_proj", MakeLinear(h, num_kv_heads_ * head_dim_, config.qkv_bias));
  v_proj = register_module("v_proj", MakeLinear(h, num_kv_heads_ * head_dim_, config.qkv_bias));
  o_proj = register_module("o_proj", MakeLinear(num_heads_ * head_dim_, h, config.o_bias));
}

namespace {
const LoraAdapter* AdapterOf(const BlockAdapters* adapters, LoraAdapter BlockAdapters::*member) {
  return adapters == nullptr ? nullptr : &(adapters->*member);
}
}  // namespace

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, int64_t position_offset,
                                          KVCache* cache, const BlockAdapters* adapters,
                                          const RopeTables* rope) {
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

  const bool shared = rope != nullptr && rope->first.defined() && rope->first.size(0) == t &&
                      rope->first.scalar_type() == q.scalar_type() &&
                      rope->first.device() == q.device();
  const auto [cos, sin] = shared ? *rope : rotary_.Tables(t, position_offset, q.options());
  q = q * cos + RotateHalf(q) * sin;
  k = k * cos + RotateHalf(k) * sin;

  int64_t past = 0;
  if (cache != nullptr) {
    // The keys appended below are rotated for position_offset: they must land there.
    TORCH_CHECK(cache->length == position_offset, "attention at position ", position_offset,
                " with a KV cache of ", cache->length, " positions");
    past = cache->length;
    cache->Append(k, v);
    k = cache->k;
    v = cache->v;
  }
  const int64_t s = k.size(2);
  // Grouped-query attention: query head i reads kv head i / n_rep (HF's repeat_kv). The n_rep
  // query heads of a kv head are stacked as rows of one product with it, instead of copying
  // each kv head n_rep times.
  const int64_t n_rep = num_heads_ / num_kv_heads_;
  const at::Tensor grouped_q = q.reshape({b, num_kv_heads_, n_rep * t, head_dim_});
  auto scores = at::matmul(grouped_q, k.transpose(-2, -1))
                    .view({b, num_heads_, t, s})
                    .div(std::sqrt(static_cast<double>(head_dim_)));
  if (t > 1 || (sliding_window_ > 0 && s > sliding_window_)) {
    // Query i (at key index past + i) must not see keys after it, nor (with a sliding window W)
    // keys W or more positions before it.
    auto mask = at::ones({t, s}, x.options().dtype(at::kBool)).triu(past + 1);
    if (sliding_window_ > 0) {
      mask = mask.logical_or(
          at::ones({t, s}, x.options().dtype(at::kBool)).tril(past - sliding_window_));
    }
    scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  }
  auto probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  auto out = at::matmul(probs.view({b, num_kv_heads_, n_rep * t, s}), v)
                 .view({b, num_heads_, t, head_dim_})
                 .transpose(1, 2)
                 .reshape({b, t, num_heads_ * head_dim_});
  return Project(o_proj, out, AdapterOf(adapters, &BlockAdapters::o_proj));
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& config) {
  const int64_t h = config.hidden_size, inter = config.intermediate_size;
  gate_proj = register_module("gate_proj", MakeLinear(h, inter, config.mlp_bias));
  up_proj = register_module("up_proj", MakeLinear(h, inter, config.mlp_bias));
  down_proj = register_module("down_proj", MakeLinear(inter, h, config.mlp_bias));
}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x, const BlockAdapters* adapters) {
  auto gate = Project(gate_proj, x, AdapterOf(adapters, &BlockAdapters::gate_proj));
  auto up = Project(up_proj, x, AdapterOf(adapters, &BlockAdapters::up_proj));
  return Project(down_proj, at::silu(gate) * up, AdapterOf(adapters, &BlockAdapters::down_proj));
}

LlamaBlockImpl::LlamaBlockImpl(const LlamaConfig& config) {
  // Registered in HF's order so that named_parameters() lists them as HF state dicts do.
  self_attn = register_module("self_attn", LlamaAttention(config));
  if (config.mixture_of_experts()) {
    block_sparse_moe = register_module("block_sparse_moe", SparseMoE(config));
  } else {
    mlp = register_module("mlp", LlamaMLP(config));
  }
  input_layernorm =
      register_module("input_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
}

torch::Tensor LlamaBlockImpl::forward(const torch::Tensor& x, int64_t position_offset,
                                      KVCache* cache, const BlockAdapters* adapters,
                                      const RopeTables* rope) {
  auto h = x + self_attn->forward(input_layernorm(x), position_offset, cache, adapters, rope);
  if (block_sparse_moe) {
    TORCH_CHECK(adapters == nullptr || !adapters->AnyMlp(),
                "LoRA adapters on the MLP of a mixture-of-experts block are not supported");
    return h + block_sparse_moe->forward(post_attention_layernorm(h));
  }
  return h + mlp->forward(post_attention_layernorm(h), adapters);
}

RopeTables LlamaBlockImpl::Rope(int64_t length, int64_t offset,
                                const at::TensorOptions& options) const {
  return self_attn->rotary().Tables(length, offset, options);
}

void LlamaBlockImpl::Quantize(WeightQuantization q) {
  for (auto* l : {&self_attn->q_proj, &self_attn->k_proj, &self_attn->v_proj, &self_attn->o_proj}) {
    model::Quantize(*l, q);
  }
  if (block_sparse_moe) {
    block_sparse_moe->Quantize(q);
    return;
  }
  for (auto* l : {&mlp->gate_proj, &mlp->up_proj, &mlp->down_proj}) model::Quantize(*l, q);
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
    embed_tokens->weight.normal_(0, kInitializerRange);
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
  return Head(RunBlocks(Embed(tokens), 0, nullptr));
}

torch::Tensor LlamaModelImpl::ForwardWithCache(const torch::Tensor& tokens,
                                               std::vector<KVCache>& caches, bool last_only) {
  if (caches.empty()) caches.resize(blocks_.size());
  TORCH_CHECK(caches.size() == blocks_.size(), "ForwardWithCache: ", caches.size(), " caches for ",
              blocks_.size(), " blocks");
  const int64_t offset = caches[0].length;
  const torch::Tensor h = RunBlocks(Embed(tokens), offset, &caches);
  return Head(last_only ? h.narrow(1, h.size(1) - 1, 1) : h);
}

torch::Tensor LlamaModelImpl::RunBlocks(torch::Tensor h, int64_t offset,
                                        std::vector<KVCache>* caches) {
  if (blocks_.empty()) return h;
  const RopeTables rope = blocks_[0]->Rope(h.size(1), offset, h.options());
  for (size_t i = 0; i < blocks_.size(); ++i) {
    h = blocks_[i](h, offset, caches ? &(*caches)[i] : nullptr, nullptr, &rope);
  }
  return h;
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
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(DeviceOf(*model));
  auto input = at::tensor(prompt, at::kLong).unsqueeze(0).to(long_opts.device());
  const auto max_len = static_cast<size_t>(model->config().max_seq_len);
  while (true) {
    auto logits = model->ForwardWithCache(input, caches, /*last_only=*/true);
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
