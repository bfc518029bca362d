// The Switch Transformer variant of the remote mixture (hivemind's RemoteSwitchMixtureOfExperts,
// after Fedus, Zoph and Shazeer, 2021): each input goes to its best live expert (k_best 1), the
// expert's output is scaled by its probability (the product over grid dimensions of the softmax
// of the gating's scores for its coordinates) and added to the input (a residual: an input whose
// expert failed passes through unchanged, as allow_zero_outputs is on by default). For balanced
// routing:
//   - jitter: while training, the gating sees the input times uniform noise in
//     [1 - jitter_eps, 1 + jitter_eps] (the experts get the input itself);
//   - grid dropout: while training, each coordinate of each dimension is kept with probability
//     grid_dropout (1: none), the others scored -inf for that batch;
//   - a load-balancing loss to add to the task's loss: for each dimension, size^2 times the mean
//     over coordinates of (mean routing probability x utilization), summed over dimensions
//     (1 per dimension when uniform). Utilization is the exponential moving average (factor
//     utilization_alpha) of the fraction of answered inputs routed to each coordinate.
//
//   moe::SwitchOptions o;
//   o.grid_name = "ffn", o.grid_size = {16, 16}, o.hidden = 64;
//   auto layer = moe::RemoteSwitchMixtureOfExperts::Create(node, o).value();
//   auto [y, balance] = layer->Forward(x).value();
//   (task_loss(y) + 0.01 * balance).backward();
#pragma once

#include <ATen/Tensor.h>

#include <memory>
#include <vector>

#include "core/status.h"
#include "dht/node.h"
#include "moe/dispatch.h"

namespace colony::moe {

// hivemind's defaults: one expert per input, none required to answer.
struct SwitchOptions : MixtureOptions {
  SwitchOptions() {
    k_best = 1;
    k_min = 0;
    backward_k_min = 0;
    allow_zero_outputs = true;
  }
  double jitter_eps = 1e-2;        // [0, 1)
  double grid_dropout = 1.0;       // (0, 1]
  double utilization_alpha = 0.9;  // [0, 1)
};

class RemoteSwitchMixtureOfExperts {
 public:
  static Result<std::unique_ptr<RemoteSwitchMixtureOfExperts>> Create(dht::Node& node,
                                                                      SwitchOptions options);
  ~RemoteSwitchMixtureOfExperts();

  struct Output {
    at::Tensor y;               // [batch, hidden]: x plus the weighted expert outputs
    at::Tensor balancing_loss;  // a differentiable scalar
  };
  // x float32 [batch, hidden]. Errors as RemoteMixtureOfExperts::Forward.
  Result<Output> Forward(const at::Tensor& x);

  // Jitter and grid dropout apply only while training (the default).
  void set_training(bool training);

  std::vector<at::Tensor> gating_parameters() const;
  // The utilization of each coordinate, dimension after dimension: float32 [sum(grid_size)].
  at::Tensor grid_utilization() const;
  MixtureStats stats() const;

  struct Impl;

 private:
  explicit RemoteSwitchMixtureOfExperts(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace colony::moe
