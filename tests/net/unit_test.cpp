// Unit tests of net's small parts: the key the caps count a source address under, the byte budget
// and its per-source form, the observed-address and peer-address books, and the notifier that
// coroutines on one strand wait on.
#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/identity.h"
#include "net/byte_budget.h"
#include "net/dial_targets.h"
#include "net/notifier.h"
#include "net/observed_addresses.h"
#include "net/peer_address_book.h"
#include "net/protobuf_logs.h"
#include "net/protocol.pb.h"
#include "net/source_address.h"
#include "net/source_budget.h"

namespace colony::net {
namespace {

using namespace std::chrono_literals;

// Which addresses a remote peer may make us dial, for each kind of reference address (the relay
// a punch came through, or where a request came from): the table net/dial_targets.h states.
TEST(DialTargets, LoopbackAndPrivateOnlyForLocalAndPrivateReferences) {
  auto ip = [](const char* text) { return asio::ip::make_address(text); };
  const auto loopback = ip("127.0.0.1"), lan = ip("192.168.1.7"), internet = ip("198.51.100.9");
  struct Case {
    const char* target;
    bool from_loopback, from_lan, from_internet;
  };
  const Case cases[] = {
      {"127.0.0.1", true, false, false},
      {"127.9.9.9", true, false, false},
      {"10.1.2.3", true, true, false},
      {"172.16.0.1", true, true, false},
      {"172.31.255.255", true, true, false},
      {"172.32.0.1", true, true, true},
      {"192.168.0.1", true, true, false},
      {"100.64.0.1", true, true, false},
      {"100.128.0.1", true, true, true},
      {"203.0.113.5", true, true, true},
      {"0.0.0.0", false, false, false},
      {"169.254.169.254", false, false, false},
      {"255.255.255.255", false, false, false},
      {"224.0.0.1", false, false, false},
      {"::1", false, false, false},  // another family than every reference here
  };
  for (const Case& c : cases) {
    EXPECT_EQ(DialTargetAllowed(ip(c.target), loopback), c.from_loopback) << c.target;
    EXPECT_EQ(DialTargetAllowed(ip(c.target), lan), c.from_lan) << c.target;
    EXPECT_EQ(DialTargetAllowed(ip(c.target), internet), c.from_internet) << c.target;
  }
  EXPECT_TRUE(DialTargetAllowed(ip("::1"), ip("::1")));
  EXPECT_FALSE(DialTargetAllowed(ip("::1"), ip("2001:db8::1")));
  EXPECT_FALSE(DialTargetAllowed(ip("fd00::1"), ip("2001:db8::1")));
  EXPECT_TRUE(DialTargetAllowed(ip("fd00::1"), ip("fd12::1")));
  EXPECT_FALSE(DialTargetAllowed(ip("fe80::1"), ip("fe80::2")));
  EXPECT_TRUE(DialTargetAllowed(ip("2001:db8::5"), ip("2001:db8::1")));
}

TEST(SourceKey, AnIpv6SubscribersWholeSlash64CountsAsOneAddress) {
  // An attacker handed 2001:db8:1:2::/64 can pick any of its 2^64 addresses: all count as one.
  EXPECT_EQ(SourceKey("2001:db8:1:2::1", false), "2001:db8:1:2::/64");
  EXPECT_EQ(SourceKey("2001:db8:1:2:ffff:ffff:ffff:ffff", false), "2001:db8:1:2::/64");
  EXPECT_EQ(SourceKey("2001:db8:1:2:a:b:c:d", true), SourceKey("2001:db8:1:2:1:2:3:4", true));
  EXPECT_NE(SourceKey("2001:db8:1:3::1", false), SourceKey("2001:db8:1:2::1", false));
  // Link-local addresses share fe80::/64 on every link: each is its own key.
  EXPECT_EQ(SourceKey("fe80::1", false), "fe80::1");
  EXPECT_NE(SourceKey("fe80::1", false), SourceKey("fe80::2", false));
  // IPv4, also mapped into IPv6, is the address itself.
  EXPECT_EQ(SourceKey("203.0.113.7", false), "203.0.113.7");
  EXPECT_EQ(SourceKey("::ffff:203.0.113.7", false), "203.0.113.7");
  // Loopback is exempt unless limited; limited, ::1 is its own key.
  EXPECT_EQ(SourceKey("::1", false), "");
  EXPECT_EQ(SourceKey("127.0.0.2", false), "");
  EXPECT_EQ(SourceKey("::1", true), "::1");
  EXPECT_EQ(SourceKey("127.0.0.2", true), "127.0.0.2");
  EXPECT_EQ(SourceKey("not an address", true), "");
}

TEST(ByteBudget, RefusesWhatWouldExceedTheLimitAndTracksThePeak) {
  ByteBudget b(100);
  EXPECT_TRUE(b.TryTake(60));
  EXPECT_FALSE(b.TryTake(41));
  EXPECT_TRUE(b.TryTake(40));
  EXPECT_EQ(b.used(), 100u);
  EXPECT_FALSE(b.TryTake(1));
  b.Give(100);
  EXPECT_EQ(b.used(), 0u);
  EXPECT_EQ(b.peak(), 100u);
  EXPECT_FALSE(b.TryTake(UINT64_MAX)) << "an overflowing request must not wrap around";
}

TEST(ByteBudget, ConcurrentTakersNeverExceedTheLimit) {
  ByteBudget b(1000);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&b] {
      for (int i = 0; i < 100000; ++i) {
        if (b.TryTake(7)) b.Give(7);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(b.used(), 0u);
  EXPECT_LE(b.peak(), 1000u);
}

// One source holds at most its share once it holds anything (its first take may be larger, up to
// the total), the total is hard for every source, loopback ("") is held to the total only, and a
// lease gives back what it took exactly once, also when moved.
TEST(SourceBudget, ASourceHoldsItsShareTheTotalIsHardAndLeasesGiveBackOnce) {
  SourceBudget budget({.limit = 100, .per_source = 30, .unit = "bytes of requests"});
  auto a1 = budget.Open("198.51.100.7");
  ASSERT_TRUE(a1.Take(40).ok()) << "a source holding nothing may take more than its share";
  auto a2 = budget.Open("198.51.100.7");
  const Status over_share = a2.Take(1);
  EXPECT_EQ(over_share.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over_share.message().find("198.51.100.7 holds 40 bytes of requests"), std::string::npos)
      << over_share.ToString();
  EXPECT_NE(over_share.message().find("one client address may hold 30"), std::string::npos);
  EXPECT_EQ(a2.held(), 0u);

  auto b = budget.Open("203.0.113.9");
  ASSERT_TRUE(b.Take(10).ok());
  ASSERT_TRUE(b.Take(20).ok()) << "up to the share";
  EXPECT_FALSE(b.Take(1).ok()) << "one past the share";
  auto proxy = budget.Open("");
  ASSERT_TRUE(proxy.Take(25).ok());
  ASSERT_TRUE(proxy.Take(5).ok()) << "loopback is held to the total, not to a share";
  EXPECT_EQ(budget.used(), 100u);
  auto c = budget.Open("192.0.2.1");
  const Status over_total = c.Take(1);
  EXPECT_EQ(over_total.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over_total.message().find("this server holds its limit of 100 bytes of requests"),
            std::string::npos)
      << over_total.ToString();
  EXPECT_FALSE(c.Take(UINT64_MAX).ok()) << "an overflowing take must not wrap around";
  EXPECT_EQ(budget.refused(), 4u);
  EXPECT_EQ(budget.sources(), 2u);

  {
    SourceBudget::Lease moved = std::move(a1);
    EXPECT_EQ(moved.held(), 40u);
    EXPECT_EQ(a1.held(), 0u);  // NOLINT(bugprone-use-after-move): moved-from holds nothing
  }
  EXPECT_EQ(budget.used(), 60u) << "the moved lease gave back its 40 once";
  ASSERT_TRUE(a2.Take(30).ok()) << "the source holds nothing again";
  a2.Release();
  b.Release();
  proxy = budget.Open("");  // the old lease is given back by the assignment
  EXPECT_EQ(budget.used(), 0u);
  EXPECT_EQ(budget.sources(), 0u);
  EXPECT_EQ(budget.peak(), 100u);
}

// Many threads taking and giving for a few sources never hold more than the total, and nothing
// is left held once they are done.
TEST(SourceBudget, ConcurrentLeasesNeverExceedTheTotal) {
  SourceBudget budget({.limit = 1000, .per_source = 300});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&budget, t] {
      for (int i = 0; i < 20000; ++i) {
        auto lease = budget.Open(t % 2 == 0 ? "10.0.0.1" : std::string());
        if (lease.Take(70).ok()) (void)lease.Take(70);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(budget.used(), 0u);
  EXPECT_EQ(budget.sources(), 0u);
  EXPECT_LE(budget.peak(), 1000u);
}

TEST(ObservedAddressBook, KeepsAtMostTheLimitAndRanksAgreementFirst) {
  ObservedAddressBook book;
  const PeerId a = KeyPair::Generate().peer_id();
  const PeerId b = KeyPair::Generate().peer_id();
  book.Add("/ip4/198.51.100.1/tcp/7000", a);
  book.Add("/ip4/198.51.100.1/tcp/7000/p2p/" + b.ToString(), b);  // same address, canonical
  for (int i = 0; i < 100; ++i) {
    book.Add("/ip4/10.1.0." + std::to_string(i) + "/tcp/1", KeyPair::Generate().peer_id());
  }
  book.Add("garbage", a);
  book.Add("/dns4/example.com/tcp/1", a);
  auto ranked = book.Ranked();
  ASSERT_EQ(ranked.size(), kMaxObservedAddresses);
  EXPECT_EQ(ranked[0], "/ip4/198.51.100.1/tcp/7000");
  // The newest single reports come next; the oldest ones were dropped.
  EXPECT_EQ(ranked[1], "/ip4/10.1.0.99/tcp/1");
  for (const auto& r : ranked) EXPECT_NE(r, "/ip4/10.1.0.0/tcp/1");
}

TEST(ObservedAddressBook, OnePeerRepeatingItselfDoesNotOutrankAgreement) {
  ObservedAddressBook book;
  const PeerId liar = KeyPair::Generate().peer_id();
  book.Add("/ip4/198.51.100.1/tcp/7000", KeyPair::Generate().peer_id());
  book.Add("/ip4/198.51.100.1/tcp/7000", KeyPair::Generate().peer_id());
  for (int i = 0; i < 50; ++i) book.Add("/ip4/10.9.9.9/tcp/1", liar);
  EXPECT_EQ(book.Ranked().at(0), "/ip4/198.51.100.1/tcp/7000");
}

Multiaddr Tcp(const std::string& ip, int port) {
  return *Multiaddr::Parse("/ip4/" + ip + "/tcp/" + std::to_string(port));
}

TEST(PeerAddressBook, KeepsTheFirstAddressesOfThePeerNamedAsIt) {
  PeerAddressBook book;
  const PeerId peer = KeyPair::Generate().peer_id();
  const PeerId other = KeyPair::Generate().peer_id();
  std::vector<Multiaddr> addrs = {Tcp("10.0.0.1", 1), Tcp("10.0.0.1", 1).WithPeerId(peer),
                                  Tcp("10.0.0.2", 1).WithPeerId(other)};
  for (int i = 0; i < 20; ++i) addrs.push_back(Tcp("10.0.1." + std::to_string(i), 1));
  book.Set(peer, addrs);
  const auto held = book.Get(peer);
  ASSERT_EQ(held.size(), PeerAddressBook::kMaxAddressesPerPeer);
  // Duplicates once, another peer's address never; each names the peer.
  EXPECT_EQ(held[0], Tcp("10.0.0.1", 1).WithPeerId(peer));
  EXPECT_EQ(held[1], Tcp("10.0.1.0", 1).WithPeerId(peer));
  for (const auto& a : held) EXPECT_EQ(a.peer_id(), peer);
  // A later announcement replaces the earlier one; an empty one forgets the peer.
  book.Set(peer, {Tcp("10.0.0.9", 2)});
  EXPECT_EQ(book.Get(peer), std::vector<Multiaddr>{Tcp("10.0.0.9", 2).WithPeerId(peer)});
  book.Set(peer, {});
  EXPECT_TRUE(book.Get(peer).empty());
  EXPECT_EQ(book.size(), 0u);
}

TEST(PeerAddressBook, HoldsAtMostItsPeersAndForgetsTheLongestSetFirst) {
  PeerAddressBook book(3);
  std::vector<PeerId> peers;
  for (int i = 0; i < 5; ++i) {
    peers.push_back(KeyPair::Generate().peer_id());
    book.Set(peers.back(), {Tcp("10.0.0.1", 1 + i)});
    if (i == 2) book.Set(peers[0], {Tcp("10.0.0.1", 100)});  // set again: now the newest
  }
  EXPECT_EQ(book.size(), 3u);
  EXPECT_FALSE(book.Get(peers[0]).empty());
  EXPECT_TRUE(book.Get(peers[1]).empty());
  EXPECT_TRUE(book.Get(peers[2]).empty());
  EXPECT_FALSE(book.Get(peers[3]).empty());
  EXPECT_FALSE(book.Get(peers[4]).empty());
}

TEST(Notifier, TwoWaitersDoNotWakeEachOther) {
  // With one timer shared by both waiters, re-arming it for the second cancelled the first,
  // which re-armed it and cancelled the second, and so on: a spin on the strand.
  asio::io_context io;
  auto strand = asio::make_strand(io);
  Notifier n(strand);
  int wakeups = 0;
  bool ready = false;
  auto waiter = [&]() -> asio::awaitable<void> {
    while (!ready) {
      co_await n.Wait();
      ++wakeups;
    }
  };
  asio::co_spawn(strand, waiter(), asio::detached);
  asio::co_spawn(strand, waiter(), asio::detached);
  io.run_for(100ms);
  EXPECT_EQ(wakeups, 0) << "waiters woke without a Notify()";
  asio::post(strand, [&] {
    ready = true;
    n.Notify();
  });
  io.run_for(100ms);
  EXPECT_EQ(wakeups, 2);
}

TEST(Notifier, WaitUntilReturnsAtItsTime) {
  asio::io_context io;
  auto strand = asio::make_strand(io);
  Notifier n(strand);
  bool done = false;
  const auto start = std::chrono::steady_clock::now();
  asio::co_spawn(
      strand,
      [&]() -> asio::awaitable<void> {
        co_await n.WaitUntil(std::chrono::steady_clock::now() + 50ms);
        done = true;
      },
      asio::detached);
  io.run_for(2s);
  EXPECT_TRUE(done);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 50ms);
}

// What a peer's OPEN frame carries, with a method name that is not UTF-8 (Colony's own callers
// refuse to send one; a hostile peer writes the bytes itself): protobuf refuses the proto3
// string and logs an ERROR about it, which once went straight to stderr, one line per frame.
// With protobuf's logs routed to Colony's debug log (Host's constructor does this), nothing
// reaches stderr.
TEST(ProtobufLogs, AnInvalidUtf8StringFromAPeerWritesNothingToStderr) {
  RouteProtobufLogs();
  const std::string bytes = std::string("\x0a\x05") + "bad\xff\xfe";  // field 1, 5 bytes
  ::testing::internal::CaptureStderr();
  proto::CallHeader header;
  const bool parsed = header.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(parsed);
  EXPECT_TRUE(err.empty()) << err;
}

}  // namespace
}  // namespace colony::net
