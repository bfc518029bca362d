// One expert as a server hosts it: hivemind's "ffn" expert (Linear, GELU, Linear) or Mixtral's
// SwiGLU expert, with its own optimizer, so that a backward request trains it where it lives
// (Learning@home).
//
//   moe::Expert e({.hidden = 64, .seed = 7});
//   at::Tensor y = e.Forward(x);                 // [batch, 64] -> [batch, 64], no grad
//   at::Tensor gx = e.Backward(x, grad_y);       // grad w.r.t. x; one optimizer step
//
// Not thread-safe: the expert server runs each expert's work on its task pool, one at a time.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "train/lr_schedule.h"

namespace colony::moe {

// The largest gradient norm an unclipped step takes: every gradient value's square stays far
// inside float32 (Adam keeps their moving average).
inline constexpr double kMaxStepGradNorm = 1e18;

struct ExpertOptions {
  // "ffn": hivemind's Linear, GELU, Linear (with biases); "swiglu": Mixtral's expert,
  // w2(silu(w1 x) * w3 x) without biases (served from a checkpoint's experts).
  std::string kind = "ffn";
  int64_t hidden = 0;              // input and output size
  int64_t ffn_hidden = 0;          // 0: 4 x hidden
  std::string optimizer = "adam";  // adam or sgd
  double lr = 1e-3;
  // The learning rate by the expert's own optimizer steps (hivemind's expert servers take
  // transformers' schedules with warmup too): the step after s steps uses lr x Factor(s). The
  // step count is part of a checkpoint, so a restored expert goes on where it was.
  train::LrSchedule schedule{};
  // > 0: each step first scales the gradients down to this global L2 norm when above it.
  double clip_grad_norm = 0;
  uint64_t seed = 0;  // the initial weights (PyTorch's Linear init, from this seed)
};

class Expert {
 public:
  // InvalidArgument for sizes outside [1, 65536], an unknown optimizer, a bad learning rate,
  // schedule or clipping norm.
  static Result<std::unique_ptr<Expert>> Create(const ExpertOptions& options);
  ~Expert();

  // x [batch, hidden] float32 -> [batch, hidden].
  at::Tensor Forward(const at::Tensor& x);
  // The gradient w.r.t. x of sum(Forward(x) * grad_y); computes the parameters' gradients,
  // clips them (clip_grad_norm) and applies one optimizer step at the schedule's rate (none,
  // with a warning, when the gradients are not finite).
  at::Tensor Backward(const at::Tensor& x, const at::Tensor& grad_y);

  // ffn: w1 [ffn, hidden], b1 [ffn], w2 [hidden, ffn], b2 [hidden]; swiglu: w1 [ffn, hidden],
  // w2 [hidden, ffn], w3 [ffn, hidden] (views of the live weights).
  std::vector<at::Tensor> parameters() const;
  // Copies `weights` (as parameters() orders them, float32, the same shapes) into the expert;
  // an error naming the first that does not fit.
  Status SetWeights(const std::vector<at::Tensor>& weights);
  // Weights, optimizer state and step count (the schedule's position), written to `path`
  // (atomically: a temporary file renamed), and read back into an expert of the same options. Load
  // refuses a checkpoint of other sizes, naming them.
  Status Save(const std::string& path) const;
  Status Load(const std::string& path);
  int64_t hidden() const;
  uint64_t steps() const;
  // Backward calls whose parameter gradients were not finite (overflow): no step was taken.
  uint64_t skipped_steps() const;

 private:
  struct Impl;
  explicit Expert(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The backward of a batch of requests (x_i, grad_y_i) as one optimizer step, as an expert server
// batches them: the input gradients, one per request. When the batch's step is skipped (its
// gradient norm not finite, or too large to step with), each request is run again alone, one step
// each, so that one client's request that cannot move the expert does not cancel the steps of the
// others batched with it.
std::vector<at::Tensor> BackwardBatch(Expert& expert,
                                      const std::vector<std::pair<at::Tensor, at::Tensor>>& batch);

// The expert's function with given weights (four: ffn, three: swiglu), differentiable in x and
// the weights: the reference that tests and the local mixture compare with.
at::Tensor ExpertFunction(const at::Tensor& x, const std::vector<at::Tensor>& params);

}  // namespace colony::moe
