// What the remote mixture layers (mixture.h, switch_mixture.h) share: checking their input, their
// gating network, and the dispatcher that finds each input's best live experts by beam search
// over the gating's scores, calls them in parallel as one autograd function (whose backward
// trains them on their servers), and gives back their outputs slot by slot with which answered.
//
//   auto d = ExpertDispatcher::Create(node, options).value();
//   auto routed = d->Call(x, scores.detach()).value();   // outputs [batch, k_best, hidden]
#pragma once

#include <ATen/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "dht/node.h"
#include "moe/beam_search.h"

namespace colony::moe {

// hivemind's options, with its meanings (see mixture.h).
struct MixtureOptions {
  std::string grid_name;
  std::vector<int64_t> grid_size;
  int64_t hidden = 0;
  size_t k_best = 4;
  size_t k_min = 1;
  size_t backward_k_min = 1;
  std::chrono::milliseconds forward_timeout{30'000};
  std::chrono::milliseconds backward_timeout{30'000};
  std::chrono::milliseconds timeout_after_k_min{1'000};
  bool detect_anomalies = false;
  bool allow_zero_outputs = false;
  BeamSearchOptions search = {};
  uint64_t seed = 0;  // the gating's initial weights (and the switch layer's noise)
};

struct MixtureStats {
  uint64_t expert_calls = 0;
  uint64_t failed_calls = 0;  // errors and answers that came too late
};

// The options' sizes and k's; an error names the one that is wrong.
Status CheckMixtureOptions(const MixtureOptions& options);

// x must be float32 [1..65536, hidden] (and finite with detect_anomalies).
Status CheckMixtureInput(const at::Tensor& x, const MixtureOptions& options);

// Where each grid dimension's scores start in the gating's output: 0, n0, n0 + n1, ...
std::vector<int64_t> GridOffsets(const std::vector<int64_t>& grid_size);

// A linear gating over the grid: weight [sum(grid_size), hidden] and bias [sum(grid_size)],
// trainable, initialised as torch.nn.Linear from `seed`; offsets[d] is where dimension d's
// scores start in its output.
struct Gating {
  at::Tensor weight, bias;
  std::vector<int64_t> offsets;
};
Gating MakeGating(const MixtureOptions& options);

class ExpertDispatcher {
 public:
  static Result<std::unique_ptr<ExpertDispatcher>> Create(dht::Node& node,
                                                          const MixtureOptions& options);
  // Waits for calls still in flight (each ends by its own deadline).
  ~ExpertDispatcher();

  struct Routed {
    // [batch, k_best, hidden]: slot j of input i holds the output of its j-th best live expert,
    // differentiable in x; zeros where the expert failed or fewer than k_best were found.
    at::Tensor outputs;
    at::Tensor alive;                // bool [batch, k_best]: the slot's expert answered
    std::vector<at::Tensor> coords;  // per grid dimension, int64 [batch, k_best]
  };
  // `scores` float32 [batch, sum(grid_size)] (no gradient; -inf rules a coordinate out where
  // others remain). Errors: no live expert, or an input with fewer than k_min answers (neither
  // with allow_zero_outputs, which gives empty slots instead).
  Result<Routed> Call(const at::Tensor& x, const at::Tensor& scores);

  MixtureStats stats() const;

  struct Impl;

 private:
  explicit ExpertDispatcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace colony::moe
