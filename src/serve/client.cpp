#include "serve/client.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <sodium.h>
#include <torch/autograd.h>

#include <asio/co_spawn.hpp>
#include <asio/use_future.hpp>
#include <cmath>
#include <future>
#include <limits>
#include <mutex>
#include <set>
#include <thread>

#include "core/log.h"
#include "dht/validation.h"
#include "net/host.h"
#include "runtime/tensor_io.h"
#include "serve/serve.pb.h"

namespace colony::serve {
namespace {

using Clock = std::chrono::steady_clock;
const std::vector<DType> kFloatDTypes = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

// Runs a coroutine on the host's threads and waits for it for at most `timeout`; on timeout
// `on_timeout` runs (e.g. cancels a stream, which makes the coroutine finish) and the result
// is still awaited.
template <typename T>
Result<T> RunSync(net::Host& host, asio::awaitable<Result<T>> op, std::chrono::milliseconds timeout,
                  const std::function<void()>& on_timeout) {
  auto future = asio::co_spawn(host.io_context(), std::move(op), asio::use_future);
  if (future.wait_for(timeout) == std::future_status::timeout && on_timeout) on_timeout();
  try {
    return future.get();
  } catch (const std::exception& e) {
    return Internal(std::string("client operation failed: ") + e.what());
  }
}

// Errors that are the caller's fault: retrying on another server cannot help.
bool IsClientError(const Status& st) { return st.code() == StatusCode::kInvalidArgument; }

Result<Multiaddr> AddressOf(const ServerRecord& r) {
  if (r.addresses.empty()) {
    return Unavailable(fmt::format("server {} announced no address", r.peer.ToString()));
  }
  return Multiaddr::Parse(r.addresses.front());
}

std::string RandomId() {
  std::string id(16, '\0');
  randombytes_buf(id.data(), id.size());
  return id;
}

Result<at::Tensor> HiddenFrom(const net::Message& m, size_t index, at::IntArrayRef shape) {
  if (m.tensors.size() <= index) return ProtocolError("the server's reply lacks a tensor");
  uint64_t n = 1;
  for (auto d : shape) n *= static_cast<uint64_t>(d);
  COLONY_ASSIGN_OR_RETURN(
      at::Tensor t, runtime::FromFrame(m.tensors[index], {.max_elements = n,
                                                          .allowed_dtypes = kFloatDTypes,
                                                          .rank = static_cast<int>(shape.size())}));
  if (!t.sizes().equals(shape)) {
    return ProtocolError(fmt::format("the server replied with shape {}, expected {}",
                                     fmt::join(t.sizes(), "x"), fmt::join(shape, "x")));
  }
  if (!at::isfinite(t).all().item<bool>()) {
    return ProtocolError("the server replied with NaN or infinite values");
  }
  return t;
}

}  // namespace

// ---------------------------------------------------------------- SequenceManager

SequenceManager::SequenceManager(dht::Node& node, ClientOptions options)
    : node_(node), options_(std::move(options)) {}

Status SequenceManager::Refresh() {
  std::vector<std::string> keys;
  for (int64_t b = 0; b < options_.num_blocks; ++b)
    keys.push_back(BlockKey(options_.model_name, b));
  auto results = node_.GetManySync(keys, /*latest=*/true);
  std::map<PeerId, ServerRecord> by_peer;
  const double now = dht::Now();
  Status last_error;
  for (auto& r : results) {
    if (!r.ok()) {
      if (r.status().code() != StatusCode::kNotFound) last_error = r.status();
      continue;
    }
    if (!r->is_dict) continue;
    for (auto& [subkey, entry] : r->subkeys) {
      auto peer = dht::ParseOwnerMarker(subkey);
      if (!peer || entry.expiration < now) continue;
      auto rec = ParseServerRecord(*peer, entry.value, options_.num_blocks);
      if (!rec.ok()) {
        COLONY_LOG_DEBUG("serve: ignoring {}'s record: {}", peer->ToString(),
                         rec.status().ToString());
        continue;
      }
      if (rec->state != ServerState::kOnline) continue;
      by_peer[*peer] = std::move(*rec);
    }
  }
  std::lock_guard lock(mu_);
  servers_.clear();
  for (auto& [peer, rec] : by_peer) servers_.push_back(std::move(rec));
  refreshed_ = Clock::now();
  ever_refreshed_ = true;
  if (servers_.empty() && !last_error.ok()) return last_error;
  return Status();
}

std::vector<ServerRecord> SequenceManager::Servers() const {
  std::lock_guard lock(mu_);
  return servers_;
}

bool SequenceManager::IsBanned(const PeerId& peer) const {
  std::lock_guard lock(mu_);
  auto it = bans_.find(peer);
  return it != bans_.end() && it->second.until > Clock::now();
}

void SequenceManager::Ban(const PeerId& peer, const Status& why) {
  std::lock_guard lock(mu_);
  auto& b = bans_[peer];
  ++b.failures;
  auto duration = options_.ban_base * (int64_t{1} << std::min(b.failures - 1, 16));
  if (duration > options_.ban_max) duration = options_.ban_max;
  b.until = Clock::now() + duration;
  rtt_.erase(peer);
  COLONY_LOG_WARN("server {} failed ({}); avoiding it for {:.1f} s", peer.ToString(),
                  why.ToString(), std::chrono::duration<double>(duration).count());
}

void SequenceManager::ReportSuccess(const PeerId& peer) {
  std::lock_guard lock(mu_);
  auto it = bans_.find(peer);
  if (it != bans_.end() && it->second.until <= Clock::now()) bans_.erase(it);
}

double SequenceManager::RttSeconds(const ServerRecord& server) {
  {
    std::lock_guard lock(mu_);
    auto it = rtt_.find(server.peer);
    if (it != rtt_.end()) return it->second;
  }
  double rtt = 1.0;  // unreachable servers look slow rather than absent
  auto addr = AddressOf(server);
  if (addr.ok()) {
    auto ping = node_.host().PingSync(*addr, std::chrono::seconds(2));
    if (ping.ok()) rtt = std::chrono::duration<double>(ping->rtt).count();
  }
  std::lock_guard lock(mu_);
  rtt_[server.peer] = rtt;
  return rtt;
}

Result<std::vector<RouteSpan>> SequenceManager::MakeRoute(int64_t start, int64_t end,
                                                          RoutingMode mode) {
  if (start < 0 || end > options_.num_blocks || start >= end) {
    return InvalidArgument(fmt::format("blocks [{}, {}) are not a range of the model's {} blocks",
                                       start, end, options_.num_blocks));
  }
  for (int pass = 0; pass < 2; ++pass) {
    bool stale;
    {
      std::lock_guard lock(mu_);
      stale = !ever_refreshed_ || Clock::now() - refreshed_ > options_.refresh_period;
    }
    if (stale || pass == 1) {
      Status st = Refresh();
      if (!st.ok()) COLONY_LOG_DEBUG("serve: refreshing servers failed: {}", st.ToString());
    }
    std::vector<ServerRecord> candidates;
    {
      std::lock_guard lock(mu_);
      const auto now = Clock::now();
      for (const auto& r : servers_) {
        auto b = bans_.find(r.peer);
        if (b != bans_.end() && b->second.until > now) continue;
        if (r.end <= start || r.start >= end || r.addresses.empty()) continue;
        candidates.push_back(r);
      }
    }
    std::vector<double> rtt(candidates.size());
    for (size_t i = 0; i < candidates.size(); ++i) rtt[i] = RttSeconds(candidates[i]);
    // Shortest path over block positions (a DAG: every edge moves forward).
    const double inf = std::numeric_limits<double>::infinity();
    const size_t n = static_cast<size_t>(end - start);
    std::vector<double> dist(n + 1, inf);
    std::vector<std::pair<size_t, size_t>> prev(n + 1, {0, 0});  // (from position, server)
    dist[0] = 0;
    for (size_t i = 0; i < n; ++i) {
      if (dist[i] == inf) continue;
      const int64_t block = start + static_cast<int64_t>(i);
      for (size_t s = 0; s < candidates.size(); ++s) {
        const auto& r = candidates[s];
        if (r.start > block || r.end <= block) continue;
        const size_t j = static_cast<size_t>(std::min(r.end, end) - start);
        const double blocks = static_cast<double>(j - i);
        const double cost = mode == RoutingMode::kMinLatency
                                ? rtt[s] + blocks / std::max(r.inference_rps, 1e-9)
                                : blocks / std::max(r.throughput, 1e-9) + 0.1 * rtt[s];
        if (dist[i] + cost < dist[j]) {
          dist[j] = dist[i] + cost;
          prev[j] = {i, s};
        }
      }
    }
    if (dist[n] < inf) {
      std::vector<RouteSpan> route;
      for (size_t j = n; j > 0;) {
        auto [i, s] = prev[j];
        route.push_back(
            {candidates[s], start + static_cast<int64_t>(i), start + static_cast<int64_t>(j)});
        j = i;
      }
      std::reverse(route.begin(), route.end());
      return route;
    }
    if (pass == 1) {
      // Name the first block that no usable server holds.
      int64_t missing = start;
      for (int64_t b = start; b < end; ++b) {
        bool covered = false;
        for (const auto& r : candidates) covered = covered || (r.start <= b && b < r.end);
        if (!covered) {
          missing = b;
          break;
        }
      }
      size_t known, banned = 0;
      {
        std::lock_guard lock(mu_);
        known = servers_.size();
        for (auto& [p, b] : bans_) banned += b.until > Clock::now();
      }
      return Unavailable(fmt::format(
          "no reachable online server holds block {} of model '{}' ({} servers known, {} "
          "temporarily banned); start one with 'colony serve --blocks {}:{}' or wait",
          missing, options_.model_name, known, banned, missing, missing + 1));
    }
  }
  return Unavailable("routing failed");
}

// ---------------------------------------------------------------- forward / backward

namespace {

// The tuning metadata of a BlockRequest or an OpenSession (their fields are named alike).
template <typename Message>
void SetTuningFields(Message& m, int64_t prompt_length, const LoraSpec& lora) {
  m.set_prompt_length(static_cast<uint32_t>(prompt_length));
  if (lora.rank > 0) {
    m.set_lora_rank(static_cast<uint32_t>(lora.rank));
    for (const auto& t : lora.targets) m.add_lora_targets(t);
    m.set_lora_scale(lora.scale);
  }
}

Result<net::Message> CallBlocks(SequenceManager& m, const RouteSpan& span,
                                const std::string& method, std::vector<at::Tensor> tensors,
                                int64_t prompt_length, const LoraSpec& lora) {
  COLONY_ASSIGN_OR_RETURN(Multiaddr addr, AddressOf(span.server));
  wire::BlockRequest req;
  req.set_start(static_cast<uint32_t>(span.start));
  req.set_end(static_cast<uint32_t>(span.end));
  SetTuningFields(req, prompt_length, lora);
  net::Message msg(req.SerializeAsString());
  for (auto& t : tensors) {
    COLONY_ASSIGN_OR_RETURN(auto f, runtime::ToFrame(t));
    msg.tensors.push_back(std::move(f));
  }
  auto r =
      m.host().CallSync(addr, method, std::move(msg), {.timeout = m.options().request_timeout});
  if (!r.ok()) {
    return r.status().WithContext(fmt::format("{} of blocks [{}, {}) on {}", method, span.start,
                                              span.end, span.server.peer.ToString()));
  }
  return r;
}

// The deep prompts of a span's blocks, from prompts of the blocks from `offset` on.
at::Tensor PromptsOf(const at::Tensor& prompts, int64_t offset, const RouteSpan& span) {
  if (!prompts.defined()) return {};
  return prompts.narrow(0, span.start - offset, span.end - span.start).detach().contiguous();
}

// The request tensors of a span besides hidden (and grad): its deep prompts and its adapters.
void AppendSpanInputs(std::vector<at::Tensor>& tensors, int64_t offset, const RouteSpan& span,
                      const at::Tensor& prompts, const LoraSpec& lora,
                      const std::vector<at::Tensor>& adapters) {
  if (prompts.defined()) tensors.push_back(PromptsOf(prompts, offset, span));
  if (lora.rank > 0) {
    const size_t per_block = 2 * lora.targets.size();
    for (size_t i = static_cast<size_t>(span.start - offset) * per_block;
         i < static_cast<size_t>(span.end - offset) * per_block; ++i) {
      tensors.push_back(adapters[i].detach().contiguous());
    }
  }
}

Status CheckLora(int64_t start, int64_t end, const LoraSpec& lora,
                 const std::vector<at::Tensor>& adapters) {
  const size_t want =
      lora.rank > 0 ? 2 * lora.targets.size() * static_cast<size_t>(end - start) : 0;
  if (adapters.size() != want) {
    return InvalidArgument(fmt::format("expected {} LoRA tensors for blocks [{}, {}), got {}", want,
                                       start, end, adapters.size()));
  }
  return Status();
}

void Backoff(SequenceManager& m, int attempt) {
  std::this_thread::sleep_for(m.options().retry_backoff * std::min(attempt, 8));
}

}  // namespace

Result<at::Tensor> RemoteForward(SequenceManager& manager, int64_t start, int64_t end,
                                 const at::Tensor& hidden, const at::Tensor& prompts,
                                 std::vector<SpanInput>* inputs, const LoraSpec& lora,
                                 const std::vector<at::Tensor>& adapters) {
  COLONY_RETURN_IF_ERROR(CheckLora(start, end, lora, adapters));
  const int64_t p = prompts.defined() ? prompts.size(2) : 0;
  at::Tensor x = hidden.detach().contiguous();
  int64_t pos = start;
  int attempts = 0;
  Status last;
  while (pos < end) {
    auto route = manager.MakeRoute(pos, end, RoutingMode::kMaxThroughput);
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
        manager.Ban(span.server.peer, last);
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
  return x;
}

Result<RemoteGradients> RemoteBackward(SequenceManager& manager, int64_t start, int64_t end,
                                       const at::Tensor& hidden, const at::Tensor& grad_output,
                                       const at::Tensor& prompts, const LoraSpec& lora,
                                       const std::vector<at::Tensor>& adapters) {
  COLONY_RETURN_IF_ERROR(CheckLora(start, end, lora, adapters));
  const int64_t p = prompts.defined() ? prompts.size(2) : 0;
  const size_t per_block = lora.rank > 0 ? 2 * lora.targets.size() : 0;
  Status last;
  for (int attempt = 1; attempt <= manager.options().max_attempts; ++attempt) {
    auto route = manager.MakeRoute(start, end, RoutingMode::kMaxThroughput);
    if (!route.ok()) {
      last = route.status();
      if (IsClientError(last)) return last;
      Backoff(manager, attempt);
      continue;
    }
    // A span served in pieces needs the pieces' inputs: recompute them forward first.
    std::vector<at::Tensor> xs{hidden.detach().contiguous()};
    bool failed = false;
    for (size_t i = 0; i + 1 < route->size() && !failed; ++i) {
      std::vector<at::Tensor> tensors{xs.back()};
      AppendSpanInputs(tensors, start, (*route)[i], prompts, lora, adapters);
      auto reply = CallBlocks(manager, (*route)[i], "serve.forward", std::move(tensors), p, lora);
      Result<at::Tensor> out = reply.ok() ? HiddenFrom(*reply, 0, hidden.sizes()) : reply.status();
      if (!out.ok()) {
        last = out.status();
        if (IsClientError(last)) return last;
        manager.Ban((*route)[i].server.peer, last);
        failed = true;
        break;
      }
      xs.push_back(out->to(hidden.scalar_type()));
    }
    if (failed) continue;
    at::Tensor g = grad_output.detach().contiguous().to(hidden.scalar_type());
    RemoteGradients result;
    std::vector<at::Tensor> prompt_grads(route->size());
    result.adapters.resize(adapters.size());
    for (size_t i = route->size(); i-- > 0;) {
      const auto& span = (*route)[i];
      std::vector<at::Tensor> tensors{xs[i], g};
      AppendSpanInputs(tensors, start, span, prompts, lora, adapters);
      auto reply = CallBlocks(manager, span, "serve.backward", std::move(tensors), p, lora);
      Result<at::Tensor> gin = reply.ok() ? HiddenFrom(*reply, 0, hidden.sizes()) : reply.status();
      size_t next = 1;
      if (gin.ok() && p > 0) {
        auto gp = HiddenFrom(*reply, next++,
                             {span.end - span.start, prompts.size(1), p, prompts.size(3)});
        if (!gp.ok()) {
          gin = gp.status();
        } else {
          prompt_grads[i] = gp->to(prompts.scalar_type());
        }
      }
      const size_t first = static_cast<size_t>(span.start - start) * per_block;
      for (size_t k = first; gin.ok() && k < static_cast<size_t>(span.end - start) * per_block;
           ++k) {
        auto ga = HiddenFrom(*reply, next++, adapters[k].sizes());
        if (!ga.ok()) {
          gin = ga.status();
        } else {
          result.adapters[k] = ga->to(adapters[k].scalar_type());
        }
      }
      if (!gin.ok()) {
        last = gin.status();
        if (IsClientError(last)) return last;
        manager.Ban(span.server.peer, last);
        failed = true;
        break;
      }
      manager.ReportSuccess(span.server.peer);
      g = gin->to(hidden.scalar_type());
    }
    if (failed) continue;
    result.hidden = g;
    if (p > 0) result.prompts = at::cat(prompt_grads, 0);
    return result;
  }
  return last.WithContext(fmt::format("backward through blocks [{}, {}) failed", start, end));
}

namespace {

LoraSpec LoraFromSaved(torch::autograd::AutogradContext* ctx) {
  LoraSpec lora;
  lora.rank = ctx->saved_data["lora_rank"].toInt();
  lora.scale = ctx->saved_data["lora_scale"].toDouble();
  for (const auto& t : ctx->saved_data["lora_targets"].toList()) {
    lora.targets.push_back(t.get().toStringRef());
  }
  return lora;
}

class RemoteFunction : public torch::autograd::Function<RemoteFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor hidden,
                            at::Tensor prompts, at::TensorList adapters, int64_t manager,
                            int64_t start, int64_t end, int64_t lora_rank, double lora_scale,
                            std::vector<std::string> lora_targets) {
    auto* m = reinterpret_cast<SequenceManager*>(manager);
    if (prompts.numel() == 0) prompts = at::Tensor();
    const LoraSpec lora{lora_rank, lora_targets, lora_scale};
    const std::vector<at::Tensor> adapter_list(adapters.begin(), adapters.end());
    std::vector<SpanInput> inputs;
    auto out = RemoteForward(*m, start, end, hidden, prompts, &inputs, lora, adapter_list);
    if (!out.ok()) throw std::runtime_error(out.status().ToString());
    std::vector<at::Tensor> xs;
    std::vector<int64_t> bounds;
    for (auto& s : inputs) {
      xs.push_back(s.input);
      bounds.push_back(s.start);
      bounds.push_back(s.end);
    }
    ctx->saved_data["inputs"] = xs;
    ctx->saved_data["bounds"] = bounds;
    ctx->saved_data["manager"] = manager;
    ctx->saved_data["start"] = start;
    ctx->saved_data["prompts"] = prompts.defined() ? prompts.detach() : at::empty({0});
    std::vector<at::Tensor> detached;
    for (const auto& a : adapter_list) detached.push_back(a.detach());
    ctx->saved_data["adapters"] = detached;
    ctx->saved_data["lora_rank"] = lora_rank;
    ctx->saved_data["lora_scale"] = lora_scale;
    c10::List<std::string> names;
    for (const auto& t : lora_targets) names.push_back(t);
    ctx->saved_data["lora_targets"] = names;
    return *out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* m = reinterpret_cast<SequenceManager*>(ctx->saved_data["manager"].toInt());
    const auto xs = ctx->saved_data["inputs"].toTensorVector();
    const auto bounds = ctx->saved_data["bounds"].toIntVector();
    const int64_t start = ctx->saved_data["start"].toInt();
    at::Tensor prompts = ctx->saved_data["prompts"].toTensor();
    if (prompts.numel() == 0) prompts = at::Tensor();
    const auto adapters = ctx->saved_data["adapters"].toTensorVector();
    const LoraSpec lora = LoraFromSaved(ctx);
    const size_t per_block = lora.rank > 0 ? 2 * lora.targets.size() : 0;
    at::Tensor g = grads[0];
    std::vector<at::Tensor> prompt_grads(xs.size());
    std::vector<at::Tensor> adapter_grads(adapters.size());
    for (size_t i = xs.size(); i-- > 0;) {
      const int64_t s = bounds[2 * i], e = bounds[2 * i + 1];
      at::Tensor pr = prompts.defined() ? prompts.narrow(0, s - start, e - s) : at::Tensor();
      const size_t first = static_cast<size_t>(s - start) * per_block;
      const size_t last = static_cast<size_t>(e - start) * per_block;
      std::vector<at::Tensor> span_adapters(adapters.begin() + static_cast<std::ptrdiff_t>(first),
                                            adapters.begin() + static_cast<std::ptrdiff_t>(last));
      auto r = RemoteBackward(*m, s, e, xs[i], g, pr, lora, span_adapters);
      if (!r.ok()) throw std::runtime_error(r.status().ToString());
      g = r->hidden;
      prompt_grads[i] = r->prompts;
      for (size_t k = first; k < last; ++k) adapter_grads[k] = r->adapters[k - first];
    }
    torch::autograd::variable_list out{g};
    out.push_back(prompts.defined() ? at::cat(prompt_grads, 0) : at::Tensor());
    for (auto& ga : adapter_grads) out.push_back(ga);
    for (int i = 0; i < 6; ++i) out.push_back(at::Tensor());  // the non-tensor arguments
    return out;
  }
};

}  // namespace

RemoteSequential::RemoteSequential(std::shared_ptr<SequenceManager> manager, int64_t start,
                                   int64_t end)
    : manager_(std::move(manager)),
      start_(start),
      end_(end < 0 ? manager_->options().num_blocks : end) {}

at::Tensor RemoteSequential::forward(const at::Tensor& hidden, const at::Tensor& prompts,
                                     const LoraSpec& lora,
                                     const std::vector<at::Tensor>& adapters) {
  // Autograd functions take no undefined tensors: an empty one stands for "no prompts".
  return RemoteFunction::apply(hidden, prompts.defined() ? prompts : at::empty({0}),
                               at::TensorList(adapters), reinterpret_cast<int64_t>(manager_.get()),
                               start_, end_, lora.rank, lora.scale, lora.targets);
}

Result<at::Tensor> RemoteSequential::Forward(const at::Tensor& hidden, const at::Tensor& prompts,
                                             const LoraSpec& lora,
                                             const std::vector<at::Tensor>& adapters) {
  return RemoteForward(*manager_, start_, end_, hidden, prompts, nullptr, lora, adapters);
}

std::unique_ptr<InferenceSession> RemoteSequential::OpenSession(SessionOptions options) {
  return std::make_unique<InferenceSession>(manager_, start_, end_, options);
}

// ---------------------------------------------------------------- InferenceSession

struct InferenceSession::Link {
  RouteSpan span;
  Multiaddr address;
  std::string session_id = RandomId();
  std::shared_ptr<net::Stream> stream;
  at::Tensor history;  // every input this span's cache holds, [B, length, H]
  at::Tensor prompts;  // this span's deep prompts, rows in the order of the cached rows
};

InferenceSession::InferenceSession(std::shared_ptr<SequenceManager> manager, int64_t start,
                                   int64_t end, SessionOptions options)
    : manager_(std::move(manager)), start_(start), end_(end), options_(options) {}

InferenceSession::~InferenceSession() { Close(); }

void InferenceSession::Close() {
  if (closed_) return;
  closed_ = true;
  for (auto& link : chain_) {
    if (!link.stream) continue;
    auto stream = link.stream;
    auto r = RunSync<bool>(
        manager_->host(),
        [stream]() -> asio::awaitable<Result<bool>> {
          Status st = co_await stream->CloseWrite();
          if (!st.ok()) co_return st;
          co_return true;
        }(),
        std::chrono::seconds(2), [stream] { stream->Cancel(); });
    (void)r;  // best effort: the server's idle timeout frees the cache anyway
    stream->Cancel(Cancelled("the client closed the session"));
  }
  chain_.clear();
}

Status InferenceSession::CheckTuning() const {
  COLONY_RETURN_IF_ERROR(CheckLora(start_, end_, options_.lora, options_.adapters));
  const at::Tensor& p = options_.prompts;
  if (p.defined() && (p.dim() != 4 || p.size(0) != end_ - start_ ||
                      (p.size(1) != 1 && p.size(1) != options_.batch_size) || p.size(2) < 1 ||
                      !p.is_floating_point())) {
    return InvalidArgument(fmt::format(
        "deep prompts must be floating point [{}, {} or 1, P, H] for blocks [{}, {}), got [{}]",
        end_ - start_, options_.batch_size, start_, end_, fmt::join(p.sizes(), ", ")));
  }
  return Status();
}

Status InferenceSession::OpenLink(Link& link, const Link* next) {
  COLONY_ASSIGN_OR_RETURN(link.address, AddressOf(link.span.server));
  wire::OpenSession open;
  open.set_session_id(link.session_id);
  open.set_start(static_cast<uint32_t>(link.span.start));
  open.set_end(static_cast<uint32_t>(link.span.end));
  open.set_max_length(static_cast<uint32_t>(options_.max_length));
  open.set_batch_size(static_cast<uint32_t>(options_.batch_size));
  if (next && manager_->options().use_push) {
    open.mutable_next()->set_address(next->address.ToString());
    open.mutable_next()->set_session_id(next->session_id);
  }
  SetTuningFields(open, link.prompts.defined() ? link.prompts.size(2) : 0, options_.lora);
  // The span's prompts (already its slice), then its blocks' adapters.
  std::vector<at::Tensor> tensors;
  if (link.prompts.defined()) tensors.push_back(link.prompts);
  AppendSpanInputs(tensors, start_, link.span, {}, options_.lora, options_.adapters);
  net::Message open_message(open.SerializeAsString());
  for (const auto& t : tensors) {
    COLONY_ASSIGN_OR_RETURN(auto f, runtime::ToFrame(t));
    open_message.tensors.push_back(std::move(f));
  }
  auto& host = manager_->host();
  const auto lifetime = manager_->options().session_lifetime;
  // Written by the opening coroutine, read by the timeout callback on this thread.
  struct Slot {
    std::mutex mu;
    std::shared_ptr<net::Stream> stream;
    void Set(std::shared_ptr<net::Stream> s) {
      std::lock_guard lock(mu);
      stream = std::move(s);
    }
    std::shared_ptr<net::Stream> Get() {
      std::lock_guard lock(mu);
      return stream;
    }
  };
  auto holder = std::make_shared<Slot>();
  auto r = RunSync<bool>(
      host,
      [&host, holder, addr = link.address, open_message,
       lifetime]() -> asio::awaitable<Result<bool>> {
        const std::string method = "serve.inference";
        const net::CallOptions call{.timeout = lifetime};
        auto stream = co_await host.OpenStream(addr, method, call);
        if (!stream.ok()) co_return stream.status();
        holder->Set(*stream);
        Status st = co_await (*stream)->Write(open_message);
        if (!st.ok()) co_return st;
        auto reply = co_await (*stream)->Read();
        if (!reply.ok()) co_return reply.status();
        if (!*reply) co_return ProtocolError("the server ended the session before opening it");
        wire::SessionOpened opened;
        if (!opened.ParseFromString((*reply)->meta))
          co_return ProtocolError("malformed SessionOpened");
        co_return true;
      }(),
      manager_->options().step_timeout,
      [holder] {
        if (auto s = holder->Get()) s->Cancel(DeadlineExceeded("opening the session timed out"));
      });
  if (!r.ok()) {
    if (auto s = holder->Get()) s->Cancel();
    return r.status().WithContext(fmt::format("opening a session for blocks [{}, {}) on {}",
                                              link.span.start, link.span.end,
                                              link.span.server.peer.ToString()));
  }
  link.stream = holder->Get();
  return Status();
}

Status InferenceSession::OpenChain(int64_t start, int64_t end, std::vector<Link>& out) {
  COLONY_ASSIGN_OR_RETURN(auto route, manager_->MakeRoute(start, end, RoutingMode::kMinLatency));
  std::vector<Link> links(route.size());
  for (size_t i = 0; i < route.size(); ++i) {
    links[i].span = route[i];
    auto addr = AddressOf(route[i].server);
    if (addr.ok()) links[i].address = *addr;
    links[i].prompts = PromptsOf(options_.prompts, start_, route[i]);
  }
  // Open back to front so that each OpenSession can name its successor's session.
  for (size_t i = links.size(); i-- > 0;) {
    const Link* next = i + 1 < links.size() ? &links[i + 1] : nullptr;
    Status st = OpenLink(links[i], next);
    if (!st.ok()) {
      if (!IsClientError(st)) manager_->Ban(links[i].span.server.peer, st);
      for (auto& l : links) {
        if (l.stream) l.stream->Cancel();
      }
      return st;
    }
  }
  out = std::move(links);
  return Status();
}

Status InferenceSession::SendStep(Link& link, uint64_t step_id, int64_t position,
                                  const at::Tensor& x, const at::Tensor& hypo_ids,
                                  const Link* next) {
  wire::Step step;
  step.set_step_id(step_id);
  step.set_position(position);
  step.set_has_hypo_ids(hypo_ids.defined());
  if (manager_->options().use_push) {
    if (next) {
      step.mutable_next()->set_address(next->address.ToString());
      step.mutable_next()->set_session_id(next->session_id);
    } else {
      step.mutable_next();  // present and empty: no push
    }
  }
  net::Message msg(step.SerializeAsString());
  COLONY_ASSIGN_OR_RETURN(auto f, runtime::ToFrame(x));
  msg.tensors.push_back(std::move(f));
  if (hypo_ids.defined()) {
    COLONY_ASSIGN_OR_RETURN(auto h, runtime::ToFrame(hypo_ids.to(at::kLong)));
    msg.tensors.push_back(std::move(h));
  }
  auto stream = link.stream;
  auto r = RunSync<bool>(
      manager_->host(),
      [stream, msg = std::move(msg)]() -> asio::awaitable<Result<bool>> {
        Status st = co_await stream->Write(msg);
        if (!st.ok()) co_return st;
        co_return true;
      }(),
      manager_->options().step_timeout,
      [stream] { stream->Cancel(DeadlineExceeded("sending a step timed out")); });
  return r.ok() ? Status() : r.status();
}

Result<at::Tensor> InferenceSession::ReadResult(Link& link, uint64_t step_id,
                                                at::IntArrayRef shape) {
  auto stream = link.stream;
  const auto timeout = manager_->options().step_timeout;
  // A result for an older step (e.g. a replay pushed by a replacement) is skipped; a step runs
  // at most once per server, so only a bounded number can be queued.
  for (int skipped = 0; skipped < 4; ++skipped) {
    auto r = RunSync<net::Message>(
        manager_->host(),
        [stream]() -> asio::awaitable<Result<net::Message>> {
          auto m = co_await stream->Read();
          if (!m.ok()) co_return m.status();
          if (!*m) co_return Closed("the server ended the session");
          co_return std::move(**m);
        }(),
        timeout,
        [stream, timeout] {
          stream->Cancel(
              DeadlineExceeded(fmt::format("no step result within {} ms", timeout.count())));
        });
    if (!r.ok()) return r.status();
    wire::StepResult result;
    if (!result.ParseFromString(r->meta)) return ProtocolError("malformed StepResult");
    if (result.step_id() < step_id) continue;
    if (result.step_id() != step_id) {
      return ProtocolError(fmt::format("the server answered step {} while step {} was expected",
                                       result.step_id(), step_id));
    }
    return HiddenFrom(*r, 0, shape);
  }
  return ProtocolError("the server sent too many results for old steps");
}

namespace {

// The inputs a server's cache holds after a step: roll back to `position`, reorder rows by
// hypo_ids, append x (the same order the server applies them).
at::Tensor AdvanceHistory(const at::Tensor& history, int64_t position, const at::Tensor& hypo_ids,
                          const at::Tensor& x) {
  if (!history.defined() || position == 0) return x.clone();
  at::Tensor h = history.narrow(1, 0, position);
  if (hypo_ids.defined()) h = h.index_select(0, hypo_ids.to(at::kLong));
  return at::cat({h, x}, 1);
}

}  // namespace

Result<at::Tensor> InferenceSession::Step(const at::Tensor& hidden, const at::Tensor& hypo_ids,
                                          int64_t position) {
  if (closed_) return FailedPrecondition("the inference session is closed");
  if (position < 0) position = position_;
  if (hidden.dim() != 3 || hidden.size(0) != options_.batch_size || hidden.size(1) < 1) {
    return InvalidArgument(fmt::format("a step takes hidden states [{}, T, H], got [{}]",
                                       options_.batch_size, fmt::join(hidden.sizes(), ", ")));
  }
  if (position > position_) {
    return InvalidArgument(
        fmt::format("position {} is past the session's {} tokens", position, position_));
  }
  if (position + hidden.size(1) > options_.max_length) {
    return InvalidArgument(fmt::format("the session's max_length {} would be exceeded ({} + {})",
                                       options_.max_length, position, hidden.size(1)));
  }
  if (hypo_ids.defined() && (hypo_ids.dim() != 1 || hypo_ids.size(0) != options_.batch_size)) {
    return InvalidArgument(fmt::format("hypo_ids must have shape [{}]", options_.batch_size));
  }
  const int max_attempts = manager_->options().max_attempts;
  int attempts = 0;
  Status last;
  if (chain_.empty()) COLONY_RETURN_IF_ERROR(CheckTuning());
  while (chain_.empty()) {
    Status st = OpenChain(start_, end_, chain_);
    if (st.ok()) break;
    last = st;
    if (IsClientError(st) || ++attempts >= max_attempts) {
      return st.WithContext("opening the inference session");
    }
    Backoff(*manager_, attempts);
  }
  // Step ids go up by two: a replacement server gets its replayed history as step id - 1.
  step_id_ += 2;
  const uint64_t id = step_id_;
  at::Tensor x = hidden.detach().contiguous();
  const at::Tensor hypo = hypo_ids.defined() ? hypo_ids.to(at::kLong).contiguous() : at::Tensor();
  for (size_t k = 0; k < chain_.size();) {
    const Link* next = k + 1 < chain_.size() ? &chain_[k + 1] : nullptr;
    Status st = SendStep(chain_[k], id, position, x, hypo, next);
    Result<at::Tensor> out =
        st.ok() ? ReadResult(chain_[k], id, x.sizes()) : Result<at::Tensor>(st);
    if (!out.ok()) {
      last = out.status();
      if (IsClientError(last)) return last;
      if (++attempts >= max_attempts) {
        return last.WithContext(fmt::format("inference step failed after {} attempts", attempts));
      }
      Status rec = Recover(k, last);
      if (!rec.ok()) return rec.WithContext("replacing a failed server");
      continue;
    }
    manager_->ReportSuccess(chain_[k].span.server.peer);
    chain_[k].history = AdvanceHistory(chain_[k].history, position, hypo, x);
    // Per-row prompts moved with their rows on the server.
    if (hypo.defined() && chain_[k].prompts.defined() && chain_[k].prompts.size(1) > 1) {
      chain_[k].prompts = chain_[k].prompts.index_select(1, hypo);
    }
    x = out->to(hidden.scalar_type());
    ++k;
  }
  position_ = position + hidden.size(1);
  stats_.route.clear();
  for (auto& l : chain_) stats_.route.push_back(l.span);
  return x;
}

Status InferenceSession::Recover(size_t k, const Status& why) {
  Link old = std::move(chain_[k]);
  if (old.stream) old.stream->Cancel(Cancelled("the client replaced this server"));
  manager_->Ban(old.span.server.peer, why);
  COLONY_LOG_WARN(
      "inference: server {} (blocks [{}, {})) failed: {}; replaying {} tokens to a "
      "replacement",
      old.span.server.peer.ToString(), old.span.start, old.span.end, why.ToString(),
      old.history.defined() ? old.history.size(1) : 0);
  const int max_attempts = manager_->options().max_attempts;
  Status last = why;
  for (int attempt = 1; attempt <= max_attempts; ++attempt) {
    auto route = manager_->MakeRoute(old.span.start, old.span.end, RoutingMode::kMinLatency);
    if (!route.ok()) {
      last = route.status();
      Backoff(*manager_, attempt);
      continue;
    }
    std::vector<Link> links(route->size());
    for (size_t i = 0; i < route->size(); ++i) {
      links[i].span = (*route)[i];
      auto addr = AddressOf((*route)[i].server);
      if (addr.ok()) links[i].address = *addr;
      // The replacements continue with the old server's prompts (in its current row order).
      links[i].prompts = PromptsOf(old.prompts, old.span.start, (*route)[i]);
    }
    const Link* after = k + 1 < chain_.size() ? &chain_[k + 1] : nullptr;
    bool failed = false;
    for (size_t i = links.size(); i-- > 0 && !failed;) {
      Status st = OpenLink(links[i], i + 1 < links.size() ? &links[i + 1] : after);
      if (!st.ok()) {
        last = st;
        manager_->Ban(links[i].span.server.peer, st);
        failed = true;
      }
    }
    // Rebuild the replacements' caches: the old server's inputs, chained through them.
    at::Tensor h = old.history;
    for (size_t i = 0; i < links.size() && !failed; ++i) {
      if (!h.defined() || h.size(1) == 0) break;
      // The replay is pushed only within the replacements: the server after them already holds
      // these positions (the next real step re-points the push target to it).
      const Link* next = i + 1 < links.size() ? &links[i + 1] : nullptr;
      Status st = SendStep(links[i], step_id_ - 1, 0, h, {}, next);
      Result<at::Tensor> out =
          st.ok() ? ReadResult(links[i], step_id_ - 1, h.sizes()) : Result<at::Tensor>(st);
      if (!out.ok()) {
        last = out.status();
        manager_->Ban(links[i].span.server.peer, last);
        failed = true;
        break;
      }
      links[i].history = h;
      stats_.replayed_tokens += h.size(1);
      h = *out;
    }
    if (failed) {
      for (auto& l : links) {
        if (l.stream) l.stream->Cancel();
      }
      Backoff(*manager_, attempt);
      continue;
    }
    chain_.erase(chain_.begin() + static_cast<std::ptrdiff_t>(k));
    chain_.insert(chain_.begin() + static_cast<std::ptrdiff_t>(k),
                  std::make_move_iterator(links.begin()), std::make_move_iterator(links.end()));
    ++stats_.failovers;
    return Status();
  }
  // Put nothing back: the session cannot continue without these blocks.
  chain_.erase(chain_.begin() + static_cast<std::ptrdiff_t>(k));
  closed_ = true;
  return last;
}

}  // namespace colony::serve
