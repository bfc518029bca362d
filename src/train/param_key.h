// The key under which torch::optim::Optimizer keeps a parameter's state. LibTorch 1.x keys its
// state map by the TensorImpl address printed as a string; LibTorch 2.x by the address itself.
// Code that reaches into optimizer state goes through StateKey() and builds against both.
#pragma once

#include <torch/optim/optimizer.h>

#include <sstream>
#include <string>
#include <type_traits>

namespace colony::train {

// The optimizer's state map key type (std::string in LibTorch 1.x, void* in 2.x).
using OptimizerStateKey =
    std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

// A template so that the branch for the other LibTorch is discarded, not compiled.
template <typename Tensor = torch::Tensor>
OptimizerStateKey StateKey(const Tensor& p) {
  if constexpr (std::is_same_v<OptimizerStateKey, std::string>) {
    std::ostringstream out;  // what c10::guts::to_string printed in LibTorch 1.x
    out << p.unsafeGetTensorImpl();
    return out.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

}  // namespace colony::train
