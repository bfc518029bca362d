// The key under which torch::optim::Optimizer keeps a parameter's state. LibTorch 1.x keys its
// state map by the TensorImpl address printed as a string; LibTorch 2.x by the address itself.
// Code that reaches into optimizer state goes through StateKey() and builds against both.
#pragma once

#include <torch/optim/optimizer.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace colony::train {

// The optimizer's state map key type (std::string in LibTorch 1.x, void* in 2.x).
using OptimizerStateKey =
    std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

// One overload per key type: overload resolution picks the one for this LibTorch, and both
// compile against either.
inline std::string StateKeyAs(const torch::Tensor& p, std::string* /*tag*/) {
  std::ostringstream out;  // what c10::guts::to_string printed in LibTorch 1.x
  out << p.unsafeGetTensorImpl();
  return out.str();
}
inline void* StateKeyAs(const torch::Tensor& p, void** /*tag*/) { return p.unsafeGetTensorImpl(); }

inline OptimizerStateKey StateKey(const torch::Tensor& p) {
  return StateKeyAs(p, static_cast<OptimizerStateKey*>(nullptr));
}

}  // namespace colony::train
