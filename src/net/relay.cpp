#include "net/relay.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sodium.h>
#include <sys/socket.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>

#include "core/clock.h"
#include "core/log.h"
#include "core/token_buckets.h"
#include "net/relay_wire.h"
#include "net/run_on_strand.h"
#include "net/source_address.h"

namespace colony::net {
namespace {

using asio::ip::tcp;
constexpr auto kUse = asio::experimental::as_tuple(asio::use_awaitable);
constexpr size_t kSpliceBuffer = 64 * 1024;

// One line without its newline, read a byte at a time so that nothing after it is consumed (the
// secure handshake follows at once).
asio::awaitable<Result<std::string>> ReadLine(tcp::socket& socket) {
  std::string line;
  char c = 0;
  while (line.size() < kMaxRelayLine) {
    auto [ec, n] = co_await asio::async_read(socket, asio::buffer(&c, 1), kUse);
    if (ec)
      co_return Unavailable("the connection closed during the relay preamble (" + ec.message() +
                            ")");
    if (c == '\n') co_return line;
    line += c;
  }
  co_return ProtocolError("relay preamble line longer than " + std::to_string(kMaxRelayLine) +
                          " bytes");
}

// Callers pass a named string: g++ 12 destroys temporaries in co_await expressions twice.
asio::awaitable<Status> WriteText(tcp::socket& socket, const std::string& text) {
  auto [ec, n] = co_await asio::async_write(socket, asio::buffer(text), kUse);
  if (ec) co_return Unavailable("writing the relay preamble failed: " + ec.message());
  co_return Status();
}

std::string RandomToken() {
  uint8_t bytes[kRelayTokenHexLength / 2];
  randombytes_buf(bytes, sizeof(bytes));
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

uint64_t RandomId() {
  uint64_t v = 0;
  randombytes_buf(&v, sizeof(v));
  return v;
}

// Waits until `next` (a pacing schedule) when a rate applies; returns the new schedule.
SteadyTime Pace(SteadyTime next, size_t bytes, double rate) {
  if (rate <= 0) return next;
  const SteadyTime now = std::chrono::steady_clock::now();
  const SteadyTime start = std::max(now, next);
  return start + std::chrono::duration_cast<SteadyTime::duration>(
                     std::chrono::duration<double>(static_cast<double>(bytes) / rate));
}

// A circuit's sockets notice a vanished peer (no FIN, no RST) within about a minute.
void KeepAlive(tcp::socket& socket) {
  const int fd = socket.native_handle();
  const int on = 1, idle = 30, interval = 10, count = 3;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

// Connections to the circuit port that have not sent their request line yet.
constexpr size_t kMaxUnidentified = 256;
// Circuits a reservation holder accepts at once (each a socket to the relay's circuit port for up
// to 10 s): a hostile relay's flood of notices must not take every file descriptor.
constexpr size_t kMaxPendingAccepts = 64;

}  // namespace

asio::awaitable<Status> RequestCircuit(tcp::socket& socket, const PeerId& target,
                                       const std::string& relay_desc) {
  RelayRequest request;
  request.kind = RelayRequest::Kind::kConnect;
  request.target = target;
  const std::string line = FormatRelayRequest(request);
  Status st = co_await WriteText(socket, line);
  if (!st.ok()) co_return st.WithContext("relay " + relay_desc);
  auto reply = co_await ReadLine(socket);
  if (!reply.ok()) co_return reply.status().WithContext("relay " + relay_desc);
  st = ParseRelayReply(*reply);
  if (!st.ok()) {
    co_return Status(st.code(), "relay " + relay_desc + " could not connect us to " +
                                    target.ToString() + ": " + st.message());
  }
  co_return Status();
}

// ---------------------------------------------------------------------------------------------
// Relay

struct Relay::Impl : std::enable_shared_from_this<Relay::Impl> {
  struct Reservation {
    std::shared_ptr<Stream> stream;
    std::string address;  // the holder's IP address, as limited (empty: exempt)
    size_t circuits = 0;  // open or being set up for this peer (on strand)
  };
  // A circuit-port socket's place in its source address's count, given back when destroyed.
  struct AddressSlot {
    std::weak_ptr<Impl> relay;
    std::string address;
    AddressSlot(std::weak_ptr<Impl> r, std::string a)
        : relay(std::move(r)), address(std::move(a)) {}
    ~AddressSlot() {
      if (auto r = relay.lock()) r->ReleaseAddress(address);
    }
    AddressSlot(const AddressSlot&) = delete;
    AddressSlot& operator=(const AddressSlot&) = delete;
  };
  // A CONNECT waiting for the reserved peer's ACCEPT (on strand).
  struct Pending {
    PeerId target;
    std::string token;
    std::optional<tcp::socket> accepted;
    std::shared_ptr<AddressSlot> accepted_slot;
    std::shared_ptr<asio::steady_timer> timer;
  };
  struct Circuit {
    tcp::socket a, b;
    std::shared_ptr<Reservation> res;  // its circuit count drops when this closes
    std::shared_ptr<AddressSlot> slot_a, slot_b;
    int pumps_left = 2;
    SteadyTime last_activity = std::chrono::steady_clock::now();
    std::optional<SteadyTime> half_closed_at;
    std::shared_ptr<asio::steady_timer> watch;  // Watch()'s timer, cancelled by Close()
    Circuit(tcp::socket x, tcp::socket y, std::shared_ptr<Reservation> r)
        : a(std::move(x)), b(std::move(y)), res(std::move(r)) {}
    void Close() {
      std::error_code ignored;
      a.close(ignored);
      b.close(ignored);
      if (watch) watch->cancel();
    }
  };

  Impl(Host& h, RelayOptions o)
      : host(h), options(std::move(o)), strand(asio::make_strand(h.io_context())) {}

  Host& host;
  RelayOptions options;
  Strand strand;
  std::shared_ptr<tcp::acceptor> acceptor;
  Multiaddr address;

  mutable std::mutex mu;  // reservations (from the host's handlers) and stopped
  std::unordered_map<PeerId, std::shared_ptr<Reservation>> reservations;
  bool stopped = false;

  // On strand.
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> pending;
  std::set<std::shared_ptr<Circuit>> circuits;
  size_t setting_up = 0;    // CONNECTs accepted but not yet spliced or refused
  size_t unidentified = 0;  // sockets still sending their request line
  SteadyTime total_next{};

  std::atomic<uint64_t> circuits_total{0}, rejected{0}, rate_refused{0}, reclaimed{0},
      bytes_relayed{0};
  // CONNECTs per limited source address (circuits_per_second_per_address; on strand).
  std::optional<TokenBuckets> circuit_rate;

  // Circuit-port sockets per limited source address.
  std::mutex address_mu;
  std::unordered_map<std::string, size_t> sockets_per_address;

  // The address `host` is limited under (empty: exempt, a loopback address unless
  // limit_loopback_addresses).
  std::string Limited(const std::string& ip_text) const {
    return SourceKey(ip_text, options.limit_loopback_addresses);
  }
  // A slot for a socket from `address`, or null when the address holds its cap.
  std::shared_ptr<AddressSlot> TakeAddress(const std::string& source) {
    std::lock_guard lock(address_mu);
    size_t& n = sockets_per_address[source];
    if (!source.empty() && n >= options.max_circuit_sockets_per_address) return nullptr;
    ++n;
    return std::make_shared<AddressSlot>(weak_from_this(), source);
  }
  void ReleaseAddress(const std::string& source) {
    std::lock_guard lock(address_mu);
    auto it = sockets_per_address.find(source);
    if (it != sockets_per_address.end() && --it->second == 0) sockets_per_address.erase(it);
  }
  std::atomic<size_t> open_circuits{0};

  asio::awaitable<Status> Serve(CallContext& ctx);
  asio::awaitable<void> AcceptLoop();
  asio::awaitable<void> HandleCircuitSocket(tcp::socket socket);
  asio::awaitable<void> Connect(tcp::socket socket, std::shared_ptr<AddressSlot> slot,
                                PeerId target);
  asio::awaitable<void> Pump(std::shared_ptr<Circuit> c, bool a_to_b);
  // Closes the circuit when it stays silent or half-closed too long.
  asio::awaitable<void> Watch(std::shared_ptr<Circuit> c);
  void Stop();
};

asio::awaitable<Status> Relay::Impl::Serve(CallContext& ctx) {
  auto stream = ctx.stream().shared_from_this();
  const PeerId peer = ctx.peer();
  auto res = std::make_shared<Reservation>();
  res->stream = stream;
  res->address = Limited(ctx.remote_address().host());
  std::shared_ptr<Reservation> replaced;
  {
    std::lock_guard lock(mu);
    if (stopped) co_return Unavailable("the relay is shutting down");
    if (reservations.size() >= options.max_reservations && !reservations.contains(peer)) {
      ++rejected;
      co_return ResourceExhausted("the relay holds " + std::to_string(reservations.size()) +
                                  " reservations (its limit); try another relay");
    }
    if (!res->address.empty()) {
      size_t same = 0;
      for (const auto& [holder, r] : reservations) {
        same += holder != peer && r->address == res->address;
      }
      if (same >= options.max_reservations_per_address) {
        ++rejected;
        co_return ResourceExhausted(res->address + " holds " + std::to_string(same) +
                                    " reservations at this relay (its limit per address)");
      }
    }
    auto& slot = reservations[peer];
    replaced = slot;
    slot = res;
  }
  if (replaced) replaced->stream->Cancel(Cancelled("replaced by a newer reservation"));
  COLONY_LOG_INFO("relay: reservation for {}", peer.Short());
  // A reservation ends after its time to live; the holder renews it.
  auto ttl = std::make_shared<asio::steady_timer>(stream->strand(), options.reservation_ttl);
  ttl->async_wait([stream](std::error_code ec) {
    if (!ec) stream->Cancel(DeadlineExceeded("the relay reservation expired; renew it"));
  });
  const Message granted(address.Relaying(peer).ToString());
  Status st = co_await stream->Write(granted);
  if (st.ok()) {
    // The holder sends nothing; this returns when it closes, goes away, or the TTL passes.
    auto end = co_await stream->Read();
    (void)end;
  }
  ttl->cancel();
  {
    std::lock_guard lock(mu);
    auto it = reservations.find(peer);
    if (it != reservations.end() && it->second == res) reservations.erase(it);
  }
  COLONY_LOG_INFO("relay: reservation for {} ended", peer.Short());
  co_return Status();
}

asio::awaitable<void> Relay::Impl::AcceptLoop() {
  auto self = shared_from_this();
  for (;;) {
    auto [ec, socket] = co_await acceptor->async_accept(strand, kUse);
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor->is_open()) co_return;
      COLONY_LOG_WARN("relay: accept failed: {}", ec.message());
      asio::steady_timer t(strand, std::chrono::milliseconds(100));
      co_await t.async_wait(kUse);
      continue;
    }
    // Each write the relay passes on goes out at once: with Nagle's algorithm a write while an
    // earlier one is unacknowledged waits for the peer's delayed acknowledgement (40 ms on
    // Linux), which every relayed call met.
    std::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    auto handle = [self, s = std::move(socket)]() mutable -> asio::awaitable<void> {
      co_await self->HandleCircuitSocket(std::move(s));
    };
    asio::co_spawn(strand, std::move(handle), asio::detached);
  }
}

asio::awaitable<void> Relay::Impl::HandleCircuitSocket(tcp::socket socket) {
  if (unidentified >= kMaxUnidentified) {
    ++rejected;
    co_return;  // closes the socket
  }
  std::error_code ep_error;
  const auto remote = socket.remote_endpoint(ep_error);
  if (ep_error) co_return;
  std::shared_ptr<AddressSlot> slot = TakeAddress(Limited(remote.address().to_string()));
  if (!slot) {
    ++rejected;
    co_return;  // closes the socket
  }
  // The request line must come in time.
  ++unidentified;
  auto socket_ptr = &socket;
  auto done = std::make_shared<bool>(false);
  asio::steady_timer timer(strand, options.accept_timeout);
  timer.async_wait([socket_ptr, done](std::error_code ec) {
    if (!ec && !*done) {
      std::error_code ignored;
      socket_ptr->close(ignored);
    }
  });
  auto line = co_await ReadLine(socket);
  *done = true;
  timer.cancel();
  --unidentified;
  if (!line.ok()) {
    ++rejected;
    co_return;
  }
  auto request = ParseRelayRequest(*line);
  if (!request.ok()) {
    ++rejected;
    const std::string reply = FormatRelayReply(request.status());
    (void)co_await WriteText(socket, reply);
    co_return;
  }
  if (request->kind == RelayRequest::Kind::kConnect) {
    co_await Connect(std::move(socket), std::move(slot), request->target);
    co_return;
  }
  // ACCEPT: the reserved peer comes for its circuit.
  auto it = pending.find(request->circuit);
  if (it == pending.end() || it->second->accepted ||
      sodium_memcmp(it->second->token.data(), request->token.data(), kRelayTokenHexLength) != 0) {
    ++rejected;
    const std::string reply = FormatRelayReply(PermissionDenied("unknown circuit or wrong token"));
    (void)co_await WriteText(socket, reply);
    co_return;
  }
  it->second->accepted.emplace(std::move(socket));
  it->second->accepted_slot = std::move(slot);
  it->second->timer->cancel();
}

asio::awaitable<void> Relay::Impl::Connect(tcp::socket socket, std::shared_ptr<AddressSlot> slot,
                                           PeerId target) {
  std::shared_ptr<Reservation> res;
  {
    std::lock_guard lock(mu);
    auto it = reservations.find(target);
    if (it != reservations.end() && !stopped) res = it->second;
  }
  Status refuse;
  std::optional<double> wait;
  if (circuit_rate && !slot->address.empty()) {
    wait = circuit_rate->Take(slot->address, std::chrono::steady_clock::now());
  }
  if (wait) {
    refuse = ResourceExhausted(
        fmt::format("{} asks for circuits faster than {:g} per second "
                    "(circuits_per_second_per_address); its next is allowed in {:.2f} s",
                    slot->address, options.circuits_per_second_per_address, *wait));
    const uint64_t n = ++rate_refused;
    if (n <= 10 || n % 1000 == 0) COLONY_LOG_WARN("relay: refused #{}: {}", n, refuse.message());
  } else if (!res) {
    refuse = NotFound("no reservation for " + target.ToString() + " at this relay");
  } else if (circuits.size() + setting_up >= options.max_circuits) {
    refuse = ResourceExhausted("the relay carries " + std::to_string(options.max_circuits) +
                               " circuits (its limit)");
  } else if (res->circuits >= options.max_circuits_per_peer) {
    refuse =
        ResourceExhausted(target.Short() + " has " + std::to_string(options.max_circuits_per_peer) +
                          " circuits through this relay (its limit)");
  }
  if (!refuse.ok()) {
    ++rejected;
    const std::string reply = FormatRelayReply(refuse);
    (void)co_await WriteText(socket, reply);
    co_return;
  }
  ++setting_up;
  ++res->circuits;
  const uint64_t id = RandomId();
  auto p = std::make_shared<Pending>();
  p->target = target;
  p->token = RandomToken();
  p->timer = std::make_shared<asio::steady_timer>(strand, options.accept_timeout);
  pending[id] = p;
  // Tell the reserved peer; it dials back with the id and token. A holder that does not even read
  // the notice in time loses its reservation (it would hold circuit slots forever).
  auto notified = std::make_shared<bool>(false);
  p->timer->async_wait([stream = res->stream, notified](std::error_code ec) {
    if (!ec && !*notified) {
      stream->Cancel(DeadlineExceeded("the reservation holder does not read its circuit notices"));
    }
  });
  const Message call(std::to_string(id) + " " + p->token);
  Status st = co_await res->stream->Write(call);
  *notified = true;
  if (st.ok()) {
    auto [ec] = co_await p->timer->async_wait(kUse);
    (void)ec;  // cancelled when the ACCEPT arrives; expired otherwise
  }
  pending.erase(id);
  --setting_up;
  std::optional<tcp::socket> other = std::move(p->accepted);
  if (!other) {
    --res->circuits;
    ++rejected;
    const Status why = st.ok()
                           ? DeadlineExceeded(target.Short() + " did not take the circuit in time")
                           : Unavailable(target.Short() + "'s reservation is gone");
    const std::string reply = FormatRelayReply(why);
    (void)co_await WriteText(socket, reply);
    co_return;
  }
  const std::string ok = FormatRelayReply(Status());
  Status ok_b = co_await WriteText(*other, ok);
  Status ok_a = ok_b;
  if (ok_b.ok()) ok_a = co_await WriteText(socket, ok);
  if (!ok_a.ok() || !ok_b.ok()) {
    --res->circuits;
    co_return;
  }
  {
    std::lock_guard lock(mu);
    if (stopped) {
      --res->circuits;
      co_return;
    }
  }
  KeepAlive(socket);
  KeepAlive(*other);
  auto c = std::make_shared<Circuit>(std::move(socket), std::move(*other), res);
  c->slot_a = std::move(slot);
  c->slot_b = std::move(p->accepted_slot);
  circuits.insert(c);
  ++circuits_total;
  ++open_circuits;
  COLONY_LOG_DEBUG("relay: circuit to {} open ({} in all)", target.Short(), circuits.size());
  auto self = shared_from_this();
  auto forward = [self, c]() -> asio::awaitable<void> { co_await self->Pump(c, true); };
  auto backward = [self, c]() -> asio::awaitable<void> { co_await self->Pump(c, false); };
  auto watch = [self, c]() -> asio::awaitable<void> { co_await self->Watch(c); };
  asio::co_spawn(strand, std::move(forward), asio::detached);
  asio::co_spawn(strand, std::move(backward), asio::detached);
  asio::co_spawn(strand, std::move(watch), asio::detached);
}

asio::awaitable<void> Relay::Impl::Watch(std::shared_ptr<Circuit> c) {
  const auto tick = std::max<std::chrono::milliseconds>(
      std::chrono::milliseconds(10),
      std::min(options.circuit_idle_timeout, options.half_closed_timeout) / 4);
  c->watch = std::make_shared<asio::steady_timer>(strand);
  auto timer = c->watch;
  while (c->pumps_left > 0 && c->a.is_open()) {
    timer->expires_after(tick);
    co_await timer->async_wait(kUse);
    if (c->pumps_left == 0 || !c->a.is_open()) break;
    const auto now = std::chrono::steady_clock::now();
    const bool silent = now - c->last_activity > options.circuit_idle_timeout;
    const bool hanging =
        c->half_closed_at && now - *c->half_closed_at > options.half_closed_timeout;
    if (silent || hanging) {
      ++reclaimed;
      COLONY_LOG_DEBUG("relay: closing a {} circuit", silent ? "silent" : "half-closed");
      c->Close();
      break;
    }
  }
}

asio::awaitable<void> Relay::Impl::Pump(std::shared_ptr<Circuit> c, bool a_to_b) {
  tcp::socket& from = a_to_b ? c->a : c->b;
  tcp::socket& to = a_to_b ? c->b : c->a;
  std::vector<uint8_t> buffer(kSpliceBuffer);
  SteadyTime next{};
  for (;;) {
    auto [ec, n] = co_await from.async_read_some(asio::buffer(buffer), kUse);
    if (ec) {
      // End of one direction: pass the half-close on; an error closes the whole circuit.
      std::error_code ignored;
      if (ec == asio::error::eof) {
        if (!c->half_closed_at) c->half_closed_at = std::chrono::steady_clock::now();
        to.shutdown(tcp::socket::shutdown_send, ignored);
      } else {
        c->Close();
      }
      break;
    }
    c->last_activity = std::chrono::steady_clock::now();
    next = Pace(next, n, options.max_circuit_rate);
    total_next = Pace(total_next, n, options.max_total_rate);
    const SteadyTime until = std::max(next, total_next);
    if (until > std::chrono::steady_clock::now()) {
      asio::steady_timer t(strand, until);
      co_await t.async_wait(kUse);
    }
    auto [wec, written] = co_await asio::async_write(to, asio::buffer(buffer.data(), n), kUse);
    if (wec) {
      c->Close();
      break;
    }
    bytes_relayed += written;
  }
  if (--c->pumps_left == 0) {
    c->Close();
    --c->res->circuits;
    circuits.erase(c);
    --open_circuits;
  }
}

void Relay::Impl::Stop() {
  std::vector<std::shared_ptr<Reservation>> held;
  {
    std::lock_guard lock(mu);
    if (stopped) return;
    stopped = true;
    for (auto& [peer, r] : reservations) held.push_back(r);
  }
  for (auto& r : held) r->stream->Cancel(Unavailable("the relay is shutting down"));
  // Close the port and every circuit on the strand, and wait for it.
  auto closed = std::make_shared<std::promise<void>>();
  auto self = shared_from_this();
  asio::post(strand, [self, closed]() {
    std::error_code ignored;
    self->acceptor->close(ignored);
    for (auto& c : self->circuits) c->Close();
    for (auto& [id, p] : self->pending) p->timer->cancel();
    closed->set_value();
  });
  // Not from the strand itself (it would wait for itself); bounded in case the host's threads
  // are already gone.
  if (!strand.running_in_this_thread()) {
    closed->get_future().wait_for(std::chrono::seconds(5));
  }
}

Result<std::unique_ptr<Relay>> Relay::Start(Host& host, RelayOptions options) {
  COLONY_RETURN_IF_ERROR(
      CheckTokenRate("circuits_per_second_per_address", options.circuits_per_second_per_address,
                     "circuit_burst_per_address", options.circuit_burst_per_address));
  auto impl = std::make_shared<Impl>(host, std::move(options));
  if (impl->options.circuits_per_second_per_address > 0) {
    impl->circuit_rate.emplace(
        TokenBucketOptions{.per_second = impl->options.circuits_per_second_per_address,
                           .burst = impl->options.circuit_burst_per_address,
                           .max_keys = Host::kMaxRateAddresses});
  }
  if (!impl->options.listen.is_ip()) {
    return InvalidArgument("the relay's circuit port needs an IP address, got " +
                           impl->options.listen.ToString());
  }
  std::error_code ec;
  const tcp::endpoint ep(asio::ip::make_address(impl->options.listen.host(), ec),
                         impl->options.listen.port());
  if (ec) return InvalidArgument("bad relay address: " + ec.message());
  impl->acceptor = std::make_shared<tcp::acceptor>(impl->strand);
  impl->acceptor->open(ep.protocol(), ec);
  if (!ec) impl->acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl->acceptor->bind(ep, ec);
  if (!ec) impl->acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Unavailable("cannot open the relay's circuit port on " +
                       impl->options.listen.ToString() + ": " + ec.message());
  }
  Multiaddr bound = EndpointAddress(impl->acceptor->local_endpoint());
  if (bound.host() == "0.0.0.0")
    bound = Multiaddr(Multiaddr::HostKind::kIp4, "127.0.0.1", bound.port());
  if (bound.host() == "::") bound = Multiaddr(Multiaddr::HostKind::kIp6, "::1", bound.port());
  impl->address = bound.WithPeerId(host.peer_id());
  std::weak_ptr<Impl> weak = impl;
  host.RegisterBidiStreaming(kRelayReserveMethod,
                             [weak](CallContext& ctx) -> asio::awaitable<Status> {
                               auto self = weak.lock();
                               if (!self) co_return Unavailable("this peer no longer runs a relay");
                               co_return co_await self->Serve(ctx);
                             });
  auto loop = [impl]() -> asio::awaitable<void> { co_await impl->AcceptLoop(); };
  asio::co_spawn(impl->strand, std::move(loop), asio::detached);
  COLONY_LOG_INFO("relay: circuits on {}", impl->address.ToString());
  return std::unique_ptr<Relay>(new Relay(std::move(impl)));
}

Relay::~Relay() {
  if (impl_) impl_->Stop();
}

Multiaddr Relay::address() const { return impl_->address; }

RelayStats Relay::stats() const {
  RelayStats s;
  {
    std::lock_guard lock(impl_->mu);
    s.reservations = impl_->reservations.size();
  }
  s.circuits = impl_->open_circuits.load();
  s.circuits_total = impl_->circuits_total.load();
  s.rejected = impl_->rejected.load();
  s.rate_refused = impl_->rate_refused.load();
  s.reclaimed = impl_->reclaimed.load();
  s.bytes_relayed = impl_->bytes_relayed.load();
  return s;
}

// ---------------------------------------------------------------------------------------------
// RelayReservation

struct RelayReservation::Impl : std::enable_shared_from_this<RelayReservation::Impl> {
  Impl(Host& h, Multiaddr r) : host(h), relay(std::move(r)) {}

  Host& host;
  const Multiaddr relay;

  mutable std::mutex mu;
  std::condition_variable granted_cv;
  bool first_done = false;
  Status first_status;
  Multiaddr address;
  bool active = false;
  std::shared_ptr<Stream> stream;
  std::atomic<bool> stopped{false};
  std::atomic<uint64_t> accepted{0};
  std::atomic<size_t> accepting{0};  // AcceptCircuit calls running
  uint64_t dropped_notices = 0;      // on Run's coroutine only

  void Report(const Status& st) {
    std::lock_guard lock(mu);
    if (first_done) return;
    first_done = true;
    first_status = st;
    granted_cv.notify_all();
  }
  asio::awaitable<void> Sleep(std::chrono::milliseconds d) {
    // In slices, so that Stop is noticed quickly.
    const SteadyTime until = std::chrono::steady_clock::now() + d;
    while (!stopped && std::chrono::steady_clock::now() < until) {
      asio::steady_timer t(host.io_context(), std::chrono::milliseconds(100));
      co_await t.async_wait(kUse);
    }
  }
  asio::awaitable<void> Run();
  asio::awaitable<void> AcceptCircuit(uint64_t id, std::string token);
};

asio::awaitable<void> RelayReservation::Impl::Run() {
  auto self = shared_from_this();
  std::chrono::milliseconds backoff(1000);
  const std::string desc = relay.ToString();
  while (!stopped) {
    CallOptions call{.timeout = std::chrono::hours(1)};
    std::string method = kRelayReserveMethod;
    auto opened = co_await host.OpenStream(relay, std::move(method), call);
    Status failure;
    if (!opened.ok()) {
      failure = opened.status().WithContext("reserving a slot at relay " + desc);
    } else {
      {
        std::lock_guard lock(mu);
        stream = *opened;
      }
      if (stopped) (*opened)->Cancel(Cancelled("reservation dropped"));
      auto first = co_await (*opened)->Read();
      Result<Multiaddr> addr = ProtocolError("the relay sent no reservation");
      if (!first.ok()) {
        addr = first.status();
      } else if (first->has_value()) {
        addr = Multiaddr::Parse((*first)->meta);
        if (addr.ok() && (!addr->is_relayed() || addr->peer_id() != host.peer_id())) {
          addr =
              ProtocolError("the relay granted an address for someone else: " + addr->ToString());
        }
      }
      if (!addr.ok()) {
        failure = addr.status().WithContext("reserving a slot at relay " + desc);
      } else {
        // The relay may not know its public address (a wildcard bind): the circuit port is at
        // the host we reached it at.
        *addr = Multiaddr(relay.kind(), relay.host(), addr->port())
                    .WithPeerId(*relay.peer_id())
                    .Relaying(host.peer_id());
        {
          std::lock_guard lock(mu);
          address = *addr;
          active = true;
        }
        COLONY_LOG_INFO("reachable through relay: {}", addr->ToString());
        Report(Status());
        backoff = std::chrono::milliseconds(1000);
        for (;;) {
          auto msg = co_await (*opened)->Read();
          if (!msg.ok() || !msg->has_value()) {
            if (!stopped) {
              COLONY_LOG_INFO("relay reservation at {} ended ({}); renewing", desc,
                              msg.ok() ? "closed" : msg.status().ToString());
            }
            break;
          }
          // "<circuit id> <token>"
          const std::string& meta = (*msg)->meta;
          const size_t space = meta.find(' ');
          auto request = ParseRelayRequest("COLONY-RELAY/1 ACCEPT " + meta);
          if (space == std::string::npos || !request.ok()) {
            COLONY_LOG_WARN("relay {} sent a malformed circuit notice; dropping the reservation",
                            desc);
            (*opened)->Cancel(ProtocolError("malformed circuit notice"));
            break;
          }
          if (accepting.load() >= kMaxPendingAccepts) {
            if (dropped_notices++ % 1000 == 0) {
              COLONY_LOG_WARN(
                  "relay {} announces more than {} circuits at once; dropping the excess ({} so "
                  "far)",
                  desc, kMaxPendingAccepts, dropped_notices);
            }
            continue;
          }
          ++accepting;
          auto accept = [self, id = request->circuit,
                         token = request->token]() -> asio::awaitable<void> {
            co_await self->AcceptCircuit(id, token);
            --self->accepting;
          };
          asio::co_spawn(host.io_context(), std::move(accept), asio::detached);
        }
        std::lock_guard lock(mu);
        active = false;
        stream.reset();
        continue;  // renew at once
      }
    }
    if (stopped) break;
    Report(failure);
    COLONY_LOG_WARN("{}; retrying in {:.0f} s", failure.ToString(), backoff.count() / 1000.0);
    co_await Sleep(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(30'000));
  }
}

asio::awaitable<void> RelayReservation::Impl::AcceptCircuit(uint64_t id, std::string token) {
  Multiaddr circuit_port;
  {
    std::lock_guard lock(mu);
    circuit_port = address;
  }
  std::error_code ec;
  const tcp::endpoint ep(asio::ip::make_address(circuit_port.host(), ec), circuit_port.port());
  if (ec) co_return;
  Strand strand = asio::make_strand(host.io_context());
  tcp::socket socket(strand);
  auto done = std::make_shared<bool>(false);
  asio::steady_timer timer(strand, std::chrono::seconds(10));
  auto* socket_ptr = &socket;
  timer.async_wait([socket_ptr, done](std::error_code e) {
    if (!e && !*done) {
      std::error_code ignored;
      socket_ptr->close(ignored);
    }
  });
  auto [cec] = co_await socket.async_connect(ep, kUse);
  Status st =
      cec ? Unavailable("cannot reach the relay's circuit port: " + cec.message()) : Status();
  if (st.ok()) {
    RelayRequest request;
    request.kind = RelayRequest::Kind::kAccept;
    request.circuit = id;
    request.token = std::move(token);
    const std::string line = FormatRelayRequest(request);
    st = co_await WriteText(socket, line);
  }
  if (st.ok()) {
    auto reply = co_await ReadLine(socket);
    st = reply.ok() ? ParseRelayReply(*reply) : reply.status();
  }
  *done = true;
  timer.cancel();
  if (!st.ok()) {
    COLONY_LOG_DEBUG("relay circuit {} not taken: {}", id, st.ToString());
    co_return;
  }
  ++accepted;
  host.AdoptRelayed(std::move(socket), strand, std::move(circuit_port));
}

Result<std::unique_ptr<RelayReservation>> RelayReservation::Start(
    Host& host, Multiaddr relay, std::chrono::milliseconds timeout) {
  if (!relay.peer_id()) {
    return InvalidArgument("the relay's address needs /p2p/<peer id>: " + relay.ToString());
  }
  if (relay.is_relayed()) {
    return InvalidArgument("a relay must be reachable directly, not through another relay: " +
                           relay.ToString());
  }
  auto impl = std::make_shared<Impl>(host, std::move(relay));
  auto run = [impl]() -> asio::awaitable<void> { co_await impl->Run(); };
  asio::co_spawn(host.io_context(), std::move(run), asio::detached);
  std::unique_ptr<RelayReservation> out(new RelayReservation(impl));
  std::unique_lock lock(impl->mu);
  if (!impl->granted_cv.wait_for(lock, timeout, [&] { return impl->first_done; })) {
    return DeadlineExceeded("relay " + impl->relay.ToString() + " granted no reservation within " +
                            std::to_string(timeout.count() / 1000.0).substr(0, 4) +
                            " s; check the address");
  }
  if (!impl->first_status.ok()) return impl->first_status;
  return out;
}

RelayReservation::~RelayReservation() {
  impl_->stopped = true;
  std::shared_ptr<Stream> s;
  {
    std::lock_guard lock(impl_->mu);
    s = impl_->stream;
  }
  if (s) s->Cancel(Cancelled("reservation dropped"));
}

Multiaddr RelayReservation::address() const {
  std::lock_guard lock(impl_->mu);
  return impl_->address;
}

bool RelayReservation::active() const {
  std::lock_guard lock(impl_->mu);
  return impl_->active;
}

uint64_t RelayReservation::circuits_accepted() const { return impl_->accepted.load(); }

}  // namespace colony::net
