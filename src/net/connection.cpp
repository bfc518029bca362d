#include "net/connection.h"

#include <algorithm>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <cstring>

#include "core/log.h"
#include "net/protocol.pb.h"
#include "net/run_on_strand.h"

namespace colony::net {
namespace {

constexpr auto kUse = asio::experimental::as_tuple(asio::use_awaitable);
constexpr size_t kWriteBatch = 1u << 20;  // bytes sealed before one socket write
constexpr size_t kInitialReadBuffer = 64u << 10;
// Room for several large records, so compaction (moving a partial record to the front) is rare.
constexpr size_t kMaxReadBuffer = 8 * (kMaxRecordPlaintext + kTagSize + 4);
// Records holding one DATA frame of at least this many bytes, for a message already begun, are
// decrypted straight into the message's buffer (no copy out of the read buffer). So the sender
// gives such frames a record of their own, and starts a large message with a small frame (the
// frame that begins a message cannot go straight in: its buffer does not exist yet).
constexpr size_t kDirectDecryptMin = 64u << 10;
// The most the reader asks the kernel to gather before waking it (SO_RCVLOWAT): one full record.
constexpr size_t kMaxLowWater = kMaxRecordPlaintext + kTagSize + 4;
constexpr size_t kFirstChunkOfLargeMessage = 4u << 10;
// Buffers above this size are released once traffic is small again.
constexpr size_t kShrinkAbove = 512u << 10;
// Backlog accounting per queued control frame beyond its payload: what the queue entry and the
// payload's allocation really take, so that the backlog limit bounds memory.
constexpr size_t kControlFrameCost = 128;
constexpr uint64_t kMaxCredit = 1ull << 40;
// The credit waiters of streams that ended are dropped once the list has this many entries.
constexpr size_t kPruneCreditWaitersAt = 1024;

size_t VarintLength(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

Bytes VarintBytes(uint64_t v) {
  Bytes b;
  ByteWriter(b).Varint(v);
  return b;
}

bool IsCancelled(const asio::cancellation_state& cs) {
  return cs.cancelled() != asio::cancellation_type::none;
}

std::string Ms(std::chrono::nanoseconds d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Stream

Stream::Stream(std::shared_ptr<Connection> conn, uint32_t id, bool outbound, std::string method,
               SteadyTime deadline)
    : conn_(std::move(conn)),
      id_(id),
      outbound_(outbound),
      method_(std::move(method)),
      peer_(conn_->peer()),
      deadline_(deadline),
      notifier_(conn_->strand()),
      deadline_timer_(conn_->strand()) {}

Stream::~Stream() {
  // Messages nobody read still count against the host's budget of received bytes.
  for (const Inbound& in : inbound_) conn_->ReleaseReceived(in.host_charge);
}

const Strand& Stream::strand() const { return conn_->strand(); }
Multiaddr Stream::remote_address() const { return conn_->remote_address(); }

asio::awaitable<Result<std::optional<Message>>> Stream::Read() {
  auto self = shared_from_this();
  auto fn = [self] { return self->ReadOnStrand(); };
  co_return co_await RunOnStrand<Result<std::optional<Message>>>(conn_->strand(), std::move(fn));
}

asio::awaitable<Status> Stream::Write(const Message& message) {
  auto self = shared_from_this();
  auto fn = [self, &message] { return self->WriteOnStrand(message); };
  co_return co_await RunOnStrand<Status>(conn_->strand(), std::move(fn));
}

asio::awaitable<Status> Stream::CloseWrite() {
  auto self = shared_from_this();
  auto fn = [self] { return self->CloseWriteOnStrand(); };
  co_return co_await RunOnStrand<Status>(conn_->strand(), std::move(fn));
}

asio::awaitable<Result<Message>> Stream::ReadFinal() {
  auto first = co_await Read();
  if (!first.ok()) co_return first.status();
  if (!first->has_value()) {
    co_return ProtocolError("peer " + peer_.Short() + " ended call '" + method_ +
                            "' without a response");
  }
  auto end = co_await Read();
  if (!end.ok()) co_return end.status();
  if (end->has_value()) {
    Cancel(InvalidArgument("expected one response"));
    co_return ProtocolError("peer " + peer_.Short() + " sent more than one response to '" +
                            method_ + "'");
  }
  co_return std::move(**first);
}

void Stream::Cancel(Status reason) {
  asio::dispatch(conn_->strand(), [self = shared_from_this(), reason = std::move(reason)] {
    if (!self->error_.ok() || !self->registered_) return;
    self->conn_->SendReset(self->id_, reason);
    self->Fail(reason);
    self->conn_->Unregister(*self);
  });
}

Status Stream::CheckCancelled(asio::cancellation_state cs) {
  if (!error_.ok()) return error_;
  if (IsCancelled(cs)) {
    Status st = colony::Cancelled("call '" + method_ + "' was cancelled");
    if (registered_) {
      conn_->SendReset(id_, st);
      Fail(st);
      conn_->Unregister(*this);
    } else {
      Fail(st);
    }
    return st;
  }
  return Status::Ok();
}

asio::awaitable<Result<std::optional<Message>>> Stream::ReadOnStrand() {
  auto cs = co_await asio::this_coro::cancellation_state;
  for (;;) {
    if (!error_.ok()) co_return error_;
    if (!inbound_.empty()) {
      Inbound in = std::move(inbound_.front());
      inbound_.pop_front();
      conn_->Credit(this, in.credit_due);
      conn_->ReleaseReceived(in.host_charge);
      co_return std::optional<Message>(std::move(in.message));
    }
    if (remote_done_ || !registered_) {
      if (outbound_ && !remote_status_.ok()) co_return remote_status_;
      co_return std::optional<Message>();
    }
    // The application is waiting for the message being assembled: let it flow.
    if (partial_ && partial_->uncredited > 0) {
      conn_->Credit(this, partial_->uncredited);
      partial_->uncredited = 0;
    }
    reader_waiting_ = true;
    co_await notifier_.Wait();
    reader_waiting_ = false;
    Status st = CheckCancelled(cs);
    if (!st.ok()) co_return st;
  }
}

asio::awaitable<Status> Stream::WriteOnStrand(const Message& message) {
  auto cs = co_await asio::this_coro::cancellation_state;
  if (!error_.ok()) co_return error_;
  if (local_done_) {
    co_return FailedPrecondition("write to call '" + method_ +
                                 "' after its sending side was closed");
  }
  if (!registered_ || (outbound_ && remote_done_)) {
    if (!remote_status_.ok()) co_return remote_status_;
    co_return FailedPrecondition("call '" + method_ + "' already ended; the peer reads no more");
  }
  auto encoded = EncodeMessage(message);
  if (!encoded.ok()) co_return encoded.status();
  if (encoded->total > conn_->peer_limits_.max_message_bytes) {
    co_return ResourceExhausted("message of " + std::to_string(encoded->total) +
                                " bytes exceeds peer " + peer_.Short() + "'s limit of " +
                                std::to_string(conn_->peer_limits_.max_message_bytes) + " bytes");
  }
  auto out = std::make_shared<OutgoingMessage>();
  out->encoded = std::move(*encoded);
  const size_t total = out->encoded.total;
  // A handler's reply counts against the connection's and the host's reply budgets until it is
  // sealed: what a peer that withholds credit can make us hold is bounded.
  struct ReplyCharge {
    Connection* conn = nullptr;
    uint64_t bytes = 0;
    ReplyCharge() = default;
    ReplyCharge(const ReplyCharge&) = delete;
    ReplyCharge& operator=(const ReplyCharge&) = delete;
    ~ReplyCharge() {
      if (conn != nullptr) conn->ReleaseReply(bytes);
    }
  } charge;
  if (!outbound_) {
    Status st = conn_->TakeReply(total);
    if (!st.ok()) co_return Abort(st);
    charge.conn = conn_.get();
    charge.bytes = total;
  }
  // A write that makes no progress (no byte of it queued or sealed) for send_stall_timeout is
  // given up: the peer is withholding credit or not reading its socket.
  const auto stall = conn_->options_.send_stall_timeout;
  SteadyTime last_progress = std::chrono::steady_clock::now();
  auto stalled = [&] { return std::chrono::steady_clock::now() - last_progress >= stall; };
  size_t sent = 0;
  while (sent < total) {
    const size_t prefix = sent == 0 ? VarintLength(total) : 0;
    // Wait for credit from both the stream's and the connection's windows.
    for (;;) {
      if (!error_.ok()) co_return error_;
      if (!registered_) co_return FailedPrecondition("call '" + method_ + "' ended while writing");
      if (send_credit_ > static_cast<int64_t>(prefix) &&
          conn_->conn_send_credit_ > static_cast<int64_t>(prefix)) {
        break;
      }
      if (conn_->conn_send_credit_ <= static_cast<int64_t>(prefix) && !waiting_conn_credit_) {
        waiting_conn_credit_ = true;
        auto& waiters = conn_->credit_waiters_;
        if (waiters.size() >= kPruneCreditWaitersAt) {
          std::erase_if(waiters, [](const std::weak_ptr<Stream>& w) { return w.expired(); });
        }
        waiters.push_back(weak_from_this());
      }
      if (stalled()) co_return Abort(StallError(total - sent, "flow-control credit"));
      co_await notifier_.WaitUntil(last_progress + stall);
      Status st = CheckCancelled(cs);
      if (!st.ok()) co_return st;
    }
    size_t credit = static_cast<size_t>(std::min(send_credit_, conn_->conn_send_credit_)) - prefix;
    size_t n = std::min({total - sent, credit, kMaxDataChunk});
    if (sent == 0 && total >= kDirectDecryptMin + kFirstChunkOfLargeMessage) {
      n = std::min(n, kFirstChunkOfLargeMessage);
    }
    Connection::OutFrame f;
    f.type = FrameType::kData;
    f.stream_id = id_;
    if (sent == 0) {
      f.flags = kFlagBegin;
      f.payload = VarintBytes(total);
    }
    f.data = out;
    f.stream = shared_from_this();
    f.offset = sent;
    f.length = n;
    send_credit_ -= static_cast<int64_t>(prefix + n);
    conn_->conn_send_credit_ -= static_cast<int64_t>(prefix + n);
    conn_->Enqueue(std::move(f));
    sent += n;
    last_progress = std::chrono::steady_clock::now();
  }
  // The message's bytes are borrowed until the writer has sealed them.
  size_t sealed = out->sealed;
  while (out->sealed < total) {
    if (!error_.ok()) co_return error_;
    if (!registered_) co_return FailedPrecondition("call '" + method_ + "' ended while writing");
    if (out->sealed != sealed) {
      sealed = out->sealed;
      last_progress = std::chrono::steady_clock::now();
    }
    if (stalled()) co_return Abort(StallError(total - out->sealed, "the peer reading its socket"));
    co_await notifier_.WaitUntil(last_progress + stall);
    Status st = CheckCancelled(cs);
    if (!st.ok()) co_return st;
  }
  co_return Status::Ok();
}

Status Stream::Abort(const Status& status) {
  if (error_.ok() && registered_) {
    conn_->SendReset(id_, status);
    Fail(status);
    conn_->Unregister(*this);
  }
  return status;
}

Status Stream::StallError(size_t unsent, const std::string& waiting_for) const {
  return DeadlineExceeded("call '" + method_ + "' to peer " + peer_.Short() +
                          " made no progress for " + Ms(conn_->options_.send_stall_timeout) +
                          " waiting for " + waiting_for + " (" + std::to_string(unsent) +
                          " bytes unsent); the stream was reset");
}

asio::awaitable<Status> Stream::CloseWriteOnStrand() {
  if (!error_.ok()) co_return error_;
  if (local_done_ || !registered_) co_return Status::Ok();
  local_done_ = true;
  conn_->EnqueueControl(FrameType::kCloseWrite, id_, {});
  co_return Status::Ok();
}

void Stream::Fail(const Status& status) {
  if (!error_.ok()) return;
  error_ = status;
  dead_.store(!error_.ok(), std::memory_order_release);
  // Frames still queued may borrow the caller's memory; drop them now.
  std::erase_if(conn_->outq_, [this](const Connection::OutFrame& f) {
    return f.type == FrameType::kData && f.stream.get() == this;
  });
  deadline_timer_.cancel();
  if (!outbound_) handler_cancel_.emit(asio::cancellation_type::terminal);
  notifier_.Notify();
}

// ---------------------------------------------------------------------------------------------
// Connection: construction and lifetime

Connection::Connection(asio::ip::tcp::socket socket, Strand strand, Role role,
                       HandshakeResult handshake, Multiaddr remote,
                       const ConnectionOptions& options, HandlerLookup handlers,
                       std::function<void(Connection*)> on_closed)
    : socket_(std::move(socket)),
      strand_(std::move(strand)),
      role_(role),
      peer_(handshake.peer.peer),
      remote_(remote.WithPeerId(handshake.peer.peer)),
      observed_by_peer_(handshake.peer.observed_addr),
      peer_listen_addrs_(handshake.peer.listen_addrs),
      peer_hello_(handshake.peer_hello),
      peer_access_(handshake.peer_access),
      peer_limits_(handshake.peer.limits),
      options_(options),
      handlers_(std::move(handlers)),
      on_closed_(std::move(on_closed)),
      sealer_(std::move(handshake.sealer)),
      opener_(std::move(handshake.opener)),
      next_stream_id_(role == Role::kInitiator ? 1 : 2),
      stream_slot_freed_(strand_),
      writer_wake_(strand_),
      backlog_drained_(strand_),
      writer_idle_(strand_),
      conn_send_credit_(static_cast<int64_t>(peer_limits_.connection_window)),
      last_received_(std::chrono::steady_clock::now()),
      idle_since_(last_received_),
      ticker_(strand_) {}

Connection::~Connection() = default;

std::shared_ptr<Connection> Connection::Start(asio::ip::tcp::socket socket, Strand strand,
                                              Role role, HandshakeResult handshake,
                                              Multiaddr remote, const ConnectionOptions& options,
                                              HandlerLookup handlers,
                                              std::function<void(Connection*)> on_closed) {
  std::error_code ignored;
  socket.set_option(asio::ip::tcp::no_delay(true), ignored);
  std::shared_ptr<Connection> c(new Connection(std::move(socket), strand, role,
                                               std::move(handshake), std::move(remote), options,
                                               std::move(handlers), std::move(on_closed)));
  asio::co_spawn(
      c->strand_, [c]() -> asio::awaitable<void> { co_await c->ReaderLoop(); }, asio::detached);
  asio::co_spawn(
      c->strand_, [c]() -> asio::awaitable<void> { co_await c->WriterLoop(); }, asio::detached);
  asio::co_spawn(
      c->strand_, [c]() -> asio::awaitable<void> { co_await c->TickerLoop(); }, asio::detached);
  return c;
}

std::string Connection::Describe() const {
  return "peer " + peer_.ToString() + " at " + remote_.WithoutPeerId().ToString();
}

void Connection::SendAccessToken(Bytes token) {
  asio::dispatch(strand_, [self = shared_from_this(), token = std::move(token)]() mutable {
    if (!self->closed_) self->EnqueueControl(FrameType::kToken, 0, std::move(token));
  });
}

void Connection::CloseAsync(Status status) {
  asio::dispatch(strand_,
                 [self = shared_from_this(), status = std::move(status)] { self->Close(status); });
}

void Connection::Shutdown(std::string reason) {
  asio::dispatch(strand_, [self = shared_from_this(), reason = std::move(reason)] {
    if (self->closed_ || self->goaway_sent_) return;
    self->goaway_sent_ = true;
    self->closing_flag_ = true;
    self->EnqueueControl(FrameType::kGoAway, 0, EncodeStatus(Closed(reason)));
    // Give the writer a moment to deliver GOAWAY (a peer that does not read cannot delay us).
    auto timer = std::make_shared<asio::steady_timer>(self->strand_, std::chrono::seconds(2));
    asio::co_spawn(
        self->strand_,
        [self, timer, reason]() -> asio::awaitable<void> {
          timer->async_wait([self](std::error_code) { self->writer_idle_.Notify(); });
          while (!self->closed_ && (!self->outq_.empty() || self->writing_) &&
                 std::chrono::steady_clock::now() < timer->expiry()) {
            co_await self->writer_idle_.Wait();
          }
          timer->cancel();
          self->Close(Closed("connection closed: " + reason));
        },
        asio::detached);
  });
}

void Connection::Retire(std::string reason, std::chrono::milliseconds grace) {
  asio::dispatch(strand_, [self = shared_from_this(), reason = std::move(reason), grace] {
    if (self->closed_ || self->goaway_sent_) return;
    self->retire_grace_ = grace;
    self->retire_reason_ = reason;
    // The grace period counts from now, also when no stream is open.
    if (self->streams_.empty()) self->idle_since_ = std::chrono::steady_clock::now();
    // Check sooner than the next keepalive tick would.
    self->ticker_.expires_after(std::min(grace, std::chrono::milliseconds(1000)));
  });
}

void Connection::Close(const Status& status) {
  if (closed_) return;
  closed_ = true;
  closed_flag_ = true;
  closing_flag_ = true;
  close_status_ = status;
  COLONY_LOG_DEBUG("connection to {} closed: {}", Describe(), status.ToString());
  auto streams = std::move(streams_);
  streams_.clear();
  for (auto& [id, s] : streams) {
    s->registered_ = false;
    s->Fail(status);
    if (s->partial_) {
      ReleaseAssembling(s->partial_->total);
      s->partial_.reset();
    }
  }
  outq_.clear();
  control_backlog_ = 0;
  for (auto& [nonce, p] : pings_) p.done->Notify();
  std::error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  ticker_.cancel();
  writer_wake_.Notify();
  backlog_drained_.Notify();
  writer_idle_.Notify();
  stream_slot_freed_.Notify();
  if (on_closed_) {
    auto cb = std::move(on_closed_);
    on_closed_ = nullptr;
    cb(this);
  }
}

// ---------------------------------------------------------------------------------------------
// Sending

void Connection::Enqueue(OutFrame frame) {
  if (closed_) return;
  if (frame.type != FrameType::kData) control_backlog_ += frame.payload.size() + kControlFrameCost;
  outq_.push_back(std::move(frame));
  writer_wake_.Notify();
}

void Connection::EnqueueControl(FrameType type, uint32_t stream_id, Bytes payload, uint8_t flags) {
  OutFrame f;
  f.type = type;
  f.flags = flags;
  f.stream_id = stream_id;
  f.payload = std::move(payload);
  Enqueue(std::move(f));
}

void Connection::SendReset(uint32_t id, const Status& status) {
  EnqueueControl(FrameType::kReset, id, EncodeStatus(status));
}

asio::awaitable<void> Connection::WriterLoop() {
  // Grows with bulk transfers and is released after them: an idle connection holds little.
  RawBuffer wbuf;
  Bytes headers;
  std::vector<size_t> header_ends;
  for (;;) {
    while (outq_.empty() && !closed_) {
      writer_idle_.Notify();
      co_await writer_wake_.Wait();
    }
    if (closed_) break;
    wbuf.clear();
    while (!outq_.empty() && wbuf.size() < kWriteBatch) {
      // Pack as many queued frames as fit into one record.
      headers.clear();
      header_ends.clear();
      size_t plain = 0;
      size_t k = 0;
      for (const OutFrame& f : outq_) {
        size_t before = headers.size();
        EncodeFrameHeader({f.type, f.flags, f.stream_id, f.payload.size() + f.length}, headers);
        size_t size = headers.size() - before + f.payload.size() + f.length;
        // A bulk DATA frame gets a record of its own (see kDirectDecryptMin).
        const bool bulk = f.type == FrameType::kData && f.flags == 0 && size >= kDirectDecryptMin;
        if (k > 0 && (bulk || plain + size > kMaxRecordPlaintext)) {
          headers.resize(before);
          break;
        }
        plain += size;
        header_ends.push_back(headers.size());
        if (++k == 4096 || bulk) break;
      }
      sealer_->Begin(plain, wbuf);
      size_t hstart = 0;
      for (size_t i = 0; i < k; ++i) {
        const OutFrame& f = outq_[i];
        sealer_->Update(ByteSpan(headers.data() + hstart, header_ends[i] - hstart), wbuf);
        hstart = header_ends[i];
        sealer_->Update(f.payload, wbuf);
        if (f.length > 0) {
          // Seal the body range straight from its pieces (tensor bytes included).
          size_t skip = f.offset, left = f.length;
          for (ByteSpan piece : f.data->encoded.pieces) {
            if (left == 0) break;
            if (skip >= piece.size()) {
              skip -= piece.size();
              continue;
            }
            size_t take = std::min(piece.size() - skip, left);
            sealer_->Update(piece.subspan(skip, take), wbuf);
            skip = 0;
            left -= take;
          }
        }
      }
      sealer_->Finish(wbuf);
      for (size_t i = 0; i < k; ++i) {
        OutFrame f = std::move(outq_.front());
        outq_.pop_front();
        if (f.type == FrameType::kData) {
          f.data->sealed = f.offset + f.length;
          f.stream->notifier_.Notify();
        } else {
          control_backlog_ -= std::min(control_backlog_, f.payload.size() + kControlFrameCost);
        }
      }
    }
    writing_ = true;
    auto [ec, n] = co_await asio::async_write(socket_, asio::buffer(wbuf), kUse);
    writing_ = false;
    if (ec) {
      Close(Unavailable("connection to " + Describe() + " lost while sending: " + ec.message()));
      break;
    }
    bytes_sent_ += n;
    if (wbuf.capacity() > kShrinkAbove && wbuf.size() < kShrinkAbove / 4) RawBuffer().swap(wbuf);
    backlog_drained_.Notify();
  }
  writer_idle_.Notify();
}

// ---------------------------------------------------------------------------------------------
// Receiving

asio::awaitable<void> Connection::ReaderLoop() {
  RawBuffer buf(kInitialReadBuffer);
  size_t begin = 0, end = 0;
  int small_records = 0;
  size_t low_water_set = 1;  // the kernel's default SO_RCVLOWAT
  // Reads until at least `need` bytes are buffered past `begin`. False when the connection ended.
  auto fill = [&](size_t need) -> asio::awaitable<bool> {
    while (end - begin < need) {
      if (buf.size() - begin < need) {
        if (buf.size() < kMaxReadBuffer && need > buf.size() / 4) {
          const size_t size = std::min(kMaxReadBuffer, std::max(buf.size() * 2, need * 4));
          ReserveRaw(buf, size);
          buf.resize(size);
        }
        if (buf.size() - begin < need) {
          std::memmove(buf.data(), buf.data() + begin, end - begin);
          end -= begin;
          begin = 0;
        }
      }
      // Ask the kernel to wake us only once the rest of this record has arrived: one wakeup and
      // one read per large record, not one per arriving segment. A blocking socket would do the
      // same with MSG_WAITALL; the kernel still wakes us early under memory pressure or at EOF.
      const size_t low_water = std::min(need - (end - begin), kMaxLowWater);
      if (low_water != low_water_set) {
        asio::error_code ignored;
        socket_.set_option(asio::socket_base::receive_low_watermark(static_cast<int>(low_water)),
                           ignored);
        low_water_set = low_water;
      }
      auto [ec, n] =
          co_await socket_.async_read_some(asio::buffer(buf.data() + end, buf.size() - end), kUse);
      if (ec) {
        if (!closed_) {
          if (ec == asio::error::eof || ec == asio::error::connection_reset) {
            Close(Closed(Describe() + " closed the connection"));
          } else {
            Close(Unavailable("connection to " + Describe() + " lost: " + ec.message()));
          }
        }
        co_return false;
      }
      end += n;
      bytes_received_ += n;
      last_received_ = std::chrono::steady_clock::now();
    }
    co_return true;
  };

  while (!closed_) {
    if (!co_await fill(4)) break;
    ByteReader lr(ByteSpan(buf.data() + begin, 4));
    uint32_t sealed_len = lr.U32();
    if (sealed_len < kTagSize || sealed_len > kMaxRecordPlaintext + kTagSize) {
      Close(ProtocolError(Describe() + " sent a record of invalid length " +
                          std::to_string(sealed_len) + "; closing the connection"));
      break;
    }
    if (!co_await fill(4 + sealed_len)) break;
    MutableByteSpan sealed(buf.data() + begin + 4, sealed_len);
    Status st = OpenAndHandleRecord(ByteSpan(buf.data() + begin, 4), sealed);
    begin += 4 + sealed_len;
    small_records = sealed_len < (16u << 10) ? small_records + 1 : 0;
    if (begin == end) {
      begin = end = 0;
      // Back to a small buffer after a bulk transfer, once records are small again.
      if (buf.size() > kShrinkAbove && small_records > 64) {
        RawBuffer(kInitialReadBuffer).swap(buf);
      }
    }
    if (!st.ok()) {
      if (!closed_) {
        COLONY_LOG_WARN("closing connection to {}: {}", Describe(), st.ToString());
        Close(st.WithContext("connection to " + Describe()));
      }
      break;
    }
    // Backpressure on a peer that sends requests but does not read our answers.
    while (!closed_ && control_backlog_ > options_.max_outgoing_backlog) {
      co_await backlog_drained_.Wait();
    }
  }
}

Status Connection::OpenAndHandleRecord(ByteSpan length_prefix, MutableByteSpan sealed) {
  const size_t n = sealed.size() - kTagSize;
  if (n < kDirectDecryptMin) {
    COLONY_RETURN_IF_ERROR(opener_->Open(length_prefix, sealed));
    return HandleRecord(ByteSpan(sealed.data(), n));
  }
  // Decrypt the first bytes to read the frame header, then decide where the rest goes. Nothing is
  // acted on before the tag verifies; a forged record only scribbles inside a message buffer of a
  // connection that is then closed.
  constexpr size_t kHead = 16;
  uint8_t head[kHead];
  opener_->OpenBegin(length_prefix);
  opener_->OpenUpdate(ByteSpan(sealed.data(), kHead), head);
  ByteReader hr(ByteSpan(head, kHead));
  uint8_t type = hr.U8();
  uint8_t flags = hr.U8();
  uint64_t id = hr.Varint();
  uint64_t len = hr.Varint();
  const size_t hlen = hr.position();
  uint8_t* dest = nullptr;
  if (hr.ok() && type == static_cast<uint8_t>(FrameType::kData) && flags == 0 && len == n - hlen &&
      id <= UINT32_MAX) {
    auto it = streams_.find(static_cast<uint32_t>(id));
    if (it != streams_.end() && !it->second->remote_done_ && it->second->partial_ &&
        len <= it->second->partial_->total - it->second->partial_->filled) {
      dest = it->second->partial_->buffer.get() + it->second->partial_->filled;
    }
  }
  if (dest) {
    std::memcpy(dest, head + hlen, kHead - hlen);
    opener_->OpenUpdate(ByteSpan(sealed.data() + kHead, n - kHead), dest + (kHead - hlen));
  } else {
    std::memcpy(sealed.data(), head, kHead);
    opener_->OpenUpdate(ByteSpan(sealed.data() + kHead, n - kHead), sealed.data() + kHead);
  }
  COLONY_RETURN_IF_ERROR(opener_->OpenFinish(ByteSpan(sealed.data() + n, kTagSize)));
  if (dest) {
    return HandleData({FrameType::kData, 0, static_cast<uint32_t>(id), len}, ByteSpan(), true);
  }
  return HandleRecord(ByteSpan(sealed.data(), n));
}

Status Connection::HandleRecord(ByteSpan plaintext) {
  ByteReader in(plaintext);
  while (in.remaining() > 0 && !closed_) {
    auto h = DecodeFrameHeader(in);
    if (!h.ok()) return h.status();
    ByteSpan payload = in.Raw(h->payload_length);
    Status st;
    switch (h->type) {
      case FrameType::kOpen:
        st = HandleOpen(h->stream_id, payload);
        break;
      case FrameType::kData:
        st = HandleData(*h, payload);
        break;
      case FrameType::kCloseWrite:
        HandleCloseWrite(h->stream_id);
        break;
      case FrameType::kStatus:
        HandleStatus(h->stream_id, payload);
        break;
      case FrameType::kReset:
        HandleReset(h->stream_id, payload);
        break;
      case FrameType::kWindow:
        st = HandleWindow(h->stream_id, payload);
        break;
      case FrameType::kPing:
        HandlePing(h->flags, payload);
        break;
      case FrameType::kToken:
        st = HandleToken(payload);
        break;
      case FrameType::kGoAway: {
        Status why = DecodeStatus(payload);
        Close(Closed(Describe() + " closed the connection: " + why.message()));
        return Status::Ok();
      }
    }
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

Status Connection::HandleToken(ByteSpan payload) {
  if (!options_.access || !options_.access->is_private()) return Status::Ok();  // nothing to renew
  auto grant = options_.access->Admit(peer_, payload);
  if (!grant.ok()) {
    return PermissionDenied(
        "peer " + peer_.ToString() +
        " renewed its access with a token this swarm refuses: " + grant.status().message());
  }
  peer_access_ = *grant;
  return Status::Ok();
}

Status Connection::HandleOpen(uint32_t id, ByteSpan payload) {
  const bool peer_parity = (id % 2 == 0) == (role_ == Role::kInitiator);
  if (!peer_parity || id <= last_peer_stream_id_) {
    return ProtocolError("peer opened stream " + std::to_string(id) + " out of sequence");
  }
  last_peer_stream_id_ = id;
  proto::CallHeader header;
  if (!header.ParseFromArray(payload.data(), static_cast<int>(payload.size())) ||
      header.method().empty() || header.method().size() > 256) {
    return ProtocolError("peer sent an invalid call header on stream " + std::to_string(id));
  }
  if (goaway_sent_) {
    SendReset(id, Unavailable("peer " + peer_.Short() + " is shutting down"));
    return Status::Ok();
  }
  if (peer_access_ && !RoleMayCall(peer_access_->role, header.method())) {
    SendReset(id, PermissionDenied("a peer whose access token has role '" +
                                   std::string(AccessRoleName(peer_access_->role)) +
                                   "' may not call '" + header.method() + "' in this swarm"));
    return Status::Ok();
  }
  // Honest callers queue at the limit we announced (see OpenStream); the slack covers streams a
  // caller already considers closed while its RESET is still on the way to us.
  if (peer_open_streams_ >=
      options_.limits.max_concurrent_streams + options_.limits.max_concurrent_streams / 4 + 4) {
    SendReset(id, ResourceExhausted("too many concurrent calls on one connection (limit " +
                                    std::to_string(options_.limits.max_concurrent_streams) +
                                    "); wait for earlier calls to finish"));
    return Status::Ok();
  }
  auto max_ms = static_cast<uint64_t>(options_.max_call_timeout.count());
  uint64_t timeout_ms = header.timeout_ms() == 0 ? max_ms : std::min(header.timeout_ms(), max_ms);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::shared_ptr<Stream> s(new Stream(shared_from_this(), id, false, header.method(), deadline));
  s->send_credit_ = peer_limits_.stream_window;
  streams_[id] = s;
  ++peer_open_streams_;
  s->deadline_timer_.expires_at(deadline);
  s->deadline_timer_.async_wait([w = std::weak_ptr<Stream>(s), timeout_ms](std::error_code ec) {
    if (ec) return;
    if (auto st = w.lock()) {
      st->Cancel(DeadlineExceeded("call '" + st->method() + "' from peer " + st->peer().Short() +
                                  " exceeded its deadline of " + std::to_string(timeout_ms) +
                                  " ms"));
    }
  });
  StreamHandler handler = handlers_ ? handlers_(header.method()) : StreamHandler();
  if (!handler) {
    EnqueueControl(FrameType::kStatus, id,
                   EncodeStatus(Unimplemented("the called peer has no handler for '" +
                                              header.method() + "'")));
    s->local_done_ = true;
    s->deadline_timer_.cancel();
    Unregister(*s);
    return Status::Ok();
  }
  StartHandler(std::move(s), std::move(handler));
  return Status::Ok();
}

void Connection::StartHandler(std::shared_ptr<Stream> stream, StreamHandler handler) {
  auto slot = stream->handler_cancel_.slot();
  asio::co_spawn(
      strand_,
      [self = shared_from_this(), stream, handler = std::move(handler)]() -> asio::awaitable<void> {
        co_await asio::this_coro::throw_if_cancelled(false);
        Status st;
        try {
          CallContext ctx(stream);
          st = co_await handler(ctx);
        } catch (const std::exception& e) {
          st = Internal("handler for '" + stream->method() + "' failed: " + e.what());
        } catch (...) {
          st = Internal("handler for '" + stream->method() + "' failed with an unknown exception");
        }
        if (stream->registered_ && stream->error_.ok() && !self->closed_) {
          self->EnqueueControl(FrameType::kStatus, stream->id_, EncodeStatus(st));
          stream->local_done_ = true;
          stream->deadline_timer_.cancel();
          self->Unregister(*stream);
        }
      },
      asio::bind_cancellation_slot(slot, asio::detached));
}

Status Connection::HandleData(const FrameHeader& h, ByteSpan payload, bool placed) {
  const uint64_t n = placed ? h.payload_length : payload.size();
  if (conn_recv_unacked_ + n > options_.limits.connection_window) {
    return ProtocolError("peer exceeded the connection's flow-control window");
  }
  conn_recv_unacked_ += n;
  auto it = streams_.find(h.stream_id);
  if (it == streams_.end() || it->second->remote_done_) {
    const bool ours = (h.stream_id % 2 == 1) == (role_ == Role::kInitiator);
    if (ours ? h.stream_id >= next_stream_id_ : h.stream_id > last_peer_stream_id_) {
      return ProtocolError("DATA for stream " + std::to_string(h.stream_id) +
                           " that was never opened");
    }
    Credit(nullptr, n);  // a stream that just ended; its data are discarded
    return Status::Ok();
  }
  Stream& s = *it->second;
  if (s.recv_unacked_ + n > options_.limits.stream_window) {
    return ProtocolError("peer exceeded the flow-control window of stream " +
                         std::to_string(h.stream_id));
  }
  s.recv_unacked_ += n;
  ByteReader r(payload);
  if (h.flags & kFlagBegin) {
    if (s.partial_) return ProtocolError("a message began before the previous one ended");
    uint64_t total = r.Varint();
    if (!r.ok() || total == 0) return ProtocolError("message start without a valid length");
    Status refuse;
    if (total > options_.limits.max_message_bytes) {
      refuse =
          ResourceExhausted("message of " + std::to_string(total) + " bytes exceeds the limit of " +
                            std::to_string(options_.limits.max_message_bytes) + " bytes");
    } else {
      refuse = TakeAssembling(total);
    }
    if (!refuse.ok()) {
      SendReset(s.id_, refuse);
      s.Fail(refuse);
      Unregister(s);
      return Status::Ok();
    }
    s.partial_ = Stream::Assembly{std::shared_ptr<uint8_t[]>(new uint8_t[total]), total, 0, 0};
  } else if (!s.partial_) {
    return ProtocolError("message data without a message start on stream " +
                         std::to_string(h.stream_id));
  }
  ByteSpan body = r.Rest();
  const uint64_t body_size = placed ? n : body.size();
  Stream::Assembly& a = *s.partial_;
  if (body_size > a.total - a.filled) {
    return ProtocolError("message data overrun the announced message length");
  }
  if (!placed && !body.empty()) std::memcpy(a.buffer.get() + a.filled, body.data(), body.size());
  a.filled += body_size;
  a.uncredited += n;
  if (s.reader_waiting_ && s.inbound_.empty()) {
    Credit(&s, a.uncredited);
    a.uncredited = 0;
  }
  if (a.filled == a.total) {
    // The message leaves this connection's assembly; the host keeps counting it until read.
    assembling_bytes_ -= a.total;
    const uint64_t host_charge = a.total + kHeldMessageOverhead;
    Stream::Assembly done = std::move(a);
    s.partial_.reset();
    auto message = DecodeMessage(ByteSpan(done.buffer.get(), done.total), done.buffer);
    if (!message.ok()) {
      ReleaseReceived(host_charge);
      Status st = message.status().WithContext("from peer " + peer_.Short());
      SendReset(s.id_, st);
      s.Fail(st);
      Unregister(s);
      return Status::Ok();
    }
    s.inbound_.push_back({std::move(*message), done.uncredited, host_charge});
    s.notifier_.Notify();
  }
  return Status::Ok();
}

void Connection::Credit(Stream* s, uint64_t n) {
  if (n == 0) return;
  if (s != nullptr) {
    if (!s->registered_) return;  // its bytes were returned to the connection when it ended
    s->recv_unacked_ -= std::min(s->recv_unacked_, n);
    if (!s->remote_done_) {
      // Stream-level credit; batched to a quarter window to keep WINDOW frames rare.
      s->pending_credit_ += n;
      if (s->pending_credit_ >= options_.limits.stream_window / 4) {
        EnqueueControl(FrameType::kWindow, s->id_, VarintBytes(s->pending_credit_));
        s->pending_credit_ = 0;
      }
    }
  }
  conn_recv_unacked_ -= std::min(conn_recv_unacked_, n);
  conn_pending_credit_ += n;
  if (conn_pending_credit_ >= options_.limits.connection_window / 4) {
    EnqueueControl(FrameType::kWindow, 0, VarintBytes(conn_pending_credit_));
    conn_pending_credit_ = 0;
  }
}

Status Connection::TakeAssembling(uint64_t n) {
  if (assembling_bytes_ + n > options_.max_assembling_bytes) {
    return ResourceExhausted("too many large messages in flight on this connection (limit " +
                             std::to_string(options_.max_assembling_bytes) +
                             " bytes); retry later");
  }
  const uint64_t charge = n + kHeldMessageOverhead;
  ByteBudget* address = options_.address_received_budget.get();
  if (address != nullptr && !address->TryTake(charge)) {
    return ResourceExhausted("the connections from " + options_.budget_key +
                             " hold too many received messages not read yet (limit " +
                             std::to_string(address->limit()) +
                             " bytes per source address); retry later");
  }
  if (options_.host_received_budget && !options_.host_received_budget->TryTake(charge)) {
    if (address != nullptr) address->Give(charge);
    return ResourceExhausted("this peer holds too many received messages (host limit " +
                             std::to_string(options_.host_received_budget->limit()) +
                             " bytes); retry later");
  }
  assembling_bytes_ += n;
  return Status::Ok();
}

void Connection::ReleaseAssembling(uint64_t n) {
  assembling_bytes_ -= n;
  ReleaseReceived(n + kHeldMessageOverhead);
}

void Connection::ReleaseReceived(uint64_t charge) {
  if (charge == 0) return;
  if (options_.address_received_budget) options_.address_received_budget->Give(charge);
  if (options_.host_received_budget) options_.host_received_budget->Give(charge);
}

Status Connection::TakeReply(uint64_t n) {
  if (reply_bytes_ + n > options_.max_reply_bytes) {
    return ResourceExhausted("replies of " + std::to_string(reply_bytes_ + n) +
                             " bytes would wait to be sent to " + Describe() +
                             ", over the connection's limit of " +
                             std::to_string(options_.max_reply_bytes) +
                             " bytes (read your replies to return flow-control credit)");
  }
  ByteBudget* address = options_.address_reply_budget.get();
  if (address != nullptr && !address->TryTake(n)) {
    return ResourceExhausted("replies of " + std::to_string(address->used() + n) +
                             " bytes would wait to be sent to the connections from " +
                             options_.budget_key + ", over the limit of " +
                             std::to_string(address->limit()) +
                             " bytes per source address (read your replies to return "
                             "flow-control credit)");
  }
  if (options_.host_reply_budget && !options_.host_reply_budget->TryTake(n)) {
    if (address != nullptr) address->Give(n);
    return ResourceExhausted("this peer has " + std::to_string(options_.host_reply_budget->used()) +
                             " bytes of replies waiting to be sent, at its limit of " +
                             std::to_string(options_.host_reply_budget->limit()) +
                             " bytes; retry later");
  }
  reply_bytes_ += n;
  return Status::Ok();
}

void Connection::ReleaseReply(uint64_t n) {
  reply_bytes_ -= n;
  if (options_.address_reply_budget) options_.address_reply_budget->Give(n);
  if (options_.host_reply_budget) options_.host_reply_budget->Give(n);
}

void Connection::Unregister(Stream& s) {
  if (!s.registered_) return;
  // Return everything this stream still holds of the connection's window.
  uint64_t held = s.recv_unacked_;
  s.recv_unacked_ = 0;
  for (auto& in : s.inbound_) in.credit_due = 0;
  s.registered_ = false;
  if (s.partial_) {
    ReleaseAssembling(s.partial_->total);
    s.partial_.reset();
  }
  std::erase_if(outq_, [&s](const OutFrame& f) {
    return f.type == FrameType::kData && f.stream.get() == &s;
  });
  if (!s.outbound_) --peer_open_streams_;
  if (s.outbound_) {
    --my_open_streams_;
    stream_slot_freed_.Notify();
  }
  auto keep = streams_.find(s.id_);
  std::shared_ptr<Stream> hold;
  if (keep != streams_.end()) {
    hold = std::move(keep->second);
    streams_.erase(keep);
  }
  if (held > 0) Credit(nullptr, held);
  if (streams_.empty()) idle_since_ = std::chrono::steady_clock::now();
  s.notifier_.Notify();
}

void Connection::HandleCloseWrite(uint32_t id) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  Stream& s = *it->second;
  if (s.outbound_) return;  // the handler's end of stream is its STATUS
  if (s.partial_) {
    Status st = ProtocolError("peer ended its side of the call in the middle of a message");
    SendReset(id, st);
    s.Fail(st);
    Unregister(s);
    return;
  }
  s.remote_done_ = true;
  s.notifier_.Notify();
}

void Connection::HandleStatus(uint32_t id, ByteSpan payload) {
  auto it = streams_.find(id);
  if (it == streams_.end() || !it->second->outbound_) return;
  Stream& s = *it->second;
  s.remote_status_ = DecodeStatus(payload);
  s.remote_done_ = true;
  s.deadline_timer_.cancel();
  Unregister(s);
}

void Connection::HandleReset(uint32_t id, ByteSpan payload) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  Stream& s = *it->second;
  Status why = DecodeStatus(payload);
  if (why.ok()) why = colony::Cancelled("peer " + peer_.Short() + " cancelled the call");
  s.Fail(why);
  Unregister(s);
}

Status Connection::HandleWindow(uint32_t id, ByteSpan payload) {
  ByteReader r(payload);
  uint64_t n = r.Varint();
  if (!r.ok() || r.remaining() != 0 || n == 0 || n > kMaxCredit) {
    return ProtocolError("invalid WINDOW frame");
  }
  if (id == 0) {
    conn_send_credit_ += static_cast<int64_t>(n);
    if (conn_send_credit_ > static_cast<int64_t>(kMaxCredit)) {
      return ProtocolError("peer granted more connection credit than allowed");
    }
    auto waiters = std::move(credit_waiters_);
    credit_waiters_.clear();
    for (auto& w : waiters) {
      if (auto s = w.lock()) {
        s->waiting_conn_credit_ = false;
        s->notifier_.Notify();
      }
    }
    return Status::Ok();
  }
  auto it = streams_.find(id);
  if (it == streams_.end()) return Status::Ok();
  Stream& s = *it->second;
  s.send_credit_ += static_cast<int64_t>(n);
  if (s.send_credit_ > static_cast<int64_t>(kMaxCredit)) {
    return ProtocolError("peer granted more stream credit than allowed");
  }
  s.notifier_.Notify();
  return Status::Ok();
}

void Connection::HandlePing(uint8_t flags, ByteSpan payload) {
  if (!(flags & kFlagAck)) {
    EnqueueControl(FrameType::kPing, 0, Bytes(payload.begin(), payload.end()), kFlagAck);
    return;
  }
  ByteReader r(payload);
  uint64_t nonce = r.U64();
  auto it = pings_.find(nonce);
  if (it == pings_.end()) return;  // a keepalive answer, or a late one
  it->second.rtt = std::chrono::steady_clock::now() - it->second.sent;
  it->second.done->Notify();
}

// ---------------------------------------------------------------------------------------------
// Operations started by the application

asio::awaitable<Result<std::shared_ptr<Stream>>> Connection::OpenStream(
    std::string method, std::chrono::milliseconds timeout) {
  auto self = shared_from_this();
  auto fn = [self, method = std::move(method),
             timeout]() -> asio::awaitable<Result<std::shared_ptr<Stream>>> {
    if (self->closed_) co_return self->close_status_;
    if (self->goaway_sent_)
      co_return Unavailable("connection to " + self->Describe() + " is closing");
    if (method.empty() || method.size() > 256 || ValidUtf8Prefix(method, 256) != method) {
      co_return InvalidArgument("method name must be 1 to 256 bytes of valid UTF-8");
    }
    auto ms = std::clamp(timeout, std::chrono::milliseconds(1), self->options_.max_call_timeout);
    auto deadline = std::chrono::steady_clock::now() + ms;
    // Respect the peer's limit on concurrent calls by waiting for a free slot.
    if (self->my_open_streams_ >= self->peer_limits_.max_concurrent_streams) {
      asio::steady_timer timer(self->strand_, deadline);
      timer.async_wait([self](std::error_code ec) {
        if (!ec) self->stream_slot_freed_.Notify();
      });
      while (!self->closed_ &&
             self->my_open_streams_ >= self->peer_limits_.max_concurrent_streams) {
        if (std::chrono::steady_clock::now() >= deadline) {
          co_return DeadlineExceeded("call '" + method + "' to " + self->Describe() + " waited " +
                                     std::to_string(ms.count()) + " ms for a free stream slot");
        }
        co_await self->stream_slot_freed_.Wait();
      }
      timer.cancel();
      if (self->closed_) co_return self->close_status_;
    }
    if (self->next_stream_id_ > UINT32_MAX - 2) {
      co_return ResourceExhausted("connection to " + self->Describe() + " ran out of stream ids");
    }
    uint32_t id = self->next_stream_id_;
    self->next_stream_id_ += 2;
    std::shared_ptr<Stream> s(new Stream(self, id, true, method, deadline));
    ++self->my_open_streams_;
    s->send_credit_ = self->peer_limits_.stream_window;
    self->streams_[id] = s;
    s->deadline_timer_.expires_at(deadline);
    s->deadline_timer_.async_wait([w = std::weak_ptr<Stream>(s), ms](std::error_code ec) {
      if (ec) return;
      if (auto st = w.lock()) {
        st->Cancel(DeadlineExceeded("call '" + st->method() + "' to peer " + st->peer().Short() +
                                    " did not complete within " + std::to_string(ms.count()) +
                                    " ms"));
      }
    });
    proto::CallHeader header;
    header.set_method(method);
    header.set_timeout_ms(static_cast<uint64_t>(ms.count()));
    Bytes payload(header.ByteSizeLong());
    header.SerializeToArray(payload.data(), static_cast<int>(payload.size()));
    self->EnqueueControl(FrameType::kOpen, id, std::move(payload));
    co_return s;
  };
  // (A named lambda: g++ 12 destroys a temporary closure passed to a coroutine twice.)
  co_return co_await RunOnStrand<Result<std::shared_ptr<Stream>>>(strand_, std::move(fn));
}

asio::awaitable<Result<std::chrono::nanoseconds>> Connection::Ping(
    std::chrono::milliseconds timeout) {
  auto self = shared_from_this();
  auto fn = [self, timeout]() -> asio::awaitable<Result<std::chrono::nanoseconds>> {
    if (self->closed_) co_return self->close_status_;
    uint64_t nonce = self->next_ping_++;
    auto done = std::make_shared<Notifier>(self->strand_);
    self->pings_[nonce] = {std::chrono::steady_clock::now(), std::nullopt, done};
    Bytes payload;
    ByteWriter(payload).U64(nonce);
    self->EnqueueControl(FrameType::kPing, 0, std::move(payload));
    asio::steady_timer timer(self->strand_, timeout);
    timer.async_wait([done](std::error_code ec) {
      if (!ec) done->Notify();
    });
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!self->closed_ && !self->pings_[nonce].rtt &&
           std::chrono::steady_clock::now() < deadline) {
      co_await done->Wait();
    }
    timer.cancel();
    auto rtt = self->pings_[nonce].rtt;
    self->pings_.erase(nonce);
    if (rtt) co_return *rtt;
    if (self->closed_) co_return self->close_status_;
    co_return DeadlineExceeded(self->Describe() + " did not answer a ping within " + Ms(timeout));
  };
  co_return co_await RunOnStrand<Result<std::chrono::nanoseconds>>(strand_, std::move(fn));
}

asio::awaitable<void> Connection::TickerLoop() {
  using namespace std::chrono;
  auto tick =
      std::max(milliseconds(10), std::min(options_.keepalive_interval, options_.idle_timeout) / 4);
  while (!closed_) {
    ticker_.expires_after(tick);
    co_await ticker_.async_wait(kUse);
    if (closed_) break;
    auto now = steady_clock::now();
    // The reader sleeps until a whole record has arrived (SO_RCVLOWAT): on a slow link the
    // bytes of a large record reach the kernel long before we read them. New bytes waiting
    // there are news from the peer too.
    asio::socket_base::bytes_readable queued;
    asio::error_code ec;
    socket_.io_control(queued, ec);
    if (!ec) {
      if (queued.get() > 0 && queued.get() != kernel_queued_seen_) last_received_ = now;
      kernel_queued_seen_ = queued.get();
    }
    auto silent = now - last_received_;
    if (silent > options_.keepalive_timeout) {
      Close(Unavailable(Describe() + " stopped responding (nothing received for " + Ms(silent) +
                        "); the peer or the network is down"));
      break;
    }
    if (peer_access_ && options_.access) {
      Status still = options_.access->StillValid(*peer_access_);
      if (!still.ok()) {
        Close(PermissionDenied("closed the connection to " + Describe() + ": " + still.message()));
        break;
      }
    }
    if (silent > options_.keepalive_interval) {
      Bytes payload;
      ByteWriter(payload).U64(0);  // keepalive pings carry nonce 0 and are not tracked
      EnqueueControl(FrameType::kPing, 0, std::move(payload));
    }
    if (streams_.empty() && retire_grace_ && now - idle_since_ >= *retire_grace_) {
      Shutdown(retire_reason_);
      break;
    }
    if (streams_.empty() && now - idle_since_ > options_.idle_timeout) {
      Shutdown("idle for " + Ms(now - idle_since_));
      break;
    }
  }
}

}  // namespace colony::net
