// A secure, multiplexed connection to one authenticated peer.
//
// After the handshake (handshake.h) the connection runs three coroutines on its strand:
//   reader:  reads records, authenticates and decrypts them, dispatches their frames;
//   writer:  packs queued frames into records, encrypts them straight from their sources
//            (tensor bytes included) into one write buffer, and writes it;
//   ticker:  keepalive pings, dead-peer detection, idle close.
// Streams (stream.h) live in a table keyed by id: the side that dialed opens odd ids, the side
// that accepted opens even ids, so both sides may call each other over one connection.
//
// Flow control is credit based, per stream and per connection (like HTTP/2): a sender may have at
// most the receiver's announced window of unacknowledged DATA bytes in flight; the receiver returns
// credit as the application consumes messages. Sending beyond the window is a protocol violation
// that closes the connection. A peer that stops reading therefore stalls its senders, and what a
// connection can make us buffer is bounded by its windows plus the messages being actively read.
//
// Thread-safety: all state is touched only on the strand. Public methods may be called from any
// thread. Close() fails every in-flight stream with the close status, exactly once.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "core/clock.h"
#include "core/identity.h"
#include "core/multiaddr.h"
#include "net/byte_budget.h"
#include "net/crypto.h"
#include "net/handshake.h"
#include "net/notifier.h"
#include "net/stream.h"
#include "net/wire.h"

namespace colony::net {

using Strand = asio::strand<asio::io_context::executor_type>;
using StreamHandler = std::function<asio::awaitable<Status>(CallContext&)>;
// Finds the handler of a method; returns an empty function when there is none.
using HandlerLookup = std::function<StreamHandler(const std::string& method)>;

// What one received message costs beyond its bytes while it waits to be read (its queue entry,
// buffer allocation and bookkeeping), counted against the host's budget of received messages.
inline constexpr uint64_t kHeldMessageOverhead = 256;

struct ConnectionOptions {
  // Our receive limits (announced to the peer during the handshake).
  PeerLimits limits;
  // Bytes of incomplete incoming messages we hold at once (over all streams).
  uint64_t max_assembling_bytes = 256ull << 20;
  // Bytes of replies this connection's handlers are sending at once, counted from Write() until
  // the writer has sealed them. A reply beyond it fails with ResourceExhausted and resets its
  // stream, so a peer that withholds flow-control credit while opening many calls holds at most
  // this much of our memory per connection.
  uint64_t max_reply_bytes = 128ull << 20;
  // A write (a reply, or a call's request) that gets no flow-control credit and has none of its
  // bytes sealed for this long fails with DeadlineExceeded and resets its stream.
  std::chrono::milliseconds send_stall_timeout{60'000};
  // Budgets shared by all connections of a host (HostOptions::max_reply_bytes and
  // max_received_bytes); the host sets them. Null: no host-wide limit.
  std::shared_ptr<ByteBudget> host_reply_budget;
  std::shared_ptr<ByteBudget> host_received_budget;
  // The shares of those that the connections of one source address may hold together
  // (HostOptions::max_reply_bytes_per_address, max_received_bytes_per_address); the host sets
  // them for each connection. Null: none (an exempt address: loopback unless limited).
  std::shared_ptr<ByteBudget> address_reply_budget;
  std::shared_ptr<ByteBudget> address_received_budget;
  std::string budget_key;  // whose they are ("203.0.113.7", "peers relayed by 203.0.113.9")
  // A private swarm's policy (the host sets it; null: a public swarm). A peer's grant is checked
  // again on every tick (expiry, revocation), its role on every call it opens, and a TOKEN frame
  // renews it.
  std::shared_ptr<const AccessControl> access;
  // Queued control frames (resets, window updates, pongs) beyond which we stop reading.
  size_t max_outgoing_backlog = 4u << 20;
  std::chrono::milliseconds handshake_timeout{10'000};
  std::chrono::milliseconds idle_timeout{120'000};       // close after this long with no stream
  std::chrono::milliseconds keepalive_interval{15'000};  // ping when nothing was received
  std::chrono::milliseconds keepalive_timeout{45'000};   // close when nothing was received
  // Upper bound for a handler's deadline (and the deadline of calls that give none).
  std::chrono::milliseconds max_call_timeout{3'600'000};
};

struct OutgoingMessage {
  EncodedMessage encoded;
  size_t sealed = 0;  // bytes already encrypted into the write buffer
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  struct Stats {
    uint64_t bytes_sent = 0;
    uint64_t bytes_received = 0;
  };

  // Takes a socket that finished the handshake and starts the reader, writer and ticker.
  static std::shared_ptr<Connection> Start(asio::ip::tcp::socket socket, Strand strand, Role role,
                                           HandshakeResult handshake, Multiaddr remote,
                                           const ConnectionOptions& options, HandlerLookup handlers,
                                           std::function<void(Connection*)> on_closed);
  ~Connection();

  // Opens a stream calling `method` on the peer. Runs on the strand.
  asio::awaitable<Result<std::shared_ptr<Stream>>> OpenStream(std::string method,
                                                              std::chrono::milliseconds timeout);
  // Round-trip time of a PING frame, bounded by `timeout`.
  asio::awaitable<Result<std::chrono::nanoseconds>> Ping(std::chrono::milliseconds timeout);
  // Tells the peer we are closing (GOAWAY), then closes. In-flight streams fail with Closed.
  // Thread-safe; idempotent.
  void Shutdown(std::string reason);
  // Closes immediately with `status` (thread-safe).
  void CloseAsync(Status status);
  // Shows the peer our renewed access token (a TOKEN frame). Thread-safe.
  void SendAccessToken(Bytes token);
  // Shuts down (as Shutdown(reason)) once no stream has been open for `grace`, instead of the
  // idle timeout: for a connection that a better one replaced (a relayed one after a hole
  // punch). Streams still open finish first. Thread-safe.
  void Retire(std::string reason, std::chrono::milliseconds grace);

  const PeerId& peer() const { return peer_; }
  const Multiaddr& remote_address() const { return remote_; }
  Role role() const { return role_; }
  // What the peer told us our address looks like from its side.
  const std::string& observed_by_peer() const { return observed_by_peer_; }
  const std::vector<std::string>& peer_listen_addrs() const { return peer_listen_addrs_; }
  const HelloInfo& peer_hello() const { return peer_hello_; }
  // Why the peer was admitted (private swarms only). Read on the strand.
  const std::optional<AccessGrant>& peer_access() const { return peer_access_; }
  bool closed() const { return closed_flag_.load(); }
  // True once the connection is closed or shutting down (no new streams).
  bool closing() const { return closing_flag_.load(); }
  Stats stats() const { return {bytes_sent_.load(), bytes_received_.load()}; }
  const Strand& strand() const { return strand_; }

 private:
  friend class Stream;
  struct OutFrame {
    FrameType type;
    uint8_t flags = 0;
    uint32_t stream_id = 0;
    Bytes payload;                          // control payloads; the BEGIN prefix of DATA
    std::shared_ptr<OutgoingMessage> data;  // DATA body source
    std::shared_ptr<Stream> stream;         // DATA: notified when sealed
    size_t offset = 0, length = 0;          // DATA body range within data->encoded
  };
  struct PendingPing {
    SteadyTime sent;
    std::optional<std::chrono::nanoseconds> rtt;
    std::shared_ptr<Notifier> done;
  };

  Connection(asio::ip::tcp::socket socket, Strand strand, Role role, HandshakeResult handshake,
             Multiaddr remote, const ConnectionOptions& options, HandlerLookup handlers,
             std::function<void(Connection*)> on_closed);

  asio::awaitable<void> ReaderLoop();
  asio::awaitable<void> WriterLoop();
  asio::awaitable<void> TickerLoop();
  Status HandleRecord(ByteSpan plaintext);
  Status HandleToken(ByteSpan payload);
  Status HandleOpen(uint32_t id, ByteSpan payload);
  // `placed`: the payload (h.payload_length bytes) was already decrypted into the stream's
  // message buffer by the reader, so `payload` is empty.
  Status HandleData(const FrameHeader& h, ByteSpan payload, bool placed = false);
  // Decrypts and handles one record. Large records holding one continuation DATA frame are
  // decrypted straight into the message being assembled (no intermediate copy).
  Status OpenAndHandleRecord(ByteSpan length_prefix, MutableByteSpan sealed);
  void HandleCloseWrite(uint32_t id);
  void HandleStatus(uint32_t id, ByteSpan payload);
  void HandleReset(uint32_t id, ByteSpan payload);
  Status HandleWindow(uint32_t id, ByteSpan payload);
  void HandlePing(uint8_t flags, ByteSpan payload);

  void Enqueue(OutFrame frame);
  void EnqueueControl(FrameType type, uint32_t stream_id, Bytes payload, uint8_t flags = 0);
  void SendReset(uint32_t id, const Status& status);
  // Returns `n` received bytes of stream `s` (may be null: stream gone) to the sender's windows.
  void Credit(Stream* s, uint64_t n);
  // Removes a finished stream from the table and releases what it held.
  void Unregister(Stream& s);
  // Takes a message of `n` bytes being assembled from this connection's budget and the host's
  // budget of received messages; the refusal names the limit. ReleaseAssembling gives back
  // both (a message dropped unfinished). A finished message leaves the connection's budget but
  // stays in the host's until it is read: ReleaseReceived gives back its charge.
  Status TakeAssembling(uint64_t n);
  void ReleaseAssembling(uint64_t n);
  void ReleaseReceived(uint64_t charge);
  // The same for a handler's reply being sent (ConnectionOptions::max_reply_bytes).
  Status TakeReply(uint64_t n);
  void ReleaseReply(uint64_t n);
  void Close(const Status& status);
  void StartHandler(std::shared_ptr<Stream> stream, StreamHandler handler);
  std::string Describe() const;

  asio::ip::tcp::socket socket_;
  Strand strand_;
  const Role role_;
  const PeerId peer_;
  const Multiaddr remote_;
  const std::string observed_by_peer_;
  const std::vector<std::string> peer_listen_addrs_;
  const HelloInfo peer_hello_;
  std::optional<AccessGrant> peer_access_;
  const PeerLimits peer_limits_;
  const ConnectionOptions options_;
  HandlerLookup handlers_;
  std::function<void(Connection*)> on_closed_;
  std::unique_ptr<RecordSealer> sealer_;
  std::unique_ptr<RecordOpener> opener_;

  std::unordered_map<uint32_t, std::shared_ptr<Stream>> streams_;
  uint32_t next_stream_id_;
  uint32_t last_peer_stream_id_ = 0;
  uint32_t peer_open_streams_ = 0;
  uint32_t my_open_streams_ = 0;  // streams we opened; kept within the peer's announced limit
  Notifier stream_slot_freed_;

  std::deque<OutFrame> outq_;
  size_t control_backlog_ = 0;
  Notifier writer_wake_;
  Notifier backlog_drained_;
  Notifier writer_idle_;
  bool writing_ = false;

  int64_t conn_send_credit_;
  std::vector<std::weak_ptr<Stream>> credit_waiters_;
  uint64_t conn_recv_unacked_ = 0;
  uint64_t conn_pending_credit_ = 0;
  uint64_t assembling_bytes_ = 0;
  uint64_t reply_bytes_ = 0;  // handlers' replies between Write() and sealed

  std::unordered_map<uint64_t, PendingPing> pings_;
  uint64_t next_ping_ = 1;
  SteadyTime last_received_;
  size_t kernel_queued_seen_ = 0;  // unread bytes in the socket at the ticker's last look
  SteadyTime idle_since_;
  asio::steady_timer ticker_;
  std::optional<std::chrono::milliseconds> retire_grace_;  // set by Retire()
  std::string retire_reason_;

  bool closed_ = false;
  bool goaway_sent_ = false;
  Status close_status_;
  std::atomic<bool> closed_flag_{false};
  std::atomic<bool> closing_flag_{false};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
};

}  // namespace colony::net
