// OpenAI's presence_penalty, frequency_penalty and logit_bias, vLLM's min_tokens and min_p, and
// the repetition penalty: a decoder backend that passes every step through and changes the logits
// each row's next token is sampled from, in vLLM's order. For a token that the row's answer has
// had c times so far (the prompt is not counted, as OpenAI counts only what was sampled), the
// logit x becomes, in float64:
//   x + bias;  then, for a token of the prompt or the answer, divided by repetition_penalty when
//   positive and multiplied by it otherwise (HF's rule);  then - c * frequency_penalty -
//   (c > 0 ? presence_penalty : 0);
// allowed_tokens (vLLM's allowed_token_ids) first leave every other token at -inf;
// while a row's answer has fewer than min_tokens tokens, the end tokens' logits are -inf (they
// cannot be chosen); with min_p (and a temperature T > 0), a token whose probability at T is
// below min_p times the most likely token's, exp((x - max) / T) < min_p, gets -inf. The row is
// rounded once to the float32 the backend returns, and the sampler's temperature, top-k and top-p
// apply to it (the sampler's own repetition penalty must then be 1: it is applied here).
//
//   AdjustedLogits adjusted(backend, {.presence_penalty = 0.5, .logit_bias = {{50256, -100}}});
//   serve::GenerateRows(adjusted, prompt, options, eos);
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "api/answer_steps.h"
#include "core/status.h"
#include "serve/generation.h"

namespace colony::api {

struct LogitAdjustments {
  double presence_penalty = 0;
  double frequency_penalty = 0;
  std::vector<std::pair<int64_t, double>> logit_bias;  // token id, bias: each id once
  // The end tokens are not chosen until a row's answer has min_tokens tokens (those outside
  // the logits' vocabulary cannot be chosen anyway).
  int64_t min_tokens = 0;
  std::vector<int64_t> end_tokens;
  // vLLM's min_p, in [0, 1] (0: off), at the sampler's temperature (0: greedy, min_p is off).
  double min_p = 0;
  double temperature = 0;
  double repetition_penalty = 1;  // 1: off
  // vLLM's allowed_token_ids: when not empty, every other token's logit is -inf (first, so that
  // min_p's most likely token is an allowed one). Ids outside the vocabulary are an error.
  std::vector<int64_t> allowed_tokens = {};

  // Whether they change nothing (then there is no need for an AdjustedLogits). The repetition
  // penalty alone is no reason for one: the sampler applies it then.
  bool none() const {
    return presence_penalty == 0 && frequency_penalty == 0 && logit_bias.empty() &&
           (min_tokens == 0 || end_tokens.empty()) && (min_p == 0 || temperature == 0) &&
           allowed_tokens.empty();
  }
};

// Serves one generation, whose answers it counts as GenerateWith and GenerateRows step them
// (api/answer_steps.h: the prompt first, not counted; then the tokens each row was given; the
// last position's logits, the ones a token is sampled from, are adjusted). Another step fails
// with InvalidArgument, as does a bias for a token outside the logits' vocabulary.
class AdjustedLogits : public serve::DecoderBackend {
 public:
  AdjustedLogits(serve::DecoderBackend& inner, LogitAdjustments adjustments);

  Result<at::Tensor> Step(const at::Tensor& tokens, int64_t position, const at::Tensor& hypo_ids,
                          serve::StepLogits logits) override;
  int64_t position() const override { return inner_.position(); }
  int64_t max_length() const override { return inner_.max_length(); }

 private:
  serve::DecoderBackend& inner_;
  LogitAdjustments adjustments_;
  std::unordered_map<int64_t, double> bias_;  // logit_bias by token
  AnswerSteps steps_;
  int64_t vocab_ = -1;         // of the logits, once the biases are checked for it
  std::vector<bool> allowed_;  // by token, for that vocabulary
  std::vector<std::unordered_map<int64_t, int64_t>> counts_;  // per row: token -> times given
  // Per row: the tokens of its prompt and answer (with a repetition penalty).
  std::vector<std::unordered_set<int64_t>> seen_;
};

}  // namespace colony::api
