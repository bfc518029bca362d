// Forward and backward passes of a range of remote blocks, with retries and re-routing: what
// RemoteSequential's autograd function and prompt/LoRA tuning run on.
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <vector>

#include "core/status.h"
#include "serve/routing.h"

namespace colony::serve {

// LoRA adapters trained by a client on frozen remote blocks: for each block and each target
// projection (in `targets` order), A [rank, in] and B [out, rank], flattened in that order.
struct LoraSpec {
  int64_t rank = 0;                  // 0: no adapters
  std::vector<std::string> targets;  // "q_proj", "v_proj", ...
  double scale = 1.0;
};

// The input a span of blocks received during a forward pass (kept for the backward pass).
struct SpanInput {
  int64_t start = 0, end = 0;
  at::Tensor input;
};

// Remote forward/backward of blocks [start, end) with retries and re-routing (used by
// RemoteSequential's autograd function). `inputs`, when given, receives each span's input.
Result<at::Tensor> RemoteForward(SequenceManager& manager, int64_t start, int64_t end,
                                 const at::Tensor& hidden, const at::Tensor& prompts,
                                 std::vector<SpanInput>* inputs, const LoraSpec& lora = {},
                                 const std::vector<at::Tensor>& adapters = {});
struct RemoteGradients {
  at::Tensor hidden;
  at::Tensor prompts;                // when prompts were given
  std::vector<at::Tensor> adapters;  // when adapters were given (flat, as given)
};
// Gradients w.r.t. hidden (and prompts and adapters, when given) of blocks [start, end).
Result<RemoteGradients> RemoteBackward(SequenceManager& manager, int64_t start, int64_t end,
                                       const at::Tensor& hidden, const at::Tensor& grad_output,
                                       const at::Tensor& prompts, const LoraSpec& lora = {},
                                       const std::vector<at::Tensor>& adapters = {});

}  // namespace colony::serve
