#include "moe/remote_expert.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/autograd.h>

#include "runtime/tensor_io.h"

namespace colony::moe {

RemoteExpert::RemoteExpert(net::Host& host, RemoteExpertInfo info)
    : host_(host), info_(std::move(info)) {}

Result<at::Tensor> RemoteExpert::Call(const std::string& method,
                                      const std::vector<at::Tensor>& tensors,
                                      const at::Tensor& like, std::chrono::milliseconds timeout) {
  if (info_.servers.empty()) return NotFound(fmt::format("no server hosts expert {}", info_.uid));
  Status last;
  for (size_t s = 0; s < info_.servers.size(); ++s) {
    if (s >= info_.addrs.size() || info_.addrs[s].empty()) continue;
    auto addr = Multiaddr::Parse(info_.addrs[s][0]);
    if (!addr.ok()) {
      last = addr.status();
      continue;
    }
    net::Message request(info_.uid);
    for (const auto& t : tensors) {
      COLONY_ASSIGN_OR_RETURN(auto frame, runtime::ToFrame(t.to(at::kFloat).contiguous()));
      request.tensors.push_back(std::move(frame));
    }
    auto reply = host_.CallSync(addr->WithPeerId(info_.servers[s]), method, std::move(request),
                                {.timeout = timeout});
    if (!reply.ok()) {
      last = reply.status().WithContext(
          fmt::format("expert {} on {}", info_.uid, info_.servers[s].ToString()));
      continue;
    }
    if (reply->tensors.size() != 1) {
      last = ProtocolError(
          fmt::format("expert {} answered {} tensors", info_.uid, reply->tensors.size()));
      continue;
    }
    auto out =
        runtime::FromFrame(reply->tensors[0], {.max_elements = static_cast<uint64_t>(like.numel()),
                                               .allowed_dtypes = {DType::kFloat32},
                                               .rank = 2});
    if (!out.ok() || !out->sizes().equals(like.sizes()) || !at::isfinite(*out).all().item<bool>()) {
      last = ProtocolError(fmt::format(
          "expert {} on {} answered a tensor that is not finite float32 of shape [{}, {}]",
          info_.uid, info_.servers[s].ToString(), like.size(0), like.size(1)));
      continue;
    }
    return *out;
  }
  return last.ok() ? Unavailable(fmt::format("no usable address for expert {}", info_.uid)) : last;
}

Result<at::Tensor> RemoteExpert::Forward(const at::Tensor& x, std::chrono::milliseconds timeout) {
  return Call("moe.forward", {x}, x, timeout);
}

Result<at::Tensor> RemoteExpert::Backward(const at::Tensor& x, const at::Tensor& grad_y,
                                          std::chrono::milliseconds timeout) {
  return Call("moe.backward", {x, grad_y}, x, timeout);
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
