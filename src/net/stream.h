// A stream: one RPC call between two peers, carrying messages both ways over a connection.
//
// Every call — unary, server-streaming, client-streaming or bidirectional — is a stream:
//   caller:  OPEN(method, deadline) -> Write()* -> CloseWrite() -> Read()* until end of stream
//   handler: Read()* until the caller's CloseWrite -> Write()* -> (the framework sends the status)
// The caller's Read() returns std::nullopt at the end of the stream when the handler succeeded,
// and the handler's error Status (with its message) when it failed.
//
// Contracts:
//   - Flow control is end to end: Write() waits for the receiver's credit, so a reader that stops
//     reading stalls the writer instead of growing a buffer.
//   - Every stream has a deadline. When it passes, or either side cancels, or the connection
//     closes, pending and later operations complete with that error (DeadlineExceeded,
//     Cancelled, Closed), and a handler's coroutine receives an asio cancellation.
//   - Write() borrows the message's meta and tensor bytes until it completes; they are not copied
//     into an intermediate buffer (they are encrypted straight into the socket buffer).
//   - Methods may be called from any thread; they run on the connection's strand.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "core/clock.h"
#include "core/identity.h"
#include "core/multiaddr.h"
#include "core/status.h"
#include "net/notifier.h"
#include "net/wire.h"

namespace colony::net {

class Connection;

class Stream : public std::enable_shared_from_this<Stream> {
 public:
  ~Stream();

  // Next message; std::nullopt at a clean end of stream; an error status otherwise.
  asio::awaitable<Result<std::optional<Message>>> Read();
  // Sends a message (waits for flow-control credit and until the bytes are sealed).
  asio::awaitable<Status> Write(const Message& message);
  // Half-close: this side sends no more messages.
  asio::awaitable<Status> CloseWrite();
  // Caller side, for unary and client-streaming calls: reads exactly one response message and
  // the end of stream.
  asio::awaitable<Result<Message>> ReadFinal();
  // Aborts the stream in both directions; the peer sees `reason`. Thread-safe; idempotent.
  void Cancel(Status reason = Cancelled("cancelled by the caller"));

  const std::string& method() const { return method_; }
  const PeerId& peer() const { return peer_; }
  uint32_t id() const { return id_; }
  // The strand of the stream's connection (where its state lives).
  const asio::strand<asio::io_context::executor_type>& strand() const;
  // The other end's address as this side sees it (for incoming calls: its IP and source port).
  Multiaddr remote_address() const;
  SteadyTime deadline() const { return deadline_; }
  // True once the stream was reset, cancelled, timed out or its connection closed. Safe from
  // any thread (handlers poll it off the connection's strand).
  bool cancelled() const { return dead_.load(std::memory_order_acquire); }

 private:
  friend class Connection;
  Stream(std::shared_ptr<Connection> conn, uint32_t id, bool outbound, std::string method,
         SteadyTime deadline);

  asio::awaitable<Result<std::optional<Message>>> ReadOnStrand();
  asio::awaitable<Status> WriteOnStrand(const Message& message);
  asio::awaitable<Status> CloseWriteOnStrand();
  // Records the first error; wakes everyone; tells a handler's coroutine to stop.
  void Fail(const Status& status);
  // Resets the stream with `status` (sent to the peer too) and returns it.
  Status Abort(const Status& status);
  // Why a write that waited send_stall_timeout for `waiting_for` was given up.
  Status StallError(size_t unsent, const std::string& waiting_for) const;
  Status CheckCancelled(asio::cancellation_state cs);

  struct Inbound {
    Message message;
    uint64_t credit_due;   // wire bytes not yet credited back to the sender
    uint64_t host_charge;  // held against the host's budget of received messages until read
  };
  struct Assembly {
    std::shared_ptr<uint8_t[]> buffer;
    uint64_t total = 0;
    uint64_t filled = 0;
    uint64_t uncredited = 0;
  };

  std::shared_ptr<Connection> conn_;
  const uint32_t id_;
  const bool outbound_;  // we opened it (we are the caller)
  const std::string method_;
  PeerId peer_;
  const SteadyTime deadline_;

  // Receive side.
  std::deque<Inbound> inbound_;
  std::optional<Assembly> partial_;
  uint64_t recv_unacked_ = 0;    // bytes received and not yet credited (<= our stream window)
  uint64_t pending_credit_ = 0;  // credited but not yet announced in a WINDOW frame
  bool reader_waiting_ = false;
  bool remote_done_ = false;  // peer sent CLOSE_WRITE or STATUS
  Status remote_status_;      // the handler's final status (caller side)

  // Send side.
  int64_t send_credit_ = 0;
  bool waiting_conn_credit_ = false;  // listed in the connection's credit_waiters_
  bool local_done_ = false;           // we sent CLOSE_WRITE or STATUS

  Status error_;                   // non-OK once the stream is dead
  std::atomic<bool> dead_{false};  // error_ is non-OK: what cancelled() reads from any thread
  bool registered_ = true;         // still in the connection's stream table
  Notifier notifier_;
  asio::steady_timer deadline_timer_;
  asio::cancellation_signal handler_cancel_;
};

// What a handler knows about its call.
class CallContext {
 public:
  explicit CallContext(std::shared_ptr<Stream> stream) : stream_(std::move(stream)) {}
  Stream& stream() { return *stream_; }
  const PeerId& peer() const { return stream_->peer(); }
  const std::string& method() const { return stream_->method(); }
  SteadyTime deadline() const { return stream_->deadline(); }
  bool cancelled() const { return stream_->cancelled(); }
  Multiaddr remote_address() const { return stream_->remote_address(); }

 private:
  std::shared_ptr<Stream> stream_;
};

}  // namespace colony::net
