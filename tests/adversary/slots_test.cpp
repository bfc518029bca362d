// Attacks on connection slots (issue 15, part 5), through real sockets against a host with the
// per-address caps applied to loopback (so that 127.0.0.2 plays another machine: the attacker
// dials from there, honest peers from 127.0.0.1):
//  - a flood of TCP connections that never speak: at most max_handshakes_per_address of them are
//    held (until the handshake deadline), the rest are closed at once;
//  - many identities from one address, each completing its handshake: at most
//    max_connections_per_address connections are kept;
//  - a host filled by one address: an honest newcomer evicts one of that address's connections,
//    while a further connection from the heavy address is refused;
//  - new identities from one address completing handshakes one after another, as fast as they
//    can: the address gets its burst, then its rate (handshakes_per_second_per_address).
// And against a circuit relay (net/relay.h), the same way:
//  - one address reserving with many identities gets max_reservations_per_address of them;
//  - one address flooding the circuit port holds max_circuit_sockets_per_address sockets;
//  - a circuit that goes silent is closed after circuit_idle_timeout, and one that one side
//    half-closed while the other keeps sending after half_closed_timeout;
//  - a hostile relay's flood of circuit notices makes its holder connect back a bounded number
//    of times at once.
// An honest peer's calls succeed beside each attack.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/use_future.hpp>
#include <cerrno>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "adversary/attack_measurements.h"
#include "loopback_socket.h"
#include "net/host.h"
#include "net/relay.h"
#include "net/relay_wire.h"
#include "test_support.h"

namespace colony::net {
namespace {

using namespace std::chrono_literals;

constexpr size_t kPerAddress = 4;
constexpr size_t kHandshakes = 2;

std::unique_ptr<Host> Victim(size_t max_connections,
                             const std::function<void(HostOptions&)>& tune = {}) {
  HostOptions o;
  o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  o.limit_loopback_addresses = true;
  o.max_connections_per_address = kPerAddress;
  o.max_handshakes_per_address = kHandshakes;
  o.max_connections = max_connections;
  o.connection.handshake_timeout = 60s;  // held handshakes stay held for the whole test
  if (tune) tune(o);
  auto host = std::make_unique<Host>(KeyPair::Generate(), o);
  EXPECT_TRUE(host->Start().ok());
  host->RegisterUnary(
      "echo", [](CallContext&, Message m) -> asio::awaitable<Result<Message>> { co_return m; });
  return host;
}

// A peer dialing from `from` (empty: the kernel's choice, 127.0.0.1).
std::unique_ptr<Host> Peer(const std::string& from = {}) {
  HostOptions o;
  o.dial_from = from;
  o.dial_timeout = 10s;
  auto host = std::make_unique<Host>(KeyPair::Generate(), o);
  EXPECT_TRUE(host->Start().ok());
  return host;
}

Status Echo(Host& from, const Multiaddr& to) {
  auto call = [&]() -> asio::awaitable<Status> {
    auto r = co_await from.Call(to, "echo", Message("ping"), {.timeout = 10s});
    if (!r.ok()) co_return r.status();
    co_return r->meta == "ping" ? Status::Ok() : Internal("echo answered something else");
  };
  return asio::co_spawn(from.io_context(), call(), asio::use_future).get();
}

// Seconds of each of `n` echo calls (the honest workload beside an attack), each expected to
// succeed.
std::vector<double> EchoLatencies(Host& from, const Multiaddr& to, int n = 10) {
  std::vector<double> out;
  for (int i = 0; i < n; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    Status st = Echo(from, to);
    out.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  return out;
}

// A TCP connection from 127.0.0.2 (to 127.0.0.1) that never speaks.
int Mute(uint16_t port) {
  const int fd = test::ConnectLoopback(port, std::chrono::seconds(10), "127.0.0.2");
  EXPECT_GE(fd, 0) << "no connection from 127.0.0.2 to port " << port;
  return fd;
}

// Whether the victim has closed `fd` (what it sent before, its Hello in the clear, is read and
// dropped). Does not wait.
bool Closed(int fd) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) continue;
    return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
  }
}

// How many of `fds` the victim has closed, once `expected` of them are (or the hang guard ran
// out), and a moment later, so that a socket closed beyond `expected` counts too.
int ClosedOnes(const std::vector<int>& fds, int expected) {
  auto count = [&] {
    int n = 0;
    for (int fd : fds) n += Closed(fd);
    return n;
  };
  test::WaitUntil([&] { return count() >= expected; }, test::HangGuard(10s));
  std::this_thread::sleep_for(100ms);
  return count();
}

TEST(SlotAttack, MuteConnectionsFromOneAddressHoldOnlyItsHandshakeSlots) {
  auto victim = Victim(64);
  const Multiaddr addr = victim->ListenAddresses()[0];
  auto honest = Peer();
  ASSERT_TRUE(Echo(*honest, addr).ok());
  const auto before = EchoLatencies(*honest, addr);

  constexpr int kFlood = 20;
  std::vector<int> fds;
  for (int i = 0; i < kFlood; ++i) fds.push_back(Mute(addr.port()));
  // Every refused one is closed at once; wait for the victim to have seen them all.
  const auto deadline = std::chrono::steady_clock::now() + test::HangGuard(30s);
  while (victim->slot_refusals().handshakes < kFlood - kHandshakes &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(victim->slot_refusals().handshakes, kFlood - kHandshakes);
  EXPECT_EQ(ClosedOnes(fds, kFlood - static_cast<int>(kHandshakes)),
            kFlood - static_cast<int>(kHandshakes));
  // The honest peer (another address) is still served, as fast, and a new one gets in too.
  EXPECT_LT(test::RecordHonestSlowdown(before, EchoLatencies(*honest, addr)), 10);
  auto newcomer = Peer();
  EXPECT_TRUE(Echo(*newcomer, addr).ok());
  for (int fd : fds) ::close(fd);
}

TEST(SlotAttack, ManyIdentitiesFromOneAddressGetOnlyItsConnectionSlots) {
  auto victim = Victim(64);
  const Multiaddr addr = victim->ListenAddresses()[0];
  auto honest = Peer();
  const auto before = EchoLatencies(*honest, addr);
  std::vector<std::unique_ptr<Host>> sybils;
  int admitted = 0;
  for (int i = 0; i < 10; ++i) {
    sybils.push_back(Peer("127.0.0.2"));
    admitted += Echo(*sybils.back(), addr).ok();
  }
  EXPECT_EQ(admitted, static_cast<int>(kPerAddress));
  EXPECT_EQ(victim->slot_refusals().per_address, 10 - kPerAddress);
  EXPECT_LT(test::RecordHonestSlowdown(before, EchoLatencies(*honest, addr)), 10);
  auto newcomer = Peer();
  EXPECT_TRUE(Echo(*newcomer, addr).ok());
  // Slots come back when the address's connections close.
  sybils.clear();
  const auto deadline = std::chrono::steady_clock::now() + test::HangGuard(30s);
  Status again = Unavailable("not tried");
  while (!again.ok() && std::chrono::steady_clock::now() < deadline) {
    auto late = Peer("127.0.0.2");
    again = Echo(*late, addr);
    if (!again.ok()) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(again.ok()) << again.ToString();
}

TEST(SlotAttack, AFullHostEvictsTheHeaviestAddressForAnHonestNewcomer) {
  auto victim = Victim(kPerAddress);  // one address can fill it
  const Multiaddr addr = victim->ListenAddresses()[0];
  std::vector<double> before;
  {
    auto early = Peer();  // the honest workload's pace on the unattacked host; leaves again
    ASSERT_TRUE(Echo(*early, addr).ok());
    before = EchoLatencies(*early, addr);
  }
  ASSERT_TRUE(
      test::WaitUntil([&] { return victim->connection_count() == 0; }, test::HangGuard(10s)));
  std::vector<std::unique_ptr<Host>> sybils;
  for (size_t i = 0; i < kPerAddress; ++i) {
    sybils.push_back(Peer("127.0.0.2"));
    ASSERT_TRUE(Echo(*sybils.back(), addr).ok());
  }
  auto honest = Peer();
  Status served = Echo(*honest, addr);
  EXPECT_TRUE(served.ok()) << served.ToString();
  EXPECT_EQ(victim->slot_refusals().evicted, 1u);
  // The heavy address cannot evict the lighter one back: the host is full for it.
  auto more = Peer("127.0.0.2");
  EXPECT_FALSE(Echo(*more, addr).ok());
  EXPECT_EQ(victim->slot_refusals().full, 1u);
  EXPECT_TRUE(Echo(*honest, addr).ok());
  EXPECT_LT(test::RecordHonestSlowdown(before, EchoLatencies(*honest, addr)), 10);
  int still_served = 0;
  for (auto& s : sybils) still_served += Echo(*s, addr).ok();
  EXPECT_EQ(still_served, static_cast<int>(kPerAddress) - 1);
}

struct RelayVictim {
  std::unique_ptr<Host> host;
  std::unique_ptr<Relay> relay;
  explicit RelayVictim(RelayOptions o) {
    HostOptions h;
    h.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
    host = std::make_unique<Host>(KeyPair::Generate(), h);
    EXPECT_TRUE(host->Start().ok());
    o.listen = *Multiaddr::Parse("/ip4/127.0.0.1/tcp/0");
    o.limit_loopback_addresses = true;
    auto r = Relay::Start(*host, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) relay = std::move(*r);
  }
  Multiaddr address() const { return host->ListenAddresses()[0]; }
};

// A peer behind NAT (no listener) reachable through `relay`, answering echo.
struct Behind {
  std::unique_ptr<Host> host;
  std::unique_ptr<RelayReservation> reservation;
  Status status;
  Behind(const Multiaddr& relay, const std::string& from) : host(Peer(from)) {
    host->RegisterUnary(
        "echo", [](CallContext&, Message m) -> asio::awaitable<Result<Message>> { co_return m; });
    auto r = RelayReservation::Start(*host, relay, 10s);
    if (r.ok()) {
      reservation = std::move(*r);
    } else {
      status = r.status();
    }
  }
};

// A relay with an honest peer behind it and an honest caller, whose calls over the circuit to
// that peer are the workload beside an attack on the relay, timed once before it.
struct RelayWithHonestCircuit {
  RelayVictim victim;
  Behind honest;
  std::unique_ptr<Host> caller = Peer();
  std::vector<double> before;

  explicit RelayWithHonestCircuit(RelayOptions o)
      : victim(std::move(o)), honest(victim.address(), "") {
    if (!victim.relay || !honest.status.ok() || !Echo(*caller, address()).ok()) return;
    before = EchoLatencies(*caller, address());
  }
  bool ready() const { return !before.empty(); }
  Multiaddr address() const { return honest.reservation->address(); }
  // The workload's slowdown now against its pace before the attack.
  double Slowdown() {
    return test::RecordHonestSlowdown(before, EchoLatencies(*caller, address()));
  }
};

TEST(SlotAttack, HandshakesFromOneAddressKeepToItsRate) {
  constexpr double kRate = 0.5;  // per second
  constexpr int kBurst = 4;
  auto victim = Victim(64, [](HostOptions& o) {
    o.max_connections_per_address = 64;  // the rate, not the slots, is what refuses here
    o.handshakes_per_second_per_address = kRate;
    o.handshake_burst_per_address = kBurst;
  });
  const Multiaddr addr = victim->ListenAddresses()[0];
  auto honest = Peer();
  const auto before = EchoLatencies(*honest, addr);
  // Each attempt a new identity that completes its handshake (when let in), makes a call and
  // leaves: one handshake at a time, so only the rate can refuse it.
  constexpr int kAttempts = 20;
  int admitted = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kAttempts; ++i) {
    auto sybil = Peer("127.0.0.2");
    admitted += Echo(*sybil, addr).ok();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Its burst, then at most its rate over the time the attack took.
  EXPECT_GE(admitted, kBurst);
  EXPECT_LE(admitted, kBurst + static_cast<int>(kRate * seconds) + 1) << seconds << " s";
  EXPECT_EQ(victim->slot_refusals().rate, static_cast<uint64_t>(kAttempts - admitted));
  EXPECT_EQ(victim->slot_refusals().handshakes + victim->slot_refusals().per_address, 0u);
  // Another address (the honest peer's, and a newcomer's) is not held back.
  EXPECT_LT(test::RecordHonestSlowdown(before, EchoLatencies(*honest, addr)), 10);
  auto newcomer = Peer();
  EXPECT_TRUE(Echo(*newcomer, addr).ok());
  // The attacker's address gets a handshake again once a token has refilled.
  std::this_thread::sleep_for(std::chrono::duration<double>(1.1 / kRate));
  auto late = Peer("127.0.0.2");
  const Status again = Echo(*late, addr);
  EXPECT_TRUE(again.ok()) << again.ToString();
}

TEST(RelayAttack, OneAddressGetsItsShareOfReservationsAndCircuitSockets) {
  RelayOptions o;
  o.max_reservations_per_address = 2;
  o.max_circuit_sockets_per_address = 3;
  RelayVictim victim(o);
  ASSERT_TRUE(victim.relay);
  std::vector<std::unique_ptr<Behind>> sybils;
  int reserved = 0;
  for (int i = 0; i < 5; ++i) {
    sybils.push_back(std::make_unique<Behind>(victim.address(), "127.0.0.2"));
    reserved += sybils.back()->status.ok();
    if (!sybils.back()->status.ok()) {
      EXPECT_NE(sybils.back()->status.message().find("its limit per address"), std::string::npos)
          << sybils.back()->status.ToString();
    }
  }
  EXPECT_EQ(reserved, 2);
  Behind honest(victim.address(), "");
  ASSERT_TRUE(honest.status.ok()) << honest.status.ToString();
  auto caller = Peer();
  const auto before = EchoLatencies(*caller, honest.reservation->address());

  // The circuit port: 10 mute sockets from 127.0.0.2, of which 3 are held.
  const uint64_t rejected_before = victim.relay->stats().rejected;
  std::vector<int> fds;
  for (int i = 0; i < 10; ++i) fds.push_back(Mute(victim.relay->address().port()));
  EXPECT_EQ(ClosedOnes(fds, 7), 7);
  EXPECT_GE(victim.relay->stats().rejected, rejected_before + 7);
  // The honest circuit is still served, as fast. (Loopback is limited here too, so a second
  // honest circuit would need more than this test's 3 sockets per address.)
  EXPECT_LT(
      test::RecordHonestSlowdown(before, EchoLatencies(*caller, honest.reservation->address())),
      10);
  for (int fd : fds) ::close(fd);
}

TEST(RelayAttack, ASilentCircuitIsReclaimed) {
  RelayOptions o;
  // Short, but long enough that an honest circuit's handshake on a loaded machine never pauses
  // that long between bytes.
  o.circuit_idle_timeout = 2s;
  RelayWithHonestCircuit relay(o);
  ASSERT_TRUE(relay.ready()) << relay.honest.status.ToString();
  RelayVictim& victim = relay.victim;
  // The attacker asks for a circuit to the honest peer, gets it, and says nothing more.
  const int fd = Mute(victim.relay->address().port());
  RelayRequest request;
  request.target = relay.honest.host->peer_id();
  const std::string line = FormatRelayRequest(request);
  ASSERT_EQ(::send(fd, line.data(), line.size(), 0), static_cast<ssize_t>(line.size()));
  EXPECT_TRUE(test::WaitUntil([&] { return victim.relay->stats().circuits_total == 2; },
                              test::HangGuard(10s)));
  // While the silent circuit is held, the honest circuit carries calls as fast.
  EXPECT_LT(relay.Slowdown(), 10);
  // The silent circuit is reclaimed and its socket closed. (The honest circuit, idle from here on,
  // is reclaimed too, 2 s after its last call, which came milliseconds after the silent circuit's
  // request: the count may go from 0 to 2 between two looks.)
  EXPECT_TRUE(
      test::WaitUntil([&] { return victim.relay->stats().reclaimed >= 1; }, test::HangGuard(10s)));
  EXPECT_TRUE(test::WaitUntil([&] { return Closed(fd); }, test::HangGuard(10s)));
  // The circuit leaves the count once both of its pumps have ended (just after the close).
  EXPECT_TRUE(
      test::WaitUntil([&] { return victim.relay->stats().circuits == 0; }, test::HangGuard(10s)));
  // A new honest caller's circuit carries its call.
  auto another = Peer();
  Status through = Echo(*another, relay.address());
  EXPECT_TRUE(through.ok()) << through.ToString();
  ::close(fd);
}

// Sends all of `text` on a blocking socket.
void SendAll(int fd, const std::string& text) {
  ASSERT_EQ(::send(fd, text.data(), text.size(), MSG_NOSIGNAL), static_cast<ssize_t>(text.size()));
}

// The relay's reply line on a circuit socket, without its newline ("" when none came in time).
std::string ReplyLine(int fd) {
  timeval tv{.tv_sec = 10, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string line;
  char c = 0;
  while (line.size() < kMaxRelayLine && ::recv(fd, &c, 1, 0) == 1 && c != '\n') line += c;
  return line;
}

// Both ends of a circuit are the attacker's: it holds a reservation by hand (an ordinary
// relay.reserve stream, whose notices name the circuits to accept), dials itself through the
// relay, and once the relay has spliced the two sockets, the dialing end half-closes while the
// reserved end keeps the circuit busy with a byte every 100 ms and never closes. The idle timeout
// never fires on a circuit that carries bytes, so without half_closed_timeout the circuit (one of
// the relay's max_circuits, and of the attacker address's sockets) would be held for as long as
// the attacker likes.
TEST(RelayAttack, ACircuitThatOneSideHalfClosedIsReclaimed) {
  RelayOptions o;
  o.half_closed_timeout = 1s;
  RelayWithHonestCircuit relay(o);
  ASSERT_TRUE(relay.ready()) << relay.honest.status.ToString();
  RelayVictim& victim = relay.victim;

  auto attacker = Peer("127.0.0.2");
  auto open = [&]() -> asio::awaitable<Result<std::shared_ptr<Stream>>> {
    co_return co_await attacker->OpenStream(victim.address(), kRelayReserveMethod,
                                            {.timeout = 120s});
  };
  auto reservation = asio::co_spawn(attacker->io_context(), open(), asio::use_future).get();
  ASSERT_TRUE(reservation.ok()) << reservation.status().ToString();
  auto next = [&]() -> asio::awaitable<Result<std::optional<Message>>> {
    co_return co_await (*reservation)->Read();
  };
  auto granted = asio::co_spawn(attacker->io_context(), next(), asio::use_future).get();
  ASSERT_TRUE(granted.ok() && granted->has_value()) << granted.status().ToString();

  const uint16_t port = victim.relay->address().port();
  const size_t honest_circuits = victim.relay->stats().circuits;
  const int dialer = Mute(port);
  RelayRequest connect;
  connect.target = attacker->peer_id();
  SendAll(dialer, FormatRelayRequest(connect));
  auto notice = asio::co_spawn(attacker->io_context(), next(), asio::use_future).get();
  ASSERT_TRUE(notice.ok() && notice->has_value()) << notice.status().ToString();
  auto accept = ParseRelayRequest("COLONY-RELAY/1 ACCEPT " + (*notice)->meta);
  ASSERT_TRUE(accept.ok()) << accept.status().ToString();
  const int holder = Mute(port);
  SendAll(holder, FormatRelayRequest(*accept));
  ASSERT_EQ(ReplyLine(holder), "OK");
  ASSERT_EQ(ReplyLine(dialer), "OK");
  EXPECT_TRUE(test::WaitUntil([&] { return victim.relay->stats().circuits == honest_circuits + 1; },
                              test::HangGuard(10s)));

  ::shutdown(dialer, SHUT_WR);  // the relay passes it on: the holder reads an end of stream
  // The holder keeps sending; once the relay has closed its socket, a send fails.
  const auto start = std::chrono::steady_clock::now();
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() - start < test::HangGuard(20s)) {
    closed = ::send(holder, "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
             (errno == EPIPE || errno == ECONNRESET);
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(closed) << "the relay kept a circuit that one side half-closed";
  EXPECT_EQ(victim.relay->stats().reclaimed, 1u);
  EXPECT_GE(std::chrono::steady_clock::now() - start, o.half_closed_timeout);
  EXPECT_TRUE(test::WaitUntil([&] { return victim.relay->stats().circuits == honest_circuits; },
                              test::HangGuard(10s)));
  // The honest circuit is still served, as fast.
  EXPECT_LT(relay.Slowdown(), 10);
  ::close(dialer);
  ::close(holder);
}

// Circuits through a relay cost the peer behind it what direct connections cost a public host:
// a socket (back to the relay) and a handshake. New identities from one address that each open a
// circuit to that peer, complete a handshake and a call through it, and leave (one at a time, so
// no cap on circuits or sockets refuses them) get the burst and then the rate; an honest caller
// keeps its pace, and the attacker's address is let in again a token's time later.
TEST(RelayAttack, CircuitsFromOneAddressKeepToItsRate) {
  constexpr double kRate = 0.5;  // per second
  constexpr int kBurst = 4;
  RelayOptions o;
  o.circuits_per_second_per_address = kRate;
  o.circuit_burst_per_address = kBurst;
  RelayWithHonestCircuit relay(o);
  ASSERT_TRUE(relay.ready()) << relay.honest.status.ToString();
  const uint64_t rejected_before = relay.victim.relay->stats().rejected;
  constexpr int kAttempts = 16;
  int admitted = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kAttempts; ++i) {
    auto sybil = Peer("127.0.0.2");
    admitted += Echo(*sybil, relay.address()).ok();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Its burst, then at most its rate over the time the attack took.
  EXPECT_GE(admitted, kBurst);
  EXPECT_LE(admitted, kBurst + static_cast<int>(kRate * seconds) + 1) << seconds << " s";
  const RelayStats stats = relay.victim.relay->stats();
  EXPECT_EQ(stats.rate_refused, static_cast<uint64_t>(kAttempts - admitted));
  EXPECT_EQ(stats.rejected - rejected_before, stats.rate_refused);  // nothing else refused them
  // The honest caller (another address) is served as before.
  EXPECT_LT(relay.Slowdown(), 10);
  // The attacker's address is let in again once a token has come back.
  std::this_thread::sleep_for(std::chrono::duration<double>(1.1 / kRate));
  auto late = Peer("127.0.0.2");
  EXPECT_TRUE(Echo(*late, relay.address()).ok());
}

TEST(RelayAttack, ACircuitRateThatIsNoRateFailsStartNamingTheOption) {
  HostOptions h;
  h.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  Host host(KeyPair::Generate(), h);
  ASSERT_TRUE(host.Start().ok());
  RelayOptions o;
  o.listen = *Multiaddr::Parse("/ip4/127.0.0.1/tcp/0");
  o.circuits_per_second_per_address = -1;
  auto negative = Relay::Start(host, o);
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("circuits_per_second_per_address"), std::string::npos);
  o.circuits_per_second_per_address = 20;
  o.circuit_burst_per_address = 0;
  auto no_burst = Relay::Start(host, o);
  ASSERT_FALSE(no_burst.ok());
  EXPECT_NE(no_burst.status().message().find("circuit_burst_per_address"), std::string::npos);
}

// A hostile relay (one a peer behind NAT picked from the swarm's list) floods its reservation
// holder with circuit notices: the holder connects back for at most 64 of them at once and drops
// the rest, instead of opening a socket for each (1,000 here; any number, until it runs out of
// file descriptors).
TEST(RelayAttack, AFloodOfCircuitNoticesFromARelayIsCapped) {
  // The relay's "circuit port": accepts connections and never answers (each accept waits).
  const int port_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &any.sin_addr);
  ASSERT_EQ(::bind(port_fd, reinterpret_cast<sockaddr*>(&any), sizeof any), 0);
  ASSERT_EQ(::listen(port_fd, 4096), 0);
  socklen_t len = sizeof any;
  ASSERT_EQ(::getsockname(port_fd, reinterpret_cast<sockaddr*>(&any), &len), 0);
  const uint16_t circuit_port = ntohs(any.sin_port);

  HostOptions h;
  h.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  Host relay(KeyPair::Generate(), h);
  ASSERT_TRUE(relay.Start().ok());
  constexpr int kNotices = 1000;
  relay.RegisterBidiStreaming(
      kRelayReserveMethod, [&relay, circuit_port](CallContext& ctx) -> asio::awaitable<Status> {
        const Multiaddr granted = Multiaddr(Multiaddr::HostKind::kIp4, "127.0.0.1", circuit_port)
                                      .WithPeerId(relay.peer_id())
                                      .Relaying(ctx.peer());
        Status st = co_await ctx.stream().Write(Message(granted.ToString()));
        for (int i = 0; st.ok() && i < kNotices; ++i) {
          st = co_await ctx.stream().Write(
              Message(std::to_string(i + 1) + " " + std::string(kRelayTokenHexLength, 'a')));
        }
        auto end = co_await ctx.stream().Read();  // until the holder leaves
        co_return end.ok() ? Status::Ok() : end.status();
      });
  // The victim holds the reservation and also serves calls on a listener of its own: the honest
  // workload, timed before the reservation and during the flood.
  HostOptions ho;
  ho.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  Host holder_host(KeyPair::Generate(), ho);
  ASSERT_TRUE(holder_host.Start().ok());
  Host* holder = &holder_host;
  holder->RegisterUnary(
      "echo", [](CallContext&, Message m) -> asio::awaitable<Result<Message>> { co_return m; });
  auto caller = Peer();
  const Multiaddr holder_addr = holder->ListenAddresses()[0];
  ASSERT_TRUE(Echo(*caller, holder_addr).ok());
  const auto before = EchoLatencies(*caller, holder_addr);
  auto reservation = RelayReservation::Start(*holder, relay.ListenAddresses()[0], 10s);
  ASSERT_TRUE(reservation.ok()) << reservation.status().ToString();
  // Count the connections that reach the circuit port until none has come for a second.
  int connections = 0;
  std::vector<int> accepted;
  auto quiet_since = std::chrono::steady_clock::now();
  const auto deadline = std::chrono::steady_clock::now() + test::HangGuard(20s);
  while (std::chrono::steady_clock::now() - quiet_since < 1s &&
         std::chrono::steady_clock::now() < deadline) {
    const int fd = ::accept(port_fd, nullptr, nullptr);
    if (fd >= 0) {
      accepted.push_back(fd);
      ++connections;
      quiet_since = std::chrono::steady_clock::now();
    } else {
      std::this_thread::sleep_for(5ms);
    }
  }
  EXPECT_GT(connections, 0);
  EXPECT_LE(connections, 64);
  EXPECT_LT(test::RecordHonestSlowdown(before, EchoLatencies(*caller, holder_addr)), 10);
  (*reservation).reset();
  for (int fd : accepted) ::close(fd);
  ::close(port_fd);
  relay.Shutdown();
}

}  // namespace
}  // namespace colony::net
