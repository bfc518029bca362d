// Dialing a peer at any of its addresses (Host::ConnectAny, Host::SetPeerAddresses): the address
// a caller is given first may be refused, silent, or another peer's, as a wildcard listener's
// loopback and LAN addresses are from another machine; the call still gets through.
#include <gtest/gtest.h>

#include "net/test_util.h"

namespace colony::net {
namespace {

using namespace std::chrono_literals;
using testing::AddressOf;
using testing::LoopbackAddress;
using testing::RunFor;
using testing::SilentListener;
using testing::StartHost;

// A server whose "whoami" method answers with its own peer id.
std::unique_ptr<Host> StartServer() {
  auto server = StartHost();
  const std::string self = server->peer_id().ToString();
  server->RegisterUnary("whoami",
                        [self](CallContext&, Message) -> asio::awaitable<Result<Message>> {
                          co_return Message(self);
                        });
  return server;
}

// A loopback port where nothing listens: a dial there is refused.
uint16_t ClosedPort() {
  asio::io_context io;
  asio::ip::tcp::acceptor a(io, {asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

TEST(DialAny, ACallGetsThroughWhenTheAddressGivenFirstIsRefused) {
  auto server = StartServer();
  auto client = StartHost();
  const Multiaddr refused = LoopbackAddress(ClosedPort(), server->peer_id());
  client->SetPeerAddresses(server->peer_id(), {refused, AddressOf(*server)});
  auto reply = client->CallSync(refused, "whoami", Message("?"), {.timeout = 10s});
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->meta, server->peer_id().ToString());
}

TEST(DialAny, AnotherPeerAtTheFirstAddressDoesNotEndTheDial) {
  // From another machine, a peer's announced 127.0.0.1:<port> leads to whoever listens there.
  auto server = StartServer();
  auto stranger = StartServer();
  auto client = StartHost();
  const Multiaddr wrong = LoopbackAddress(AddressOf(*stranger).port(), server->peer_id());
  auto conn =
      RunFor(*client, client->ConnectAny(server->peer_id(), {wrong, AddressOf(*server)}, 0, 10s));
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  EXPECT_EQ((*conn)->peer(), server->peer_id());
  auto reply = client->CallSync(AddressOf(*server), "whoami", Message("?"), {.timeout = 10s});
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->meta, server->peer_id().ToString());
}

TEST(DialAny, ASilentFirstAddressDoesNotTakeTheCallsDeadline) {
  // The silent address would hold its dial for the whole dial timeout (60 s); the next address
  // is dialed beside it after dial_stagger and answers well within the call's 20 s.
  SilentListener silent;
  auto server = StartServer();
  HostOptions options = testing::LoopbackOptions();
  options.dial_timeout = 60s;
  auto client = StartHost(options);
  const Multiaddr first = silent.Address(server->peer_id());
  client->SetPeerAddresses(server->peer_id(), {first, AddressOf(*server)});
  auto reply = RunFor(*client, client->Call(first, "whoami", Message("?"), {.timeout = 20s}), 60s);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->meta, server->peer_id().ToString());
}

TEST(DialAny, WhenNoAddressGetsThroughEachFailureIsNamed) {
  auto client = StartHost();
  const PeerId peer = KeyPair::Generate().peer_id();
  const Multiaddr a = LoopbackAddress(ClosedPort(), peer);
  const Multiaddr b = LoopbackAddress(ClosedPort(), peer);
  auto conn = RunFor(*client, client->ConnectAny(peer, {a, b}, 0, 10s));
  ASSERT_FALSE(conn.ok());
  EXPECT_EQ(conn.status().code(), StatusCode::kUnavailable) << conn.status().ToString();
  for (const Multiaddr& m : {a, b}) {
    EXPECT_NE(conn.status().message().find(m.ToString()), std::string::npos)
        << conn.status().ToString();
  }
  // Silent addresses: the caller's timeout ends the wait, not the dials' 10 s.
  SilentListener one, two;
  const auto start = std::chrono::steady_clock::now();
  conn = RunFor(*client, client->ConnectAny(peer, {one.Address(peer), two.Address(peer)}, 0, 500ms),
                60s);
  EXPECT_EQ(conn.status().code(), StatusCode::kDeadlineExceeded) << conn.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 8s);
}

TEST(DialAny, AnAddressNamingAnotherPeerIsNotDialed) {
  auto server = StartServer();
  auto stranger = StartServer();
  auto client = StartHost();
  // The stranger's own address, /p2p/ and all, given as the server's: skipped, not dialed.
  auto conn = RunFor(*client, client->ConnectAny(server->peer_id(), {AddressOf(*stranger)}, 0, 5s));
  EXPECT_EQ(conn.status().code(), StatusCode::kUnavailable) << conn.status().ToString();
  EXPECT_EQ(client->connection_count(), 0u);
}

}  // namespace
}  // namespace colony::net
