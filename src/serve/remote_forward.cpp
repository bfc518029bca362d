// Forward and backward passes of remote blocks (remote_forward.h): route the range, call each
// span's server, and on failure ban the server, re-route the remaining blocks and retry.
#include "serve/remote_forward.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "core/log.h"
#include "runtime/tensor_io.h"
#include "serve/client_internal.h"

namespace colony::serve {
namespace {

// How long a trainer waits for a server's answer to serve.fence (at most its request timeout).
constexpr std::chrono::milliseconds kFenceTimeout{3'000};

// A backward's microbatch (a SWARM trainer's) and whether a server of its blocks took it.
struct Microbatch {
  uint64_t id = 0;
  bool replay = false;
  uint32_t attempt = 0;
};

Result<net::Message> CallBlocks(SequenceManager& m, const RouteSpan& span,
                                const std::string& method, std::vector<at::Tensor> tensors,
                                int64_t prompt_length, const LoraSpec& lora,
                                Microbatch microbatch = {}) {
  COLONY_ASSIGN_OR_RETURN(Multiaddr addr, AddressOf(span.server));
  const compression::Codec codec = m.options().boundary_codec;
  net::Message msg(EncodeBlockRequest({.start = span.start,
                                       .end = span.end,
                                       .tuning = TuningOf(prompt_length, lora),
                                       .epoch = m.epoch(),
                                       .boundary_codec = codec,
                                       .microbatch = microbatch.id,
                                       .replay = microbatch.replay,
                                       .attempt = microbatch.attempt}));
  // The work measured: blocks x tokens of the hidden states sent.
  const double work = static_cast<double>(span.end - span.start) *
                      static_cast<double>(tensors.front().size(0) * tensors.front().size(1));
  // The hidden states (and, for a backward, their gradient) in the boundary codec.
  const size_t hidden = method == "serve.backward" ? 2 : 1;
  for (size_t i = 0; i < tensors.size(); ++i) {
    COLONY_ASSIGN_OR_RETURN(
        auto f, runtime::ToFrame(tensors[i], i < hidden ? codec : compression::Codec::kNone,
                                 {.block_size = kBoundaryBlockSize, .max_threads = 1}));
    msg.tensors.push_back(std::move(f));
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto r =
      m.host().CallSync(addr, method, std::move(msg), {.timeout = m.options().request_timeout});
  if (r.ok()) {
    m.ReportCall(span.server.peer, work,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (!r.ok()) {
    return ServerFailure(r.status())
        .WithContext(fmt::format("{} of blocks [{}, {}) on {}", method, span.start, span.end,
                                 span.server.peer.ToString()));
  }
  return r;
}

// Try `attempt` of a backward of `id` failed at the span's server, which may have taken its
// gradient all the same (the reply lost or late): asks it (serve.fence), so that it never takes
// that try after this, and notes the microbatch taken when it says so (the retry is then a
// replay). A server that does not answer may have taken it (alive behind a partition that
// heals) or not (gone, its gradients with it): the microbatch is noted taken as well, so that
// the stage counts it at most once; a gradient missing from one stage's average is a smaller
// batch there, one counted twice is a bias.
void Fence(SequenceManager& m, const RouteSpan& span, uint64_t id, uint32_t attempt) {
  auto addr = AddressOf(span.server);
  if (!addr.ok()) return;  // the backward never left either (CallBlocks needs the address)
  const auto timeout =
      std::min<std::chrono::milliseconds>(m.options().request_timeout, kFenceTimeout);
  auto r = m.host().CallSync(
      *addr, "serve.fence",
      net::Message(EncodeFence(
          {.start = span.start, .end = span.end, .microbatch = id, .attempt = attempt})),
      {.timeout = timeout});
  auto reply = r.ok() ? DecodeFenceReply(r->meta) : Result<FenceReply>(r.status());
  if (!reply.ok()) {
    COLONY_LOG_INFO(
        "serve.fence of blocks [{}, {}) on {} got no answer ({}): the retry of microbatch {:016x} "
        "is a replay, so that stage may miss its gradient but does not count it twice",
        span.start, span.end, span.server.peer.ToString(), reply.status().ToString(), id);
    m.NoteTaken(id, span.start, span.end);
    return;
  }
  if (reply->taken) m.NoteTaken(id, span.start, span.end);
}

}  // namespace

Result<at::Tensor> RemoteForward(SequenceManager& manager, int64_t start, int64_t end,
                                 const at::Tensor& hidden, const at::Tensor& prompts,
                                 std::vector<SpanInput>* inputs, const LoraSpec& lora,
                                 const std::vector<at::Tensor>& adapters) {
  COLONY_RETURN_IF_ERROR(CheckLora(start, end, lora, adapters));
  COLONY_RETURN_IF_ERROR(CheckFinite(hidden, "hidden states"));
  COLONY_RETURN_IF_ERROR(CheckFinite(prompts, "deep prompts"));
  const int64_t p = prompts.defined() ? prompts.size(2) : 0;
  // Hidden states cross the network from host memory; the result goes back to hidden's device.
  at::Tensor x = hidden.detach().to(at::kCPU).contiguous();
  int64_t pos = start;
  int attempts = 0;
  Status last;
  while (pos < end) {
    auto route = manager.MakeRoute(pos, end, manager.TrainingMode());
    if (!route.ok()) {
      last = route.status();
      if (IsClientError(last) || ++attempts >= manager.options().max_attempts) break;
      Backoff(manager, attempts);
      continue;
    }
    for (const auto& span : *route) {
      std::vector<at::Tensor> tensors{x};
      AppendSpanInputs(tensors, start, span, prompts, lora, adapters);
      auto reply = CallBlocks(manager, span, "serve.forward", std::move(tensors), p, lora);
      Result<at::Tensor> out = reply.ok() ? HiddenFrom(*reply, 0, x.sizes()) : reply.status();
      if (!out.ok()) {
        last = out.status();
        if (IsClientError(last)) return last;
        manager.Ban(span.server, last);
        ++attempts;
        break;
      }
      manager.ReportSuccess(span.server.peer);
      if (inputs) inputs->push_back({span.start, span.end, x});
      x = out->to(hidden.scalar_type());
      pos = span.end;
    }
    if (attempts >= manager.options().max_attempts) break;
  }
  if (pos < end) {
    return last.WithContext(fmt::format("forward through blocks [{}, {}) failed after {} attempts",
                                        start, end, attempts));
  }
  return x.to(hidden.device());
}

Result<RemoteGradients> RemoteBackward(SequenceManager& manager, int64_t start, int64_t end,
                                       const at::Tensor& hidden, const at::Tensor& grad_output,
                                       const at::Tensor& prompts, const LoraSpec& lora,
                                       const std::vector<at::Tensor>& adapters) {
  COLONY_RETURN_IF_ERROR(CheckLora(start, end, lora, adapters));
  COLONY_RETURN_IF_ERROR(CheckFinite(hidden, "hidden states"));
  COLONY_RETURN_IF_ERROR(CheckFinite(grad_output, "output gradients"));
  COLONY_RETURN_IF_ERROR(CheckFinite(prompts, "deep prompts"));
  const int64_t p = prompts.defined() ? prompts.size(2) : 0;
  const size_t per_block = lora.rank > 0 ? 2 * lora.targets.size() : 0;
  Status last;
  for (int attempt = 1; attempt <= manager.options().max_attempts; ++attempt) {
    auto route = manager.MakeRoute(start, end, manager.TrainingMode());
    if (!route.ok()) {
      last = route.status();
      if (IsClientError(last)) return last;
      Backoff(manager, attempt);
      continue;
    }
    // A span served in pieces needs the pieces' inputs: recompute them forward first.
    std::vector<at::Tensor> xs{hidden.detach().to(at::kCPU).contiguous()};
    bool failed = false;
    for (size_t i = 0; i + 1 < route->size() && !failed; ++i) {
      std::vector<at::Tensor> tensors{xs.back()};
      AppendSpanInputs(tensors, start, (*route)[i], prompts, lora, adapters);
      auto reply = CallBlocks(manager, (*route)[i], "serve.forward", std::move(tensors), p, lora);
      Result<at::Tensor> out = reply.ok() ? HiddenFrom(*reply, 0, hidden.sizes()) : reply.status();
      if (!out.ok()) {
        last = out.status();
        if (IsClientError(last)) return last;
        manager.Ban((*route)[i].server, last);
        failed = true;
        break;
      }
      xs.push_back(out->to(hidden.scalar_type()));
    }
    if (failed) continue;
    at::Tensor g = grad_output.detach().to(at::kCPU, hidden.scalar_type()).contiguous();
    RemoteGradients result;
    std::vector<at::Tensor> prompt_grads(route->size());
    result.adapters.resize(adapters.size());
    for (size_t i = route->size(); i-- > 0;) {
      const auto& span = (*route)[i];
      std::vector<at::Tensor> tensors{xs[i], g};
      AppendSpanInputs(tensors, start, span, prompts, lora, adapters);
      // A SWARM trainer's microbatch: a replay where a server of these blocks took it.
      const uint64_t id = manager.epoch() >= 0 ? manager.microbatch() : 0;
      const Microbatch mb{.id = id,
                          .replay = id != 0 && manager.Taken(id, span.start, span.end),
                          .attempt = id != 0 ? manager.NextAttempt(id) : 0};
      auto reply = CallBlocks(manager, span, "serve.backward", std::move(tensors), p, lora, mb);
      Result<at::Tensor> gin = reply.ok() ? HiddenFrom(*reply, 0, hidden.sizes()) : reply.status();
      size_t next = 1;
      if (gin.ok() && p > 0) {
        auto gp = HiddenFrom(*reply, next++,
                             {span.end - span.start, prompts.size(1), p, prompts.size(3)});
        if (!gp.ok()) {
          gin = gp.status();
        } else {
          prompt_grads[i] = gp->to(prompts.device(), prompts.scalar_type());
        }
      }
      const size_t first = static_cast<size_t>(span.start - start) * per_block;
      for (size_t k = first; gin.ok() && k < static_cast<size_t>(span.end - start) * per_block;
           ++k) {
        auto ga = HiddenFrom(*reply, next++, adapters[k].sizes());
        if (!ga.ok()) {
          gin = ga.status();
        } else {
          result.adapters[k] = ga->to(adapters[k].device(), adapters[k].scalar_type());
        }
      }
      if (!gin.ok()) {
        last = gin.status();
        if (IsClientError(last)) return last;
        if (id != 0 && !mb.replay) Fence(manager, span, id, mb.attempt);
        manager.Ban(span.server, last);
        failed = true;
        break;
      }
      manager.ReportSuccess(span.server.peer);
      if (id != 0) manager.NoteTaken(id, span.start, span.end);
      g = gin->to(hidden.scalar_type());
    }
    if (failed) continue;
    result.hidden = g.to(hidden.device());
    if (p > 0) result.prompts = at::cat(prompt_grads, 0);
    return result;
  }
  return last.WithContext(fmt::format("backward through blocks [{}, {}) failed", start, end));
}

}  // namespace colony::serve
