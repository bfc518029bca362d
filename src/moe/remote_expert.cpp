#include "moe/remote_expert.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/autograd.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/use_future.hpp>
#include <future>

#include "model/finite.h"
#include "moe/expert_chunks.h"
#include "runtime/tensor_io.h"

namespace colony::moe {

std::vector<size_t> ServerHealth::Order(const std::vector<PeerId>& servers) {
  std::lock_guard lock(mu_);
  std::vector<State> states;
  for (const PeerId& p : servers) {
    auto it = state_.find(p);
    states.push_back(it == state_.end() ? State{} : it->second);
  }
  std::vector<size_t> order(servers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return states[a].failures != states[b].failures ? states[a].failures < states[b].failures
                                                    : states[a].answered > states[b].answered;
  });
  return order;
}

ServerHealth::State& ServerHealth::Of(const PeerId& server) {
  if (state_.size() >= kMaxServers && !state_.contains(server)) state_.clear();
  return state_[server];
}

void ServerHealth::Answered(const PeerId& server) {
  std::lock_guard lock(mu_);
  State& st = Of(server);
  st.answered = ++answers_;
  st.failures = 0;
  st.refusals = 0;
}

void ServerHealth::Failed(const PeerId& server) {
  std::lock_guard lock(mu_);
  State& st = Of(server);
  ++st.failures;
  st.refusals = 0;
}

bool ServerHealth::Refused(const PeerId& server) {
  std::lock_guard lock(mu_);
  State& st = Of(server);
  if (++st.refusals < kRefusalsBeforeFailing) return false;
  ++st.failures;
  st.refusals = 0;
  return true;
}

bool ServerHealth::Failing(const PeerId& server) {
  std::lock_guard lock(mu_);
  auto it = state_.find(server);
  return it != state_.end() && it->second.failures > 0;
}

RemoteExpert::RemoteExpert(net::Host& host, RemoteExpertInfo info,
                           std::shared_ptr<ServerHealth> health)
    : host_(host),
      info_(std::move(info)),
      health_(health ? std::move(health) : std::make_shared<ServerHealth>()) {
  for (size_t s = 0; s < info_.servers.size(); ++s) {
    if (s >= info_.addrs.size() || info_.addrs[s].empty()) continue;
    auto addr = Multiaddr::Parse(info_.addrs[s][0]);
    if (!addr.ok()) {
      unusable_ = addr.status().WithContext(
          fmt::format("expert {} on {}", info_.uid, info_.servers[s].ToString()));
      continue;
    }
    servers_.push_back(info_.servers[s]);
    addrs_.push_back(addr->WithPeerId(info_.servers[s]));
    // The others too: the first may lead elsewhere from this machine (Host::SetPeerAddresses).
    host_.SetPeerAddresses(info_.servers[s], ParseMultiaddrs(info_.addrs[s]));
  }
}

namespace {

// One call to one server: the request's chunks out, the output's chunks back (expert_chunks.h),
// each checked: float32 [1.., hidden], finite, `rows` in all.
asio::awaitable<Result<at::Tensor>> Exchange(net::Host& host, Multiaddr address, std::string method,
                                             std::vector<net::Message> request, int64_t rows,
                                             int64_t hidden,
                                             std::chrono::steady_clock::time_point deadline) {
  using Ms = std::chrono::milliseconds;
  const auto left = [&] {
    return std::chrono::duration_cast<Ms>(deadline - std::chrono::steady_clock::now());
  };
  auto stream = co_await host.OpenStream(std::move(address), std::move(method),
                                         {.timeout = std::max(Ms(1), left())});
  if (!stream.ok()) co_return stream.status();
  // The dial is bounded by the host's own timeout, not this one: an attempt given up on meanwhile
  // must not send its request (a backward would train the expert) after the call moved on.
  if (left() <= Ms(0)) {
    (*stream)->Cancel(DeadlineExceeded("the attempt's time ran out while dialling"));
    co_return DeadlineExceeded("connecting took the attempt's whole share");
  }
  for (const auto& m : request) {
    Status st = co_await (*stream)->Write(m);
    if (!st.ok()) co_return st;
  }
  Status closed = co_await (*stream)->CloseWrite();
  if (!closed.ok()) co_return closed;
  std::vector<at::Tensor> parts;
  int64_t got = 0;
  for (;;) {
    auto next = co_await (*stream)->Read();
    if (!next.ok()) co_return next.status();
    if (!next->has_value()) break;
    const net::Message& m = **next;
    auto part =
        m.tensors.size() != 1
            ? Result<at::Tensor>(ProtocolError("a reply chunk of other than one tensor"))
            : runtime::FromFrame(m.tensors[0],
                                 {.max_elements = static_cast<uint64_t>((rows - got) * hidden),
                                  .allowed_dtypes = {DType::kFloat32},
                                  .rank = 2});
    if (!part.ok() || part->size(0) < 1 || part->size(1) != hidden || !model::AllFinite(*part)) {
      (*stream)->Cancel(ProtocolError("malformed reply"));
      co_return ProtocolError(
          fmt::format("answered what is not finite float32 of shape [{}, {}] in chunks of rows{}",
                      rows, hidden, part.ok() ? "" : ": " + part.status().ToString()));
    }
    got += part->size(0);
    parts.push_back(std::move(*part));
  }
  if (got != rows) {
    co_return ProtocolError(fmt::format("answered {} rows of the {} it was sent", got, rows));
  }
  co_return parts.size() == 1 ? parts[0] : at::cat(parts, 0);
}

}  // namespace

Result<at::Tensor> RemoteExpert::Call(const std::string& method,
                                      const std::vector<at::Tensor>& tensors,
                                      const at::Tensor& like, std::chrono::milliseconds timeout,
                                      CallReport* report) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  if (info_.servers.empty()) return NotFound(fmt::format("no server hosts expert {}", info_.uid));
  if (servers_.empty()) {
    return unusable_.ok() ? Unavailable(fmt::format("no usable address for expert {}", info_.uid))
                          : unusable_;
  }
  std::vector<at::Tensor> sent;
  for (const auto& t : tensors) sent.push_back(t.to(at::kFloat).contiguous());
  COLONY_ASSIGN_OR_RETURN(auto request, ChunkRows(info_.uid, sent));
  std::vector<size_t> order = health_->Order(servers_);
  {
    std::lock_guard lock(mu_);
    if (last_answered_ && !health_->Failing(servers_[*last_answered_])) {
      std::erase(order, *last_answered_);
      order.insert(order.begin(), *last_answered_);
    }
  }
  const size_t attempts = std::min(order.size(), kMaxServersPerCall);
  Status last;
  for (size_t n = 0; n < attempts; ++n) {
    const size_t s = order[n];
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      last = DeadlineExceeded(
          fmt::format("expert {}: the call's {} ms were spent before its server {} could be tried",
                      info_.uid, timeout.count(), servers_[s].ToString()));
      break;
    }
    const auto share =
        std::max(std::chrono::milliseconds(1), left / static_cast<int64_t>(attempts - n));
    auto pending = asio::co_spawn(host_.io_context(),
                                  Exchange(host_, addrs_[s], method, request, like.size(0),
                                           like.size(1), Clock::now() + share),
                                  asio::use_future);
    // An attempt still dialling at the end of its share goes on alone, unread, and sends
    // nothing (Exchange).
    Result<at::Tensor> out = pending.wait_for(share) == std::future_status::ready
                                 ? pending.get()
                                 : Result<at::Tensor>(DeadlineExceeded(fmt::format(
                                       "did not answer within its {} ms share", share.count())));
    if (out.ok()) {
      health_->Answered(servers_[s]);
      std::lock_guard lock(mu_);
      last_answered_ = s;
      if (report != nullptr) report->answered = servers_[s];
      return *out;
    }
    // A busy server, or one refusing this input, is alive, until it has refused too often.
    const StatusCode code = out.status().code();
    const bool refused =
        code == StatusCode::kResourceExhausted || code == StatusCode::kInvalidArgument;
    const bool failed = refused ? health_->Refused(servers_[s]) : true;
    if (!refused) health_->Failed(servers_[s]);
    if (failed && report != nullptr) report->failed.push_back(servers_[s]);
    last =
        out.status().WithContext(fmt::format("expert {} on {}", info_.uid, servers_[s].ToString()));
  }
  return last;
}

Result<at::Tensor> RemoteExpert::Forward(const at::Tensor& x, std::chrono::milliseconds timeout,
                                         CallReport* report) {
  return Call("moe.forward", {x}, x, timeout, report);
}

Result<at::Tensor> RemoteExpert::Backward(const at::Tensor& x, const at::Tensor& grad_y,
                                          std::chrono::milliseconds timeout, CallReport* report) {
  return Call("moe.backward", {x, grad_y}, x, timeout, report);
}

namespace {

class RemoteExpertFunction : public torch::autograd::Function<RemoteExpertFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor x, int64_t expert,
                            int64_t forward_ms, int64_t backward_ms) {
    auto* e = reinterpret_cast<RemoteExpert*>(expert);
    ctx->saved_data["expert"] = expert;
    ctx->saved_data["backward_ms"] = backward_ms;
    ctx->saved_data["x"] = x.detach();
    auto y = e->Forward(x.detach(), std::chrono::milliseconds(forward_ms));
    TORCH_CHECK(y.ok(), y.status().ToString());
    return *y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* e = reinterpret_cast<RemoteExpert*>(ctx->saved_data["expert"].toInt());
    const at::Tensor x = ctx->saved_data["x"].toTensor();
    auto gx = e->Backward(x, grads[0].contiguous(),
                          std::chrono::milliseconds(ctx->saved_data["backward_ms"].toInt()));
    TORCH_CHECK(gx.ok(), gx.status().ToString());
    return {*gx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor CallRemoteExpert(RemoteExpert& expert, const at::Tensor& x,
                            const RemoteCallOptions& options) {
  return RemoteExpertFunction::apply(x, reinterpret_cast<int64_t>(&expert),
                                     static_cast<int64_t>(options.forward_timeout.count()),
                                     static_cast<int64_t>(options.backward_timeout.count()));
}

}  // namespace colony::moe
