// presence_penalty, frequency_penalty, logit_bias and min_tokens on the logits of each step.
#include "api/logit_adjustments.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <limits>

namespace colony::api {

AdjustedLogits::AdjustedLogits(serve::DecoderBackend& inner, LogitAdjustments adjustments)
    : inner_(inner), adjustments_(std::move(adjustments)) {
  for (const auto& [token, bias] : adjustments_.logit_bias) bias_[token] += bias;
}

Result<at::Tensor> AdjustedLogits::Step(const at::Tensor& tokens, int64_t position,
                                        const at::Tensor& hypo_ids, serve::StepLogits logits) {
  if (logits != serve::StepLogits::kLast) {
    return InvalidArgument("logit adjustments apply to the last position's logits only");
  }
  if (hypo_ids.defined()) {
    return InvalidArgument("logit adjustments do not follow reordered rows (beam search)");
  }
  if (position != inner_.position()) {
    return InvalidArgument(
        fmt::format("logit adjustments count what each row was given: a step at {} after {} would "
                    "miscount",
                    position, inner_.position()));
  }
  if (tokens.dim() != 2) return InvalidArgument("tokens must be [rows, T]");
  const int64_t rows = tokens.size(0);
  if (!started_) {
    started_ = true;
    counts_.assign(static_cast<size_t>(rows), {});
  } else {
    if (rows != static_cast<int64_t>(counts_.size())) {
      return InvalidArgument(
          fmt::format("a step of {} rows after a first step of {}", rows, counts_.size()));
    }
    const at::Tensor given = tokens.to(at::kCPU, at::kLong).contiguous();
    const int64_t* g = given.data_ptr<int64_t>();
    const int64_t per_row = given.size(1);
    for (int64_t i = 0; i < given.numel(); ++i) ++counts_[static_cast<size_t>(i / per_row)][g[i]];
    answered_ += per_row;
  }
  COLONY_ASSIGN_OR_RETURN(at::Tensor out, inner_.Step(tokens, position, hypo_ids, logits));
  if (out.dim() != 3 || out.size(0) != rows || out.scalar_type() != at::kFloat) {
    return InvalidArgument("logit adjustments need float32 logits [rows, 1, V]");
  }
  out = out.select(1, out.size(1) - 1).clone().contiguous();  // [rows, V], our own
  const int64_t vocab = out.size(1);
  if (vocab != vocab_) {
    for (const auto& [token, bias] : adjustments_.logit_bias) {
      if (token < 0 || token >= vocab) {
        return InvalidArgument(
            fmt::format("'logit_bias.{}' is outside the vocabulary [0, {})", token, vocab));
      }
    }
    vocab_ = vocab;
  }
  // Rows are stepped together: every row's answer has answered_ tokens.
  const bool mask_ends = answered_ < adjustments_.min_tokens;
  float* base = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    float* row = base + r * vocab;
    const auto& counts = counts_[static_cast<size_t>(r)];
    // Each changed logit is written once: bias and penalty summed in float64, then rounded.
    for (const auto& [token, count] : counts) {
      if (token < 0 || token >= vocab) continue;  // never sampled: nothing to lower
      const auto b = bias_.find(token);
      const double delta = (b == bias_.end() ? 0.0 : b->second) -
                           (static_cast<double>(count) * adjustments_.frequency_penalty +
                            adjustments_.presence_penalty);
      row[token] = static_cast<float>(static_cast<double>(row[token]) + delta);
    }
    for (const auto& [token, bias] : bias_) {
      if (counts.contains(token)) continue;  // written above
      row[token] = static_cast<float>(static_cast<double>(row[token]) + bias);
    }
    if (!mask_ends) continue;
    for (int64_t token : adjustments_.end_tokens) {
      if (token >= 0 && token < vocab) row[token] = -std::numeric_limits<float>::infinity();
    }
  }
  return out.unsqueeze(1);
}

}  // namespace colony::api
