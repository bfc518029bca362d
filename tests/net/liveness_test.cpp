// Connection liveness over real sockets and processes: idle close, keepalive against a frozen
// peer process (SIGSTOP) and for a slow peer, observed addresses.
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "core/subprocess.h"
#include "net/raw_peer.h"
#include "net/test_util.h"
#include "test_support.h"

namespace colony::net {
namespace {

using namespace std::chrono_literals;
using test::ColonyBinary;
using test::WaitUntil;
using testing::AddressOf;
using testing::AppendFrame;
using testing::AppendMessageFrame;
using testing::OpenPayload;
using testing::RawPeer;
using testing::StartHost;

// The state letter of a process from /proc/<pid>/stat ('T' when stopped), or '?'.
char ProcessState(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');  // the command name may contain spaces and parentheses
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
}

TEST(Liveness, IdleConnectionIsClosed) {
  HostOptions opts = testing::LoopbackOptions();
  // (Long enough that the connection is still open when the call returns, whatever the load.)
  opts.connection.idle_timeout = 1s;
  auto server = StartHost(opts);
  server->RegisterUnary(
      "echo", [](CallContext&, Message m) -> asio::awaitable<Result<Message>> { co_return m; });
  HostOptions client_opts;
  client_opts.connection.idle_timeout = 1s;
  auto client = StartHost(client_opts);
  ASSERT_TRUE(client->CallSync(AddressOf(*server), "echo", Message("x")).ok());
  EXPECT_EQ(client->connection_count(), 1u);
  EXPECT_TRUE(WaitUntil([&] { return client->connection_count() == 0; }, 5000ms))
      << "idle connection was not closed";
  // A new call simply dials again.
  auto again = client->CallSync(AddressOf(*server), "echo", Message("y"));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
}

TEST(Liveness, BusyConnectionIsNotClosedAsIdle) {
  HostOptions opts = testing::LoopbackOptions();
  opts.connection.idle_timeout = 100ms;
  auto server = StartHost(opts);
  server->RegisterUnary("slow", [](CallContext&, Message m) -> asio::awaitable<Result<Message>> {
    asio::steady_timer t(co_await asio::this_coro::executor, 600ms);
    co_await t.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    co_return m;
  });
  HostOptions client_opts;
  client_opts.connection = opts.connection;
  auto client = StartHost(client_opts);
  auto r = client->CallSync(AddressOf(*server), "slow", Message("x"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();  // a call longer than the idle timeout survives
}

TEST(Liveness, FrozenPeerProcessIsDetectedByKeepalive) {
  auto peer = Subprocess::Spawn({ColonyBinary(), "--log-level", "warn", "listen"});
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  auto line = peer->ReadLine(10s);
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  auto addr = Multiaddr::Parse(*line);
  ASSERT_TRUE(addr.ok()) << *line;

  HostOptions opts;
  opts.connection.keepalive_interval = 100ms;
  opts.connection.keepalive_timeout = 500ms;
  auto client = StartHost(opts);
  auto ping = client->PingSync(*addr);
  ASSERT_TRUE(ping.ok()) << ping.status().ToString();

  peer->Signal(SIGSTOP);  // the process is alive and its socket open, but it answers nothing
  // Signals are delivered asynchronously: wait until the kernel reports the process stopped.
  ASSERT_TRUE(WaitUntil([&] { return ProcessState(peer->pid()) == 'T'; }, 5000ms))
      << "peer process did not stop";
  auto start = std::chrono::steady_clock::now();
  auto r = client->CallSync(*addr, "colony.echo", Message("hello?"), CallOptions{.timeout = 30s});
  auto waited = std::chrono::steady_clock::now() - start;
  peer->Signal(SIGCONT);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_NE(r.status().message().find("stopped responding"), std::string::npos)
      << r.status().ToString();
  EXPECT_LT(waited, 10s) << "keepalive should notice long before the 30 s call deadline";
}

// The reader waits until a whole record has arrived before it reads (SO_RCVLOWAT). A large
// record that crawls in over a slow link, three keepalive timeouts long, must still count as a
// live peer: its bytes arrive all the time, they are just not read yet.
TEST(Liveness, ALargeRecordArrivingSlowlyIsNotMistakenForADeadPeer) {
  HostOptions opts = testing::LoopbackOptions();
  opts.connection.keepalive_interval = 250ms;
  opts.connection.keepalive_timeout = 1000ms;
  auto server = StartHost(opts);
  server->RegisterUnary("size", [](CallContext&, Message m) -> asio::awaitable<Result<Message>> {
    co_return Message(std::to_string(m.meta.size()));
  });
  RawPeer r(AddressOf(*server));
  ASSERT_TRUE(r.connected());
  ASSERT_TRUE(r.Handshake().ok());
  // One record: the call's OPEN, a 200 KiB message and CLOSE_WRITE.
  Bytes plain;
  AppendFrame(plain, FrameType::kOpen, 0, 1, OpenPayload("size", 30'000));
  AppendMessageFrame(plain, 1, Message(std::string(200u << 10, 'z')));
  AppendFrame(plain, FrameType::kCloseWrite, 0, 1, ByteSpan{});
  const Bytes record = r.Seal(plain);
  const size_t pieces = 30;  // one every 100 ms: 3 s for the record
  for (size_t i = 0; i < pieces; ++i) {
    const size_t from = record.size() * i / pieces, to = record.size() * (i + 1) / pieces;
    ASSERT_TRUE(r.SendRaw(ByteSpan(record.data() + from, to - from)))
        << "the server closed the connection after " << i << " of " << pieces << " pieces";
    std::this_thread::sleep_for(100ms);
  }
  std::string reply;
  bool ok = false;
  ASSERT_TRUE(r.ReadFramesUntil(
      [&](const FrameView& f) {
        if (f.header.stream_id != 1) return false;
        if (f.header.type == FrameType::kData) reply.append(f.payload.begin(), f.payload.end());
        if (f.header.type != FrameType::kStatus && f.header.type != FrameType::kReset) return false;
        ok = f.header.type == FrameType::kStatus && DecodeStatus(f.payload).ok();
        return true;
      },
      10s))
      << "the server closed the connection to a slow but live peer";
  EXPECT_TRUE(ok) << "the call failed";
  EXPECT_NE(reply.find(std::to_string(200u << 10)), std::string::npos)
      << "the reply does not carry the message's size";
}

TEST(Liveness, PeersTellEachOtherTheObservedAddress) {
  auto server = StartHost();
  auto client = StartHost();
  ASSERT_TRUE(client->PingSync(AddressOf(*server)).ok());
  auto observed = client->ObservedAddresses();
  ASSERT_EQ(observed.size(), 1u);
  EXPECT_EQ(observed[0].rfind("/ip4/127.0.0.1/tcp/", 0), 0u) << observed[0];
  // And the server learned what the client saw of it.
  ASSERT_TRUE(WaitUntil([&] { return !server->ObservedAddresses().empty(); }, 5000ms));
  EXPECT_EQ(server->ObservedAddresses()[0], AddressOf(*server).WithoutPeerId().ToString());
}

TEST(Liveness, ListenOnSeveralAddressesReportsEachBoundPort) {
  HostOptions opts;
  opts.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0"), *Multiaddr::Parse("/ip6/::1/tcp/0")};
  auto host = std::make_unique<Host>(KeyPair::Generate(), opts);
  Status st = host->Start();
  if (!st.ok() && st.message().find("::1") != std::string::npos) GTEST_SKIP() << "no IPv6 loopback";
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto addrs = host->ListenAddresses();
  ASSERT_EQ(addrs.size(), 2u);
  EXPECT_NE(addrs[0].port(), 0);
  EXPECT_NE(addrs[1].port(), 0);
  EXPECT_EQ(addrs[1].kind(), Multiaddr::HostKind::kIp6);
  auto client = StartHost(HostOptions{});
  for (const auto& a : addrs) {
    auto r = client->PingSync(a);
    ASSERT_TRUE(r.ok()) << a.ToString() << ": " << r.status().ToString();
    EXPECT_EQ(r->peer, host->peer_id());
  }
}

TEST(Liveness, ListeningOnABusyPortIsAClearError) {
  auto first = StartHost();
  HostOptions opts;
  opts.listen = {AddressOf(*first).WithoutPeerId()};
  Host second(KeyPair::Generate(), opts);
  Status st = second.Start();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("in use"), std::string::npos) << st.ToString();
}

TEST(Liveness, DialingNothingIsAClearError) {
  auto client = StartHost(HostOptions{});
  // Bind and close to find a port nobody listens on.
  auto tmp = StartHost();
  auto addr = AddressOf(*tmp);
  tmp->Shutdown();
  auto r = client->PingSync(addr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("refused"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find(addr.ToString()), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace colony::net
