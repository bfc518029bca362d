// Hole punching: replacing a relayed connection with a direct one (see docs/nat.md).
//
// B accepted a connection from A through a relay (B holds the reservation; A may be behind NAT
// too). Both sides bind a TCP socket to a free port first, so each can name the public address its
// SYN will come from: an IP that peers have seen it at (handshake observations), with that port.
// That assumes a NAT that keeps the source port (Linux MASQUERADE and most home routers do when
// the port is free); behind one that does not, the punch fails and the relay stays.
//   B -> A   connect <B's addresses>      B measures the round trip through the relay
//   A -> B   connect <A's addresses>
//   B -> A   sync                         B waits half the round trip, A none: both SYNs leave
//                                         at about the same time
// Each side then connects from its bound port to the other's first usable address, and also
// listens on that port (SO_REUSEPORT) for a connection from exactly that address. Each outgoing
// SYN opens its own NAT for the other's; whichever arrives after that meets either a socket in
// SYN-SENT (TCP's simultaneous open joins the two attempts) or the listener. The ports are fixed
// on both sides, so there can be only one connection. A SYN that is refused is retried soon, one
// that a NAT drops is retransmitted by TCP. The secure handshake then runs as usual (A as
// initiator, B as responder, each expecting the other's id), and the direct connection takes
// the relayed one's place in the pool; the relayed one closes when its streams are done.
#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/address.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include "core/log.h"
#include "net/dial_targets.h"
#include "net/host.h"
#include "net/notifier.h"
#include "net/relay_wire.h"
#include "net/source_address.h"

namespace colony::net {
namespace {

using tcp = asio::ip::tcp;
constexpr auto kUse = asio::experimental::as_tuple(asio::use_awaitable);

// The exchange over the relay, in all.
constexpr std::chrono::milliseconds kExchangeTimeout{10'000};
// How long connect attempts go on after the sync. TCP retransmits a dropped SYN after 1 s and
// 3 s; a refused one is retried after kRetryPause.
constexpr std::chrono::milliseconds kConnectWindow{5'000};
constexpr std::chrono::milliseconds kRetryPause{20};
// Punches one host takes part in at once (both roles together).
constexpr size_t kMaxPunches = 8;

// Our public addresses for a punch from local port `port`: the IPs peers saw us at.
std::vector<Multiaddr> OurAddresses(const std::vector<std::string>& observed,
                                    const asio::ip::address& relay, uint16_t port) {
  std::vector<Multiaddr> out;
  for (const std::string& text : observed) {
    auto seen = Multiaddr::Parse(text);
    if (!seen.ok() || !seen->is_ip()) continue;
    std::error_code ec;
    auto ip = asio::ip::make_address(seen->host(), ec);
    if (ec || !DialTargetAllowed(ip, relay)) continue;
    Multiaddr candidate(seen->kind(), seen->host(), port);
    if (std::find(out.begin(), out.end(), candidate) == out.end()) out.push_back(candidate);
    if (out.size() == kMaxPunchAddresses) break;
  }
  return out;
}

std::optional<tcp::endpoint> PickTarget(const std::vector<Multiaddr>& theirs,
                                        const asio::ip::address& relay) {
  for (const Multiaddr& a : theirs) {
    std::error_code ec;
    auto ip = asio::ip::make_address(a.host(), ec);
    if (!ec && DialTargetAllowed(ip, relay)) return tcp::endpoint(ip, a.port());
  }
  return std::nullopt;
}

// The next message on a punch stream, which must be of `kind`.
asio::awaitable<Result<PunchMessage>> ReadPunch(Stream& stream, PunchMessage::Kind kind) {
  const std::string name = kind == PunchMessage::Kind::kConnect ? "connect" : "sync";
  auto msg = co_await stream.Read();
  if (!msg.ok()) co_return msg.status();
  if (!msg->has_value()) co_return InvalidArgument("hole punching: no " + name + " message");
  auto parsed = ParsePunchMessage((*msg)->meta);
  if (!parsed.ok()) co_return parsed.status();
  if (parsed->kind != kind) co_return ProtocolError("hole punching: expected " + name);
  co_return std::move(*parsed);
}

using ReusePort = asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>;

}  // namespace

// The port a punch runs on: a listener and the socket that connects from the same port. Lives
// on one strand; the accept and connect loops race and the first connection wins.
struct Host::PunchPort : std::enable_shared_from_this<Host::PunchPort> {
  explicit PunchPort(const Strand& s) : strand(s), acceptor(s), connector(s), done(s) {}
  Strand strand;
  tcp::acceptor acceptor;
  tcp::socket connector;
  tcp::endpoint local;
  std::optional<tcp::socket> winner;
  std::error_code last_error;  // of the connect attempts
  bool over = false;
  int running = 0;
  Notifier done;

  // Binds the listener to a free port of the relay's address family and listens.
  Result<uint16_t> Open(const asio::ip::address& relay) {
    std::error_code ec;
    const tcp::endpoint any(relay.is_v4() ? asio::ip::address(asio::ip::address_v4::any())
                                          : asio::ip::address(asio::ip::address_v6::any()),
                            0);
    acceptor.open(any.protocol(), ec);
    if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor.set_option(ReusePort(true), ec);
    if (!ec) acceptor.bind(any, ec);
    if (!ec) acceptor.listen(4, ec);
    if (!ec) local = acceptor.local_endpoint(ec);
    if (ec) return Unavailable("cannot open a port for hole punching: " + ec.message());
    return local.port();
  }

  void Finish() {
    over = true;
    std::error_code ignored;
    acceptor.close(ignored);
    connector.close(ignored);
    done.Notify();
  }
  void Won(tcp::socket s) {
    if (!winner) winner.emplace(std::move(s));
    Finish();
  }

  asio::awaitable<void> AcceptLoop(tcp::endpoint target) {
    while (!over) {
      auto [ec, s] = co_await acceptor.async_accept(kUse);
      if (ec || over) break;
      std::error_code rec;
      if (s.remote_endpoint(rec) == target && !rec) {
        Won(std::move(s));
        break;
      }
      s.close(rec);  // someone else: not for this punch
    }
    --running;
    done.Notify();
  }

  asio::awaitable<void> ConnectLoop(tcp::endpoint target) {
    while (!over) {
      std::error_code ec;
      connector.open(local.protocol(), ec);
      if (!ec) connector.set_option(asio::socket_base::reuse_address(true), ec);
      if (!ec) connector.set_option(ReusePort(true), ec);
      if (!ec) connector.bind(local, ec);
      if (ec) {
        last_error = ec;
        break;
      }
      auto [cec] = co_await connector.async_connect(target, kUse);
      if (over) break;
      if (!cec) {
        tcp::socket s = std::move(connector);
        Won(std::move(s));
        break;
      }
      last_error = cec;
      connector.close(ec);
      asio::steady_timer pause(strand, kRetryPause);
      co_await pause.async_wait(kUse);
    }
    --running;
    done.Notify();
  }

  // Races the two loops until one connects or `deadline`.
  asio::awaitable<Result<tcp::socket>> Connect(tcp::endpoint target, SteadyTime deadline) {
    running = 2;
    auto accept = AcceptLoop(target);
    auto connect = ConnectLoop(target);
    asio::co_spawn(strand, std::move(accept), asio::detached);
    asio::co_spawn(strand, std::move(connect), asio::detached);
    asio::steady_timer timer(strand, deadline);
    timer.async_wait([self = shared_from_this()](std::error_code e) {
      if (!e) self->Finish();
    });
    while (running > 0) co_await done.Wait();
    timer.cancel();
    if (winner) co_return std::move(*winner);
    co_return Unavailable("no direct connection to " + target.address().to_string() + ":" +
                          std::to_string(target.port()) + " within " +
                          std::to_string(kConnectWindow.count()) + " ms (" +
                          (last_error ? last_error.message() : std::string("timed out")) + ")");
  }
};

namespace {

asio::ip::address RelayIp(const Multiaddr& relayed, std::error_code& ec) {
  return asio::ip::make_address(relayed.host(), ec);
}

}  // namespace

bool Host::BeginPunch(const PeerId& peer) {
  std::lock_guard lock(mu_);
  if (shut_down_ || punching_.size() >= kMaxPunches) return false;
  return punching_.insert(peer).second;
}

void Host::EndPunch(const PeerId& peer) {
  std::lock_guard lock(mu_);
  punching_.erase(peer);
}

asio::awaitable<void> Host::FinishPunch(std::shared_ptr<PunchPort> port, tcp::endpoint target,
                                        Role role, PeerId peer) {
  const Strand strand = port->strand;
  const Multiaddr remote = *Multiaddr::FromIp(target.address().to_string(), target.port(), peer);
  const std::string desc = remote.ToString();
  auto attempt = [&]() -> asio::awaitable<Status> {
    const SteadyTime deadline = std::chrono::steady_clock::now() + kConnectWindow;
    auto direct = co_await port->Connect(target, deadline);
    if (!direct.ok()) co_return direct.status();
    {
      std::lock_guard lock(mu_);
      if (shut_down_) co_return Closed("host is shut down");
      if (connection_count_ >= options_.max_connections) {
        co_return ResourceExhausted("too many connections to add a direct one");
      }
      ++connection_count_;  // reserved during the handshake
    }
    auto finished = std::make_shared<bool>(false);
    asio::steady_timer timer(strand, options_.connection.handshake_timeout);
    tcp::socket* raw = &*direct;
    timer.async_wait([raw, finished](std::error_code e) {
      if (!e && !*finished) {
        std::error_code ignored;
        raw->close(ignored);
      }
    });
    const HandshakeOptions options =
        MakeHandshakeOptions(role, peer, remote.WithoutPeerId().ToString());
    const std::string hs_desc = "peer " + desc + " (hole punched)";
    auto hs = co_await RunHandshake(*direct, options, hs_desc);
    *finished = true;
    timer.cancel();
    if (!hs.ok()) {
      std::error_code ignored;
      direct->close(ignored);
      std::lock_guard lock(mu_);
      --connection_count_;
      all_closed_.notify_all();
      co_return hs.status();
    }
    auto conn = Connection::Start(
        std::move(*direct), strand, role, std::move(*hs), remote,
        ConnectionOptionsFor(SourceKey(target.address(), options_.limit_loopback_addresses)),
        [this](const std::string& m) { return LookupHandler(m); },
        [this](Connection* c) { OnConnectionClosed(c); });
    AddConnection(conn, 0);
    co_return Status();
  };
  Status outcome = co_await attempt();
  if (outcome.ok()) {
    COLONY_LOG_INFO("direct connection to {} (hole punched); the relay is no longer used", desc);
  } else {
    COLONY_LOG_INFO("hole punching to {} failed, staying on the relay: {}", desc,
                    outcome.ToString());
  }
  EndPunch(peer);
}

asio::awaitable<void> Host::PunchThroughRelay(std::shared_ptr<Connection> relayed) {
  const PeerId peer = relayed->peer();
  std::error_code ec;
  const asio::ip::address relay = RelayIp(relayed->remote_address(), ec);
  if (auto existing = FindConnection(peer); existing && !existing->remote_address().is_relayed()) {
    co_return;  // already connected directly
  }
  if (ec || !BeginPunch(peer)) co_return;
  auto port = std::make_shared<PunchPort>(asio::make_strand(io_));
  std::optional<tcp::endpoint> target;
  auto exchange = [&]() -> asio::awaitable<Status> {
    auto bound = port->Open(relay);
    if (!bound.ok()) co_return bound.status();
    PunchMessage ours;
    ours.addresses = OurAddresses(ObservedAddresses(), relay, *bound);
    if (ours.addresses.empty()) co_return FailedPrecondition("no public address of ours is known");
    std::string method = kPunchMethod;
    auto opened = co_await relayed->OpenStream(std::move(method), kExchangeTimeout);
    if (!opened.ok()) co_return opened.status();
    std::shared_ptr<Stream> stream = *opened;
    const auto sent = std::chrono::steady_clock::now();
    const Message connect(FormatPunchMessage(ours));
    Status st = co_await stream->Write(connect);
    if (!st.ok()) co_return st;
    auto theirs = co_await ReadPunch(*stream, PunchMessage::Kind::kConnect);
    if (!theirs.ok()) co_return theirs.status();
    const auto rtt = std::chrono::steady_clock::now() - sent;
    if (theirs->addresses.empty()) co_return FailedPrecondition("the peer cannot punch");
    target = PickTarget(theirs->addresses, relay);
    if (!target) co_return FailedPrecondition("the peer named no address we can try");
    const Message sync(FormatPunchMessage({.kind = PunchMessage::Kind::kSync}));
    st = co_await stream->Write(sync);
    if (st.ok()) st = co_await stream->CloseWrite();
    if (!st.ok()) co_return st;
    // The sync reaches the peer half a round trip from now and it connects then; so do we.
    asio::steady_timer wait(port->strand, rtt / 2);
    co_await wait.async_wait(kUse);
    co_return Status();
  };
  Status st = co_await exchange();
  if (!st.ok()) {
    COLONY_LOG_INFO("hole punching to {} not tried, staying on the relay: {}", peer.ToString(),
                    st.ToString());
    EndPunch(peer);
    co_return;
  }
  const Strand strand = port->strand;
  auto finish = FinishPunch(std::move(port), *target, Role::kResponder, peer);
  asio::co_spawn(strand, std::move(finish), asio::detached);
}

asio::awaitable<Status> Host::ServePunch(CallContext& ctx) {
  const Multiaddr via = ctx.remote_address();
  if (!via.is_relayed()) {
    co_return FailedPrecondition("hole punching is only for connections through a relay");
  }
  if (!options_.hole_punching) co_return FailedPrecondition("hole punching is turned off here");
  std::error_code ec;
  const asio::ip::address relay = RelayIp(via, ec);
  if (ec) co_return FailedPrecondition("cannot tell the relay's address");
  const PeerId peer = ctx.peer();
  if (!BeginPunch(peer)) co_return ResourceExhausted("already punching (to this or many peers)");
  auto port = std::make_shared<PunchPort>(asio::make_strand(io_));
  std::optional<tcp::endpoint> target;
  auto exchange = [&]() -> asio::awaitable<Status> {
    auto theirs = co_await ReadPunch(ctx.stream(), PunchMessage::Kind::kConnect);
    if (!theirs.ok()) co_return theirs.status();
    target = PickTarget(theirs->addresses, relay);
    PunchMessage ours;
    if (target) {
      auto bound = port->Open(relay);
      if (bound.ok()) ours.addresses = OurAddresses(ObservedAddresses(), relay, *bound);
    }
    // An answer without addresses tells the peer to stop.
    const Message answer(FormatPunchMessage(ours));
    Status st = co_await ctx.stream().Write(answer);
    if (!st.ok()) co_return st;
    if (ours.addresses.empty()) {
      co_return FailedPrecondition(target ? "no public address of ours is known"
                                          : "the peer named no address we can try");
    }
    auto sync = co_await ReadPunch(ctx.stream(), PunchMessage::Kind::kSync);
    co_return sync.status();
  };
  Status st = co_await exchange();
  if (!st.ok()) {
    EndPunch(peer);
    COLONY_LOG_INFO("hole punching with {} not tried, staying on the relay: {}", peer.ToString(),
                    st.ToString());
    co_return st;
  }
  // Connect at once, outside this call (whose deadline the peer set).
  const Strand strand = port->strand;
  auto finish = FinishPunch(std::move(port), *target, Role::kInitiator, peer);
  asio::co_spawn(strand, std::move(finish), asio::detached);
  co_return Status();
}

}  // namespace colony::net
