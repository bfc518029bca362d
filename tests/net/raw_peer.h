// Hand-driven peers for hostile-input tests: a raw client that speaks exactly the bytes a test
// chooses (before or after a real handshake), and a TCP relay that records what a real client
// sends. Every wait is bounded by an explicit limit; nothing here can hang a test.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/bytes.h"
#include "core/identity.h"
#include "core/multiaddr.h"
#include "core/status.h"
#include "net/crypto.h"
#include "net/handshake.h"
#include "net/protocol.pb.h"
#include "net/wire.h"
#include "test_support.h"

namespace colony::net::testing {

using RawClock = std::chrono::steady_clock;

using colony::test::VmRssKb;
using colony::test::WaitUntil;

// ---- building frames by hand ----------------------------------------------------------------

inline void AppendFrame(Bytes& out, FrameType type, uint8_t flags, uint32_t stream_id,
                        ByteSpan payload) {
  EncodeFrameHeader({type, flags, stream_id, payload.size()}, out);
  out.insert(out.end(), payload.begin(), payload.end());
}

inline Bytes OpenPayload(const std::string& method, uint64_t timeout_ms = 0) {
  proto::CallHeader h;
  h.set_method(method);
  h.set_timeout_ms(timeout_ms);
  Bytes out(h.ByteSizeLong());
  h.SerializeToArray(out.data(), static_cast<int>(out.size()));
  return out;
}

// The wire bytes of a message (EncodeMessage's pieces, concatenated).
inline Bytes EncodeMessageBytes(const Message& m) {
  auto em = EncodeMessage(m);
  Bytes out;
  if (!em.ok()) return out;
  for (ByteSpan p : em->pieces) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// A complete message as one DATA frame (BEGIN flag, varint total, message bytes).
inline void AppendMessageFrame(Bytes& out, uint32_t stream_id, const Message& m) {
  Bytes body = EncodeMessageBytes(m);
  Bytes payload;
  ByteWriter(payload).Varint(body.size());
  payload.insert(payload.end(), body.begin(), body.end());
  AppendFrame(out, FrameType::kData, kFlagBegin, stream_id, payload);
}

// ---- RawPeer --------------------------------------------------------------------------------

// A TCP client under the test's full control. After Handshake() it can seal and open records
// with the session keys of a real handshake (as the initiator, with a fresh identity).
class RawPeer {
 public:
  // `from`: the local address to connect from (e.g. 127.0.0.2, to play another machine);
  // empty: the kernel's choice.
  explicit RawPeer(const Multiaddr& address, const std::string& from = {}) {
    std::error_code ec;
    asio::ip::tcp::endpoint ep(asio::ip::make_address(address.host(), ec), address.port());
    if (!ec && !from.empty()) {
      socket_.open(ep.protocol(), ec);
      if (!ec) socket_.bind(asio::ip::tcp::endpoint(asio::ip::make_address(from, ec), 0), ec);
    }
    if (!ec) socket_.connect(ep, ec);
    if (!ec) socket_.non_blocking(true, ec);
    connected_ = !ec;
  }
  ~RawPeer() { Close(); }
  RawPeer(const RawPeer&) = delete;
  RawPeer& operator=(const RawPeer&) = delete;

  bool connected() const { return connected_; }
  // What the handshake tells the server its address looks like from here.
  void set_observed_addr(std::string a) { observed_addr_ = std::move(a); }
  const PeerId& peer_id() const { return identity_.peer_id(); }
  const HandshakeResult& handshake() const { return *handshake_; }

  // Runs the real handshake (as the dialer) on the socket.
  Status Handshake(PeerLimits limits = {}, std::optional<PeerId> expected = std::nullopt,
                   std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    if (!connected_) return Unavailable("not connected");
    HandshakeOptions opts;
    opts.role = Role::kInitiator;
    opts.identity = &identity_;
    opts.expected_peer = std::move(expected);
    opts.observed_addr = observed_addr_;
    opts.limits = limits;
    opts.agent = "raw-peer";
    std::error_code ec;
    auto fut = asio::co_spawn(io_, RunHandshake(socket_, opts, "server"), asio::use_future);
    io_.restart();
    io_.run_for(limit);  // returns as soon as the handshake is done
    if (fut.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      socket_.close(ec);  // aborts the handshake; let it unwind before `opts` goes away
      io_.restart();
      io_.run_for(std::chrono::seconds(5));
    }
    if (fut.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      std::abort();  // cannot happen: the socket is closed
    }
    auto hs = fut.get();
    if (!hs.ok()) return hs.status();
    handshake_ = std::move(*hs);
    return Status::Ok();
  }

  // The next record: 4-byte length, ciphertext, tag.
  Bytes Seal(ByteSpan plaintext) {
    RawBuffer out;
    handshake_->sealer->Begin(plaintext.size(), out);
    handshake_->sealer->Update(plaintext, out);
    handshake_->sealer->Finish(out);
    return Bytes(out.begin(), out.end());
  }

  // Sends bytes as they are; false when the peer closed or `limit` passed. Whatever arrives
  // meanwhile is kept for the readers below (so a peer that answers cannot deadlock us).
  bool SendRaw(ByteSpan bytes, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    const auto deadline = RawClock::now() + limit;
    size_t off = 0;
    while (off < bytes.size()) {
      pollfd p{fd(), static_cast<short>(POLLOUT | (eof_ ? 0 : POLLIN)), 0};
      int r = ::poll(&p, 1, RemainingMs(deadline));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      if (p.revents & POLLIN) Drain();
      if (p.revents & (POLLOUT | POLLERR | POLLHUP)) {
        ssize_t n = ::send(fd(), bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
        if (n < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
          return false;
        }
        off += static_cast<size_t>(n);
      }
    }
    return true;
  }
  bool SendRecord(ByteSpan plaintext, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    return SendRaw(Seal(plaintext), limit);
  }

  // Reads and opens the next record. Closed at end of stream, DeadlineExceeded after `limit`.
  Result<Bytes> ReadRecord(std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    const auto deadline = RawClock::now() + limit;
    COLONY_RETURN_IF_ERROR(Fill(4, deadline));
    ByteReader lr(ByteSpan(in_.data(), 4));
    uint32_t len = lr.U32();
    if (len < kTagSize || len > kMaxRecordPlaintext + kTagSize) {
      return ProtocolError("record length " + std::to_string(len));
    }
    COLONY_RETURN_IF_ERROR(Fill(4 + len, deadline));
    Bytes sealed(in_.begin() + 4, in_.begin() + 4 + len);
    Status st = handshake_->opener->Open(ByteSpan(in_.data(), 4), sealed);
    in_.erase(in_.begin(), in_.begin() + 4 + len);
    if (!st.ok()) return st;
    sealed.resize(len - kTagSize);
    return sealed;
  }

  // Reads records until `fn` (called for every frame) returns true. False on end of stream,
  // a malformed record or after `limit`.
  bool ReadFramesUntil(const std::function<bool(const FrameView&)>& fn,
                       std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    const auto deadline = RawClock::now() + limit;
    for (;;) {
      auto rec = ReadRecord(std::chrono::duration_cast<std::chrono::milliseconds>(
          std::max(deadline - RawClock::now(), RawClock::duration::zero())));
      if (!rec.ok()) return false;
      auto frames = SplitFrames(*rec);
      if (!frames.ok()) return false;
      for (const FrameView& f : *frames) {
        if (fn(f)) return true;
      }
    }
  }

  // A PING round trip over the secure channel: proves the connection is alive and that our
  // records are accepted.
  bool PingPong(std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    Bytes nonce;
    ByteWriter(nonce).U64(0x5eed0000u + ++pings_);
    Bytes rec;
    AppendFrame(rec, FrameType::kPing, 0, 0, nonce);
    if (!SendRecord(rec, limit)) return false;
    return ReadFramesUntil(
        [&](const FrameView& f) {
          return f.header.type == FrameType::kPing && (f.header.flags & kFlagAck) &&
                 Bytes(f.payload.begin(), f.payload.end()) == nonce;
        },
        limit);
  }

  // True when the peer closes the connection (end of stream or reset) within `limit`; data that
  // arrives meanwhile is discarded.
  bool WaitClosed(std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    const auto deadline = RawClock::now() + limit;
    for (;;) {
      in_.clear();
      Status st = Fill(1, deadline);
      if (st.code() == StatusCode::kClosed) return true;
      if (st.code() == StatusCode::kDeadlineExceeded) return false;
    }
  }

  void Close() {
    std::error_code ec;
    socket_.close(ec);
  }

 private:
  int fd() { return socket_.native_handle(); }

  static int RemainingMs(RawClock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - RawClock::now());
    return static_cast<int>(std::max<int64_t>(0, left.count()));
  }

  // Reads what is available without blocking.
  void Drain() {
    uint8_t buf[65536];
    for (;;) {
      ssize_t n = ::recv(fd(), buf, sizeof(buf), 0);
      if (n > 0) {
        in_.insert(in_.end(), buf, buf + n);
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) eof_ = true;
      return;
    }
  }

  // Buffers at least `n` bytes. Closed when the stream ends first; DeadlineExceeded on time.
  Status Fill(size_t n, RawClock::time_point deadline) {
    while (in_.size() < n) {
      if (eof_) return Closed("peer closed the connection");
      pollfd p{fd(), POLLIN, 0};
      int r = ::poll(&p, 1, RemainingMs(deadline));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return Internal("poll failed");
      if (r == 0) return DeadlineExceeded("nothing received in time");
      Drain();
    }
    return Status::Ok();
  }

  asio::io_context io_;
  asio::ip::tcp::socket socket_{io_};
  bool connected_ = false;
  std::string observed_addr_ = "/ip4/127.0.0.1/tcp/1";
  bool eof_ = false;
  Bytes in_;
  KeyPair identity_ = KeyPair::Generate();
  std::optional<HandshakeResult> handshake_;
  uint64_t pings_ = 0;
};

// ---- RecordingRelay -------------------------------------------------------------------------

// Listens on loopback, forwards its first connection to `target` and records every byte the
// client sent through it.
class RecordingRelay {
 public:
  explicit RecordingRelay(const Multiaddr& target) : target_(target) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof(a);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::listen(listen_fd_, 4) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ::close(listen_fd_);
      listen_fd_ = -1;
      return;
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~RecordingRelay() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (listen_fd_ >= 0) ::close(listen_fd_);
  }
  RecordingRelay(const RecordingRelay&) = delete;
  RecordingRelay& operator=(const RecordingRelay&) = delete;

  bool ok() const { return listen_fd_ >= 0; }
  // The relay's address, carrying the target's /p2p/ id (the relay is transparent).
  Multiaddr address() const {
    Multiaddr m(Multiaddr::HostKind::kIp4, "127.0.0.1", port_);
    return target_.peer_id() ? m.WithPeerId(*target_.peer_id()) : m;
  }
  Bytes client_bytes() const {
    std::lock_guard lock(mu_);
    return client_bytes_;
  }
  // True once the relayed session ended (either side closed).
  bool finished() const { return finished_; }

 private:
  void Run() {
    int client = -1;
    while (!stop_ && client < 0) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) client = ::accept(listen_fd_, nullptr, nullptr);
    }
    if (client < 0) return;
    int server = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(target_.port());
    ::inet_pton(AF_INET, target_.host().c_str(), &a.sin_addr);
    if (::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      timeval tv{2, 0};  // a stuck receiver cannot block the relay forever
      ::setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      ::setsockopt(server, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      uint8_t buf[65536];
      while (!stop_) {
        pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
        int r = ::poll(p, 2, 20);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break;
        bool done = false;
        for (int i = 0; i < 2 && !done; ++i) {
          if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
          ssize_t n = ::recv(p[i].fd, buf, sizeof(buf), 0);
          if (n <= 0) {
            done = true;
            break;
          }
          if (i == 0) {
            std::lock_guard lock(mu_);
            client_bytes_.insert(client_bytes_.end(), buf, buf + n);
          }
          if (!SendAll(p[1 - i].fd, buf, static_cast<size_t>(n))) done = true;
        }
        if (done) break;
      }
    }
    ::close(server);
    ::close(client);
    finished_ = true;
  }

  static bool SendAll(int fd, const uint8_t* data, size_t n) {
    while (n > 0) {
      ssize_t k = ::send(fd, data, n, MSG_NOSIGNAL);
      if (k <= 0) return false;
      data += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }

  Multiaddr target_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  mutable std::mutex mu_;
  Bytes client_bytes_;
};

}  // namespace colony::net::testing
