// Calling an expert on another peer, and through autograd (Learning@home's RemoteExpert).
//
//   moe::RemoteExpert expert(node.host(), info);   // info from GetExperts or a beam search
//   at::Tensor y = moe::CallRemoteExpert(expert, x, {});  // differentiable in x
//   y.sum().backward();   // sends grad_y to the server, which trains the expert, returns grad_x
//
// Every call has one deadline, whatever the number of servers that host the expert. At most
// kMaxServersPerCall of them are tried, one after another, each at the first address it declared
// (dialled as that server, so another peer cannot answer for it) and with an equal share of the
// time left among the attempts still to make, connecting included: a server that never answers
// holds a call for its share, not the whole deadline. Which server to try first comes from what
// the client learned about them (ServerHealth, shared by all of a mixture's experts).
#pragma once

#include <ATen/Tensor.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/status.h"
#include "moe/discovery.h"
#include "net/host.h"

namespace colony::moe {

// What a client learned about the servers it calls experts on. The order to try an expert's
// servers in: those not suspected first, the latest to answer first among them (a backward goes
// where its forward was computed), then the suspected, by failures since they last answered. A
// server is suspected while its last attempt failed or one is running, so a mute server that
// declared experts too costs one call, not every call, whichever of its experts it is. Remembers
// at most kMaxServers servers (then forgets those with no attempt running). Thread-safe.
class ServerHealth {
 public:
  static constexpr size_t kMaxServers = 65536;

  std::vector<size_t> Order(const std::vector<PeerId>& servers);
  void Attempt(const PeerId& server);
  void Ended(const PeerId& server, bool ok);
  // Its last attempt failed (and none answered since).
  bool Failing(const PeerId& server);

 private:
  struct State {
    uint64_t answered = 0;  // when it last answered, in answers counted by `answers_`
    uint32_t running = 0;   // attempts in flight
    uint32_t failures = 0;  // since it last answered
  };
  std::mutex mu_;
  std::map<PeerId, State> state_;
  uint64_t answers_ = 0;
};

struct RemoteCallOptions {
  std::chrono::milliseconds forward_timeout{30'000};
  std::chrono::milliseconds backward_timeout{30'000};
};

class RemoteExpert {
 public:
  static constexpr size_t kMaxServersPerCall = 3;

  // `health` null: a ServerHealth of its own.
  RemoteExpert(net::Host& host, RemoteExpertInfo info,
               std::shared_ptr<ServerHealth> health = nullptr);

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
  std::shared_ptr<ServerHealth> health_;
  // The servers whose first address parses, and that address; why the others are left out.
  std::vector<PeerId> servers_;
  std::vector<Multiaddr> addrs_;
  Status unusable_;
};

// y = expert(x), differentiable in x: the backward pass calls moe.backward. A failed call throws
// (c10::Error naming the expert and the reason). `expert` must outlive the graph's backward.
at::Tensor CallRemoteExpert(RemoteExpert& expert, const at::Tensor& x,
                            const RemoteCallOptions& options);

}  // namespace colony::moe
