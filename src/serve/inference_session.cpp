// Inference sessions over chains of servers (inference_session.h): opening the chain back to
// front (each server may push its output to the next), sending steps, reading results, and
// recovering from a dead server by replaying its history to a replacement.
#include "serve/inference_session.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <mutex>

#include "core/log.h"
#include "runtime/tensor_io.h"
#include "serve/client_internal.h"
#include "serve/step_history.h"

namespace colony::serve {

struct InferenceSession::Link {
  RouteSpan span;
  Multiaddr address;
  std::string session_id = RandomId();
  std::shared_ptr<net::Stream> stream;
  StepHistory history;  // every input this span's cache holds, [B, length, H]
  at::Tensor prompts;   // this span's deep prompts, rows in the order of the cached rows
};

InferenceSession::InferenceSession(std::shared_ptr<SequenceManager> manager, int64_t start,
                                   int64_t end, SessionOptions options)
    : manager_(std::move(manager)), start_(start), end_(end), options_(std::move(options)) {
  // Like hidden states, tuning weights travel from host memory (and beam search reorders the
  // prompts' rows with host indices), whatever device the caller trained them on.
  if (options_.prompts.defined()) options_.prompts = options_.prompts.detach().to(at::kCPU);
  for (auto& a : options_.adapters) a = a.detach().to(at::kCPU);
}

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
  return CheckFinite(p, "deep prompts");
}

Status InferenceSession::OpenLink(Link& link, const Link* next, const Link* prev) {
  COLONY_ASSIGN_OR_RETURN(link.address, AddressOf(link.span.server));
  OpenSessionRequest open;
  open.session_id = link.session_id;
  open.start = link.span.start;
  open.end = link.span.end;
  open.max_length = options_.max_length;
  open.batch_size = options_.batch_size;
  if (next && manager_->options().use_push) {
    open.next = {next->address.ToString(), next->session_id};
  }
  if (prev && manager_->options().use_push) open.upstream = prev->span.server.peer.ToString();
  open.tuning = TuningOf(link.prompts.defined() ? link.prompts.size(2) : 0, options_.lora);
  // The span's prompts (already its slice), then its blocks' adapters.
  std::vector<at::Tensor> tensors;
  if (link.prompts.defined()) tensors.push_back(link.prompts);
  AppendSpanInputs(tensors, start_, link.span, {}, options_.lora, options_.adapters);
  net::Message open_message(EncodeOpenSession(open));
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
        auto opened = DecodeSessionOpened((*reply)->meta);
        if (!opened.ok()) co_return opened.status();
        co_return true;
      }(),
      manager_->options().step_timeout,
      [holder] {
        if (auto s = holder->Get()) s->Cancel(DeadlineExceeded("opening the session timed out"));
      });
  if (!r.ok()) {
    if (auto s = holder->Get()) s->Cancel();
    return ServerFailure(r.status())
        .WithContext(fmt::format("opening a session for blocks [{}, {}) on {}", link.span.start,
                                 link.span.end, link.span.server.peer.ToString()));
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
    links[i].history = StepHistory(options_.max_length);
  }
  // Open back to front so that each OpenSession can name its successor's session.
  for (size_t i = links.size(); i-- > 0;) {
    const Link* next = i + 1 < links.size() ? &links[i + 1] : nullptr;
    Status st = OpenLink(links[i], next, i > 0 ? &links[i - 1] : nullptr);
    if (!st.ok()) {
      if (!IsClientError(st)) manager_->Ban(links[i].span.server, st);
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
                                  const at::Tensor& x, const at::Tensor& hypo_ids, const Link* next,
                                  const Link* prev, std::optional<uint32_t> last_at) {
  StepRequest step{.step_id = step_id, .position = position, .has_hypo_ids = hypo_ids.defined()};
  step.last_position_at = last_at;
  if (manager_->options().use_push) {
    // Present and empty without a next server: no push.
    step.next = next ? PushTarget{next->address.ToString(), next->session_id} : PushTarget{};
    // Likewise the server whose pushes it takes (it changes when a neighbour is replaced).
    step.upstream = prev ? prev->span.server.peer.ToString() : std::string();
  }
  net::Message msg(EncodeStep(step));
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
  return r.ok() ? Status() : ServerFailure(r.status());
}

Result<at::Tensor> InferenceSession::ReadResult(Link& link, uint64_t step_id, at::IntArrayRef shape,
                                                bool last_only) {
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
    if (!r.ok()) return ServerFailure(r.status());
    COLONY_ASSIGN_OR_RETURN(StepReply result, DecodeStepReply(r->meta));
    if (result.step_id < step_id) continue;
    if (result.step_id != step_id) {
      return ProtocolError(fmt::format("the server answered step {} while step {} was expected",
                                       result.step_id, step_id));
    }
    for (const auto& t : r->tensors) stats_.received_bytes += static_cast<int64_t>(t.data.size());
    if (!last_only || shape[1] == 1) return HiddenFrom(*r, 0, shape);
    const std::array<int64_t, 3> last = {shape[0], 1, shape[2]};
    if (!r->tensors.empty() && r->tensors[0].shape.size() == 3 && r->tensors[0].shape[1] > 1) {
      COLONY_ASSIGN_OR_RETURN(at::Tensor all, HiddenFrom(*r, 0, shape));
      return all.narrow(1, shape[1] - 1, 1);
    }
    return HiddenFrom(*r, 0, last);
  }
  return ProtocolError("the server sent too many results for old steps");
}

Result<at::Tensor> InferenceSession::Step(const at::Tensor& hidden, const at::Tensor& hypo_ids,
                                          int64_t position, StepOutputs outputs) {
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
  COLONY_RETURN_IF_ERROR(CheckFinite(hidden, "hidden states"));
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
  // The session's history (replayed to a replacement server) and every step's result live in
  // host memory, whatever device the client computes on.
  at::Tensor x = hidden.detach().to(at::kCPU).contiguous();
  const auto last_at = outputs == StepOutputs::kLast
                           ? std::optional<uint32_t>(static_cast<uint32_t>(end_))
                           : std::nullopt;
  const at::Tensor hypo =
      hypo_ids.defined() ? hypo_ids.to(at::kCPU, at::kLong).contiguous() : at::Tensor();
  for (size_t k = 0; k < chain_.size();) {
    const Link* next = k + 1 < chain_.size() ? &chain_[k + 1] : nullptr;
    // Every link is told where the chain ends: a push carries it to the last server too.
    Status st =
        SendStep(chain_[k], id, position, x, hypo, next, k > 0 ? &chain_[k - 1] : nullptr, last_at);
    const bool last_link = k + 1 == chain_.size();
    Result<at::Tensor> out = st.ok() ? ReadResult(chain_[k], id, x.sizes(), last_at && last_link)
                                     : Result<at::Tensor>(st);
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
    // The inputs the server's cache now holds, in the order it applied them.
    chain_[k].history.Advance(position, hypo, x);
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
  manager_->Ban(old.span.server, why);
  COLONY_LOG_WARN(
      "inference: server {} (blocks [{}, {})) failed: {}; replaying {} tokens to a "
      "replacement",
      old.span.server.peer.ToString(), old.span.start, old.span.end, why.ToString(),
      old.history.length());
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
      links[i].history = StepHistory(options_.max_length);
    }
    const Link* after = k + 1 < chain_.size() ? &chain_[k + 1] : nullptr;
    bool failed = false;
    for (size_t i = links.size(); i-- > 0 && !failed;) {
      const Link* before = i > 0 ? &links[i - 1] : (k > 0 ? &chain_[k - 1] : nullptr);
      Status st = OpenLink(links[i], i + 1 < links.size() ? &links[i + 1] : after, before);
      if (!st.ok()) {
        last = st;
        manager_->Ban(links[i].span.server, st);
        failed = true;
      }
    }
    // Rebuild the replacements' caches: the old server's inputs, chained through them.
    at::Tensor h = old.history.tensor();
    for (size_t i = 0; i < links.size() && !failed; ++i) {
      if (!h.defined() || h.size(1) == 0) break;
      // The replay is pushed only within the replacements: the server after them already holds
      // these positions (the next real step re-points the push target to it).
      const Link* next = i + 1 < links.size() ? &links[i + 1] : nullptr;
      const Link* before = i > 0 ? &links[i - 1] : (k > 0 ? &chain_[k - 1] : nullptr);
      Status st = SendStep(links[i], step_id_ - 1, 0, h, {}, next, before);
      Result<at::Tensor> out =
          st.ok() ? ReadResult(links[i], step_id_ - 1, h.sizes()) : Result<at::Tensor>(st);
      if (!out.ok()) {
        last = out.status();
        manager_->Ban(links[i].span.server, last);
        failed = true;
        break;
      }
      links[i].history.Assign(h);
      stats_.replayed_tokens += h.size(1);
      // In the history's dtype, as Step passes each server's output on (a reply in a codec
      // decodes to float32): the next server gets what it got before, and its history appends in
      // place.
      h = out->to(h.scalar_type());
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
