// logit_bias, the repetition penalty, presence_penalty, frequency_penalty, min_tokens and min_p on
// the logits of each step.
#include "api/logit_adjustments.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace colony::api {

AdjustedLogits::AdjustedLogits(serve::DecoderBackend& inner, LogitAdjustments adjustments)
    : inner_(inner), adjustments_(std::move(adjustments)), steps_("logit adjustments") {
  for (const auto& [token, bias] : adjustments_.logit_bias) bias_[token] += bias;
}

Result<at::Tensor> AdjustedLogits::Step(const at::Tensor& tokens, int64_t position,
                                        const at::Tensor& hypo_ids, serve::StepLogits logits) {
  COLONY_ASSIGN_OR_RETURN(AnswerSteps::Given given,
                          steps_.Begin(tokens, position, hypo_ids, logits, inner_.position()));
  const int64_t rows = steps_.rows();
  const bool repeats = adjustments_.repetition_penalty != 1;
  const int64_t* g = given.tokens.data_ptr<int64_t>();
  const int64_t per_row = given.tokens.size(1);
  if (given.prompt) {
    counts_.assign(static_cast<size_t>(rows), {});
    seen_.assign(static_cast<size_t>(rows), {});
  } else {
    for (int64_t i = 0; i < given.tokens.numel(); ++i)
      ++counts_[static_cast<size_t>(i / per_row)][g[i]];
  }
  if (repeats) {  // the prompt's tokens count too
    for (int64_t i = 0; i < given.tokens.numel(); ++i)
      seen_[static_cast<size_t>(i / per_row)].insert(g[i]);
  }
  COLONY_ASSIGN_OR_RETURN(at::Tensor out, inner_.Step(tokens, position, hypo_ids, logits));
  COLONY_ASSIGN_OR_RETURN(const at::Tensor last, steps_.LastLogits(out));
  // [rows, V] in float64 (exact), rounded once at the end.
  at::Tensor wide = last.to(at::kDouble).contiguous();
  const int64_t vocab = wide.size(1);
  if (vocab != vocab_) {
    for (const auto& [token, bias] : adjustments_.logit_bias) {
      if (token < 0 || token >= vocab) {
        return InvalidArgument(
            fmt::format("'logit_bias.{}' is outside the vocabulary [0, {})", token, vocab));
      }
    }
    allowed_.assign(adjustments_.allowed_tokens.empty() ? 0 : static_cast<size_t>(vocab), false);
    for (int64_t token : adjustments_.allowed_tokens) {
      if (token < 0 || token >= vocab) {
        return InvalidArgument(fmt::format(
            "'allowed_token_ids': token {} is outside the vocabulary [0, {})", token, vocab));
      }
      allowed_[static_cast<size_t>(token)] = true;
    }
    vocab_ = vocab;
  }
  const bool mask_ends = steps_.answered() < adjustments_.min_tokens;
  const bool min_p = adjustments_.min_p > 0 && adjustments_.temperature > 0;
  constexpr double kOut = -std::numeric_limits<double>::infinity();
  double* base = wide.data_ptr<double>();
  for (int64_t r = 0; r < rows; ++r) {
    double* row = base + r * vocab;
    if (!allowed_.empty()) {
      for (int64_t v = 0; v < vocab; ++v) {
        if (!allowed_[static_cast<size_t>(v)]) row[v] = kOut;
      }
    }
    for (const auto& [token, bias] : bias_) row[token] += bias;
    if (repeats) {
      const double penalty = adjustments_.repetition_penalty;
      for (int64_t token : seen_[static_cast<size_t>(r)]) {
        if (token < 0 || token >= vocab) continue;
        row[token] = row[token] > 0 ? row[token] / penalty : row[token] * penalty;
      }
    }
    for (const auto& [token, count] : counts_[static_cast<size_t>(r)]) {
      if (token < 0 || token >= vocab) continue;  // never sampled: nothing to lower
      row[token] -= static_cast<double>(count) * adjustments_.frequency_penalty +
                    adjustments_.presence_penalty;
    }
    if (mask_ends) {
      for (int64_t token : adjustments_.end_tokens) {
        if (token >= 0 && token < vocab) row[token] = kOut;
      }
    }
    if (min_p) {
      // exp((x - top) / T) < min_p, i.e. x < top + T log(min_p) (min_p 1: below the top).
      const double top = *std::max_element(row, row + vocab);
      const double cutoff = top + adjustments_.temperature * std::log(adjustments_.min_p);
      for (int64_t v = 0; v < vocab; ++v) {
        if (row[v] < cutoff) row[v] = kOut;
      }
    }
  }
  return wide.to(at::kFloat).unsqueeze(1);
}

}  // namespace colony::api
