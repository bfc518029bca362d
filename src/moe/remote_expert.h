// Calling an expert on another peer, and through autograd (Learning@home's RemoteExpert).
//
//   moe::RemoteExpert expert(node.host(), info);   // info from GetExperts or a beam search
//   at::Tensor y = moe::CallRemoteExpert(expert, x, {});  // differentiable in x
//   y.sum().backward();   // sends grad_y to the server, which trains the expert, returns grad_x
//
// Every call has one deadline, whatever the number of servers that host the expert. They are tried
// one after another, each at the first address it declared (dialled as that server, so another
// peer cannot answer for it) and with an equal share of the time left among the servers not yet
// tried: a server that never answers holds a call for its share, not the whole deadline. The
// server that answered last is tried first (a backward goes where its forward was computed), and
// a server whose last attempt failed, or is still running, goes after those that did not: a mute
// server that declared the expert too costs one call, not every call.
#pragma once

#include <ATen/Tensor.h>

#include <chrono>
#include <mutex>
#include <vector>

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
  // The servers with an address, in the order to try them (see above).
  std::vector<size_t> Order();
  void Attempt(size_t server);
  void Ended(size_t server, bool ok);

  net::Host& host_;
  RemoteExpertInfo info_;
  struct ServerState {
    uint64_t answered = 0;  // when it last answered, in answers counted by `answers_`
    uint32_t running = 0;   // attempts in flight
    uint32_t failures = 0;  // since it last answered
  };
  std::mutex mu_;  // calls may run on several threads at once (a late one, the next one)
  std::vector<ServerState> state_;
  uint64_t answers_ = 0;
};

// y = expert(x), differentiable in x: the backward pass calls moe.backward. A failed call throws
// (c10::Error naming the expert and the reason). `expert` must outlive the graph's backward.
at::Tensor CallRemoteExpert(RemoteExpert& expert, const at::Tensor& x,
                            const RemoteCallOptions& options);

}  // namespace colony::moe
