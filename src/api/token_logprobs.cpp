// LogprobRecorder: log-softmax of each step's logits, the chosen tokens gathered and the top
// ones taken per row. LogprobFormat: each token's text decoded in the context of the tokens
// before it, written in the completions or the chat shape.
#include "api/token_logprobs.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>

#include "model/utf8.h"

namespace colony::api {

namespace {

using json = nlohmann::json;

// Tokens before a token that its text is decoded after: enough for any tokenizer's context
// (a word start, a character split over several byte tokens, at most 4 bytes).
constexpr size_t kContext = 8;

// Characters of UTF-8 text as a Python client counts them (an invalid byte counts as one).
int64_t Characters(std::string_view s) {
  return std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; });
}

}  // namespace

LogprobRecorder::LogprobRecorder(serve::DecoderBackend& inner, int64_t top, bool score_prompt,
                                 int64_t max_scored_elements)
    : inner_(inner),
      top_(std::max<int64_t>(0, top)),
      score_prompt_(score_prompt),
      max_scored_elements_(std::max<int64_t>(1, max_scored_elements)) {}

Result<at::Tensor> LogprobRecorder::Step(const at::Tensor& tokens, int64_t position,
                                         const at::Tensor& hypo_ids, serve::StepLogits logits) {
  if (tokens.dim() != 2 || tokens.size(0) < 1 || hypo_ids.defined()) {
    return InvalidArgument(
        "log-probabilities are recorded for rows stepped in place, not for reordered beams");
  }
  if (recorded_.empty()) {
    recorded_.resize(static_cast<size_t>(tokens.size(0)));
  } else if (tokens.size(0) != static_cast<int64_t>(recorded_.size())) {
    return InvalidArgument(
        fmt::format("a step of {} rows after steps of {}", tokens.size(0), recorded_.size()));
  }
  if (tokens.size(1) < 1) return InvalidArgument("a step needs at least one token");
  chosen_.assign(recorded_.size(), false);
  if (position == 0 && score_prompt_) return ScorePrompt(tokens, logits);
  COLONY_ASSIGN_OR_RETURN(at::Tensor out, inner_.Step(tokens, position, hypo_ids, logits));
  next_ = at::log_softmax(out.select(1, out.size(1) - 1).to(at::kFloat), -1);
  return out;
}

Result<at::Tensor> LogprobRecorder::ScorePrompt(const at::Tensor& tokens,
                                                serve::StepLogits logits) {
  const at::Tensor ids = tokens.to(at::kCPU, at::kLong).contiguous();
  const int64_t rows = ids.size(0), t = ids.size(1);
  auto row_tokens = [&](int64_t r) {
    return std::span<const int64_t>(ids.data_ptr<int64_t>() + r * t, static_cast<size_t>(t));
  };
  for (int64_t r = 0; r < rows; ++r) {
    recorded_[static_cast<size_t>(r)].push_back(
        {.token = row_tokens(r)[0], .logprob = std::nullopt, .top = {}});
  }
  std::vector<at::Tensor> all;  // every step's logits, when the caller asks for every position's
  at::Tensor out;
  int64_t step = 1;  // the first token alone: its logits tell V
  for (int64_t done = 0; done < t;) {
    const int64_t n = std::min(step, t - done);
    COLONY_ASSIGN_OR_RETURN(
        out, inner_.Step(tokens.narrow(1, done, n), done, {}, serve::StepLogits::kAll));
    const at::Tensor logp = at::log_softmax(out.to(at::kFloat), -1);  // [B, n, V]
    // Position i follows token done + i: it scores the prompt's next token, or (the prompt's
    // last position) the first one chosen after it.
    const int64_t inside = std::min(n, t - 1 - done);
    for (int64_t r = 0; r < rows && inside > 0; ++r) {
      Record(r, logp[r].narrow(0, 0, inside),
             row_tokens(r).subspan(static_cast<size_t>(done + 1), static_cast<size_t>(inside)));
    }
    done += n;
    if (done == t) next_ = logp.select(1, n - 1).clone();
    if (logits == serve::StepLogits::kAll) all.push_back(out);
    step = std::max<int64_t>(1, max_scored_elements_ / std::max<int64_t>(1, logp.size(2) * rows));
  }
  if (logits == serve::StepLogits::kAll) return all.size() == 1 ? all.front() : at::cat(all, 1);
  return out.narrow(1, out.size(1) - 1, 1);
}

void LogprobRecorder::Chose(int64_t token, int64_t row) {
  if (!next_.defined() || row < 0 || row >= next_.size(0)) return;
  const auto r = static_cast<size_t>(row);
  if (chosen_[r]) return;
  chosen_[r] = true;
  const int64_t one[] = {token};
  Record(row, next_[row].unsqueeze(0), one);
}

std::vector<TokenLogprob> LogprobRecorder::Take(int64_t row) {
  if (row < 0 || row >= static_cast<int64_t>(recorded_.size())) return {};
  return std::exchange(recorded_[static_cast<size_t>(row)], {});
}

void LogprobRecorder::Record(int64_t row, const at::Tensor& logp, std::span<const int64_t> tokens) {
  const int64_t rows = logp.size(0), vocab = logp.size(1);
  const at::Tensor ids =
      at::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()), at::kLong).clamp(0, vocab - 1);
  const at::Tensor chosen = logp.gather(1, ids.unsqueeze(1)).squeeze(1).contiguous();
  const int64_t k = std::min(top_, vocab);
  at::Tensor top_values, top_ids;
  if (k > 0) {
    std::tie(top_values, top_ids) = logp.topk(k, /*dim=*/1, /*largest=*/true, /*sorted=*/true);
    top_values = top_values.contiguous();
    top_ids = top_ids.contiguous();
  }
  auto& recorded = recorded_[static_cast<size_t>(row)];
  for (int64_t r = 0; r < rows; ++r) {
    TokenLogprob e{
        .token = tokens[static_cast<size_t>(r)], .logprob = chosen.data_ptr<float>()[r], .top = {}};
    for (int64_t j = 0; j < k; ++j) {
      e.top.push_back({.token = top_ids.data_ptr<int64_t>()[r * k + j],
                       .logprob = top_values.data_ptr<float>()[r * k + j]});
    }
    recorded.push_back(std::move(e));
  }
}

LogprobFormat::LogprobFormat(model::Tokenizer tokenizer, Kind kind, bool as_ids,
                             std::vector<int64_t> before)
    : tokenizer_(std::move(tokenizer)), kind_(kind), as_ids_(as_ids), before_(std::move(before)) {}

std::string LogprobFormat::Piece(int64_t token) const {
  const size_t n = std::min(kContext, before_.size());
  std::vector<int32_t> ids(before_.end() - static_cast<std::ptrdiff_t>(n), before_.end());
  const std::string context = tokenizer_.Decode(ids);
  ids.push_back(static_cast<int32_t>(token));
  std::string with = tokenizer_.Decode(ids);
  if (with.starts_with(context)) return with.substr(context.size());
  // The token rewrote the text before it: its own decoding is the best there is.
  const int32_t alone[] = {static_cast<int32_t>(token)};
  return tokenizer_.Decode(alone);
}

std::string LogprobFormat::Name(int64_t token, const std::string& piece) const {
  if (as_ids_) return fmt::format("token_id:{}", token);
  if (kind_ == kChat || model::IsValidUtf8(piece)) return model::Utf8Lossy(piece);
  std::string out = "bytes:";
  for (unsigned char c : piece) out += fmt::format("\\x{:02x}", c);
  return out;
}

json LogprobFormat::Answer(const std::vector<TokenLogprob>& entries) {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       offsets = json::array(), content = json::array();
  const auto bytes = [](const std::string& piece) {
    json b = json::array();
    for (unsigned char c : piece) b.push_back(c);
    return b;
  };
  for (const TokenLogprob& e : entries) {
    const std::string piece = Piece(e.token);
    const std::string name = Name(e.token, piece);
    const json logprob = e.logprob ? json(*e.logprob) : json(nullptr);
    if (kind_ == kCompletion) {
      tokens.push_back(name);
      token_logprobs.push_back(logprob);
      offsets.push_back(text_offset_);
      if (!e.logprob) {
        top_logprobs.push_back(nullptr);
      } else {
        // OpenAI's shape: the most likely tokens by text, and the chosen one among them always.
        json top = json::object();
        for (const TopLogprob& t : e.top) top.emplace(Name(t.token, Piece(t.token)), t.logprob);
        top.emplace(name, *e.logprob);
        top_logprobs.push_back(std::move(top));
      }
    } else {
      json top = json::array();
      for (const TopLogprob& t : e.top) {
        const std::string p = Piece(t.token);
        top.push_back({{"token", Name(t.token, p)}, {"logprob", t.logprob}, {"bytes", bytes(p)}});
      }
      content.push_back({{"token", name},
                         {"logprob", logprob},
                         {"bytes", bytes(piece)},
                         {"top_logprobs", std::move(top)}});
    }
    text_offset_ += Characters(piece);
    before_.push_back(e.token);
  }
  if (kind_ == kChat) return {{"content", std::move(content)}, {"refusal", nullptr}};
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

}  // namespace colony::api
