// RPC over real loopback sockets: unary and streaming calls, errors, deadlines, cancellation.
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>
#include <atomic>
#include <limits>
#include <numeric>
#include <thread>

#include "net/test_util.h"

namespace colony::net {
namespace {

using namespace std::chrono_literals;
using testing::AddressOf;
using testing::RunFor;
using testing::SilentListener;
using testing::StartHost;

TEST(Rpc, UnaryEcho) {
  auto server = StartHost();
  server->RegisterUnary("echo", [](CallContext&, Message m) -> asio::awaitable<Result<Message>> {
    m.meta += "!";
    co_return m;
  });
  auto client = StartHost();
  auto reply = client->CallSync(AddressOf(*server), "echo", Message("hello"));
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->meta, "hello!");
  // The connection is reused for the next call.
  auto again = client->CallSync(AddressOf(*server), "echo", Message("again"));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->meta, "again!");
  EXPECT_EQ(client->connection_count(), 1u);
}

TEST(Rpc, AHandshakeRateThatIsNoRateFailsStartNamingTheOption) {
  const auto start = [](double per_second, double burst) {
    HostOptions o;
    o.handshakes_per_second_per_address = per_second;
    o.handshake_burst_per_address = burst;
    Host host(KeyPair::Generate(), o);
    return host.Start();
  };
  for (double bad :
       {-1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    const Status st = start(bad, 64);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("handshakes_per_second_per_address"), std::string::npos);
  }
  const Status burst = start(20, 0.5);
  EXPECT_EQ(burst.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(burst.message().find("handshake_burst_per_address"), std::string::npos);
  EXPECT_TRUE(start(0, 1).ok());  // 0: no limit
}

TEST(Rpc, HandlerSeesCallerIdentity) {
  auto server = StartHost();
  server->RegisterUnary("whoami",
                        [](CallContext& ctx, Message) -> asio::awaitable<Result<Message>> {
                          co_return Message(ctx.peer().ToString());
                        });
  auto client = StartHost();
  auto reply = client->CallSync(AddressOf(*server), "whoami", Message());
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->meta, client->peer_id().ToString());
}

TEST(Rpc, TensorsTravelIntact) {
  auto server = StartHost();
  server->RegisterUnary("sum", [](CallContext&, Message m) -> asio::awaitable<Result<Message>> {
    if (m.tensors.size() != 2) co_return InvalidArgument("want two tensors");
    const auto& a = m.tensors[0];
    const auto& b = m.tensors[1];
    size_t n = a.data.size() / 4;
    auto out = std::make_shared<std::vector<float>>(n);
    for (size_t i = 0; i < n; ++i) {
      float x, y;
      std::memcpy(&x, a.data.data() + 4 * i, 4);
      std::memcpy(&y, b.data.data() + 4 * i, 4);
      (*out)[i] = x + y;
    }
    Message r("sum");
    TensorFrame t;
    t.dtype = DType::kFloat32;
    t.shape = a.shape;
    t.data = ByteSpan(reinterpret_cast<const uint8_t*>(out->data()), n * 4);
    t.owner = out;
    r.tensors.push_back(t);
    co_return r;
  });
  auto client = StartHost();
  // 3 MiB each: several DATA frames and records per message.
  std::vector<float> a(3 << 18), b(3 << 18);
  std::iota(a.begin(), a.end(), 0.0f);
  std::iota(b.begin(), b.end(), 1.0f);
  Message m("add");
  for (auto* v : {&a, &b}) {
    TensorFrame t;
    t.dtype = DType::kFloat32;
    t.shape = {3, static_cast<int64_t>(v->size() / 3)};
    t.data = ByteSpan(reinterpret_cast<const uint8_t*>(v->data()), v->size() * 4);
    m.tensors.push_back(t);
  }
  auto reply = client->CallSync(AddressOf(*server), "sum", m);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  ASSERT_EQ(reply->tensors.size(), 1u);
  EXPECT_EQ(reply->tensors[0].shape, (std::vector<int64_t>{3, static_cast<int64_t>(a.size() / 3)}));
  ASSERT_EQ(reply->tensors[0].data.size(), a.size() * 4);
  for (size_t i = 0; i < a.size(); i += 4099) {
    float v;
    std::memcpy(&v, reply->tensors[0].data.data() + 4 * i, 4);
    EXPECT_EQ(v, a[i] + b[i]);
  }
}

TEST(Rpc, HandlerErrorReachesCaller) {
  auto server = StartHost();
  server->RegisterUnary("fail", [](CallContext&, Message) -> asio::awaitable<Result<Message>> {
    co_return PermissionDenied("you shall not pass");
  });
  auto client = StartHost();
  auto reply = client->CallSync(AddressOf(*server), "fail", Message());
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(reply.status().message(), "you shall not pass");
}

TEST(Rpc, HandlerThatThrowsGivesInternalErrorAndServerKeepsServing) {
  auto server = StartHost();
  server->RegisterUnary("throw", [](CallContext&, Message) -> asio::awaitable<Result<Message>> {
    throw std::runtime_error("boom");
    co_return Message();
  });
  server->RegisterUnary(
      "ok", [](CallContext&, Message m) -> asio::awaitable<Result<Message>> { co_return m; });
  auto client = StartHost();
  auto reply = client->CallSync(AddressOf(*server), "throw", Message());
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kInternal);
  EXPECT_NE(reply.status().message().find("boom"), std::string::npos) << reply.status().ToString();
  auto ok = client->CallSync(AddressOf(*server), "ok", Message("still here"));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->meta, "still here");
}

TEST(Rpc, UnknownMethodIsUnimplemented) {
  auto server = StartHost();
  auto client = StartHost();
  auto reply = client->CallSync(AddressOf(*server), "nope", Message());
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(reply.status().message().find("nope"), std::string::npos);
  // It speaks of the called peer, not of the caller (it once described the caller's own
  // identity and address as the peer without the handler).
  EXPECT_EQ(reply.status().message().find(client->peer_id().ToString()), std::string::npos)
      << reply.status().ToString();
  EXPECT_NE(reply.status().message().find("the called peer has no handler"), std::string::npos)
      << reply.status().ToString();
}

TEST(Rpc, ServerStreaming) {
  auto server = StartHost();
  server->RegisterServerStreaming(
      "count", [](CallContext& ctx, Message m) -> asio::awaitable<Status> {
        int n = std::stoi(m.meta);
        for (int i = 0; i < n; ++i) {
          Status st = co_await ctx.stream().Write(Message(std::to_string(i)));
          if (!st.ok()) co_return st;
        }
        co_return Status::Ok();
      });
  auto client = StartHost();
  auto got = RunFor(*client, [&]() -> asio::awaitable<Result<int>> {
    auto s = co_await client->OpenStream(AddressOf(*server), "count");
    if (!s.ok()) co_return s.status();
    COLONY_CO_RETURN_IF_ERROR(co_await (*s)->Write(Message("100")));
    COLONY_CO_RETURN_IF_ERROR(co_await (*s)->CloseWrite());
    int expected = 0;
    for (;;) {
      auto m = co_await (*s)->Read();
      if (!m.ok()) co_return m.status();
      if (!m->has_value()) break;
      if ((*m)->meta != std::to_string(expected)) co_return Internal("out of order: " + (*m)->meta);
      ++expected;
    }
    co_return expected;
  }());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, 100);
}

TEST(Rpc, ClientStreaming) {
  auto server = StartHost();
  server->RegisterClientStreaming("total",
                                  [](CallContext& ctx) -> asio::awaitable<Result<Message>> {
                                    long total = 0;
                                    for (;;) {
                                      auto m = co_await ctx.stream().Read();
                                      if (!m.ok()) co_return m.status();
                                      if (!m->has_value()) break;
                                      total += std::stol((*m)->meta);
                                    }
                                    co_return Message(std::to_string(total));
                                  });
  auto client = StartHost();
  auto got = RunFor(*client, [&]() -> asio::awaitable<Result<Message>> {
    auto s = co_await client->OpenStream(AddressOf(*server), "total");
    if (!s.ok()) co_return s.status();
    for (int i = 1; i <= 1000; ++i)
      COLONY_CO_RETURN_IF_ERROR(co_await (*s)->Write(Message(std::to_string(i))));
    COLONY_CO_RETURN_IF_ERROR(co_await (*s)->CloseWrite());
    co_return co_await (*s)->ReadFinal();
  }());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->meta, "500500");
}

TEST(Rpc, BidirectionalPingPong) {
  auto server = StartHost();
  server->RegisterBidiStreaming("double", [](CallContext& ctx) -> asio::awaitable<Status> {
    for (;;) {
      auto m = co_await ctx.stream().Read();
      if (!m.ok()) co_return m.status();
      if (!m->has_value()) co_return Status::Ok();
      COLONY_CO_RETURN_IF_ERROR(
          co_await ctx.stream().Write(Message(std::to_string(2 * std::stoi((*m)->meta)))));
    }
  });
  auto client = StartHost();
  auto got = RunFor(*client, [&]() -> asio::awaitable<Status> {
    auto s = co_await client->OpenStream(AddressOf(*server), "double");
    if (!s.ok()) co_return s.status();
    for (int i = 0; i < 50; ++i) {
      COLONY_CO_RETURN_IF_ERROR(co_await (*s)->Write(Message(std::to_string(i))));
      auto r = co_await (*s)->Read();
      if (!r.ok()) co_return r.status();
      if (!r->has_value() || (*r)->meta != std::to_string(2 * i)) co_return Internal("bad reply");
    }
    COLONY_CO_RETURN_IF_ERROR(co_await (*s)->CloseWrite());
    auto end = co_await (*s)->Read();
    if (!end.ok()) co_return end.status();
    if (end->has_value()) co_return Internal("expected end of stream");
    co_return Status::Ok();
  }());
  EXPECT_TRUE(got.ok()) << got.ToString();
}

TEST(Rpc, DeadlineReachesCallerAndHandler) {
  auto server = StartHost();
  std::promise<Status> handler_saw;
  server->RegisterUnary("slow", [&](CallContext& ctx, Message) -> asio::awaitable<Result<Message>> {
    // Wait for more input than will ever come; the deadline must end the wait.
    auto m = co_await ctx.stream().Read();
    handler_saw.set_value(m.ok() ? Status::Ok() : m.status());
    co_return Message();
  });
  server->RegisterBidiStreaming("hang", [&](CallContext& ctx) -> asio::awaitable<Status> {
    auto first = co_await ctx.stream().Read();
    auto m = co_await ctx.stream().Read();  // the caller never closes its side
    handler_saw.set_value(m.ok() ? Status::Ok() : m.status());
    co_return Status::Ok();
  });
  auto client = StartHost();
  auto start = std::chrono::steady_clock::now();
  auto got = RunFor(*client, [&]() -> asio::awaitable<Status> {
    auto s = co_await client->OpenStream(AddressOf(*server), "hang", CallOptions{.timeout = 300ms});
    if (!s.ok()) co_return s.status();
    COLONY_CO_RETURN_IF_ERROR(co_await (*s)->Write(Message("x")));
    auto r = co_await (*s)->Read();
    co_return r.ok() ? Status::Ok() : r.status();
  }());
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(got.code(), StatusCode::kDeadlineExceeded) << got.ToString();
  EXPECT_LT(elapsed, 5s);
  auto fut = handler_saw.get_future();
  ASSERT_EQ(fut.wait_for(10s), std::future_status::ready) << "handler never saw the deadline";
  Status hs = fut.get();
  EXPECT_FALSE(hs.ok());
  EXPECT_TRUE(hs.code() == StatusCode::kDeadlineExceeded || hs.code() == StatusCode::kCancelled)
      << hs.ToString();
}

TEST(Rpc, CancellationReachesHandler) {
  auto server = StartHost();
  std::promise<Status> handler_saw;
  std::promise<void> handler_started;
  server->RegisterBidiStreaming("wait", [&](CallContext& ctx) -> asio::awaitable<Status> {
    handler_started.set_value();
    // A timer that would wait far longer than the test; cancellation must interrupt it.
    asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::hours(1));
    auto [ec] = co_await t.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    handler_saw.set_value(ctx.cancelled() ? Cancelled("seen") : Internal(ec.message()));
    co_return Status::Ok();
  });
  auto client = StartHost();
  auto stream = RunFor(*client, client->OpenStream(AddressOf(*server), "wait"));
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  ASSERT_EQ(handler_started.get_future().wait_for(10s), std::future_status::ready);
  (*stream)->Cancel();
  auto fut = handler_saw.get_future();
  ASSERT_EQ(fut.wait_for(10s), std::future_status::ready) << "handler was not cancelled";
  EXPECT_EQ(fut.get().code(), StatusCode::kCancelled);
  auto r = RunFor(*client, (*stream)->Read());
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled);
}

TEST(Rpc, CallerCoroutineCancellationCancelsTheCall) {
  using namespace asio::experimental::awaitable_operators;
  auto server = StartHost();
  std::promise<void> handler_cancelled;
  server->RegisterUnary(
      "forever", [&](CallContext& ctx, Message) -> asio::awaitable<Result<Message>> {
        asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::hours(1));
        co_await t.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        if (ctx.cancelled()) handler_cancelled.set_value();
        co_return Message();
      });
  auto client = StartHost();
  auto result = RunFor(*client, [&]() -> asio::awaitable<int> {
    asio::steady_timer t(co_await asio::this_coro::executor, 200ms);
    auto which = co_await (client->Call(AddressOf(*server), "forever", Message()) ||
                           t.async_wait(asio::use_awaitable));
    co_return static_cast<int>(which.index());
  }());
  EXPECT_EQ(result, 1);  // the timer won
  EXPECT_EQ(handler_cancelled.get_future().wait_for(10s), std::future_status::ready);
}

TEST(Rpc, ManyConcurrentCalls) {
  auto server = StartHost();
  std::atomic<int> served{0};
  server->RegisterUnary("inc", [&](CallContext&, Message m) -> asio::awaitable<Result<Message>> {
    ++served;
    co_return Message(std::to_string(std::stoi(m.meta) + 1));
  });
  auto client = StartHost();
  auto addr = AddressOf(*server);
  std::vector<std::future<Result<Message>>> futs;
  for (int i = 0; i < 500; ++i) {
    futs.push_back(asio::co_spawn(client->io_context(),
                                  client->Call(addr, "inc", Message(std::to_string(i))),
                                  asio::use_future));
  }
  for (int i = 0; i < 500; ++i) {
    ASSERT_EQ(futs[i].wait_for(20s), std::future_status::ready);
    auto r = futs[i].get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->meta, std::to_string(i + 1));
  }
}

TEST(Rpc, ShutdownFailsInFlightCallsWithClosed) {
  auto server = StartHost();
  std::promise<void> started;
  server->RegisterUnary("block", [&](CallContext&, Message) -> asio::awaitable<Result<Message>> {
    started.set_value();
    asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::hours(1));
    co_await t.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    co_return Message();
  });
  auto client = StartHost();
  auto fut = asio::co_spawn(client->io_context(),
                            client->Call(AddressOf(*server), "block", Message()), asio::use_future);
  ASSERT_EQ(started.get_future().wait_for(10s), std::future_status::ready);
  server->Shutdown();
  ASSERT_EQ(fut.wait_for(10s), std::future_status::ready);
  auto r = fut.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kClosed) << r.status().ToString();
}

TEST(Rpc, PingReportsPeerAndVersion) {
  auto server = StartHost();
  auto client = StartHost();
  auto r = client->PingSync(AddressOf(*server));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->peer, server->peer_id());
  EXPECT_EQ(r->version_major, kProtocolMajor);
  EXPECT_GT(r->rtt.count(), 0);
  EXPECT_LT(r->rtt, 1s);
  // A ping needs time to wait for its answer: none is an error, not a wait of dial_timeout.
  auto none = client->PingSync(AddressOf(*server), 0ms);
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument) << none.status().ToString();
}

TEST(Rpc, ServerCanCallBackOverTheSameConnection) {
  auto server = StartHost();
  auto client = StartHost(HostOptions{});  // no listener: reachable only through its own connection
  client->RegisterUnary("hello", [](CallContext&, Message) -> asio::awaitable<Result<Message>> {
    co_return Message("from the client");
  });
  std::promise<Result<Message>> back;
  server->RegisterUnary("callback",
                        [&](CallContext& ctx, Message) -> asio::awaitable<Result<Message>> {
                          auto conn = server->FindConnection(ctx.peer());
                          if (!conn) co_return Internal("no connection");
                          auto s = co_await conn->OpenStream("hello", 5000ms);
                          if (!s.ok()) co_return s.status();
                          COLONY_CO_RETURN_IF_ERROR(co_await (*s)->Write(Message()));
                          COLONY_CO_RETURN_IF_ERROR(co_await (*s)->CloseWrite());
                          co_return co_await (*s)->ReadFinal();
                        });
  auto r = client->CallSync(AddressOf(*server), "callback", Message());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->meta, "from the client");
}

TEST(Rpc, LanesOpenSeparateConnections) {
  auto server = StartHost();
  server->RegisterUnary(
      "echo", [](CallContext&, Message m) -> asio::awaitable<Result<Message>> { co_return m; });
  auto client = StartHost();
  for (size_t lane = 0; lane < 3; ++lane) {
    auto r = client->CallSync(AddressOf(*server), "echo", Message("x"), CallOptions{.lane = lane});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  EXPECT_EQ(client->connection_count(), 3u);
}

// Two peers that dial each other at the same moment hold two connections. Both must open their
// streams on the same one, the one dialed by the smaller peer id; otherwise each direction of the
// pair's traffic takes its own TCP flow, and the flows compete (docs/benchmarks.md, "wan").
TEST(Rpc, PeersThatDialEachOtherAtOnceUseOneConnection) {
  int simultaneous = 0;
  for (int trial = 0; trial < 50 && simultaneous < 5; ++trial) {
    auto a = StartHost();
    auto b = StartHost();
    auto from_a = asio::co_spawn(a->io_context(), a->Connect(AddressOf(*b)), asio::use_future);
    auto from_b = asio::co_spawn(b->io_context(), b->Connect(AddressOf(*a)), asio::use_future);
    ASSERT_EQ(from_a.wait_for(20s), std::future_status::ready);
    ASSERT_EQ(from_b.wait_for(20s), std::future_status::ready);
    ASSERT_TRUE(from_a.get().ok());
    ASSERT_TRUE(from_b.get().ok());
    // Both dialed (the other's dial had not reached it yet) once each holds a second connection.
    const auto deadline = std::chrono::steady_clock::now() + 1s;
    auto both_pooled = [&] {
      return a->FindConnection(b->peer_id(), 1) && b->FindConnection(a->peer_id(), 1);
    };
    while (!both_pooled() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
    if (!both_pooled()) continue;
    ++simultaneous;
    auto at_a = a->FindConnection(b->peer_id());
    auto at_b = b->FindConnection(a->peer_id());
    ASSERT_TRUE(at_a && at_b);
    // One TCP connection has opposite roles at its two ends.
    EXPECT_NE(at_a->role(), at_b->role()) << "trial " << trial << ": new streams use two flows";
    const bool a_dialed_it = at_a->role() == Role::kInitiator;
    EXPECT_EQ(a_dialed_it, a->peer_id() < b->peer_id()) << "trial " << trial;
    // A call each way goes over it: each sees the other where that connection comes from.
    for (Host* h : {a.get(), b.get()}) {
      h->RegisterUnary("where", [](CallContext& ctx, Message) -> asio::awaitable<Result<Message>> {
        co_return Message(ctx.remote_address().ToString());
      });
    }
    auto b_as_a_sees_it = b->CallSync(AddressOf(*a), "where", Message());
    auto a_as_b_sees_it = a->CallSync(AddressOf(*b), "where", Message());
    ASSERT_TRUE(b_as_a_sees_it.ok() && a_as_b_sees_it.ok());
    const auto bare = [](const std::string& text) {
      return Multiaddr::Parse(text)->WithoutPeerId().ToString();
    };
    EXPECT_EQ(bare(b_as_a_sees_it->meta), at_a->remote_address().WithoutPeerId().ToString());
    EXPECT_EQ(bare(a_as_b_sees_it->meta), at_b->remote_address().WithoutPeerId().ToString());
  }
  EXPECT_GE(simultaneous, 5) << "the peers hardly ever dialed each other at once";
}

TEST(Rpc, ACallsTimeoutBoundsTheDialBeforeIt) {
  SilentListener silent;
  HostOptions options = testing::LoopbackOptions();
  options.dial_timeout = 30s;
  auto client = StartHost(options);
  const auto start = std::chrono::steady_clock::now();
  auto reply = RunFor(*client,
                      client->Call(silent.Address(KeyPair::Generate().peer_id()), "echo",
                                   Message("x"), CallOptions{.timeout = 300ms}),
                      60s);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(reply.status().code(), StatusCode::kDeadlineExceeded) << reply.status().ToString();
  // The call's 0.3 s, not the dial's 30 s.
  EXPECT_LT(elapsed, 15s);
  // Ping's timeout bounds its dial too.
  auto ping =
      RunFor(*client, client->Ping(silent.Address(KeyPair::Generate().peer_id()), 300ms), 60s);
  EXPECT_EQ(ping.status().code(), StatusCode::kDeadlineExceeded) << ping.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
}

TEST(Rpc, ShutdownDoesNotWaitForHandshakesInProgress) {
  // Outbound: a dial waits for a handshake from a listener that never speaks.
  SilentListener silent;
  auto client = StartHost();
  auto reply = RunFor(*client, client->Call(silent.Address(KeyPair::Generate().peer_id()), "echo",
                                            Message("x"), CallOptions{.timeout = 100ms}));
  EXPECT_EQ(reply.status().code(), StatusCode::kDeadlineExceeded) << reply.status().ToString();
  // Inbound: a peer connects and never says a word.
  auto server = StartHost();
  asio::ip::tcp::socket mute(silent.io);
  mute.connect({asio::ip::make_address("127.0.0.1"), AddressOf(*server).port()});
  // Shutdown waits up to 3 s for open connections to close cleanly; these are not open yet.
  for (Host* host : {client.get(), server.get()}) {
    const auto start = std::chrono::steady_clock::now();
    host->Shutdown();
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  }
}

// Forwards one TCP connection to `target`, but only once Release() is called: until then the
// dialer sees a connected socket that does not answer, as behind a slow path.
class HeldProxy {
 public:
  explicit HeldProxy(uint16_t target) : target_(target) {
    accepting_ = std::thread([this] {
      std::error_code ec;
      acceptor_.accept(downstream_, ec);
      if (ec) return;
      released_.get_future().wait();
      upstream_.connect({asio::ip::make_address("127.0.0.1"), target_}, ec);
      if (ec) return;
      pumps_.emplace_back([this] { Pump(downstream_, upstream_); });
      pumps_.emplace_back([this] { Pump(upstream_, downstream_); });
    });
  }
  ~HeldProxy() {
    Release();
    accepting_.join();
    for (auto& t : pumps_) t.join();
  }
  uint16_t port() const { return acceptor_.local_endpoint().port(); }
  void Release() {
    if (!released_once_.exchange(true)) released_.set_value();
  }
  // Whether a second connection is waiting to be accepted (call after the first was forwarded).
  bool AnotherConnectionWaits() {
    acceptor_.non_blocking(true);
    asio::ip::tcp::socket extra(io_);
    std::error_code ec;
    acceptor_.accept(extra, ec);
    return !ec;
  }

 private:
  static void Pump(asio::ip::tcp::socket& from, asio::ip::tcp::socket& to) {
    std::array<char, 16384> buf{};
    std::error_code ec;
    for (;;) {
      size_t n = from.read_some(asio::buffer(buf), ec);
      if (ec || asio::write(to, asio::buffer(buf.data(), n), ec) != n || ec) break;
    }
    std::error_code ignored;
    to.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    from.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  }

  uint16_t target_;
  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_{io_, {asio::ip::make_address("127.0.0.1"), 0}};
  asio::ip::tcp::socket downstream_{io_};
  asio::ip::tcp::socket upstream_{io_};
  std::promise<void> released_;
  std::atomic<bool> released_once_{false};
  std::thread accepting_;
  std::vector<std::thread> pumps_;
};

TEST(Rpc, ADialOutlastingAShortCallGoesOnAndServesTheNextCall) {
  auto server = StartHost();
  server->RegisterUnary(
      "echo", [](CallContext&, Message m) -> asio::awaitable<Result<Message>> { co_return m; });
  HeldProxy proxy(AddressOf(*server).port());
  const Multiaddr via_proxy = testing::LoopbackAddress(proxy.port(), server->peer_id());
  HostOptions options = testing::LoopbackOptions();
  options.dial_timeout = 30s;
  auto client = StartHost(options);
  // The path stays held for longer than this call may wait: the call gives up, the dial does not.
  auto first =
      RunFor(*client,
             client->Call(via_proxy, "echo", Message("first"), CallOptions{.timeout = 300ms}), 60s);
  EXPECT_EQ(first.status().code(), StatusCode::kDeadlineExceeded) << first.status().ToString();
  proxy.Release();
  auto second =
      RunFor(*client,
             client->Call(via_proxy, "echo", Message("second"), CallOptions{.timeout = 20s}), 60s);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->meta, "second");
  // The second call used the first call's dial: one TCP connection through the proxy.
  EXPECT_FALSE(proxy.AnotherConnectionWaits());
  EXPECT_EQ(client->connection_count(), 1u);
  client->Shutdown();
}

}  // namespace
}  // namespace colony::net
