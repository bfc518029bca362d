// serve.inference: one session per stream, with a server-side KV cache of max_length tokens
// reserved up front from the server's budget (waiting up to alloc_timeout for room), an idle
// timeout, duplicate steps dropped by id, and each step's output pushed to the next server of
// the chain when the client asks (serve.push saves it a round trip).
#include <fmt/format.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include "core/log.h"
#include "model/finite.h"
#include "net/dial_targets.h"
#include "net/source_address.h"
#include "runtime/tensor_io.h"
#include "serve/server_internal.h"

namespace colony::serve {

using asio::experimental::as_tuple;
constexpr auto use_awaitable = asio::use_awaitable;

asio::awaitable<Result<net::Message>> BlockServer::Impl::Push(const PeerId& from, net::Message m) {
  auto req = DecodePush(m.meta);
  if (!req.ok()) co_return req.status();
  std::shared_ptr<Session> s;
  bool from_upstream = false;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(req->session_id);
    if (it != sessions_.end()) {
      s = it->second;
      from_upstream = s->upstream && *s->upstream == from;
    }
  }
  if (!s) co_return NotFound("no such inference session on this server (it ended or never began)");
  // Knowing the session's id is not enough: a server the client replaced knows it too.
  if (!from_upstream) {
    co_return PermissionDenied(
        "this session accepts pushes only from the server its client named before it");
  }
  if (Status st = CheckStepSize(*s, m); !st.ok()) co_return st;
  auto input = std::make_shared<Input>();
  input->step = std::move(req->step);  // never with a next hop: the client chooses it
  input->tensors = std::move(m.tensors);
  input->from_push = true;
  // Never wait for room: when the session is busy the client's own copy of the step follows.
  (void)s->channel->try_send(asio::error_code{}, input);
  co_return net::Message();
}

Status BlockServer::Impl::CheckStepSize(const Session& s, const net::Message& m) {
  if (m.meta.size() > kMaxStepMetaBytes || m.tensors.size() > 2) {
    return InvalidArgument(
        fmt::format("a step carries {} bytes of metadata and {} tensors (at most {} and 2)",
                    m.meta.size(), m.tensors.size(), kMaxStepMetaBytes));
  }
  uint64_t bytes = 0;
  for (const auto& t : m.tensors) bytes += t.data.size();
  if (bytes > s.max_step_bytes) {
    return InvalidArgument(fmt::format(
        "a step of {} bytes is larger than this session can use (at most {}: batch {} x "
        "max_length {} hidden states)",
        bytes, s.max_step_bytes, s.batch, s.max_length));
  }
  return Status::Ok();
}

Status BlockServer::Impl::CheckPushTarget(const PushTarget& target, const std::string& client_ip) {
  if (target.empty()) return Status::Ok();
  auto addr = Multiaddr::Parse(target.address);
  std::error_code ec, client_ec;
  const auto ip =
      addr.ok() && addr->is_ip() ? asio::ip::make_address(addr->host(), ec) : asio::ip::address();
  const auto client = asio::ip::make_address(client_ip, client_ec);
  if (!addr.ok() || !addr->is_ip() || !addr->peer_id() || ec || client_ec ||
      !net::DialTargetAllowed(ip, client)) {
    return PermissionDenied(fmt::format(
        "push target '{}' is not an address this server dials for a client at {}: it must be "
        "an /ip4/ or /ip6/ address with /p2p/, and loopback or private only for a client there "
        "too",
        target.address.substr(0, 128), client_ip.substr(0, 64)));
  }
  return Status::Ok();
}

asio::awaitable<Status> BlockServer::Impl::ReserveCache(net::CallContext& ctx,
                                                        const std::string& source, int64_t bytes) {
  if (bytes > options_.cache_bytes) {
    co_return ResourceExhausted(fmt::format(
        "the session needs {:.1f} MiB of KV cache, more than this server's whole budget of "
        "{:.1f} MiB; use a smaller batch or max_length",
        bytes / 1048576.0, options_.cache_bytes / 1048576.0));
  }
  const int64_t share = source.empty()
                            ? options_.cache_bytes
                            : static_cast<int64_t>(options_.cache_share_per_address *
                                                   static_cast<double>(options_.cache_bytes));
  if (bytes > share) {
    co_return ResourceExhausted(fmt::format(
        "the session needs {:.1f} MiB of KV cache, more than one client address may hold on "
        "this server ({:.1f} MiB, {:.0f}% of its budget); use a smaller batch or max_length",
        bytes / 1048576.0, share / 1048576.0, 100 * options_.cache_share_per_address));
  }
  const auto deadline = Clock::now() + options_.alloc_timeout;
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (true) {
    int64_t used = 0, own = 0;
    {
      std::lock_guard lock(mu_);
      if (stopped_) co_return Unavailable("the server is shutting down");
      own = source.empty() ? 0 : sources_[source].cache_bytes;
      used = cache_used_;
      if (used + bytes <= options_.cache_bytes && own + bytes <= share) {
        cache_used_ += bytes;
        if (!source.empty()) sources_[source].cache_bytes += bytes;
        co_return Status();
      }
    }
    if (Clock::now() >= deadline || ctx.cancelled()) {
      if (own + bytes > share) {
        co_return ResourceExhausted(fmt::format(
            "no room in the KV cache within {} ms: the session needs {:.1f} MiB and sessions "
            "from {} already hold {:.1f} of the {:.1f} MiB one address may hold; close "
            "sessions or use another server",
            options_.alloc_timeout.count(), bytes / 1048576.0, source, own / 1048576.0,
            share / 1048576.0));
      }
      co_return ResourceExhausted(fmt::format(
          "no room in the KV cache within {} ms: the session needs {:.1f} MiB, {:.1f} of "
          "{:.1f} MiB are in use; retry later or use another server",
          options_.alloc_timeout.count(), bytes / 1048576.0, used / 1048576.0,
          options_.cache_bytes / 1048576.0));
    }
    timer.expires_after(std::chrono::milliseconds(20));
    co_await timer.async_wait(as_tuple(use_awaitable));
  }
}

asio::awaitable<void> BlockServer::Impl::SendPush(std::shared_ptr<Impl> self, Multiaddr addr,
                                                  net::Message message,
                                                  std::shared_ptr<std::atomic<bool>> pushing) {
  const std::string method = "serve.push";
  const net::CallOptions call{.timeout = std::chrono::seconds(5)};
  auto r = co_await self->node_.host().Call(addr, method, std::move(message), call);
  if (!r.ok()) COLONY_LOG_DEBUG("serve: push failed: {}", r.status().ToString());
  pushing->store(false);
}

asio::awaitable<void> BlockServer::Impl::ReadSteps(std::shared_ptr<net::Stream> stream,
                                                   std::shared_ptr<Session> s) {
  while (true) {
    auto m = co_await stream->Read();
    InputPtr input;
    if (m.ok() && *m) {
      auto step = DecodeStep((*m)->meta);
      Status size = step.ok() ? CheckStepSize(*s, **m) : step.status();
      if (!size.ok()) {
        stream->Cancel(size);
      } else {
        input = std::make_shared<Input>();
        input->step = std::move(*step);
        input->tensors = std::move((*m)->tensors);
      }
    }
    // A null input ends the session (clean end of stream or an error).
    auto [ec] = co_await s->channel->async_send(asio::error_code{}, input, as_tuple(use_awaitable));
    if (ec || !input) co_return;
  }
}

asio::awaitable<void> BlockServer::Impl::Watchdog(std::shared_ptr<net::Stream> stream,
                                                  std::shared_ptr<Session> s,
                                                  std::chrono::milliseconds idle) {
  while (!s->done) {
    s->idle_timer->expires_at(s->idle_deadline);
    co_await s->idle_timer->async_wait(as_tuple(use_awaitable));
    if (s->done) break;
    if (Clock::now() >= s->idle_deadline) {
      stream->Cancel(DeadlineExceeded(
          fmt::format("inference session idle for {} ms; the server closed it", idle.count())));
      break;
    }
  }
}

asio::awaitable<Status> BlockServer::Impl::Inference(net::CallContext& ctx) {
  COLONY_CO_RETURN_IF_ERROR(CheckServing());
  if (training_) {
    co_return FailedPrecondition(
        "this server trains its blocks (a SWARM stage): its weights change at every step, so it "
        "opens no inference sessions");
  }
  auto& stream = ctx.stream();
  auto first = co_await stream.Read();
  if (!first.ok()) co_return first.status();
  if (!*first) co_return Status();
  auto decoded = DecodeOpenSession((*first)->meta);
  if (!decoded.ok()) {
    co_return decoded.status().WithContext(
        "serve.inference: the first message must be an OpenSession");
  }
  const OpenSessionRequest& open = *decoded;
  COLONY_CO_RETURN_IF_ERROR(CheckRange(open.start, open.end));
  if (open.max_length > max_length_) {
    co_return InvalidArgument(fmt::format("max_length {} is outside [1, {}] (this server's limit)",
                                          open.max_length, max_length_));
  }
  if (open.batch_size > options_.max_batch) {
    co_return InvalidArgument(
        fmt::format("batch size {} is outside [1, {}]", open.batch_size, options_.max_batch));
  }
  const TuningSpec& spec = open.tuning;
  auto tuning = ReadTuning((*first)->tensors, 0, open.start, open.end, spec, open.batch_size,
                           open.max_length);
  if (!tuning.ok()) co_return tuning.status();
  if (!AllFinite(*tuning)) {
    co_return InvalidArgument("deep prompts or LoRA adapters contain NaN or infinity");
  }
  auto s = std::make_shared<Session>();
  s->id = open.session_id;
  s->start = open.start;
  s->end = open.end;
  s->max_length = open.max_length;
  s->batch = open.batch_size;
  s->max_step_bytes =
      static_cast<uint64_t>(s->batch * s->max_length * config_.hidden_size) * sizeof(float) +
      static_cast<uint64_t>(s->batch) * sizeof(int64_t);
  s->client_ip = ctx.remote_address().host();
  s->source = net::SourceKey(ctx, options_.limit_loopback_addresses);
  if (!open.upstream.empty()) s->upstream = *PeerId::Parse(open.upstream);
  COLONY_CO_RETURN_IF_ERROR(CheckPushTarget(open.next, s->client_ip));
  s->next = open.next;
  s->caches.resize(static_cast<size_t>(s->end - s->start));
  // The reservation counts max_length positions: their storage is made once, at the first step.
  for (auto& c : s->caches) c.reserve = s->max_length;
  // Kept in the server's dtype and counted in the session's reservation with its cache: they
  // move to the device only once it is reserved.
  const auto element = static_cast<int64_t>(c10::elementSize(dtype_));
  int64_t tuning_bytes = tuning->prompts.defined() ? tuning->prompts.numel() * element : 0;
  for (const auto& t : tuning->lora) tuning_bytes += t.numel() * element;
  const auto ex = co_await asio::this_coro::executor;
  s->channel = std::make_unique<Channel>(ex, 4);
  s->idle_timer = std::make_unique<asio::steady_timer>(ex);
  {
    std::lock_guard lock(mu_);
    if (sessions_.size() >= options_.max_sessions) {
      co_return ResourceExhausted(fmt::format(
          "this server already runs {} inference sessions (its limit); use another server",
          sessions_.size()));
    }
    if (!s->source.empty()) {
      auto it = sources_.find(s->source);
      if (it != sources_.end() && it->second.sessions >= options_.max_sessions_per_address) {
        co_return ResourceExhausted(fmt::format(
            "{} already holds {} inference sessions on this server (the limit per client "
            "address); close one or use another server",
            s->source, it->second.sessions));
      }
    }
    if (!sessions_.emplace(s->id, s).second) {
      co_return AlreadyExists("an inference session with this id is already open");
    }
    if (!s->source.empty()) ++sources_[s->source].sessions;
  }
  struct Cleanup {
    Impl* impl;
    std::shared_ptr<Session> s;
    ~Cleanup() {
      s->done = true;
      s->idle_timer->cancel();
      s->channel->close();
      std::lock_guard lock(impl->mu_);
      impl->sessions_.erase(s->id);
      impl->cache_used_ -= s->reserved;
      if (auto it = impl->sources_.find(s->source); it != impl->sources_.end()) {
        it->second.cache_bytes -= s->reserved;
        if (--it->second.sessions == 0) impl->sources_.erase(it);
      }
    }
  } cleanup{this, s};
  const int64_t bytes =
      s->batch * s->max_length * (s->end - s->start) * CacheBytesPerToken(config_, dtype_) +
      tuning_bytes;
  COLONY_CO_RETURN_IF_ERROR(co_await ReserveCache(ctx, s->source, bytes));
  s->reserved = bytes;
  if (tuning->prompts.defined()) s->prompts = tuning->prompts.to(device_, dtype_).contiguous();
  std::vector<at::Tensor> lora;
  for (const auto& t : tuning->lora) lora.push_back(t.to(device_, dtype_).contiguous());
  s->adapters = MakeAdapters(lora, s->end - s->start, spec);
  COLONY_LOG_DEBUG(
      "serve: session {} opened: blocks [{}, {}), batch {}, max_length {}, "
      "{} prompt tokens, LoRA rank {}",
      Hex(s->id), s->start, s->end, s->batch, s->max_length, spec.prompt_length, spec.lora_rank);
  SessionOpenedReply opened;
  {
    std::lock_guard lock(mu_);
    opened.cache_tokens_left = static_cast<uint64_t>(CacheTokensLeftLocked());
  }
  const net::Message opened_message(EncodeSessionOpened(opened));
  COLONY_CO_RETURN_IF_ERROR(co_await stream.Write(opened_message));

  auto stream_ptr = stream.shared_from_this();
  s->idle_deadline = Clock::now() + options_.session_idle_timeout;
  asio::co_spawn(ex, ReadSteps(stream_ptr, s), asio::detached);
  asio::co_spawn(ex, Watchdog(stream_ptr, s, options_.session_idle_timeout), asio::detached);

  while (true) {
    auto [ec, input] = co_await s->channel->async_receive(as_tuple(use_awaitable));
    if (ec || !input) break;
    // The client may re-point the push target with any message, even a duplicate step.
    if (!input->from_push && input->step.next) {
      COLONY_CO_RETURN_IF_ERROR(CheckPushTarget(*input->step.next, s->client_ip));
      s->next = *input->step.next;
    }
    if (!input->from_push && input->step.upstream) {
      std::lock_guard lock(mu_);
      s->upstream = input->step.upstream->empty()
                        ? std::nullopt
                        : std::optional<PeerId>(*PeerId::Parse(*input->step.upstream));
    }
    if (!input->from_push) {
      s->client_step = std::max(s->client_step, input->step.step_id);
    } else if (input->step.step_id > s->client_step && input->step.step_id - s->client_step > 2) {
      COLONY_LOG_DEBUG("serve: ignoring a push of step {} for session {}: its client is at {}",
                       input->step.step_id, Hex(s->id), s->client_step);
      continue;
    }
    if (input->step.step_id <= s->last_step) {
      std::lock_guard lock(mu_);
      ++duplicates_;
      continue;
    }
    Status st = co_await Step(stream, *s, *input);
    if (!st.ok()) {
      if (input->from_push && !s->dirty) {
        COLONY_LOG_DEBUG("serve: ignoring a bad push for session {}: {}", Hex(s->id),
                         st.ToString());
        continue;
      }
      co_return st;
    }
    s->idle_deadline = Clock::now() + options_.session_idle_timeout;
  }
  if (stream.cancelled()) co_return Cancelled("the inference stream ended");
  co_return Status();
}

asio::awaitable<Status> BlockServer::Impl::Step(net::Stream& stream, Session& s, Input& input) {
  const StepRequest& step = input.step;
  const size_t want = step.has_hypo_ids ? 2 : 1;
  if (input.tensors.size() != want) {
    co_return InvalidArgument(
        fmt::format("a step carries {} tensors, got {}", want, input.tensors.size()));
  }
  auto x = ReadHidden(input.tensors[0], s.batch * s.max_length * config_.hidden_size);
  if (!x.ok()) co_return x.status();
  if (x->size(0) != s.batch) {
    co_return InvalidArgument(
        fmt::format("the session was opened for a batch of {}, the step "
                    "has {}",
                    s.batch, x->size(0)));
  }
  const int64_t position = step.position, tokens = x->size(1);
  if (position < 0 || position > s.length) {
    co_return InvalidArgument(fmt::format(
        "step position {} is outside [0, {}] (the tokens cached so far)", position, s.length));
  }
  if (position + tokens > s.max_length) {
    co_return InvalidArgument(fmt::format(
        "the session's max_length {} is exceeded: {} tokens at position {}; open a session "
        "with a larger max_length",
        s.max_length, tokens, position));
  }
  at::Tensor hypo;
  if (step.has_hypo_ids) {
    auto h = runtime::FromFrame(input.tensors[1], {.max_elements = static_cast<uint64_t>(s.batch),
                                                   .allowed_dtypes = {DType::kInt64},
                                                   .rank = 1});
    if (!h.ok()) co_return h.status();
    if (h->size(0) != s.batch ||
        (h->numel() > 0 && (h->min().item<int64_t>() < 0 || h->max().item<int64_t>() >= s.batch))) {
      co_return InvalidArgument(
          fmt::format("hypo_ids must be {} indices in [0, {})", s.batch, s.batch));
    }
    hypo = *h;
  }
  const at::ScalarType client_dtype = x->scalar_type();
  // The end of the client's chain may reply with the last position only; a push still needs
  // every position (the next server caches them all).
  const bool last_only = step.last_position_at && *step.last_position_at == s.end;
  const bool pushes = !s.next.empty();
  auto self = shared_from_this();
  Session* sp = &s;
  auto work = [self, sp, x = *x, hypo, position, client_dtype,
               trim = last_only && !pushes]() -> Result<at::Tensor> {
    if (!model::AllFinite(x)) {
      return InvalidArgument("inputs contain NaN or infinity");
    }
    if (!self->Holds(sp->start, sp->end)) return self->MovedError();
    at::NoGradGuard no_grad;
    sp->dirty = true;  // cleared once the blocks have run (an exception leaves it set)
    // Inputs go to the GPU without waiting for it to finish other processes' work (ToDevice).
    const at::Tensor hypo_d = hypo.defined() ? model::ToDevice(hypo, self->device_) : hypo;
    for (auto& c : sp->caches) {
      c.Truncate(position);
      if (hypo_d.defined()) c.Reorder(hypo_d);
    }
    // Per-row prompts belong to their rows: they move with them.
    if (hypo_d.defined() && sp->prompts.defined() && sp->prompts.size(1) > 1) {
      sp->prompts = sp->prompts.index_select(1, hypo_d);
    }
    at::Tensor h = self->RunBlocks(
        sp->start, sp->end, model::ToDevice(x, self->device_, self->dtype_), position, &sp->caches,
        sp->prompts, sp->adapters.empty() ? nullptr : &sp->adapters);
    // Only what is sent leaves the device.
    if (trim) h = h.narrow(1, h.size(1) - 1, 1);
    at::Tensor out = h.to(at::kCPU, client_dtype);
    sp->dirty = false;
    return out;
  };
  auto out =
      co_await runtime::RunOnPool<at::Tensor>(pool_, runtime::kPriorityInference, std::move(work));
  if (!out.ok()) co_return out.status();
  s.length = position + tokens;
  s.last_step = step.step_id;
  {
    std::lock_guard lock(mu_);
    ++steps_;
    if (input.from_push) ++pushes_used_;
  }
  auto frame = runtime::ToFrame(*out);
  if (!frame.ok()) co_return frame.status();
  if (!s.next.empty() && !s.pushing->exchange(true)) {
    auto addr = Multiaddr::Parse(s.next.address);  // checked when decoded
    if (!addr.ok()) s.pushing->store(false);
    if (addr.ok()) {
      PushRequest push{.session_id = s.next.session_id, .step = step};
      push.step.next.reset();
      push.step.upstream.reset();
      net::Message pm(EncodePush(push));
      pm.tensors.push_back(*frame);
      // A frame of its own: the client's would keep its whole message alive until the push ends.
      if (hypo.defined()) {
        auto hf = runtime::ToFrame(hypo);
        if (hf.ok()) pm.tensors.push_back(std::move(*hf));
      }
      // (g++ 12: no temporaries in an expression that also co_awaits.)
      const auto ex = co_await asio::this_coro::executor;
      asio::co_spawn(ex, SendPush(self, *addr, std::move(pm), s.pushing), asio::detached);
    }
  }
  net::Message reply(EncodeStepReply({.step_id = step.step_id, .length = s.length}));
  if (last_only && out->size(1) > 1) {
    auto last = runtime::ToFrame(out->narrow(1, out->size(1) - 1, 1).contiguous());
    if (!last.ok()) co_return last.status();
    reply.tensors.push_back(std::move(*last));
  } else {
    reply.tensors.push_back(std::move(*frame));
  }
  co_return co_await stream.Write(reply);
}

}  // namespace colony::serve
