// Private swarms over real loopback sockets: who the handshake admits (tokens of the swarm's
// authority for the peer's own id, an allowlist) and who it refuses, with the reason on both
// sides; roles; revocation and expiry of open connections; renewal that fails no call. In the
// spirit of hivemind's test_auth.py.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "core/clock.h"
#include "core/files.h"
#include "core/periodic.h"
#include "net/access_control.h"
#include "net/access_token.h"
#include "net/test_util.h"
#include "net/token_source.h"
#include "test_support.h"

namespace colony::net {
namespace {

using namespace std::chrono_literals;
using testing::AddressOf;
using testing::RunFor;

double Now() { return SystemClock::Instance().WallSeconds(); }

KeyPair Seeded(uint8_t n) {
  Bytes seed(32, n);
  return KeyPair::FromSeed(seed);
}

// A host of a private swarm of `authority`, showing `token` (when not empty).
struct Peer {
  std::shared_ptr<AccessControl> access;
  std::unique_ptr<Host> host;
};

Peer StartPeer(KeyPair identity, AccessOptions access_options, const Bytes& token = {},
               std::chrono::milliseconds keepalive = 15s) {
  Peer p;
  p.access = std::make_shared<AccessControl>(std::move(access_options));
  if (!token.empty()) {
    Status st = p.access->SetOwnToken(identity.peer_id(), token);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  HostOptions o = testing::LoopbackOptions();
  o.access = p.access;
  o.default_call_timeout = 5s;
  o.connection.keepalive_interval = keepalive;
  p.host = std::make_unique<Host>(std::move(identity), std::move(o));
  EXPECT_TRUE(p.host->Start().ok());
  p.host->RegisterUnary(
      "echo", [](CallContext&, Message m) -> asio::awaitable<Result<Message>> { co_return m; });
  return p;
}

AccessOptions Swarm(const KeyPair& authority, double skew = 60) {
  AccessOptions o;
  o.authority = authority.peer_id();
  o.clock_skew_seconds = skew;
  return o;
}

Result<Message> Echo(Host& from, const Host& to, const std::string& method = "echo") {
  return from.CallSync(AddressOf(to), method, Message("hi"));
}

TEST(AccessToken, RoundTripsAndRefusesTampering) {
  const KeyPair authority = Seeded(1);
  const KeyPair alice = Seeded(2);
  const Bytes token =
      IssueAccessToken(authority, alice.peer_id(), "alice", AccessRole::kTrain, 1000, 3600);
  auto t = DecodeAccessToken(token);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->peer, alice.peer_id());
  EXPECT_EQ(t->name, "alice");
  EXPECT_EQ(t->role, AccessRole::kTrain);
  EXPECT_EQ(t->expires_at, 4600);
  EXPECT_EQ(PeerId::FromPublicKey(t->authority), authority.peer_id());

  auto text = ParseAccessTokenText("  " + AccessTokenText(token) + "\n");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, token);
  EXPECT_FALSE(ParseAccessTokenText("abc$def").ok());
  EXPECT_FALSE(ParseAccessTokenText("").ok());

  // Every single flipped byte is refused (a bad signature, or not a token at all).
  for (size_t i = 0; i < token.size(); ++i) {
    Bytes bad = token;
    bad[i] ^= 0x20;
    EXPECT_FALSE(DecodeAccessToken(bad).ok()) << "byte " << i;
  }
  EXPECT_FALSE(DecodeAccessToken(Bytes(kMaxTokenBytes + 1, 0)).ok());
}

TEST(AccessToken, RolesLimitWhatTheirHoldersMayCall) {
  EXPECT_TRUE(RoleMayCall(AccessRole::kAny, "avg.run.reduce"));
  EXPECT_TRUE(RoleMayCall(AccessRole::kTrain, "avg.run.join"));
  EXPECT_FALSE(RoleMayCall(AccessRole::kTrain, "serve.inference"));
  EXPECT_TRUE(RoleMayCall(AccessRole::kServe, "serve.push"));
  EXPECT_FALSE(RoleMayCall(AccessRole::kServe, "avg.run.reduce"));
  EXPECT_TRUE(RoleMayCall(AccessRole::kClient, "dht.find"));
  EXPECT_FALSE(RoleMayCall(AccessRole::kClient, "dht.store"));
  EXPECT_FALSE(RoleMayCall(AccessRole::kClient, "avg.run.join"));
  for (AccessRole r :
       {AccessRole::kAny, AccessRole::kTrain, AccessRole::kServe, AccessRole::kClient}) {
    EXPECT_TRUE(RoleMayCall(r, "net.punch"));
    EXPECT_TRUE(RoleMayCall(r, "relay.reserve"));
  }
  EXPECT_FALSE(ParseAccessRole("admin").ok());
}

TEST(PrivateSwarm, PeersWithTokensTalkBothWays) {
  const KeyPair authority = Seeded(1);
  KeyPair a = Seeded(2), b = Seeded(3);
  const double now = Now();
  const Bytes ta = IssueAccessToken(authority, a.peer_id(), "a", AccessRole::kAny, now, 600);
  const Bytes tb = IssueAccessToken(authority, b.peer_id(), "b", AccessRole::kAny, now, 600);
  Peer pa = StartPeer(std::move(a), Swarm(authority), ta);
  Peer pb = StartPeer(std::move(b), Swarm(authority), tb);
  auto r = Echo(*pa.host, *pb.host);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->meta, "hi");
  // The other direction, on a connection of its own lane.
  auto back = pb.host->CallSync(AddressOf(*pa.host), "echo", Message("ho"), {.lane = 1});
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(pa.host->access_refusals().count, 0u);
  EXPECT_EQ(pb.host->access_refusals().count, 0u);
}

// Each way of not belonging: the dialer's error and the listener's refusal name the reason.
TEST(PrivateSwarm, OutsidersAreRefusedWithTheReasonOnBothSides) {
  const KeyPair authority = Seeded(1);
  const KeyPair stranger_authority = Seeded(9);
  KeyPair server_id = Seeded(2);
  const double now = Now();
  const Bytes server_token =
      IssueAccessToken(authority, server_id.peer_id(), "server", AccessRole::kAny, now, 600);
  Peer server = StartPeer(std::move(server_id), Swarm(authority), server_token);

  struct Case {
    std::string what;
    std::function<Bytes(const KeyPair& self)> token;  // empty result: none
    std::string reason;
  };
  const KeyPair other = Seeded(7);
  uint64_t revoked_serial = 0;
  const std::vector<Case> cases = {
      {"no token", [](const KeyPair&) { return Bytes(); }, "shows no access token"},
      {"expired",
       [&](const KeyPair& self) {
         return IssueAccessToken(authority, self.peer_id(), "late", AccessRole::kAny, now - 7200,
                                 3600);
       },
       "expired"},
      {"another authority",
       [&](const KeyPair& self) {
         return IssueAccessToken(stranger_authority, self.peer_id(), "x", AccessRole::kAny, now,
                                 600);
       },
       "another authority"},
      {"another peer's token",
       [&](const KeyPair&) {
         return IssueAccessToken(authority, other.peer_id(), "other", AccessRole::kAny, now, 600);
       },
       "issued to another peer"},
      {"revoked",
       [&](const KeyPair& self) {
         Bytes t = IssueAccessToken(authority, self.peer_id(), "fired", AccessRole::kAny, now, 600);
         revoked_serial = DecodeAccessToken(t)->serial;
         server.access->Revoke(revoked_serial, now + 600);
         return t;
       },
       "revoked"},
  };
  uint64_t refusals = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].what);
    KeyPair self = Seeded(static_cast<uint8_t>(20 + i));
    const Bytes token = cases[i].token(self);
    // The outsider shows whatever token it holds: its own AccessControl is told that the
    // token's peer is itself and trusts any clock, as an attacker's would (a thief shows
    // another peer's token while the handshake proves its own id).
    HostOptions o = testing::LoopbackOptions();
    std::shared_ptr<AccessControl> access;
    if (!token.empty()) {
      auto decoded = DecodeAccessToken(token);
      ASSERT_TRUE(decoded.ok());
      AccessOptions lax;
      lax.authority = PeerId::FromPublicKey(decoded->authority);
      lax.clock_skew_seconds = 1e9;
      access = std::make_shared<AccessControl>(lax);
      Status set = access->SetOwnToken(decoded->peer, token);
      ASSERT_TRUE(set.ok()) << set.ToString();
    }
    o.access = access;
    Host outsider(std::move(self), o);
    ASSERT_TRUE(outsider.Start().ok());
    auto r = Echo(outsider, *server.host);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().ToString();
    // "... refused this peer: <reason>" (an outsider of another authority refuses the server
    // too, for the same reason: "refused peer ...: <reason>").
    EXPECT_NE(r.status().message().find("refused"), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find(cases[i].reason), std::string::npos)
        << r.status().ToString();
    ++refusals;
    ASSERT_TRUE(colony::test::WaitUntil(
        [&] { return server.host->access_refusals().count == refusals; }, 5s));
    EXPECT_NE(server.host->access_refusals().last.find(cases[i].reason), std::string::npos)
        << server.host->access_refusals().last;
  }
  EXPECT_EQ(refusals, cases.size());
  // The server still serves its swarm.
  KeyPair member_id = Seeded(40);
  const Bytes member_token =
      IssueAccessToken(authority, member_id.peer_id(), "member", AccessRole::kAny, now, 600);
  Peer member = StartPeer(std::move(member_id), Swarm(authority), member_token);
  EXPECT_TRUE(Echo(*member.host, *server.host).ok());
}

TEST(PrivateSwarm, APrivatePeerRefusesPublicListenersToo) {
  const KeyPair authority = Seeded(1);
  KeyPair a = Seeded(2);
  const Bytes ta = IssueAccessToken(authority, a.peer_id(), "a", AccessRole::kAny, Now(), 600);
  Peer member = StartPeer(std::move(a), Swarm(authority), ta);
  auto outsider = testing::StartHost();
  outsider->RegisterUnary(
      "echo", [](CallContext&, Message m) -> asio::awaitable<Result<Message>> { co_return m; });
  auto r = Echo(*member.host, *outsider);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().ToString();
  EXPECT_NE(r.status().message().find("refused"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("shows no access token"), std::string::npos)
      << r.status().ToString();
}

TEST(PrivateSwarm, AllowlistedPeersNeedNoToken) {
  AccessOptions options;
  options.allowlist = {Seeded(3).peer_id()};
  Peer server = StartPeer(Seeded(2), options);
  // Listed: admitted (the server's own list is checked; the client checks nobody).
  AccessOptions client_options;
  client_options.allowlist = {Seeded(2).peer_id()};
  Peer listed = StartPeer(Seeded(3), client_options);
  EXPECT_TRUE(Echo(*listed.host, *server.host).ok());
  Peer unlisted = StartPeer(Seeded(4), client_options);
  auto r = Echo(*unlisted.host, *server.host);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not on this swarm's allowlist"), std::string::npos)
      << r.status().ToString();
}

TEST(PrivateSwarm, ARoleLimitsWhatItsHolderMayCall) {
  const KeyPair authority = Seeded(1);
  KeyPair s = Seeded(2), c = Seeded(3);
  const double now = Now();
  Peer server = StartPeer(
      std::move(s), Swarm(authority),
      IssueAccessToken(authority, Seeded(2).peer_id(), "server", AccessRole::kAny, now, 600));
  server.host->RegisterUnary(
      "avg.run.join",
      [](CallContext&, Message m) -> asio::awaitable<Result<Message>> { co_return m; });
  server.host->RegisterUnary(
      "dht.find", [](CallContext&, Message m) -> asio::awaitable<Result<Message>> { co_return m; });
  Peer client = StartPeer(
      std::move(c), Swarm(authority),
      IssueAccessToken(authority, Seeded(3).peer_id(), "reader", AccessRole::kClient, now, 600));
  EXPECT_TRUE(Echo(*client.host, *server.host, "dht.find").ok());
  auto r = Echo(*client.host, *server.host, "avg.run.join");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().ToString();
  EXPECT_NE(r.status().message().find("role 'client'"), std::string::npos) << r.status().ToString();
}

TEST(PrivateSwarm, EachRoleMayMakeTheCallsOfTheCommandsItIsFor) {
  const KeyPair authority = Seeded(1);
  const double now = Now();
  Peer server = StartPeer(
      Seeded(2), Swarm(authority),
      IssueAccessToken(authority, Seeded(2).peer_id(), "server", AccessRole::kAny, now, 600));
  for (const char* method :
       {"dht.store", "dht.find", "avg.run.join", "serve.forward", "serve.backward", "serve.fence",
        "serve.inference", "moe.forward", "moe.backward"}) {
    server.host->RegisterUnary(
        method, [](CallContext&, Message m) -> asio::awaitable<Result<Message>> { co_return m; });
  }
  // What each command calls on others: a trainer (lm, moe-lm, swarm-lm) averages, calls experts
  // and a SWARM run's stage peers (block servers' forward, backward and fence, no inference
  // sessions); a block or expert server stores its records and pushes to the next server; a client
  // (generate, api, experts generate) reads the DHT, runs blocks (inference sessions too) and
  // experts' forward.
  const std::map<AccessRole, std::set<std::string>> allowed = {
      {AccessRole::kTrain,
       {"dht.store", "dht.find", "avg.run.join", "serve.forward", "serve.backward", "serve.fence",
        "moe.forward", "moe.backward"}},
      {AccessRole::kServe,
       {"dht.store", "dht.find", "serve.forward", "serve.backward", "serve.fence",
        "serve.inference"}},
      // An expert's backward trains it, and a client trains nothing.
      {AccessRole::kClient,
       {"dht.find", "serve.forward", "serve.backward", "serve.fence", "serve.inference",
        "moe.forward"}},
  };
  uint8_t seed = 3;
  for (const auto& [role, may] : allowed) {
    const KeyPair key = Seeded(seed);
    Peer caller = StartPeer(Seeded(seed++), Swarm(authority),
                            IssueAccessToken(authority, key.peer_id(), "caller", role, now, 600));
    for (const char* method :
         {"dht.store", "dht.find", "avg.run.join", "serve.forward", "serve.backward", "serve.fence",
          "serve.inference", "moe.forward", "moe.backward"}) {
      auto r = Echo(*caller.host, *server.host, method);
      if (may.count(method) != 0) {
        EXPECT_TRUE(r.ok()) << AccessRoleName(role) << " " << method << ": "
                            << r.status().ToString();
      } else {
        EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied)
            << AccessRoleName(role) << " " << method << ": " << r.status().ToString();
      }
    }
  }
}

// Short tokens (2 s, clocks trusted to 0.5 s) and a fast ticker, so that expiry shows in a test.
constexpr double kTtl = 2.0;
constexpr double kSkew = 0.5;

TEST(PrivateSwarm, ARevokedOrExpiredPeerLosesItsOpenConnection) {
  const KeyPair authority = Seeded(1);
  const double now = Now();
  Peer server = StartPeer(
      Seeded(2), Swarm(authority, kSkew),
      IssueAccessToken(authority, Seeded(2).peer_id(), "server", AccessRole::kAny, now, 600),
      400ms);
  // Revoked while connected.
  const Bytes fired =
      IssueAccessToken(authority, Seeded(3).peer_id(), "fired", AccessRole::kAny, now, 600);
  Peer revoked = StartPeer(Seeded(3), Swarm(authority, kSkew), fired, 400ms);
  ASSERT_TRUE(Echo(*revoked.host, *server.host).ok());
  server.access->Revoke(DecodeAccessToken(fired)->serial, now + 600);
  // Both ends must have seen the close: a call made before the revoked peer read it would go out
  // on the dying connection and fail with "closed the connection", not at a new handshake.
  EXPECT_TRUE(colony::test::WaitUntil([&] { return server.host->connection_count() == 0; }, 10s));
  EXPECT_TRUE(colony::test::WaitUntil([&] { return revoked.host->connection_count() == 0; }, 10s));
  auto again = Echo(*revoked.host, *server.host);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("revoked"), std::string::npos)
      << again.status().ToString();

  // Expired while connected, never renewed.
  Peer lapsing = StartPeer(
      Seeded(4), Swarm(authority, kSkew),
      IssueAccessToken(authority, Seeded(4).peer_id(), "lapsing", AccessRole::kAny, Now(), kTtl),
      400ms);
  ASSERT_TRUE(Echo(*lapsing.host, *server.host).ok());
  EXPECT_TRUE(colony::test::WaitUntil([&] { return server.host->connection_count() == 0; }, 10s));
}

// Renewal through a token file rewritten by an "authority" thread: over five token lifetimes,
// calls every 50 ms on one connection, and not one of them fails.
TEST(PrivateSwarm, TokensRenewWithoutFailingACall) {
  const KeyPair authority = Seeded(1);
  const auto dir =
      std::filesystem::temp_directory_path() / ("colony_access_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "client.token").string();
  auto write_token = [&](const PeerId& peer) {
    const std::string tmp = file + ".tmp";
    std::ofstream(tmp) << AccessTokenText(
        IssueAccessToken(authority, peer, "client", AccessRole::kAny, Now(), kTtl));
    std::filesystem::rename(tmp, file);
  };
  const PeerId client_id = Seeded(3).peer_id();
  write_token(client_id);
  Peer server = StartPeer(
      Seeded(2), Swarm(authority, kSkew),
      IssueAccessToken(authority, Seeded(2).peer_id(), "server", AccessRole::kAny, Now(), 600),
      400ms);
  TokenSource source;
  source.file = file;
  source.poll = 100ms;
  auto first = FetchAccessToken(source, client_id);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  Peer client = StartPeer(Seeded(3), Swarm(authority, kSkew), *first, 400ms);
  TokenRefresher refresher(*client.host, source);

  int calls = 0, failures = 0;
  {
    // The authority writes a fresh token every third of a lifetime.
    Periodic authority_issues(
        std::chrono::milliseconds(static_cast<int>(kTtl * 1000 / 3)),
        [&] { write_token(client_id); }, Periodic::Start::kAfterInterval);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(5 * kTtl);
    while (std::chrono::steady_clock::now() < until) {
      auto r = Echo(*client.host, *server.host);
      ++calls;
      if (!r.ok()) {
        ++failures;
        ADD_FAILURE() << r.status().ToString();
      }
      // The next call comes right after a renewal, or 50 ms after this one.
      const uint64_t renewed = refresher.renewals();
      (void)colony::test::WaitUntil([&] { return refresher.renewals() != renewed; }, 50ms);
    }
  }
  EXPECT_EQ(failures, 0) << "of " << calls << " calls";
  EXPECT_GE(refresher.renewals(), 4u);
  EXPECT_EQ(server.host->access_refusals().count, 0u);
  // One connection all along: renewals reached the open connection (TOKEN frames).
  EXPECT_EQ(server.host->connection_count(), 1u);
  RemoveTree(dir);
}

TEST(PrivateSwarm, ATokenCommandGetsThePeerIdAndItsFailureIsClear) {
  const KeyPair authority = Seeded(1);
  const PeerId self = Seeded(3).peer_id();
  const std::string text =
      AccessTokenText(IssueAccessToken(authority, self, "cmd", AccessRole::kAny, Now(), 60));
  TokenSource source;
  source.command = "test \"$COLONY_PEER_ID\" = " + self.ToString() + " && echo " + text;
  auto ok = FetchAccessToken(source, self);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(AccessTokenText(*ok), text);
  source.command = "echo nope >&2; exit 3";
  auto failed = FetchAccessToken(source, self);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("command"), std::string::npos)
      << failed.status().ToString();
}

}  // namespace
}  // namespace colony::net
