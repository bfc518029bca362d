// Fuzz target for a connection's handling of what an authenticated peer sends: sequences of
// frames (OPEN, DATA, WINDOW, RESET, STATUS, CLOSE_WRITE, PING, GOAWAY, TOKEN, and raw bytes) in
// any order and any packing into records, sealed with the session's key and written into a real
// Connection over a loopback TCP socket. Large DATA records take the reader's direct-decryption
// path (a continuation's payload decrypted straight into the message being assembled); tampered
// records take the authentication-failure path. The victim serves "echo" (which writes every
// message back, under flow control) and "sink" (which reads and drops them).
//
// The input is a program of ops (Program below), so that mutations keep reaching deep states.
// Checks, besides the sanitizers: once the peer's side ends, the connection closes, on_closed
// runs once, the Connection object is freed (no reference cycle keeps it), and every byte it
// charged to its host's and its address's budgets (messages received, replies being sent) is
// given back. A hang (the connection does not close within 20 s) traps.

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/bytes.h"
#include "core/identity.h"
#include "core/log.h"
#include "core/multiaddr.h"
#include "net/connection.h"
#include "net/crypto.h"
#include "net/protobuf_logs.h"
#include "net/wire.h"

using namespace colony;
using namespace colony::net;

namespace {

constexpr size_t kMaxRecords = 256;
constexpr size_t kMaxBytes = 8u << 20;  // sealed bytes per input

// The input, read as a program.
class Program {
 public:
  Program(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return at_ >= size_; }
  uint8_t Next() { return at_ < size_ ? data_[at_++] : 0; }
  ByteSpan Take(size_t n) {
    n = std::min(n, size_ - std::min(at_, size_));
    ByteSpan s(data_ + at_, n);
    at_ += n;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_, at_ = 0;
};

// Builds the records a hostile peer sends: frames appended to the current record, records sealed
// in order with the peer's key.
class Records {
 public:
  explicit Records(const Key32& key) : sealer_(key) {}

  void Frame(FrameType type, uint8_t flags, uint32_t id, ByteSpan payload) {
    Bytes f;
    EncodeFrameHeader(
        {.type = type, .flags = flags, .stream_id = id, .payload_length = payload.size()}, f);
    f.insert(f.end(), payload.begin(), payload.end());
    Raw(f);
  }
  void Raw(ByteSpan bytes) {
    if (plain_.size() + bytes.size() > kMaxRecordPlaintext) Flush();
    plain_.insert(plain_.end(), bytes.begin(), bytes.end());
  }
  // Ends the current record; `tamper` flips a bit of its ciphertext or tag.
  void Flush(uint8_t tamper = 0) {
    if (plain_.empty() && tamper == 0) return;
    if (sealed_.size() >= kMaxRecords || bytes_ > kMaxBytes) {
      plain_.clear();
      return;
    }
    RawBuffer out;
    sealer_.Begin(plain_.size(), out);
    sealer_.Update(plain_, out);
    sealer_.Finish(out);
    if (tamper != 0) out[4 + tamper % (out.size() - 4)] ^= static_cast<uint8_t>(1u << (tamper % 8));
    bytes_ += out.size();
    sealed_.push_back(std::move(out));
    plain_.clear();
  }
  std::vector<RawBuffer>& sealed() { return sealed_; }

 private:
  RecordSealer sealer_;
  Bytes plain_;
  std::vector<RawBuffer> sealed_;
  size_t bytes_ = 0;
};

// A CallHeader's protobuf encoding, written by hand so that any bytes (invalid UTF-8 too) can be
// the method.
Bytes CallHeaderBytes(const std::string& method, uint64_t timeout_ms) {
  Bytes b;
  ByteWriter w(b);
  w.U8(0x0a);  // field 1, length-delimited
  w.Varint(method.size());
  w.Raw(method);
  if (timeout_ms != 0) {
    w.U8(0x10);  // field 2, varint
    w.Varint(timeout_ms);
  }
  return b;
}

std::string Text(ByteSpan b) { return std::string(AsStringView(b)); }

// Turns the program into records.
void Build(Program& p, Records& r) {
  while (!p.done()) {
    const uint8_t op = p.Next();
    const uint32_t id = p.Next();
    switch (op % 13) {
      case 0:
        r.Flush();
        break;
      case 1: {  // OPEN a call
        const uint8_t m = p.Next();
        const std::string method = m % 4 == 0   ? "echo"
                                   : m % 4 == 1 ? "sink"
                                   : m % 4 == 2 ? "no.such.method"
                                                : Text(p.Take(m / 4));
        r.Frame(FrameType::kOpen, 0, id, CallHeaderBytes(method, p.Next() * 10ull));
        break;
      }
      case 2: {  // a whole, well-formed message as DATA frames of the stream
        Message msg(Text(p.Take(p.Next())));
        std::vector<float> values(p.Next() % 33, 1.5f);
        if (!values.empty()) {
          TensorFrame t;
          t.shape = {static_cast<int64_t>(values.size())};
          t.data = ByteSpan(reinterpret_cast<const uint8_t*>(values.data()),
                            values.size() * sizeof(float));
          msg.tensors.push_back(std::move(t));
        }
        auto enc = EncodeMessage(msg);
        if (!enc.ok()) break;
        Bytes body;
        for (ByteSpan piece : enc->pieces) body.insert(body.end(), piece.begin(), piece.end());
        const size_t chunk = 1 + p.Next() * 4u;
        for (size_t at = 0; at < body.size() || at == 0; at += chunk) {
          Bytes payload;
          if (at == 0) ByteWriter(payload).Varint(body.size());
          const size_t n = std::min(chunk, body.size() - at);
          payload.insert(payload.end(), body.begin() + static_cast<ptrdiff_t>(at),
                         body.begin() + static_cast<ptrdiff_t>(at + n));
          r.Frame(FrameType::kData, at == 0 ? kFlagBegin : 0, id, payload);
          if (body.empty()) break;
        }
        break;
      }
      case 3: {  // a DATA frame with any payload
        const uint8_t flags = p.Next();
        r.Frame(FrameType::kData, flags, id, p.Take(p.Next()));
        break;
      }
      case 4: {  // large DATA frames, each alone in its record (the direct-decryption path)
        const uint8_t mode = p.Next();
        const size_t high = p.Next();
        const size_t n = std::min<size_t>((high << 8 | p.Next()) * 4u, kMaxDataChunk);
        if ((mode & 2) != 0) {
          // A whole, valid message with an n-byte meta, in frames of up to kMaxDataChunk bytes.
          Bytes body;
          ByteWriter(body).Varint(n);
          body.resize(body.size() + n, 'm');
          ByteWriter(body).Varint(0);  // no tensors
          for (size_t at = 0; at < body.size(); at += kMaxDataChunk) {
            Bytes payload;
            if (at == 0) ByteWriter(payload).Varint(body.size());
            const size_t len = std::min(kMaxDataChunk, body.size() - at);
            payload.insert(payload.end(), body.begin() + static_cast<ptrdiff_t>(at),
                           body.begin() + static_cast<ptrdiff_t>(at + len));
            r.Flush();
            r.Frame(FrameType::kData, at == 0 ? kFlagBegin : 0, id, payload);
            r.Flush();
          }
          break;
        }
        // A chunk of filler (no valid message): a BEGIN announcing more, or a continuation.
        const uint8_t flags = mode & kFlagBegin;
        Bytes payload;
        if (flags != 0) ByteWriter(payload).Varint(n + p.Next() * 4096u);  // the message's length
        payload.resize(payload.size() + n, 0x5a);
        r.Flush();
        r.Frame(FrameType::kData, flags, id, payload);
        r.Flush();
        break;
      }
      case 5: {  // WINDOW: credit for a stream or (id 0) the connection
        Bytes payload;
        const uint8_t kind = p.Next();
        const uint64_t high = p.Next(), mid = p.Next();
        const uint64_t credit = kind == 255   ? ~0ull
                                : kind == 254 ? (1ull << 30)
                                              : (high << 16 | mid << 8 | kind);
        ByteWriter(payload).Varint(credit);
        r.Frame(FrameType::kWindow, 0, id, payload);
        break;
      }
      case 6:
      case 7: {  // RESET or STATUS with a status
        const auto code = static_cast<StatusCode>(p.Next() % 19);
        Bytes payload = EncodeStatus(Status(code, Text(p.Take(p.Next() % 64))));
        r.Frame(op % 13 == 6 ? FrameType::kReset : FrameType::kStatus, 0, id, payload);
        break;
      }
      case 8:
        r.Frame(FrameType::kCloseWrite, 0, id, {});
        break;
      case 9: {  // PING, or its answer
        const uint8_t flags = p.Next() & kFlagAck;
        r.Frame(FrameType::kPing, flags, 0, p.Take(p.Next() % 12));
        break;
      }
      case 10: {  // any frame: type, flags, stream and payload as given
        const auto type = static_cast<FrameType>(p.Next() % 10);
        const uint8_t flags = p.Next();
        r.Frame(type, flags, id, p.Take(p.Next()));
        break;
      }
      case 11:  // raw bytes in the record (malformed frame headers)
        r.Raw(p.Take(id));
        break;
      case 12:  // ends the record with a flipped bit: authentication fails
        r.Flush(static_cast<uint8_t>(id | 1));
        break;
    }
  }
  r.Flush();
}

asio::awaitable<Status> Echo(CallContext& ctx) {
  for (;;) {
    auto m = co_await ctx.stream().Read();
    if (!m.ok()) co_return m.status();
    if (!*m) co_return Status::Ok();
    Status st = co_await ctx.stream().Write(**m);
    if (!st.ok()) co_return st;
  }
}

asio::awaitable<Status> Sink(CallContext& ctx) {
  for (;;) {
    auto m = co_await ctx.stream().Read();
    if (!m.ok()) co_return m.status();
    if (!*m) co_return Status::Ok();
  }
}

// (Named functions: g++ 12 gives coroutine lambdas of one extern "C" function the same symbol.)
asio::awaitable<void> WriteAll(asio::ip::tcp::socket& peer, const std::vector<RawBuffer>& records,
                               bool& written) {
  for (const RawBuffer& rec : records) {
    auto [ec, n] = co_await asio::async_write(peer, asio::buffer(rec.data(), rec.size()),
                                              asio::experimental::as_tuple(asio::use_awaitable));
    if (ec) break;
  }
  written = true;
}

// Reads what the victim sends until it closes. With COLONY_FUZZ_LOG set, also opens its records
// and prints the frames they hold (to see what a seed reaches).
asio::awaitable<void> DrainThen(asio::ip::tcp::socket& peer, asio::steady_timer& watchdog,
                                const Key32& key) {
  const bool show = std::getenv("COLONY_FUZZ_LOG") != nullptr;
  RecordOpener opener(key);
  std::vector<uint8_t> buf(64 << 10), pending;
  for (;;) {
    auto [ec, n] = co_await peer.async_read_some(asio::buffer(buf),
                                                 asio::experimental::as_tuple(asio::use_awaitable));
    if (ec) break;
    if (!show) continue;
    pending.insert(pending.end(), buf.begin(), buf.begin() + static_cast<ptrdiff_t>(n));
    while (pending.size() >= 4) {
      const uint32_t len =
          pending[0] | pending[1] << 8 | pending[2] << 16 | static_cast<uint32_t>(pending[3]) << 24;
      if (pending.size() < 4 + size_t{len}) break;
      MutableByteSpan sealed(pending.data() + 4, len);
      if (opener.Open(ByteSpan(pending.data(), 4), sealed).ok()) {
        auto frames = SplitFrames(ByteSpan(sealed.data(), len - kTagSize));
        for (const FrameView& f : frames.ok() ? *frames : std::vector<FrameView>{}) {
          const bool has_status = f.header.type == FrameType::kReset ||
                                  f.header.type == FrameType::kStatus ||
                                  f.header.type == FrameType::kGoAway;
          std::fprintf(stderr, "victim sent frame type %d stream %u, %zu bytes %s\n",
                       static_cast<int>(f.header.type), f.header.stream_id, f.payload.size(),
                       has_status ? DecodeStatus(f.payload).ToString().c_str() : "");
        }
      }
      pending.erase(pending.begin(), pending.begin() + 4 + len);
    }
  }
  watchdog.cancel();
}

const KeyPair& PeerIdentity() {
  static const KeyPair k = KeyPair::Generate();
  return k;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool init = [] {
    std::signal(SIGPIPE, SIG_IGN);
    RouteProtobufLogs();  // as a Host does
    // The victim logs every connection it closes; COLONY_FUZZ_LOG=1 shows why.
    if (std::getenv("COLONY_FUZZ_LOG") == nullptr) spdlog::set_level(spdlog::level::off);
    return true;
  }();
  (void)init;
  Key32 to_victim{}, from_victim{};
  to_victim.fill(0x11);
  from_victim.fill(0x22);

  Program program(data, size);
  // The victim's limits, small so that flow control and the budgets come into play.
  const uint8_t shape = program.Next();
  ConnectionOptions o;
  o.limits = {.stream_window = 1024u << (shape % 8),
              .connection_window = 4096ull << (shape % 8),
              .max_concurrent_streams = 1u + shape % 16,
              .max_message_bytes = 256ull << (shape % 12)};
  o.max_assembling_bytes = 64ull << 10;
  o.max_reply_bytes = 32ull << 10;
  o.send_stall_timeout = std::chrono::milliseconds(200);
  o.max_outgoing_backlog = 64u << 10;
  o.max_call_timeout = std::chrono::milliseconds(2000);
  o.host_reply_budget = std::make_shared<ByteBudget>(1u << 20);
  o.host_received_budget = std::make_shared<ByteBudget>(1u << 20);
  o.address_reply_budget = std::make_shared<ByteBudget>(1u << 19);
  o.address_received_budget = std::make_shared<ByteBudget>(1u << 19);
  o.budget_key = "the fuzzer";

  Records records(to_victim);
  Build(program, records);

  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::address_v4::loopback(), 0});
  asio::ip::tcp::socket peer(io);
  peer.connect(acceptor.local_endpoint());
  asio::ip::tcp::socket victim_socket = acceptor.accept();

  HandshakeResult hs;
  hs.peer.peer = PeerIdentity().peer_id();
  // What the fuzzing peer announced: windows as small as the victim's, so its replies wait for
  // credit that only the program's WINDOW frames give.
  hs.peer.limits = {.stream_window = 512u << (shape % 4),
                    .connection_window = 2048ull << (shape % 4),
                    .max_concurrent_streams = 4,
                    .max_message_bytes = 1u << 20};
  hs.sealer = std::make_unique<RecordSealer>(from_victim);
  hs.opener = std::make_unique<RecordOpener>(to_victim);
  int closed = 0;
  std::weak_ptr<Connection> weak;
  {
    auto conn = Connection::Start(
        std::move(victim_socket), asio::make_strand(io), Role::kResponder, std::move(hs),
        *Multiaddr::Parse("/ip4/127.0.0.1/tcp/9"), o,
        [](const std::string& method) -> StreamHandler {
          if (method == "echo") return Echo;
          if (method == "sink") return Sink;
          return {};
        },
        [&closed](Connection*) { ++closed; });
    weak = conn;
  }

  asio::steady_timer watchdog(io, std::chrono::seconds(20));
  bool hung = false;
  watchdog.async_wait([&](std::error_code ec) {
    if (ec) return;
    hung = true;
    if (auto c = weak.lock()) c->CloseAsync(Internal("the fuzzer's watchdog"));
    std::error_code ignored;
    peer.close(ignored);
  });
  // The peer writes its records while it reads (and drops) whatever the victim sends, so that
  // the victim never stops on a full socket. Once the victim has nothing left to do that does not
  // wait for a timer (handlers replied, or wait for credit), the peer ends its side.
  bool written = false;
  asio::co_spawn(io, WriteAll(peer, records.sealed(), written), asio::detached);
  asio::co_spawn(io, DrainThen(peer, watchdog, from_victim), asio::detached);
  for (int quiet = 0; quiet < 3 && !io.stopped();) {
    if (io.poll() > 0 || !written) {
      quiet = 0;
      if (!written) io.run_one_for(std::chrono::milliseconds(1));
    } else {
      ++quiet;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  std::error_code ignored;
  peer.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
  io.run();

  if (hung) __builtin_trap();             // the connection did not close once the peer's side ended
  if (closed != 1) __builtin_trap();      // on_closed must run exactly once
  if (!weak.expired()) __builtin_trap();  // something still holds the connection
  if (o.host_reply_budget->used() != 0 || o.host_received_budget->used() != 0 ||
      o.address_reply_budget->used() != 0 || o.address_received_budget->used() != 0) {
    __builtin_trap();  // bytes charged to the budgets and never given back
  }
  return 0;
}
