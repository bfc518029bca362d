// FlatGradients: the .grad of every parameter kept as a view of one flat buffer, so that checking,
// summing, copying or zeroing all gradients is one kernel instead of one per parameter tensor.
// On a GPU each kernel costs a launch (~5-10 µs of host time whatever its size), and a model has
// dozens to hundreds of parameter tensors: per-tensor loops cost milliseconds per batch there.
// (PyTorch DDP's gradient_as_bucket_view does the same for its buckets.)
//
//   FlatGradients grads(model->parameters());    // binds every .grad to its view (zeros)
//   loss.backward();                             // autograd accumulates into the views in place
//   bool ok = grads.AllFinite();                 // one reduction, one synchronization
//   acc.add_(grads.Bind(), batch_size);          // one kernel
//   grads.Zero();
//
// Autograd adds into a defined .grad in place (outside create_graph), so the views survive
// backward passes. Code that replaces or drops a .grad (an optimizer's zero_grad(set_to_none),
// a test that assigns one) is caught by Bind(): a dropped gradient is a zero, a replaced one is
// copied into its view, and the view is bound again. The checks are pointer comparisons, no
// kernels.
#pragma once

#include <ATen/Tensor.h>

#include <vector>

namespace colony::train {

class FlatGradients {
 public:
  // `params`: defined, contiguous, of one dtype and on one device (the caller checks).
  // `pinned`: the buffer in page-locked host memory (for parameters in host memory whose
  // gradients are copied from a GPU).
  explicit FlatGradients(std::vector<at::Tensor> params, bool pinned = false);

  // Every .grad bound to its view again (see above); returns the flat buffer, in the parameters'
  // order.
  const at::Tensor& Bind();
  // True when every gradient is finite: one reduction (in double, which no float32 sum
  // overflows) and one synchronization with the device.
  bool AllFinite();
  // Sets every gradient to zero (and binds them).
  void Zero();

 private:
  // True when parameter i's .grad is its view of flat_.
  bool Bound(size_t i) const;

  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> views_;
  at::Tensor flat_;
};

}  // namespace colony::train
