// presence_penalty, frequency_penalty and logit_bias on the logits of each step.
#include "api/logit_adjustments.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace colony::api {

AdjustedLogits::AdjustedLogits(serve::DecoderBackend& inner, LogitAdjustments adjustments)
    : inner_(inner), adjustments_(std::move(adjustments)) {}

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
  }
  COLONY_ASSIGN_OR_RETURN(at::Tensor out, inner_.Step(tokens, position, hypo_ids, logits));
  if (out.dim() != 3 || out.size(0) != rows || out.scalar_type() != at::kFloat) {
    return InvalidArgument("logit adjustments need float32 logits [rows, 1, V]");
  }
  out = out.select(1, out.size(1) - 1).clone().contiguous();  // [rows, V], our own
  const int64_t vocab = out.size(1);
  for (const auto& [token, bias] : adjustments_.logit_bias) {
    if (token < 0 || token >= vocab) {
      return InvalidArgument(
          fmt::format("'logit_bias.{}' is outside the vocabulary [0, {})", token, vocab));
    }
  }
  float* base = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    float* row = base + r * vocab;
    std::unordered_map<int64_t, double> delta;
    for (const auto& [token, bias] : adjustments_.logit_bias) delta[token] += bias;
    for (const auto& [token, count] : counts_[static_cast<size_t>(r)]) {
      if (token < 0 || token >= vocab) continue;  // never sampled: nothing to lower
      delta[token] -= static_cast<double>(count) * adjustments_.frequency_penalty +
                      adjustments_.presence_penalty;
    }
    for (const auto& [token, d] : delta) {
      row[token] = static_cast<float>(static_cast<double>(row[token]) + d);
    }
  }
  return out.unsqueeze(1);
}

}  // namespace colony::api
