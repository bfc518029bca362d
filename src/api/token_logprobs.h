// Log-probabilities of a completion's tokens, for the API's `logprobs` and `echo`: a decoder
// backend that passes every step through and records, from its logits, the log-probability of
// the token that followed each position and the most likely tokens there; and the two OpenAI
// shapes they are answered in (completions: `tokens`, `token_logprobs`, `top_logprobs`,
// `text_offset`; chat: `content` entries with `bytes`). The log-probabilities are the model's
// own (the log-softmax of its logits), before logit biases, penalties, temperature, top-p and
// top-k.
//
//   LogprobRecorder rec(decoder.backend, /*top=*/5, /*score_prompt=*/echo);
//   GenerateWith(rec, prompt, options, eos, [&](int64_t t) { rec.Chose(t); });
//   LogprobFormat format(tokenizer, LogprobFormat::kCompletion, /*as_ids=*/false, prompt);
//   json logprobs = format.Answer(rec.Take());
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/tokenizer.h"
#include "serve/generation.h"

namespace colony::api {

struct TopLogprob {
  int64_t token = 0;
  double logprob = 0;
};

struct TokenLogprob {
  int64_t token = 0;
  std::optional<double> logprob;  // none for a prompt's first token: nothing precedes it
  std::vector<TopLogprob> top;    // the most likely tokens at its position, best first
};

// Scoring a prompt takes every position's logits, T x V floats twice over (the logits and their
// log-probabilities): 4 GB each for 8,192 tokens of a 128k vocabulary. A prompt is therefore
// scored in steps of at most this many elements' worth of positions (128 MB of float32).
inline constexpr int64_t kMaxScoredElements = int64_t{1} << 25;

// Steps `inner` (rows stepped in place: no reordering) and records each row's log-probabilities
// at each position, row by row.
class LogprobRecorder : public serve::DecoderBackend {
 public:
  // top: how many of the most likely tokens to keep per position; score_prompt: also record
  // the tokens of the first step (the prompt) after its first. A scored prompt goes to `inner`
  // as its first token alone (whose logits tell the vocabulary's size V), then in steps of
  // max_scored_elements / (V x rows) tokens (at least one).
  LogprobRecorder(serve::DecoderBackend& inner, int64_t top, bool score_prompt,
                  int64_t max_scored_elements = kMaxScoredElements);

  // Asks `inner` for every position's logits when the step scores a prompt, for the last
  // position's otherwise; returns those `logits` names. Every step has the first one's rows.
  Result<at::Tensor> Step(const at::Tensor& tokens, int64_t position, const at::Tensor& hypo_ids,
                          serve::StepLogits logits) override;
  int64_t position() const override { return inner_.position(); }
  int64_t max_length() const override { return inner_.max_length(); }

  // The token chosen for `row` after the last step: recorded with what that step's last
  // position gave the row.
  void Chose(int64_t token, int64_t row = 0);
  // What was recorded for `row` since the last call, in order.
  std::vector<TokenLogprob> Take(int64_t row = 0);

 private:
  // The prompt step: tokens [B, T] from position 0, in bounded steps, every position recorded.
  Result<at::Tensor> ScorePrompt(const at::Tensor& tokens, serve::StepLogits logits);
  // Records tokens[i] for `row` as following the position of logp's row i ([R, V]
  // log-probabilities).
  void Record(int64_t row, const at::Tensor& logp, std::span<const int64_t> tokens);

  serve::DecoderBackend& inner_;
  int64_t top_;
  bool score_prompt_;
  int64_t max_scored_elements_;
  // [B, V]: the last step's last position (a copy of its own); a row's is read once, by Chose().
  at::Tensor next_;
  std::vector<bool> chosen_;                         // per row: Chose() since the last step
  std::vector<std::vector<TokenLogprob>> recorded_;  // per row
};

// Answers recorded log-probabilities in the OpenAI shape of one kind of request. Called once for
// a whole answer, or once per streamed event with the entries since the last one: the tokens'
// text depends on the tokens before them, which it keeps.
class LogprobFormat {
 public:
  enum Kind { kCompletion, kChat };
  // before: the tokens that precede the first entry (the prompt, unless it is echoed).
  // as_ids: tokens are written "token_id:N" (vLLM's return_tokens_as_token_ids).
  LogprobFormat(model::Tokenizer tokenizer, Kind kind, bool as_ids, std::vector<int64_t> before);

  nlohmann::json Answer(const std::vector<TokenLogprob>& entries);

 private:
  // The bytes `token` adds to the text of the tokens so far: a token's spelling can depend on
  // what precedes it (sentencepiece's word starts, byte-level BPE's merged characters).
  std::string Piece(int64_t token) const;
  // How a token is written: "token_id:N", its text, or (completions, not valid UTF-8) OpenAI's
  // "bytes:\xNN...".
  std::string Name(int64_t token, const std::string& piece) const;

  model::Tokenizer tokenizer_;
  Kind kind_;
  bool as_ids_;
  std::vector<int64_t> before_;
  int64_t text_offset_ = 0;  // characters of the answer's text before the next entry
};

}  // namespace colony::api
