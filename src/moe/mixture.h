// A layer whose feed-forward is a mixture of remote experts (Learning@home's
// RemoteMixtureOfExperts): a local gating network scores every coordinate of the expert grid, a
// beam search finds each input's k_best live experts in the DHT, the experts are called in
// parallel, and the output is the sum of their outputs weighted by the softmax of their scores
// over the experts that answered. Differentiable in the input and the gating's parameters; the
// backward pass trains the experts on their servers.
//
//   auto moe = moe::RemoteMixtureOfExperts::Create(node, {.grid_name = "ffn",
//       .grid_size = {16, 16}, .hidden = 64, .k_best = 4, .k_min = 1});
//   at::Tensor y = (*moe)->Forward(x).value();   // [batch, 64]
//   y.sum().backward();
//
// hivemind's options: once every input has k_min answers, the layer waits at most
// timeout_after_k_min for the rest (as hivemind); an input with fewer than k_min answers to its
// forward (backward_k_min: its backward) fails the call, or with allow_zero_outputs gets a zero
// output (hivemind counts the answers of the whole batch against k_min, so there an input may go
// unanswered while others have answers); detect_anomalies refuses non-finite inputs and
// gradients, and a non-finite answer is always dropped (hivemind drops it only with
// detect_anomalies). An expert that failed or came late has weight 0 and gets no gradient.
// Unlike hivemind, the servers of a failed call are
// left out of the next searches (BeamSearchOptions::avoid_failed_for) and the DHT keys that named
// them are read again from the nearest replicas, so that a dead server costs a step, not the
// minute its records live, and a partial copy of a prefix record cannot hide live experts; when
// avoiding them leaves an input no expert at all (after this side's own outage), they are
// searched again now and then (BeamSearchOptions::retry_avoided_after). An expert declared by
// several servers is one call with one deadline, shared among them (remote_expert.h). An input
// for which the DHT holds fewer than k_min live experts needs only those (at least one) to answer:
// a grid that is mostly empty still trains instead of failing every step.
#pragma once

#include <ATen/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "dht/node.h"
#include "moe/dispatch.h"

namespace colony::moe {

class RemoteMixtureOfExperts {
 public:
  static Result<std::unique_ptr<RemoteMixtureOfExperts>> Create(dht::Node& node,
                                                                MixtureOptions options);
  // Waits for calls still in flight (each ends by its own deadline).
  ~RemoteMixtureOfExperts();

  // x [batch, hidden] float32 -> [batch, hidden]. Errors: a malformed input, no live expert,
  // fewer than k_min answers for an input (without allow_zero_outputs).
  Result<at::Tensor> Forward(const at::Tensor& x);

  // The gating: weight [sum(grid_size), hidden] and bias [sum(grid_size)], trainable.
  std::vector<at::Tensor> gating_parameters() const;

  MixtureStats stats() const;

  struct Impl;

 private:
  explicit RemoteMixtureOfExperts(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace colony::moe
