// Calling an expert on another peer, and through autograd (Learning@home's RemoteExpert).
//
//   moe::RemoteExpert expert(node.host(), info);   // info from GetExperts or a beam search
//   at::Tensor y = moe::CallRemoteExpert(expert, x, {});  // differentiable in x
//   y.sum().backward();   // sends grad_y to the server, which trains the expert, returns grad_x
//
// Every call has a deadline. The servers that host the expert are tried in turn, each at the
// first address it declared (dialled as that server, so another peer cannot answer for it).
#pragma once

#include <ATen/Tensor.h>

#include <chrono>

#include "core/status.h"
#include "moe/discovery.h"
#include "net/host.h"

namespace colony::moe {

struct RemoteCallOptions {
  std::chrono::milliseconds forward_timeout{30'000};
  std::chrono::milliseconds backward_timeout{30'000};
};

class RemoteExpert {
 public:
  RemoteExpert(net::Host& host, RemoteExpertInfo info);

  const std::string& uid() const { return info_.uid; }
  // x [batch, hidden] float32. The reply is checked: the input's shape, float32, finite values.
  Result<at::Tensor> Forward(const at::Tensor& x, std::chrono::milliseconds timeout);
  Result<at::Tensor> Backward(const at::Tensor& x, const at::Tensor& grad_y,
                              std::chrono::milliseconds timeout);

 private:
  Result<at::Tensor> Call(const std::string& method, const std::vector<at::Tensor>& tensors,
                          const at::Tensor& like, std::chrono::milliseconds timeout);

  net::Host& host_;
  RemoteExpertInfo info_;
};

// y = expert(x), differentiable in x: the backward pass calls moe.backward. A failed call throws
// (c10::Error naming the expert and the reason). `expert` must outlive the graph's backward.
at::Tensor CallRemoteExpert(RemoteExpert& expert, const at::Tensor& x,
                            const RemoteCallOptions& options);

}  // namespace colony::moe
