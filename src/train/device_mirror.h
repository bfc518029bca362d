// DeviceMirror: a model that computes on a GPU, and the float32 host copy of its parameters that
// the collaborative optimizer then accumulates, averages, steps and shares (hivemind's
// offload_optimizer: the optimizer and its state stay in host memory, beside the network, and
// leave the GPU's memory to the model). Without offloading the collaborative optimizer works on
// the GPU's parameters themselves (the faster choice when the GPU has the memory: nothing crosses
// the bus for a batch or a lone peer's step), and the mirror's copies are no-ops.
//
//   DeviceMirror mirror(model->parameters(), /*offload=*/true);   // on cuda:0
//   auto opt = CollaborativeOptimizer::Create(node, mirror.master(), MakeAdam(mirror.master()), o);
//   loss.backward();
//   mirror.PullGradients();                          // device .grad -> host .grad (device zeroed)
//   auto r = (*opt)->Step(batch);
//   if ((*opt)->ParametersChanged(*r)) mirror.PushParameters();  // host -> device
//
// For parameters already in host memory as contiguous float32 (a CPU model), or when not
// offloading contiguous parameters, the mirror is the parameters themselves, and both copies are
// no-ops. Host copies are pinned when CUDA is available, so that the transfers run at the bus's
// speed; each direction ends with one synchronization.
#pragma once

#include <ATen/Tensor.h>

#include <memory>
#include <vector>

#include "core/status.h"
#include "train/flat_grads.h"

namespace colony::train {

class DeviceMirror {
 public:
  // `params`: the model's parameters, defined, float32, all on one device (Check them first:
  // the constructor throws std::invalid_argument otherwise). `offload`: keep the master copies
  // in host memory when the parameters are elsewhere (non-contiguous parameters are always
  // copied, to contiguous ones).
  DeviceMirror(std::vector<at::Tensor> params, bool offload);
  ~DeviceMirror();
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;
  // Why `params` cannot be mirrored (InvalidArgument), or Ok.
  static Status Check(const std::vector<at::Tensor>& params);

  // The host copies (the parameters themselves when not offloaded), with .grad after a pull.
  const std::vector<at::Tensor>& master() const { return master_; }
  // True when the parameters live off the host and the copies below move data.
  bool offloaded() const { return offloaded_; }

  // Copies every device gradient into its master's .grad (zeros where a parameter got none)
  // and zeroes the device gradients.
  void PullGradients();
  // Copies the master parameters onto the device parameters.
  void PushParameters();

 private:
  std::vector<at::Tensor> device_;
  std::vector<at::Tensor> master_;
  // When offloaded: both sides' .grad as views of one flat buffer each.
  std::unique_ptr<FlatGradients> device_grads_, master_grads_;
  bool offloaded_ = false;
};

}  // namespace colony::train
