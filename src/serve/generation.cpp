#include "serve/generation.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in fmt/format.h only before fmt 11)

#include <algorithm>
#include <cmath>
#include <random>

#include "model/checkpoint.h"
#include "model/device.h"

namespace colony::serve {

ClientModelImpl::ClientModelImpl(const model::LlamaConfig& config) : config_(config) {
  embed_tokens =
      register_module("embed_tokens", torch::nn::Embedding(config.vocab_size, config.hidden_size));
  norm = register_module("norm", model::RMSNorm(config.hidden_size, config.rms_norm_eps));
  if (!config.tie_word_embeddings) {
    lm_head = register_module(
        "lm_head",
        torch::nn::Linear(
            torch::nn::LinearOptions(config.hidden_size, config.vocab_size).bias(false)));
  }
}

at::Tensor ClientModelImpl::Embed(const at::Tensor& tokens) { return embed_tokens(tokens); }

at::Tensor ClientModelImpl::Head(const at::Tensor& hidden) {
  auto h = norm(hidden);
  return lm_head ? lm_head(h) : at::linear(h, embed_tokens->weight);
}

model::NamedTensors ClientModelImpl::NamedParametersHF() {
  model::NamedTensors out{{"model.embed_tokens.weight", embed_tokens->weight},
                          {"model.norm.weight", norm->weight}};
  if (lm_head) out.emplace_back("lm_head.weight", lm_head->weight);
  return out;
}

Result<ClientModel> LoadClientModel(const std::filesystem::path& dir, c10::Device device) {
  COLONY_ASSIGN_OR_RETURN(model::LlamaConfig config, model::LoadLlamaConfig(dir));
  ClientModel m(config);
  COLONY_RETURN_IF_ERROR(model::LoadLlamaTensors(dir, m->NamedParametersHF()));
  m->eval();
  m->to(device);
  return m;
}

// ---------------------------------------------------------------- backends

namespace {

Status CheckStepTokens(const at::Tensor& tokens) {
  if (tokens.dim() != 2 || tokens.size(0) == 0 || tokens.size(1) == 0) {
    return InvalidArgument(
        fmt::format("a step's tokens must have shape [B, T], both at least 1; got [{}]",
                    fmt::join(tokens.sizes(), ", ")));
  }
  return {};
}

}  // namespace

LocalBackend::LocalBackend(model::LlamaModel model)
    : model_(std::move(model)), device_(model::DeviceOf(*model_)) {
  caches_.resize(static_cast<size_t>(model_->num_blocks()));
}

Result<at::Tensor> LocalBackend::Step(const at::Tensor& tokens, int64_t position,
                                      const at::Tensor& hypo_ids, StepLogits logits) {
  COLONY_RETURN_IF_ERROR(CheckStepTokens(tokens));
  if (position > position_ || position < 0) {
    return InvalidArgument(fmt::format("position {} is outside [0, {}]", position, position_));
  }
  at::NoGradGuard no_grad;
  const at::Tensor hypo =
      hypo_ids.defined() ? model::ToDevice(hypo_ids, device_, at::kLong) : hypo_ids;
  for (auto& c : caches_) {
    c.Truncate(position);
    if (hypo.defined()) c.Reorder(hypo);
  }
  const at::Tensor out =
      model_->ForwardWithCache(tokens.to(device_), caches_, logits == StepLogits::kLast);
  position_ = position + tokens.size(1);
  return out.to(at::kCPU, at::kFloat);
}

RemoteBackend::RemoteBackend(ClientModel head, InferenceSession& session, int64_t max_length,
                             at::Tensor prompts)
    : head_(std::move(head)),
      device_(model::DeviceOf(*head_)),
      session_(session),
      max_length_(max_length),
      prompts_(prompts.defined() ? prompts.detach() : prompts) {}

Result<at::Tensor> RemoteBackend::Step(const at::Tensor& tokens, int64_t position,
                                       const at::Tensor& hypo_ids, StepLogits logits) {
  COLONY_RETURN_IF_ERROR(CheckStepTokens(tokens));
  at::NoGradGuard no_grad;
  const int64_t p = prompt_length();
  if (p > 0 && (prompts_.dim() != 2 || prompts_.size(1) != head_->config().hidden_size)) {
    return InvalidArgument(fmt::format("shallow prompts must have shape [P, {}], got [{}]",
                                       head_->config().hidden_size,
                                       fmt::join(prompts_.sizes(), ", ")));
  }
  if (position < 0 || position > this->position()) {
    return InvalidArgument(
        fmt::format("position {} is outside [0, {}]", position, this->position()));
  }
  at::Tensor h = head_->Embed(tokens.to(device_));
  if (p > 0 && position == 0) {
    at::Tensor prompts =
        prompts_.to(device_, h.scalar_type()).unsqueeze(0).expand({h.size(0), -1, -1});
    h = at::cat({prompts, h}, 1);
  }
  // Past the prompt the session's positions are the tokens' shifted by P.
  const int64_t session_position = position == 0 ? 0 : position + p;
  // A decoding step gets only the last position back from the servers.
  const bool last = logits == StepLogits::kLast;
  COLONY_ASSIGN_OR_RETURN(
      at::Tensor out,
      session_.Step(h, hypo_ids, session_position, last ? StepOutputs::kLast : StepOutputs::kAll));
  if (!last && p > 0 && position == 0) {
    out = out.narrow(1, p, tokens.size(1));
  }
  // The servers' output goes to the GPU without waiting for it (model::ToDevice).
  return head_->Head(model::ToDevice(out, device_)).to(at::kCPU, at::kFloat);
}

// ---------------------------------------------------------------- decoding

Result<std::vector<std::vector<int64_t>>> GenerateRows(
    DecoderBackend& backend, const std::vector<int64_t>& prompt,
    std::span<const model::SamplingOptions> rows, int64_t eos_id,
    const std::function<void(int64_t, int64_t)>& on_token,
    const std::function<bool(int64_t)>& stop_requested) {
  if (prompt.empty()) return InvalidArgument("the prompt is empty");
  if (rows.empty()) return InvalidArgument("no rows to generate");
  const auto n = static_cast<int64_t>(rows.size());
  const auto max_len = static_cast<size_t>(backend.max_length());
  if (prompt.size() >= max_len) {
    return InvalidArgument(
        fmt::format("the prompt has {} tokens; the limit is {}", prompt.size(), max_len - 1));
  }
  std::vector<std::vector<int64_t>> out(rows.size());
  std::vector<std::mt19937_64> rng;
  std::vector<std::vector<int64_t>> history(rows.size(), prompt);
  std::vector<bool> ended(rows.size(), false);
  for (const auto& o : rows) rng.emplace_back(o.seed);
  auto live = [&] { return std::ranges::find(ended, false) != ended.end(); };
  for (size_t r = 0; r < rows.size(); ++r) ended[r] = rows[r].max_new_tokens <= 0;
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  at::Tensor input = at::tensor(prompt, long_opts).unsqueeze(0).repeat({n, 1});
  while (live()) {
    COLONY_ASSIGN_OR_RETURN(at::Tensor logits,
                            backend.Step(input, backend.position(), {}, StepLogits::kLast));
    if (logits.dim() != 3 || logits.size(0) != n) {
      return Internal(fmt::format("a step of {} rows returned logits of shape [{}]", n,
                                  fmt::join(logits.sizes(), ", ")));
    }
    std::vector<int64_t> next(rows.size());
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto row = static_cast<int64_t>(r);
      // An ended row is stepped with its last token, its logits unread: the rows share steps.
      next[r] = history[r].back();
      if (ended[r]) continue;
      next[r] = model::SampleNextToken(logits[row][-1], history[r], rows[r], rng[r]);
      out[r].push_back(next[r]);
      history[r].push_back(next[r]);
      if (on_token) on_token(row, next[r]);
      ended[r] = next[r] == eos_id ||
                 static_cast<int64_t>(out[r].size()) >= rows[r].max_new_tokens ||
                 history[r].size() >= max_len || (stop_requested && stop_requested(row));
    }
    input = at::tensor(next, long_opts).unsqueeze(1);
  }
  return out;
}

Result<std::vector<int64_t>> GenerateWith(DecoderBackend& backend,
                                          const std::vector<int64_t>& prompt,
                                          const model::SamplingOptions& options, int64_t eos_id,
                                          const std::function<void(int64_t)>& on_token,
                                          const std::function<bool()>& stop_requested) {
  if (prompt.empty()) return InvalidArgument("the prompt is empty");
  if (options.max_new_tokens <= 0) return std::vector<int64_t>{};
  COLONY_ASSIGN_OR_RETURN(auto rows,
                          GenerateRows(
                              backend, prompt, std::span(&options, 1), eos_id,
                              [&](int64_t, int64_t t) {
                                if (on_token) on_token(t);
                              },
                              [&](int64_t) { return stop_requested && stop_requested(); }));
  return std::move(rows.front());
}

Result<std::vector<Beam>> BeamSearch(DecoderBackend& backend, const std::vector<int64_t>& prompt,
                                     int64_t num_beams, int64_t max_new_tokens,
                                     const std::vector<int64_t>& end_ids, double length_penalty,
                                     double repetition_penalty) {
  if (prompt.empty()) return InvalidArgument("the prompt is empty");
  if (num_beams < 1) return InvalidArgument("num_beams must be at least 1");
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty)) {
    return InvalidArgument(
        fmt::format("repetition_penalty {} must be positive and finite", repetition_penalty));
  }
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  const int64_t max_total = backend.max_length();
  max_new_tokens =
      std::min<int64_t>(max_new_tokens, max_total - static_cast<int64_t>(prompt.size()));
  if (max_new_tokens <= 0) return InvalidArgument("the prompt leaves no room for new tokens");
  at::Tensor input = at::tensor(prompt, long_opts).unsqueeze(0).repeat({num_beams, 1});
  COLONY_ASSIGN_OR_RETURN(at::Tensor logits, backend.Step(input, 0, {}, StepLogits::kLast));
  std::vector<Beam> alive(static_cast<size_t>(num_beams)), finished;
  auto rank = [&](const Beam& b) {
    return b.log_prob /
           std::pow(static_cast<double>(std::max<size_t>(b.tokens.size(), 1)), length_penalty);
  };
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    at::Tensor logp = at::log_softmax(logits.select(1, -1).to(at::kDouble), -1);  // [B, V]
    const int64_t vocab = logp.size(1);
    // At the first step every row holds the same prompt: expand row 0 only.
    const int64_t rows = step == 0 ? 1 : num_beams;
    if (repetition_penalty != 1.0) {
      // transformers' rule, on the log-probabilities as its beam search applies its processors:
      // a token already in the row's sequence (prompt included) has its score multiplied by the
      // penalty when negative, divided when positive.
      auto lp = logp.accessor<double, 2>();
      for (int64_t b = 0; b < rows; ++b) {
        std::vector<bool> seen(static_cast<size_t>(vocab), false);
        auto penalize = [&](int64_t t) {
          if (t < 0 || t >= vocab || seen[static_cast<size_t>(t)]) return;
          seen[static_cast<size_t>(t)] = true;
          double& x = lp[b][t];
          x = x < 0 ? x * repetition_penalty : x / repetition_penalty;
        };
        for (int64_t t : prompt) penalize(t);
        for (int64_t t : alive[static_cast<size_t>(b)].tokens) penalize(t);
      }
    }
    std::vector<double> base(static_cast<size_t>(rows));
    for (int64_t b = 0; b < rows; ++b)
      base[static_cast<size_t>(b)] = alive[static_cast<size_t>(b)].log_prob;
    at::Tensor scores = logp.narrow(0, 0, rows) +
                        at::tensor(base, at::TensorOptions().dtype(at::kDouble)).unsqueeze(1);
    const int64_t k = std::min<int64_t>(2 * num_beams, rows * vocab);
    auto [top_scores, top_idx] = scores.reshape({-1}).topk(k);
    std::vector<Beam> next;
    std::vector<int64_t> sources, tokens;
    for (int64_t i = 0; i < k && static_cast<int64_t>(next.size()) < num_beams; ++i) {
      const int64_t flat = top_idx[i].item<int64_t>();
      const int64_t src = flat / vocab, token = flat % vocab;
      Beam b = alive[static_cast<size_t>(src)];
      b.tokens.push_back(token);
      b.log_prob = top_scores[i].item<double>();
      if (std::find(end_ids.begin(), end_ids.end(), token) != end_ids.end()) {
        b.finished = true;
        if (static_cast<int64_t>(finished.size()) < num_beams) finished.push_back(std::move(b));
        continue;
      }
      next.push_back(std::move(b));
      sources.push_back(src);
      tokens.push_back(token);
    }
    alive = std::move(next);
    const bool last = step + 1 == max_new_tokens;
    if (static_cast<int64_t>(finished.size()) >= num_beams || last ||
        static_cast<int64_t>(alive.size()) < num_beams) {
      break;
    }
    at::Tensor hypo = at::tensor(sources, long_opts);
    at::Tensor step_tokens = at::tensor(tokens, long_opts).unsqueeze(1);
    COLONY_ASSIGN_OR_RETURN(logits,
                            backend.Step(step_tokens, backend.position(), hypo, StepLogits::kLast));
  }
  for (auto& b : alive) finished.push_back(std::move(b));
  std::stable_sort(finished.begin(), finished.end(),
                   [&](const Beam& a, const Beam& b) { return rank(a) > rank(b); });
  if (static_cast<int64_t>(finished.size()) > num_beams)
    finished.resize(static_cast<size_t>(num_beams));
  return finished;
}

}  // namespace colony::serve
