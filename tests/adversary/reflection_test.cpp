// Reflection through hole punching (issue 15, part 7), through real sockets. A peer that reached
// the victim through a relay names the addresses the victim should punch to (net.punch,
// net/punch.cpp); a hostile one names the victim's own loopback services, or the unspecified
// address (which Linux connects to the local host), to make the victim send SYNs there. The
// victim dials a named address only when net/dial_targets.h allows it for the relay's address:
// it answers that it has nothing to try, and no connection reaches the listener the attacker
// named. Control: an address of the relay's own kind is dialled, so the listener would see a
// forged target that got through.
//
// The relay listens on this machine's own non-loopback address (loopback targets are allowed
// for a relay on loopback, a swarm on one machine), so the test needs one; it skips otherwise.
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "net/host.h"
#include "net/relay.h"
#include "net/relay_wire.h"
#include "net/test_util.h"
#include "test_support.h"

namespace colony::net {
namespace {

using namespace std::chrono_literals;
using tcp = asio::ip::tcp;
using testing::StartHost;

// An IPv4 address of an interface that is up and not loopback or link-local.
std::optional<asio::ip::address> NonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return std::nullopt;
  std::optional<asio::ip::address> found;
  for (const ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    const asio::ip::address_v4 ip(ntohl(in->sin_addr.s_addr));
    if (ip.is_loopback() || (ip.to_uint() >> 16) == 0xA9FE) continue;  // 169.254/16
    found = ip;
  }
  ::freeifaddrs(list);
  return found;
}

// A TCP listener that counts the connections it accepts: the SYNs the victim was made to send.
class Listener {
 public:
  explicit Listener(const asio::ip::address& ip) : acceptor_(io_, tcp::endpoint(ip, 0)) {
    Accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~Listener() {
    io_.stop();
    thread_.join();
  }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  uint16_t port() const { return acceptor_.local_endpoint().port(); }
  size_t accepted() const { return accepted_.load(); }

 private:
  void Accept() {
    acceptor_.async_accept([this](std::error_code ec, tcp::socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) ++accepted_;
      Accept();
    });
  }
  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::atomic<size_t> accepted_{0};
  std::thread thread_;
};

Multiaddr Target(const asio::ip::address& ip, uint16_t port) {
  return {ip.is_v4() ? Multiaddr::HostKind::kIp4 : Multiaddr::HostKind::kIp6, ip.to_string(), port};
}

// A relay on `here`, an attacker that holds a reservation with it and never punches by itself,
// and a victim (hole punching on, as by default) that called the attacker through the relay, as
// it would any peer the DHT named by a relayed address.
struct RelayedVictim {
  std::unique_ptr<Host> relay_host, attacker, victim;
  std::unique_ptr<Relay> relay;
  std::unique_ptr<RelayReservation> reservation;

  void Setup(const asio::ip::address& here) {
    const Multiaddr any_port = Target(here, 0);
    HostOptions relay_options;
    relay_options.listen = {any_port};
    relay_host = StartHost(relay_options);
    RelayOptions ro;
    ro.listen = any_port;
    auto started = Relay::Start(*relay_host, ro);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    relay = std::move(*started);

    HostOptions attacker_options;
    attacker_options.hole_punching = false;  // it names targets of its own choosing instead
    attacker = StartHost(attacker_options);
    attacker->RegisterUnary(
        "echo", [](CallContext&, Message m) -> asio::awaitable<Result<Message>> { co_return m; });
    auto reserved = RelayReservation::Start(*attacker, relay_host->ListenAddresses().at(0));
    ASSERT_TRUE(reserved.ok()) << reserved.status().ToString();
    reservation = std::move(*reserved);

    victim = StartHost(HostOptions{});
    // The victim learns the address it is seen at, as peers do from the DHT; without one it
    // would have no address of its own to offer and could not punch at all.
    ASSERT_TRUE(victim->PingSync(relay_host->ListenAddresses().at(0)).ok());
    ASSERT_FALSE(victim->ObservedAddresses().empty());
    auto reply = victim->CallSync(reservation->address(), "echo", Message("hello"));
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  }

  // The attacker's side of a punch over its relayed connection to the victim: `connect
  // <targets>`, the victim's answer, and `sync` when the victim offered addresses of its own
  // (after which it dials the target it picked). The victim's addresses: none when it refused.
  Result<std::vector<Multiaddr>> AskToPunch(std::vector<Multiaddr> targets) {
    auto conn = victim->FindConnection(attacker->peer_id());
    if (!conn || !conn->remote_address().is_relayed()) {
      return FailedPrecondition("the victim has no relayed connection to the attacker");
    }
    const Multiaddr to_victim = conn->remote_address().WithPeerId(victim->peer_id());
    auto exchange = [&]() -> asio::awaitable<Result<std::vector<Multiaddr>>> {
      auto stream = co_await attacker->OpenStream(to_victim, kPunchMethod, {.timeout = 10s});
      if (!stream.ok()) co_return stream.status();
      const Message connect(FormatPunchMessage({.addresses = std::move(targets)}));
      COLONY_CO_RETURN_IF_ERROR(co_await (*stream)->Write(connect));
      auto answer = co_await (*stream)->Read();
      if (!answer.ok()) co_return answer.status();
      if (!answer->has_value()) co_return ProtocolError("the victim sent no answer");
      auto theirs = ParsePunchMessage((*answer)->meta);
      if (!theirs.ok()) co_return theirs.status();
      if (!theirs->addresses.empty()) {
        const Message sync(FormatPunchMessage({.kind = PunchMessage::Kind::kSync}));
        COLONY_CO_RETURN_IF_ERROR(co_await (*stream)->Write(sync));
        COLONY_CO_RETURN_IF_ERROR(co_await (*stream)->CloseWrite());
      }
      co_return std::move(theirs->addresses);
    };
    return asio::co_spawn(attacker->io_context(), exchange(), asio::use_future).get();
  }
};

TEST(ReflectionAttack, APunchCannotAimTheVictimAtItsOwnLoopbackServices) {
  const auto here = NonLoopbackAddress();
  if (!here) GTEST_SKIP() << "this machine has no non-loopback IPv4 address to put a relay on";
  RelayedVictim s;
  ASSERT_NO_FATAL_FAILURE(s.Setup(*here));

  Listener loopback_service(asio::ip::make_address("127.0.0.1"));
  const std::vector<Multiaddr> forged = {
      Target(asio::ip::make_address("127.0.0.1"), loopback_service.port()),
      Target(asio::ip::make_address("0.0.0.0"), loopback_service.port()),
      Target(asio::ip::make_address("169.254.169.254"), 80),  // a cloud's metadata service
      Target(asio::ip::make_address("224.0.0.1"), loopback_service.port()),
  };
  auto offered = s.AskToPunch(forged);
  ASSERT_TRUE(offered.ok()) << offered.status().ToString();
  EXPECT_TRUE(offered->empty()) << "the victim agreed to punch to a forged target";
  // The victim would dial at once after the sync; give it time to do it wrongly.
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(loopback_service.accepted(), 0u) << "the victim was made to connect to its loopback";

  // The honest workload: the relayed connection still carries calls.
  auto reply = s.victim->CallSync(s.reservation->address(), "echo", Message("still there"));
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->meta, "still there");

  // Control: a target of the relay's own kind, named after the forged ones, is dialled, so the
  // listener above would have seen a forged target that got through.
  Listener beside_relay(*here);
  std::vector<Multiaddr> mixed = {forged[0], Target(*here, beside_relay.port())};
  auto agreed = s.AskToPunch(mixed);
  ASSERT_TRUE(agreed.ok()) << agreed.status().ToString();
  EXPECT_FALSE(agreed->empty()) << "the victim refused a target it may dial";
  EXPECT_TRUE(test::WaitUntil([&] { return beside_relay.accepted() > 0; }, 15s))
      << "the victim never dialled the allowed target";
  EXPECT_EQ(loopback_service.accepted(), 0u) << "the victim dialled the forged target too";
}

}  // namespace
}  // namespace colony::net
