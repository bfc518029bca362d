// The checks of a step that a logits processor can follow.
#include "api/answer_steps.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace colony::api {

Result<AnswerSteps::Given> AnswerSteps::Begin(const at::Tensor& tokens, int64_t position,
                                              const at::Tensor& hypo_ids, serve::StepLogits logits,
                                              int64_t inner_position) {
  if (logits != serve::StepLogits::kLast) {
    return InvalidArgument(fmt::format("{}: a step takes the last position's logits only", what_));
  }
  if (hypo_ids.defined()) {
    return InvalidArgument(
        fmt::format("{}: a step cannot follow reordered rows (beam search)", what_));
  }
  if (position != inner_position) {
    return InvalidArgument(
        fmt::format("{}: a step at {} after {} (what each row was given is read in order)", what_,
                    position, inner_position));
  }
  if (!tokens.defined() || tokens.dim() != 2 || tokens.size(0) < 1) {
    return InvalidArgument(fmt::format("{}: tokens must be [rows, T]", what_));
  }
  const int64_t rows = tokens.size(0);
  if (rows_ >= 0 && rows != rows_) {
    return InvalidArgument(
        fmt::format("{}: a step of {} rows after a first step of {}", what_, rows, rows_));
  }
  Given given{.tokens = tokens.to(at::kCPU, at::kLong).contiguous(),
              .prompt = rows_ < 0,
              .answered = answered_};
  if (given.prompt) {
    rows_ = rows;
  } else {
    answered_ += tokens.size(1);
  }
  return given;
}

Result<at::Tensor> AnswerSteps::LastLogits(const at::Tensor& out) const {
  if (!out.defined() || out.dim() != 3 || out.size(0) != rows_ || out.size(1) < 1 ||
      out.scalar_type() != at::kFloat) {
    return InvalidArgument(fmt::format("{}: the logits must be float32 [rows, 1, V]", what_));
  }
  return out.select(1, out.size(1) - 1);
}

}  // namespace colony::api
