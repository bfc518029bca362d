// Calling an expert on another peer, and through autograd (Learning@home's RemoteExpert).
//
//   moe::RemoteExpert expert(node.host(), info);   // info from GetExperts or a beam search
//   at::Tensor y = moe::CallRemoteExpert(expert, x, {});  // differentiable in x
//   y.sum().backward();   // sends grad_y to the server, which trains the expert, returns grad_x
//
// Every call has one deadline, whatever the number of servers that host the expert. At most
// kMaxServersPerCall of them are tried, one after another, each at the first address it declared
// (dialled as that server, so another peer cannot answer for it) and with an equal share of the
// time left among the attempts still to make, connecting included (an attempt whose dial ends after
// its share sends nothing): a server that never answers holds a call for its share, not the whole
// deadline. Which server to try first comes from what the client learned about them (ServerHealth).
#pragma once

#include <ATen/Tensor.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/status.h"
#include "moe/discovery.h"
#include "net/host.h"

namespace colony::moe {

// What a client learned about the servers it calls experts on, shared by all of a mixture's
// experts: which failed since they last answered, and when they last answered. The order to try
// an expert's servers in: those not failing first, the latest to answer first among them, then the
// failing, fewest failures first; so a mute server that declared experts too is tried last for
// every one of them once it failed. A server that was busy or refused the input is alive, but
// one that refuses kRefusalsBeforeFailing calls in a row without answering one counts as failed
// then: a peer that declares experts and only ever says it is busy would otherwise keep them
// chosen forever. Remembers at most kMaxServers servers (then starts over). Thread-safe.
class ServerHealth {
 public:
  static constexpr size_t kMaxServers = 65536;
  static constexpr uint32_t kRefusalsBeforeFailing = 3;

  std::vector<size_t> Order(const std::vector<PeerId>& servers);
  void Answered(const PeerId& server);
  void Failed(const PeerId& server);
  // It refused a call (busy, or the input): returns whether that made it fail (as Failed).
  bool Refused(const PeerId& server);
  // It failed since it last answered.
  bool Failing(const PeerId& server);

 private:
  struct State {
    uint64_t answered = 0;  // when it last answered, in answers counted by `answers_`
    uint32_t failures = 0;  // since it last answered
    uint32_t refusals = 0;  // in a row, since it last answered or failed
  };
  State& Of(const PeerId& server);  // mu_ held

  std::mutex mu_;
  std::map<PeerId, State> state_;
  uint64_t answers_ = 0;
};

// Which of an expert's servers a call tried: the one that answered, and those that failed.
struct CallReport {
  std::optional<PeerId> answered;
  std::vector<PeerId> failed;
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
  // The server that answered this expert last is tried first (a backward goes where its forward
  // was computed) unless it is failing. `report`, if given, says which servers were tried.
  Result<at::Tensor> Forward(const at::Tensor& x, std::chrono::milliseconds timeout,
                             CallReport* report = nullptr);
  Result<at::Tensor> Backward(const at::Tensor& x, const at::Tensor& grad_y,
                              std::chrono::milliseconds timeout, CallReport* report = nullptr);

 private:
  Result<at::Tensor> Call(const std::string& method, const std::vector<at::Tensor>& tensors,
                          const at::Tensor& like, std::chrono::milliseconds timeout,
                          CallReport* report);

  net::Host& host_;
  RemoteExpertInfo info_;
  std::shared_ptr<ServerHealth> health_;
  // The servers whose first address parses, and that address; why the others are left out.
  std::vector<PeerId> servers_;
  std::vector<Multiaddr> addrs_;
  Status unusable_;
  std::mutex mu_;
  std::optional<size_t> last_answered_;  // index into servers_
};

// y = expert(x), differentiable in x: the backward pass calls moe.backward. A failed call throws
// (c10::Error naming the expert and the reason). `expert` must outlive the graph's backward.
at::Tensor CallRemoteExpert(RemoteExpert& expert, const at::Tensor& x,
                            const RemoteCallOptions& options);

}  // namespace colony::moe
