// API keys and per-client rates in front of a real HTTP server on loopback, asked by clients that
// play the attacker: no key, wrong keys, near misses, another scheme; a client over its rate;
// clients from other addresses; more addresses than the gate remembers.
#include "api/client_gate.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/files.h"
#include "loopback_socket.h"
#include "test_support.h"

namespace colony::api {
namespace {

const std::string kKey1 = "k1-0123456789abcdef";
const std::string kKey2 = "k2-fedcba9876543210";

struct Answer {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;
};

// One GET over a fresh connection from `source` (a loopback address) with `headers`.
Answer Get(uint16_t port, const std::string& headers, const char* source = "127.0.0.1") {
  Answer a;
  const int fd = test::ConnectLoopback(port, std::chrono::seconds(10), source);
  if (fd < 0) return a;
  const std::string request =
      "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + "\r\n";
  (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t end = out.find("\r\n\r\n");
  if (out.size() < 12 || end == std::string::npos) return a;
  a.status = std::atoi(out.substr(9, 3).c_str());
  a.head = out.substr(0, end);
  a.body = out.substr(end + 4);
  return a;
}

// An HTTP server whose one route is behind `gate`, counting the requests that reach it.
struct Guarded {
  explicit Guarded(std::shared_ptr<ClientGate> g) : gate(std::move(g)) {
    http::Router router;
    router.Add("GET", "/v1/models", gate->Guard([this](const http::Request&) {
      ++served;
      return http::Json(200, R"({"object": "list", "data": []})");
    }));
    auto s = http::Server::Start({}, std::move(router));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok()) server = std::move(*s);
  }
  ~Guarded() {
    if (server) server->Stop();
  }
  uint16_t port() const { return server->port(); }

  std::shared_ptr<ClientGate> gate;
  std::unique_ptr<http::Server> server;
  std::atomic<int> served{0};
};

std::shared_ptr<ClientGate> MakeGate(ClientGateOptions o) {
  auto gate = ClientGate::Create(std::move(o));
  EXPECT_TRUE(gate.ok()) << gate.status().ToString();
  return gate.ok() ? *gate : nullptr;
}

TEST(ClientGate, OnlyRequestsWithOneOfTheKeysAreServed) {
  Guarded g(MakeGate({.keys = {kKey1, kKey2}}));
  const std::string near_miss = kKey1.substr(0, kKey1.size() - 1) + "x";
  struct Case {
    std::string headers;
    int status;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"", 401, "didn't provide an API key"},
      {"Authorization: Bearer wrong-key-0123456789\r\n", 401, "Incorrect API key"},
      {"Authorization: Bearer " + near_miss + "\r\n", 401, "Incorrect API key"},
      {"Authorization: Bearer " + kKey1.substr(0, kKey1.size() - 1) + "\r\n", 401, "Incorrect"},
      {"Authorization: Bearer " + kKey1 + "x\r\n", 401, "Incorrect API key"},
      {"Authorization: Basic " + kKey1 + "\r\n", 401, "didn't provide an API key"},
      {"Authorization: Bearer\r\n", 401, "didn't provide an API key"},
      {"Authorization: Bearer " + kKey1 + "\r\n", 200, "\"list\""},
      {"authorization: bearer   " + kKey2 + " \r\n", 200, "\"list\""},
  };
  int admitted = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.headers);
    const Answer a = Get(g.port(), c.headers);
    EXPECT_EQ(a.status, c.status) << a.head << "\n" << a.body;
    EXPECT_NE(a.body.find(c.says), std::string::npos) << a.body;
    if (c.status == 401) {
      EXPECT_NE(a.body.find("\"invalid_api_key\""), std::string::npos) << a.body;
      EXPECT_NE(a.head.find("WWW-Authenticate: Bearer"), std::string::npos) << a.head;
    } else {
      ++admitted;
    }
  }
  EXPECT_EQ(g.served.load(), admitted);
  EXPECT_EQ(g.gate->stats().unauthorized, static_cast<int64_t>(cases.size()) - admitted);
}

TEST(ClientGate, EachKeyHasItsOwnRateAndIsToldWhenToRetry) {
  // 3 a minute: a burst of 3, then one every 20 s (this test takes far less).
  Guarded g(MakeGate({.keys = {kKey1, kKey2}, .requests_per_minute = 3}));
  const std::string as1 = "Authorization: Bearer " + kKey1 + "\r\n";
  const std::string as2 = "Authorization: Bearer " + kKey2 + "\r\n";
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Get(g.port(), as1).status, 200) << i;
  // From another address too: the key is the client.
  const Answer over = Get(g.port(), as1, "127.0.0.2");
  EXPECT_EQ(over.status, 429) << over.head;
  EXPECT_NE(over.body.find("\"rate_limit_exceeded\""), std::string::npos) << over.body;
  // (20 s until the next request's token, less the time the four took: less on a slow machine)
  const size_t retry = over.head.find("Retry-After: ");
  ASSERT_NE(retry, std::string::npos) << over.head;
  const int seconds = std::atoi(over.head.c_str() + retry + 13);
  EXPECT_TRUE(seconds >= 18 && seconds <= 20) << over.head;
  EXPECT_EQ(Get(g.port(), as2).status, 200);
  EXPECT_EQ(g.served.load(), 4);
  EXPECT_EQ(g.gate->stats().rate_limited, 1);
}

TEST(ClientGate, WithoutKeysEachAddressHasItsOwnRate) {
  Guarded g(MakeGate({.requests_per_minute = 2}));
  EXPECT_EQ(Get(g.port(), "").status, 200);
  EXPECT_EQ(Get(g.port(), "").status, 200);
  EXPECT_EQ(Get(g.port(), "").status, 429);
  EXPECT_EQ(Get(g.port(), "", "127.0.0.2").status, 200);
  EXPECT_EQ(g.served.load(), 3);
}

// Without keys an IPv6 client is its /64, all of whose 2^64 addresses its subscriber can pick
// from: each new address would otherwise bring a fresh rate. An IPv4 client on a dual-stack
// listener (::ffff:a.b.c.d) is its IPv4 address.
TEST(ClientGate, WithoutKeysAnIpv6SubscribersWholeSlash64SharesOneRate) {
  auto gate = MakeGate({.requests_per_minute = 1});
  ASSERT_NE(gate, nullptr);
  auto admitted = [&](const std::string& remote) {
    http::Request r;
    r.remote_address = remote;
    return !gate->Admit(r).has_value();
  };
  EXPECT_TRUE(admitted("2001:db8:1:2::1:443"));
  EXPECT_FALSE(admitted("2001:db8:1:2::2:443"));
  EXPECT_FALSE(admitted("[2001:db8:1:2:ffff:ffff:ffff:ffff]:443"));
  EXPECT_TRUE(admitted("2001:db8:1:3::1:443"));  // another /64: another subscriber
  EXPECT_TRUE(admitted("203.0.113.7:1"));
  EXPECT_FALSE(admitted("::ffff:203.0.113.7:2"));
  EXPECT_EQ(gate->stats().rate_limited, 3);
}

TEST(ClientGate, ManyAddressesCannotGrowWhatItRemembersPastTheCap) {
  auto gate = MakeGate({.requests_per_minute = 1, .max_clients = 1000});
  ASSERT_NE(gate, nullptr);
  http::Request r;
  int admitted = 0;
  for (int i = 0; i < 20000; ++i) {
    r.remote_address = "10." + std::to_string(i / 65536) + "." + std::to_string(i / 256 % 256) +
                       "." + std::to_string(i % 256) + ":443";
    admitted += gate->Admit(r) ? 0 : 1;
    ASSERT_LE(gate->clients_remembered(), 1000u) << i;
  }
  EXPECT_EQ(admitted, 20000);  // each new address has its first request
  // A client over its rate stays refused while others come and go below the cap.
  r.remote_address = "192.0.2.1:1";
  EXPECT_FALSE(gate->Admit(r).has_value());
  EXPECT_TRUE(gate->Admit(r).has_value());
  for (int i = 0; i < 100; ++i) {
    http::Request other;
    other.remote_address = "198.51.100." + std::to_string(i) + ":1";
    (void)gate->Admit(other);
  }
  EXPECT_TRUE(gate->Admit(r).has_value());
}

TEST(ApiKeys, AFileOfKeysIsReadAndGuessableKeysAreRefusedByLine) {
  const std::filesystem::path dir = test::TempPath("api-keys");
  std::filesystem::create_directories(dir);
  const auto write = [&](const std::string& text) {
    const std::string path = (dir / "keys.txt").string();
    std::ofstream(path) << text;
    return path;
  };
  auto keys = LoadApiKeys(write("# team keys\n" + kKey1 + "\r\n\n" + kKey2 + "\n"));
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(*keys, (std::vector<std::string>{kKey1, kKey2}));

  auto short_key = LoadApiKeys(write(kKey1 + "\nsecret\n"));
  ASSERT_FALSE(short_key.ok());
  EXPECT_NE(short_key.status().message().find("line 2"), std::string::npos)
      << short_key.status().ToString();
  auto spaced = LoadApiKeys(write("a key with spaces in it\n"));
  ASSERT_FALSE(spaced.ok());
  EXPECT_NE(spaced.status().message().find("line 1"), std::string::npos);
  EXPECT_FALSE(LoadApiKeys(write("# nothing\n")).ok());
  EXPECT_FALSE(LoadApiKeys((dir / "missing.txt").string()).ok());
  EXPECT_FALSE(ClientGate::Create({.requests_per_minute = -1}).ok());
  RemoveTree(dir);
}

}  // namespace
}  // namespace colony::api
