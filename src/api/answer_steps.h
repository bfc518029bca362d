// The steps of a generation that a logits processor over a decoder backend can follow, checked
// (AdjustedLogits, JsonObjectLogits). Such a processor reads the tokens each row is given and
// changes the logits the next token is drawn from, so it follows a generation as
// serve::GenerateRows and GenerateWith step one: the first step is the prompt, every later one the
// tokens each row was given after the step before; the last position's logits only; no reordered
// rows (beam search scores log-probabilities, not these); each step at the inner backend's position
// (no rollback); the first step's rows throughout. Another step fails with InvalidArgument naming
// the processor, before it reaches the inner backend.
//
//   COLONY_ASSIGN_OR_RETURN(AnswerSteps::Given given,
//                           steps_.Begin(tokens, position, hypo_ids, logits, inner_.position()));
//   COLONY_ASSIGN_OR_RETURN(at::Tensor out, inner_.Step(tokens, position, hypo_ids, logits));
//   COLONY_ASSIGN_OR_RETURN(at::Tensor last, steps_.LastLogits(out));  // [rows, V]
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "core/status.h"
#include "serve/generation.h"

namespace colony::api {

class AnswerSteps {
 public:
  // `what` names the processor in errors ("logit adjustments").
  explicit AnswerSteps(std::string what) : what_(std::move(what)) {}

  struct Given {
    at::Tensor tokens;     // the step's tokens on the CPU: int64, contiguous, [rows, T]
    bool prompt = false;   // the first step: the prompt's tokens
    int64_t answered = 0;  // tokens each row had been given after the prompt before these
  };
  // Checks a step before it is passed on, and counts its tokens as given.
  Result<Given> Begin(const at::Tensor& tokens, int64_t position, const at::Tensor& hypo_ids,
                      serve::StepLogits logits, int64_t inner_position);
  // The last position's logits of the inner backend's answer to the step just begun, which must
  // be float32 [rows, P, V]: a [rows, V] view.
  Result<at::Tensor> LastLogits(const at::Tensor& out) const;

  int64_t rows() const { return rows_; }  // -1 before the prompt's step
  // Tokens each row was given after the prompt, the step just begun's included: every row's
  // answer has as many (rows are stepped together).
  int64_t answered() const { return answered_; }

 private:
  std::string what_;
  int64_t rows_ = -1;
  int64_t answered_ = 0;
};

}  // namespace colony::api
