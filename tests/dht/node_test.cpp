// DHT nodes on real sockets: in-process swarms over loopback, hostile requests, and swarms of
// real `colony dht` processes driven through the CLI.
#include "dht/node.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "dht/wire.h"
#include "net/relay_wire.h"
#include "test_support.h"

namespace colony::dht {
namespace {

using namespace std::chrono_literals;
using colony::test::ColonyBinary;
using colony::test::ReadFile;
using colony::test::RunCli;

NodeOptions Opts(std::vector<std::string> initial = {}) {
  NodeOptions o;
  o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  o.initial_peers = std::move(initial);
  o.dht.request_timeout = 2s;
  return o;
}

std::string AddrOf(const Node& n) { return n.VisibleAddresses().at(0).ToString(); }

class TenNodes : public ::testing::Test {
 protected:
  void SetUp() override {
    auto first = Node::Start(KeyPair::Generate(), Opts());
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    nodes.push_back(std::move(*first));
    for (int i = 1; i < 10; ++i) {
      auto n = Node::Start(KeyPair::Generate(), Opts({AddrOf(*nodes[static_cast<size_t>(i) / 2])}));
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      nodes.push_back(std::move(*n));
    }
  }
  Node& Random() { return *nodes[std::uniform_int_distribution<size_t>(0, 9)(rng)]; }
  std::vector<std::unique_ptr<Node>> nodes;
  std::mt19937 rng{42};
};

TEST_F(TenNodes, StoreAndGetFromRandomNodes) {
  const double exp = Now() + 60;
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(Random().StoreSync("k" + std::to_string(i), "v" + std::to_string(i), exp).ok());
  }
  for (int i = 0; i < 20; ++i) {
    auto r = Random().GetSync("k" + std::to_string(i));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->value.value, "v" + std::to_string(i));
    EXPECT_EQ(r->value.expiration, exp);
  }
  auto many = Random().GetManySync({"k1", "k2", "missing"});
  ASSERT_EQ(many.size(), 3u);
  EXPECT_TRUE(many[0].ok() && many[1].ok());
  EXPECT_EQ(many[2].status().code(), StatusCode::kNotFound);
}

TEST_F(TenNodes, LatestSeesOverwrites) {
  const double t = Now();
  ASSERT_TRUE(nodes[1]->StoreSync("epoch", "1", t + 30).ok());
  ASSERT_EQ(nodes[7]->GetSync("epoch", Freshness::kLatest)->value.value, "1");
  ASSERT_TRUE(nodes[4]->StoreSync("epoch", "2", t + 40).ok());
  auto r = nodes[7]->GetSync("epoch", Freshness::kLatest);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->value.value, "2");
  EXPECT_EQ(nodes[2]->StoreSync("epoch", "0", t + 10).code(), StatusCode::kAlreadyExists);
}

TEST_F(TenNodes, SubkeysFromTwoNodesMergeAndCoroutineApiWorks) {
  const double t = Now();
  ASSERT_TRUE(nodes[2]->StoreSync("peers", "a", t + 30, "alice").ok());
  // The coroutine API, awaited on an executor of our own.
  asio::io_context io;
  std::optional<Status> stored;
  std::optional<Result<Record>> got;
  Node& bob = *nodes[5];
  Node& reader = *nodes[8];
  auto task = [&]() -> asio::awaitable<void> {
    stored = co_await bob.Store("peers", "b", t + 40, "bob");
    got = co_await reader.Get("peers", Freshness::kLatest);
  };
  asio::co_spawn(io, task, asio::detached);
  io.run();
  ASSERT_TRUE(stored && stored->ok());
  ASSERT_TRUE(got && got->ok()) << got->status().ToString();
  ASSERT_TRUE((*got)->is_dict);
  EXPECT_EQ((*got)->subkeys.size(), 2u);
  EXPECT_EQ((*got)->subkeys.at("alice").value, "a");
  EXPECT_EQ((*got)->subkeys.at("bob").value, "b");
  // The node thread that posted the last completion to `io` may still be inside that post (asio
  // signals io's condition variable after unlocking it): stop the nodes' threads before `io`
  // is destroyed (ThreadSanitizer reported the race).
  nodes.clear();
}

TEST_F(TenNodes, MalformedRequestsGetAnErrorAndTheNodeKeepsServing) {
  net::HostOptions ho;
  net::Host attacker(KeyPair::Generate(), ho);
  ASSERT_TRUE(attacker.Start().ok());
  const Multiaddr target = nodes[3]->VisibleAddresses().at(0);
  std::mt19937 junk(7);
  for (const char* method : {"dht.ping", "dht.store", "dht.find"}) {
    for (int i = 0; i < 20; ++i) {
      std::string bytes(static_cast<size_t>(i * 7), '\0');
      for (auto& c : bytes) c = static_cast<char>(junk());
      auto r = attacker.CallSync(target, method, net::Message(bytes));
      // Random bytes are occasionally a valid message (a ping whose clock is far off, an empty
      // store); otherwise a protocol error comes back.
      if (!r.ok()) {
        EXPECT_TRUE(r.status().code() == StatusCode::kProtocolError ||
                    r.status().code() == StatusCode::kFailedPrecondition)
            << r.status().ToString();
      }
    }
  }
  // A find with too many ids, and a store with a wrong-sized id.
  FindRequest many;
  many.ids.assign(kMaxFindIds + 1, DhtId::ForKey("x"));
  auto r = attacker.CallSync(target, "dht.find", net::Message(EncodeFindRequest(many)));
  EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(r.status().message().find("ids"), std::string::npos) << r.status().message();
  attacker.Shutdown();
  ASSERT_TRUE(nodes[3]->StoreSync("still-alive", "yes", Now() + 30).ok());
  EXPECT_EQ(nodes[6]->GetSync("still-alive")->value.value, "yes");
}

// A lookup runs over 1 to 8 disjoint paths; other counts are refused by name.
TEST(DhtNode, DisjointPathsOutsideTheirRangeAreRefusedByName) {
  for (size_t paths : {size_t{0}, kMaxDisjointPaths + 1}) {
    NodeOptions o;
    o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
    o.dht.disjoint_paths = paths;
    auto refused = Node::Start(KeyPair::Generate(), o);
    ASSERT_FALSE(refused.ok()) << paths;
    EXPECT_NE(refused.status().message().find("dht.disjoint_paths"), std::string::npos)
        << refused.status().ToString();
  }
}

TEST(DhtNode, DeadAndSilentBootstrapPeersGiveClearErrors) {
  // A port nobody listens on, and a socket that accepts but never speaks.
  const int silent = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(::listen(silent, 8), 0);
  socklen_t len = sizeof(sa);
  ::getsockname(silent, reinterpret_cast<sockaddr*>(&sa), &len);
  const std::string silent_addr = "/ip4/127.0.0.1/tcp/" + std::to_string(ntohs(sa.sin_port));
  const std::string dead_addr = "/ip4/127.0.0.1/tcp/1";

  NodeOptions o = Opts({dead_addr, silent_addr});
  o.dht.request_timeout = 1s;
  auto n = Node::Start(KeyPair::Generate(), o);
  ::close(silent);
  ASSERT_FALSE(n.ok());
  const std::string& m = n.status().message();
  EXPECT_EQ(n.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(m.find(dead_addr), std::string::npos) << m;
  EXPECT_NE(m.find("refused"), std::string::npos) << m;
  EXPECT_NE(m.find(silent_addr), std::string::npos) << m;
}

// A node whose only contact (its bootstrap peer) died has nobody left to ask; when the
// bootstrap peer comes back at the same address, Rejoin() finds it and the swarm behind it.
TEST(DhtNode, RejoinFindsARestartedBootstrapPeer) {
  const std::array<uint8_t, 32> seed{7};
  auto boot = Node::Start(KeyPair::FromSeed(seed), Opts());
  ASSERT_TRUE(boot.ok()) << boot.status().ToString();
  const std::string boot_addr = AddrOf(**boot);
  auto x = Node::Start(KeyPair::Generate(), Opts({boot_addr}));
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  (*boot)->Shutdown();
  boot->reset();
  EXPECT_FALSE((*x)->GetSync("after-restart").ok());  // its only contact fails

  NodeOptions again = Opts();
  again.listen = {Multiaddr::Parse(boot_addr)->WithoutPeerId()};
  auto restarted = Node::Start(KeyPair::FromSeed(seed), again);
  ASSERT_TRUE(restarted.ok()) << restarted.status().ToString();
  auto y = Node::Start(KeyPair::Generate(), Opts({boot_addr}));
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  ASSERT_TRUE((*y)->StoreSync("after-restart", "found", Now() + 60).ok());

  auto rejoined = (*x)->Rejoin();
  ASSERT_TRUE(rejoined.ok()) << rejoined.status().ToString();
  EXPECT_GE(*rejoined, 1u);
  auto got = (*x)->GetSync("after-restart");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->value.value, "found");
  // A node that started a swarm has nothing to rejoin: the error says so.
  auto first = (*restarted)->Rejoin();
  EXPECT_EQ(first.status().code(), StatusCode::kFailedPrecondition);
}

TEST(DhtNode, ClientModeNodeWorksWithoutListening) {
  auto server = Node::Start(KeyPair::Generate(), Opts());
  ASSERT_TRUE(server.ok());
  NodeOptions o;
  o.initial_peers = {AddrOf(**server)};
  auto client = Node::Start(KeyPair::Generate(), o);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_TRUE((*client)->client_mode());
  EXPECT_TRUE((*client)->VisibleAddresses().empty());
  ASSERT_TRUE((*client)->StoreSync("c", "1", Now() + 30).ok());
  EXPECT_EQ((*server)->GetSync("c")->value.value, "1");
  EXPECT_EQ((*server)->RoutingTableSize(), 0u);  // the client is in nobody's table
}

// NodeOptions::announce replaces the listen addresses in what others learn (the DHT's contacts,
// VisibleAddresses), and others reach the node through it.
TEST(DhtNode, AnnouncedAddressesReplaceTheListenAddressesEverywhere) {
  net::HostOptions host_options;
  host_options.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  auto host = std::make_shared<net::Host>(KeyPair::Generate(), host_options);
  ASSERT_TRUE(host->Start().ok());
  const uint16_t port = host->ListenAddresses().at(0).port();
  // Nothing listens on 127.0.0.9: a dialer must move on to the second address.
  const std::vector<std::string> announced = {fmt::format("/ip4/127.0.0.9/tcp/{}", port),
                                              fmt::format("/ip4/127.0.0.1/tcp/{}", port)};
  NodeOptions o = Opts();
  for (const auto& a : announced) o.announce.push_back(*Multiaddr::Parse(a));
  auto a = Node::Attach(host, o);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ((*a)->VisibleAddresses().size(), 2u);
  EXPECT_EQ((*a)->VisibleAddresses()[0].ToString(),
            announced[0] + "/p2p/" + host->peer_id().ToString());
  EXPECT_FALSE((*a)->client_mode());
  // b joins through a's real address, c through b. A bootstrap contact is known at the address
  // it was dialed at; a node's own requests then tell the others where it says it is.
  auto b = Node::Start(KeyPair::Generate(), Opts({host->ListenAddresses().at(0).ToString()}));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto c = Node::Start(KeyPair::Generate(), Opts({AddrOf(**b)}));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE((*a)->StoreSync("announced", "1", Now() + 30).ok());  // a's stores reach b and c
  for (const auto& node : {b->get(), c->get()}) {
    const auto known = node->KnownPeers();
    auto it = std::find_if(known.begin(), known.end(),
                           [&](const Contact& k) { return k.peer == host->peer_id(); });
    ASSERT_NE(it, known.end());
    EXPECT_EQ(it->addrs, announced);
  }
  // d, joining through c, learns a from c and dials it there (its join looks itself up among
  // all four): past the address that leads nowhere, at the second one.
  auto d = Node::Start(KeyPair::Generate(), Opts({AddrOf(**c)}));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_TRUE((*d)->StoreSync("from d", "2", Now() + 30).ok());  // a is one of the 4 nearest
  EXPECT_NE((*d)->host().FindConnection(host->peer_id()), nullptr);
  auto r = (*a)->GetSync("from d");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->value.value, "2");
}

TEST(DhtNode, AnnounceAddressesThatCannotBeRightAreRefusedByName) {
  const std::string other = KeyPair::Generate().peer_id().ToString();
  const PeerId relay = KeyPair::Generate().peer_id();
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {"/ip4/198.51.100.7/tcp/4000/p2p/" + other, "names another peer's id"},
           {"/ip4/198.51.100.7/tcp/0", "has no port"},
           {"/ip4/198.51.100.7/tcp/4000/p2p/" + relay.ToString() + "/p2p-circuit/p2p/" + other,
            "is relayed"}}) {
    NodeOptions o = Opts();
    o.announce = {*Multiaddr::Parse(text)};
    auto n = Node::Start(KeyPair::Generate(), o);
    ASSERT_FALSE(n.ok()) << text;
    EXPECT_NE(n.status().message().find(expected), std::string::npos) << n.status().ToString();
    EXPECT_NE(n.status().message().find("announce address"), std::string::npos);
  }
  NodeOptions client;
  client.dht.client_mode = true;
  client.listen = Opts().listen;
  client.announce = {*Multiaddr::Parse("/ip4/198.51.100.7/tcp/4000")};
  auto n = Node::Start(KeyPair::Generate(), client);
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("announce addresses need a node that listens"),
            std::string::npos)
      << n.status().ToString();
}

// Whether every one of `addrs` is a loopback address: a node listening on every interface of a
// machine that has no other asks nobody to dial it back, so the tests of dial-backs skip there.
bool OnlyLoopback(const std::vector<Multiaddr>& addrs) {
  return std::all_of(addrs.begin(), addrs.end(), [](const Multiaddr& a) {
    return a.host().rfind("127.", 0) == 0 || a.host() == "::1";
  });
}
constexpr char kOnlyLoopback[] =
    "this machine has no interface but loopback: a node on it asks nobody to dial it back";

// A public node whose initial peer has gone asks peers of its routing table to dial it back, and
// any peer can claim to have reached it anywhere: an address it did not listen on replaces its
// own only when two of them agree (as a router's new address would be seen by all).
TEST(DhtNode, RoutingTablePeersMoveAPublicNodesAddressOnlyWhenTwoAgree) {
  auto boot = Node::Start(KeyPair::Generate(), Opts());
  ASSERT_TRUE(boot.ok()) << boot.status().ToString();
  // Two peers whose dial-back answers name any address they like for the node's port and id.
  struct Liar {
    std::unique_ptr<Node> node;
    std::shared_ptr<std::atomic<int>> asked = std::make_shared<std::atomic<int>>(0);
  };
  std::mutex mu;
  std::string id, port;               // the node's, once it runs; guarded by mu
  std::array<std::string, 2> claims;  // each liar's IP; guarded by mu
  std::vector<Liar> liars(2);
  for (size_t i = 0; i < liars.size(); ++i) {
    auto n = Node::Start(KeyPair::Generate(), Opts({AddrOf(**boot)}));
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    liars[i].node = std::move(*n);
    liars[i].node->host().RegisterUnary(
        "net.dialback",
        [&mu, &id, &port, &claims, i, asked = liars[i].asked](
            net::CallContext&, net::Message) -> asio::awaitable<Result<net::Message>> {
          std::string answer;
          {
            std::lock_guard lock(mu);
            answer = fmt::format("reachable /ip4/{}/tcp/{}/p2p/{}", claims[i], port, id);
          }
          ++*asked;
          co_return net::Message(answer);
        });
  }
  NodeOptions o = Opts({AddrOf(**boot)});
  o.listen = {*Multiaddr::Parse("/ip4/0.0.0.0/tcp/0")};
  o.reachability_recheck = 100ms;
  std::atomic<int> changes{0};
  o.on_addresses_changed = [&](const std::vector<Multiaddr>&) { ++changes; };
  auto node = Node::Start(KeyPair::Generate(), o);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  const std::vector<Multiaddr> own = (*node)->VisibleAddresses();
  if (OnlyLoopback(own)) GTEST_SKIP() << kOnlyLoopback;
  {
    std::lock_guard lock(mu);
    id = (*node)->peer_id().ToString();
    port = std::to_string(own.at(0).port());
    claims = {"198.51.100.7", "198.51.100.8"};
  }
  // Both liars must be in the node's routing table: it looks itself up among all four.
  ASSERT_TRUE((*node)->StoreSync("seen by all", "1", Now() + 30).ok());
  (*boot)->Shutdown();  // the initial peer, whose word was taken, is gone
  const auto asked_each = [&](int n) {
    const auto until = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < until) {
      if (*liars[0].asked >= n && *liars[1].asked >= n) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  };
  const auto claimed = [&](const std::string& ip) {
    for (const Multiaddr& a : (*node)->VisibleAddresses()) {
      if (a.host() == ip) return true;
    }
    return false;
  };
  // Each names another address, three times over: neither is taken.
  ASSERT_TRUE(asked_each(3)) << "the node did not ask its routing table's peers";
  EXPECT_FALSE(claimed("198.51.100.7"));
  EXPECT_FALSE(claimed("198.51.100.8"));
  EXPECT_EQ(changes.load(), 0);
  // They agree: the node takes the address, before its loopback ones.
  {
    std::lock_guard lock(mu);
    claims = {"198.51.100.9", "198.51.100.9"};
  }
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (!claimed("198.51.100.9") && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(claimed("198.51.100.9"));
  EXPECT_EQ((*node)->VisibleAddresses().size(), own.size() + 1);
  while (changes.load() == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(changes.load(), 1);
  // Reached at one of its own interfaces' addresses (as helpers on its LAN would): that says
  // nothing about its router's, which stays.
  {
    std::lock_guard lock(mu);
    claims = {"127.0.0.1", "127.0.0.1"};
  }
  const int asked = std::min(liars[0].asked->load(), liars[1].asked->load());
  ASSERT_TRUE(asked_each(asked + 3));
  EXPECT_TRUE(claimed("198.51.100.9"));
  EXPECT_EQ(changes.load(), 1);
  (*node)->Shutdown();
  for (auto& l : liars) l.node->Shutdown();
}

// Dial-back answers, scripted: reached at the port asked about, on loopback (one of the node's
// own interfaces' addresses, so its addresses stay what they were), not reached, or no answer.
enum class Says { kReached, kUnreachable, kNothing };
struct Helper {
  std::shared_ptr<std::atomic<Says>> says = std::make_shared<std::atomic<Says>>(Says::kReached);
  std::shared_ptr<std::atomic<int>> asked = std::make_shared<std::atomic<int>>(0);  // dial-backs
  // The first this many dial-backs are answered as a helper busy with others answers them.
  std::shared_ptr<std::atomic<int>> busy_first = std::make_shared<std::atomic<int>>(0);
};

// `node` answers dial-backs as `h` says.
void Script(Node& node, const Helper& h) {
  node.host().RegisterUnary(
      "net.dialback",
      [h](net::CallContext& ctx, net::Message m) -> asio::awaitable<Result<net::Message>> {
        if (++*h.asked <= h.busy_first->load()) {
          co_return ResourceExhausted("this peer is busy dialing others back; ask another");
        }
        auto ports = net::ParseDialbackPorts(m.meta);
        if (!ports.ok()) co_return ports.status();
        switch (h.says->load()) {
          case Says::kReached:
            co_return net::Message(fmt::format("reachable /ip4/127.0.0.1/tcp/{}/p2p/{}",
                                               ports->at(0), ctx.peer().ToString()));
          case Says::kUnreachable:
            co_return net::Message("unreachable UNAVAILABLE");
          case Says::kNothing:
            break;
        }
        co_return Unavailable("no answer today");
      });
}

// A bootstrap node that also runs a relay, on loopback.
NodeOptions RelayingOpts() {
  NodeOptions o = Opts();
  o.relay_service = net::RelayOptions{};
  o.relay_service->listen = *Multiaddr::Parse("/ip4/127.0.0.1/tcp/0");
  return o;
}

// One node per helper, joined through `boot`, answering dial-backs as its helper says.
std::vector<std::unique_ptr<Node>> ScriptedPeers(const Node& boot,
                                                 const std::vector<Helper>& helpers) {
  std::vector<std::unique_ptr<Node>> out;
  for (const Helper& h : helpers) {
    auto n = Node::Start(KeyPair::Generate(), Opts({AddrOf(boot)}));
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    if (!n.ok()) break;
    Script(**n, h);
    out.push_back(std::move(*n));
  }
  return out;
}

// What a node's NodeOptions::on_addresses_changed told, in order.
class AddressChanges {
 public:
  void Listen(NodeOptions& o) {
    o.on_addresses_changed = [this](const std::vector<Multiaddr>& now) {
      std::lock_guard lock(mu_);
      told_.push_back(now);
    };
  }
  size_t count() const {
    std::lock_guard lock(mu_);
    return told_.size();
  }
  std::vector<Multiaddr> at(size_t i) const {
    std::lock_guard lock(mu_);
    return told_.at(i);
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::vector<Multiaddr>> told_;  // guarded by mu_
};

// That `node` serves the DHT directly at `own`, holding no reservation at `relaying` (the relay of
// the node it left): a peer that joins through its address alone finds a record it stores.
void ExpectServesDirectlyAt(Node& node, const Node& relaying, const std::vector<Multiaddr>& own) {
  EXPECT_FALSE(node.client_mode());
  EXPECT_TRUE(node.publicly_reachable());
  EXPECT_EQ(node.VisibleAddresses(), own);
  EXPECT_TRUE(test::WaitUntil([&] { return relaying.relay()->stats().reservations == 0; }, 10s));
  ASSERT_TRUE(node.StoreSync("served directly", "yes", Now() + 30).ok());
  auto late = Node::Start(KeyPair::Generate(), Opts({own.back().ToString()}));
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  auto got = (*late)->GetSync("served directly");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->value.value, "yes");
}

// A public node whose router stops forwarding its port, and later forwards it again: its dial-back
// checks find that its initial peer (which also runs a relay) can no longer reach it, so it
// reserves with the relay, runs its DHT as a client and is called through the relayed address;
// once the initial peer reaches it again it serves the DHT at its own addresses and drops the
// reservation. Before that, two routing-table peers that answer that they cannot reach it, while
// the initial peer does not answer, move nothing (any peer could say so).
TEST(DhtNode, APublicNodeThatItsInitialPeerCannotReachMovesBehindARelayAndBack) {
  auto boot = Node::Start(KeyPair::Generate(), RelayingOpts());
  ASSERT_TRUE(boot.ok()) << boot.status().ToString();
  Helper initial;
  Script(**boot, initial);
  std::vector<Helper> other_helpers(2);
  for (const Helper& h : other_helpers) h.says->store(Says::kUnreachable);
  const std::vector<std::unique_ptr<Node>> others = ScriptedPeers(**boot, other_helpers);
  ASSERT_EQ(others.size(), 2u);
  NodeOptions o = Opts({AddrOf(**boot)});
  o.listen = {*Multiaddr::Parse("/ip4/0.0.0.0/tcp/0")};
  o.reachability_recheck = 100ms;
  o.relay_failover = 1s;
  AddressChanges told;
  told.Listen(o);
  auto node = Node::Start(KeyPair::Generate(), o);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  const std::vector<Multiaddr> own = (*node)->VisibleAddresses();
  if (OnlyLoopback(own)) GTEST_SKIP() << kOnlyLoopback;
  ASSERT_FALSE((*node)->client_mode());
  (*node)->host().RegisterUnary(
      "hello", [](net::CallContext&, net::Message m) -> asio::awaitable<Result<net::Message>> {
        co_return m;
      });
  // The other two must be in the node's routing table: it looks itself up among all four.
  ASSERT_TRUE((*node)->StoreSync("seen by all", "1", Now() + 30).ok());

  // The initial peer does not answer; the routing table's peers say they cannot reach the node,
  // each three times over: it stays a DHT server at its addresses.
  initial.says->store(Says::kNothing);
  const int before = std::min(other_helpers[0].asked->load(), other_helpers[1].asked->load());
  ASSERT_TRUE(test::WaitUntil(
      [&] {
        return *other_helpers[0].asked >= before + 3 && *other_helpers[1].asked >= before + 3;
      },
      60s))
      << "the node did not ask its routing table's peers";
  EXPECT_FALSE((*node)->client_mode());
  EXPECT_TRUE((*node)->publicly_reachable());
  EXPECT_EQ((*node)->VisibleAddresses(), own);
  EXPECT_EQ(told.count(), 0u);

  // The initial peer cannot reach it: behind the relay, called through it.
  initial.says->store(Says::kUnreachable);
  ASSERT_TRUE(test::WaitUntil([&] { return told.count() == 1; }, 60s))
      << "the node did not move behind the relay";
  EXPECT_TRUE((*node)->client_mode());
  EXPECT_FALSE((*node)->publicly_reachable());
  const std::vector<Multiaddr> relayed = (*node)->VisibleAddresses();
  ASSERT_EQ(relayed.size(), 1u);
  EXPECT_EQ(told.at(0), relayed);
  ASSERT_TRUE(relayed[0].is_relayed() && relayed[0].relay_id());
  EXPECT_EQ(*relayed[0].relay_id(), (*boot)->peer_id());
  EXPECT_EQ((*boot)->relay()->stats().reservations, 1u);
  net::Host caller(KeyPair::Generate(), net::HostOptions{});
  ASSERT_TRUE(caller.Start().ok());
  auto reply = caller.CallSync(relayed[0], "hello", net::Message("through the relay"));
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->meta, "through the relay");
  // As a client it still stores records with the others.
  ASSERT_TRUE((*node)->StoreSync("from behind the relay", "2", Now() + 30).ok());
  auto got = others[0]->GetSync("from behind the relay");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->value.value, "2");

  // Reached again: a DHT server at its own addresses, without the reservation.
  initial.says->store(Says::kReached);
  ASSERT_TRUE(test::WaitUntil([&] { return told.count() == 2; }, 60s))
      << "the node did not come back from behind the relay";
  EXPECT_EQ(told.at(1), own);
  ExpectServesDirectlyAt(**node, **boot, own);
  (*node)->Shutdown();
}

// A node that its initial peer (which runs a relay) cannot dial back at start runs behind the relay
// as a DHT client, as before; it keeps asking that peer, waiting twice as long after each answer
// that leaves it there, and never asks the routing table's peers (which here would claim to reach
// it: their word alone changes nothing behind a relay). Once the initial peer reaches it (its
// router now forwards the port), it serves the DHT at its own addresses, drops the reservation,
// and a peer that joins through its address alone finds a record there.
TEST(DhtNode, ANodeThatStartsBehindNatServesTheDhtOnceItsInitialPeerReachesIt) {
  auto boot = Node::Start(KeyPair::Generate(), RelayingOpts());
  ASSERT_TRUE(boot.ok()) << boot.status().ToString();
  Helper initial;
  initial.says->store(Says::kUnreachable);
  Script(**boot, initial);
  const std::vector<Helper> other_helpers(2);  // they would say they reach it
  const std::vector<std::unique_ptr<Node>> others = ScriptedPeers(**boot, other_helpers);
  ASSERT_EQ(others.size(), 2u);
  NodeOptions o = Opts({AddrOf(**boot)});
  o.listen = {*Multiaddr::Parse("/ip4/0.0.0.0/tcp/0")};
  o.reachability_recheck = 100ms;
  AddressChanges told;
  told.Listen(o);
  const auto started = std::chrono::steady_clock::now();
  auto node = Node::Start(KeyPair::Generate(), o);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  const std::vector<Multiaddr> own = (*node)->host().ListenAddresses();
  if (OnlyLoopback(own)) GTEST_SKIP() << kOnlyLoopback;
  EXPECT_TRUE((*node)->client_mode());
  EXPECT_FALSE((*node)->publicly_reachable());
  const std::vector<Multiaddr> relayed = (*node)->VisibleAddresses();
  ASSERT_EQ(relayed.size(), 1u);
  EXPECT_TRUE(relayed[0].is_relayed());
  // The others must be in the node's routing table: it looks the key up among all four.
  ASSERT_TRUE((*node)->StoreSync("seen by all", "1", Now() + 30).ok());

  // Asked at start, then after 100, 200, 400 and 800 ms: at least 1.5 s for five questions (an
  // unchanging pace would ask them within 0.4 s and some milliseconds).
  ASSERT_TRUE(test::WaitUntil([&] { return *initial.asked >= 5; }, 60s))
      << "the node behind NAT did not ask its initial peer again";
  EXPECT_GE(std::chrono::steady_clock::now() - started, 1500ms);
  EXPECT_EQ(*other_helpers[0].asked, 0);
  EXPECT_EQ(*other_helpers[1].asked, 0);
  EXPECT_TRUE((*node)->client_mode());
  EXPECT_EQ(told.count(), 0u);

  // Reached: a DHT server at its own addresses, without the reservation.
  initial.says->store(Says::kReached);
  ASSERT_TRUE(test::WaitUntil([&] { return told.count() > 0; }, 60s))
      << "the node did not come out from behind the relay";
  EXPECT_EQ(told.count(), 1u);
  EXPECT_EQ(told.at(0), own);
  ExpectServesDirectlyAt(**node, **boot, own);
  (*node)->Shutdown();
}

// A node's only initial peer is busy dialing others back when the node starts (it runs 4
// dial-backs at once; here it says so twice): the node asks again after a pause, and takes the
// answer (that it cannot be reached) instead of taking itself for public for want of one.
TEST(DhtNode, AnInitialPeerBusyWithOtherDialBacksIsAskedAgain) {
  auto boot = Node::Start(KeyPair::Generate(), RelayingOpts());
  ASSERT_TRUE(boot.ok()) << boot.status().ToString();
  Helper initial;
  initial.says->store(Says::kUnreachable);
  initial.busy_first->store(2);
  Script(**boot, initial);
  NodeOptions o = Opts({AddrOf(**boot)});
  o.listen = {*Multiaddr::Parse("/ip4/0.0.0.0/tcp/0")};
  auto node = Node::Start(KeyPair::Generate(), o);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  if (OnlyLoopback((*node)->host().ListenAddresses())) GTEST_SKIP() << kOnlyLoopback;
  EXPECT_EQ(initial.asked->load(), 3);
  EXPECT_TRUE((*node)->client_mode());
  EXPECT_FALSE((*node)->publicly_reachable());
  const std::vector<Multiaddr> relayed = (*node)->VisibleAddresses();
  ASSERT_EQ(relayed.size(), 1u);
  EXPECT_TRUE(relayed[0].is_relayed());
  (*node)->Shutdown();
}

// Nodes ask their initial peers to dial them back in an order of each check's own: 30 nodes that
// name the same two initial peers, which both answer that they reach them, ask both (the first
// answer that reaches a node is taken, so with a fixed order only the first peer would be asked;
// with a random one, all 30 pick the same peer first about once in 500 million runs).
TEST(DhtNode, NodesSpreadTheirDialBackQuestionsOverTheirInitialPeers) {
  auto first = Node::Start(KeyPair::Generate(), Opts());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = Node::Start(KeyPair::Generate(), Opts({AddrOf(**first)}));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  const std::vector<Helper> helpers(2);
  Script(**first, helpers[0]);
  Script(**second, helpers[1]);
  NodeOptions o = Opts({AddrOf(**first), AddrOf(**second)});
  o.listen = {*Multiaddr::Parse("/ip4/0.0.0.0/tcp/0")};
  for (int i = 0; i < 30; ++i) {
    auto node = Node::Start(KeyPair::Generate(), o);
    ASSERT_TRUE(node.ok()) << node.status().ToString();
    if (OnlyLoopback((*node)->host().ListenAddresses())) GTEST_SKIP() << kOnlyLoopback;
    EXPECT_FALSE((*node)->client_mode());
    (*node)->Shutdown();
  }
  EXPECT_EQ(*helpers[0].asked + *helpers[1].asked, 30);
  EXPECT_GT(helpers[0].asked->load(), 0);
  EXPECT_GT(helpers[1].asked->load(), 0);
}

// A node behind NAT (here: told it is private) that picked a relay announced in the DHT moves to
// another announced relay when its relay goes away, and is reachable through the new one.
TEST(DhtNode, APrivateNodeMovesToAnotherRelayWhenItsRelayDies) {
  auto boot = Node::Start(KeyPair::Generate(), Opts());
  ASSERT_TRUE(boot.ok()) << boot.status().ToString();
  std::vector<std::unique_ptr<Node>> relays;
  for (int i = 0; i < 2; ++i) {
    NodeOptions o = Opts({AddrOf(**boot)});
    o.relay_service = net::RelayOptions{};
    o.relay_service->listen = *Multiaddr::Parse("/ip4/127.0.0.1/tcp/0");
    auto r = Node::Start(KeyPair::Generate(), o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    relays.push_back(std::move(*r));
  }
  // Both relays are announced before the private node looks.
  ASSERT_TRUE(test::WaitUntil(
      [&] {
        auto got = (*boot)->GetSync(kRelaysKey);
        return got.ok() && got->is_dict && got->subkeys.size() == 2;
      },
      20s))
      << "the relays were not announced";
  NodeOptions po = Opts({AddrOf(**boot)});
  po.reachability = NodeOptions::Reachability::kPrivate;
  po.relay_failover = 1s;
  auto priv = Node::Start(KeyPair::Generate(), po);
  ASSERT_TRUE(priv.ok()) << priv.status().ToString();
  (*priv)->host().RegisterUnary(
      "hello", [](net::CallContext&, net::Message m) -> asio::awaitable<Result<net::Message>> {
        co_return m;
      });
  ASSERT_EQ((*priv)->VisibleAddresses().size(), 1u);
  const Multiaddr first = (*priv)->VisibleAddresses()[0];
  ASSERT_TRUE(first.is_relayed() && first.relay_id());
  size_t dead = relays[0]->peer_id() == *first.relay_id() ? 0 : 1;
  ASSERT_EQ(relays[dead]->peer_id(), *first.relay_id());
  relays[dead]->Shutdown();

  const PeerId other = relays[1 - dead]->peer_id();
  std::optional<Multiaddr> now;
  ASSERT_TRUE(test::WaitUntil(
      [&] {
        auto v = (*priv)->VisibleAddresses();
        if (v.size() == 1 && v[0].relay_id() == other) now = v[0];
        return now.has_value();
      },
      30s))
      << "the node did not move to the other relay";
  net::Host caller(KeyPair::Generate(), net::HostOptions{});
  ASSERT_TRUE(caller.Start().ok());
  auto reply = caller.CallSync(*now, "hello", net::Message("through the new relay"));
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->meta, "through the new relay");
}

TEST(DhtNode, ManyNodesStartedAtOnceFromOneBootstrapPeerFormOneSwarm) {
  auto boot = Node::Start(KeyPair::Generate(), Opts());
  ASSERT_TRUE(boot.ok());
  const std::string addr = AddrOf(**boot);
  const size_t n = 24;
  std::vector<std::unique_ptr<Node>> nodes(n);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      auto node = Node::Start(KeyPair::Generate(), Opts({addr}));
      if (node.ok()) nodes[i] = std::move(*node);
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < n; ++i) ASSERT_NE(nodes[i], nullptr) << i;
  threads.clear();
  // Everyone publishes at once, then everyone reads everyone's record.
  const double exp = Now() + 120;
  std::atomic<size_t> stored{0}, found{0};
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      if (nodes[i]
              ->StoreSync("member." + std::to_string(i), nodes[i]->peer_id().ToString(), exp)
              .ok()) {
        ++stored;
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(stored.load(), n);
  threads.clear();
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      std::vector<std::string> keys;
      for (size_t j = 0; j < n; ++j) keys.push_back("member." + std::to_string(j));
      auto rs = nodes[i]->GetManySync(keys);
      for (size_t j = 0; j < n; ++j) {
        if (rs[j].ok() && rs[j]->value.value == nodes[j]->peer_id().ToString()) ++found;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(found.load(), n * n);
}

// ---------------------------------------------------------------------------------------------
// Real processes

TEST(DhtProcesses, TwentyProcessesOnLoopback) {
  std::vector<Subprocess> procs;
  std::vector<std::string> addrs;
  for (int i = 0; i < 20; ++i) {
    std::vector<std::string> argv{ColonyBinary(), "--log-level", "warn",
                                  "dht",          "--listen",    "/ip4/127.0.0.1/tcp/0"};
    if (i > 0) {
      argv.push_back("--initial-peers");
      argv.push_back(addrs[static_cast<size_t>(i - 1) / 3]);
    }
    auto p = Subprocess::Spawn(argv);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    auto line = p->ReadLine(20s);
    ASSERT_TRUE(line.ok()) << "process " << i << ": " << line.status().ToString();
    ASSERT_EQ(line->rfind("/ip4/", 0), 0u) << *line;
    addrs.push_back(*line);
    procs.push_back(std::move(*p));
  }
  // Store through some processes, read through others, as a script would.
  for (int i = 0; i < 5; ++i) {
    auto r = RunCli({"dht", "store", "proc.key" + std::to_string(i), "value" + std::to_string(i),
                     "--ttl", "120", "--initial-peers", addrs[static_cast<size_t>(i * 3)]});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(nlohmann::json::parse(r.out)["stored"].get<bool>());
  }
  ASSERT_EQ(
      RunCli({"dht", "store", "proc.dict", "x", "--subkey", "s1", "--initial-peers", addrs[4]})
          .code,
      0);
  ASSERT_EQ(
      RunCli({"dht", "store", "proc.dict", "y", "--subkey", "s2", "--initial-peers", addrs[17]})
          .code,
      0);
  for (int i = 0; i < 5; ++i) {
    // One lookup path, and the most there may be (--disjoint-paths), find the same.
    auto r = RunCli({"dht", "get", "proc.key" + std::to_string(i), "--initial-peers",
                     addrs[static_cast<size_t>(19 - i * 2)], "--disjoint-paths",
                     i % 2 == 0 ? "1" : "8"});
    ASSERT_EQ(r.code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["value"], "value" + std::to_string(i));
    EXPECT_GT(j["expiration"].get<double>(), Now() + 100);
  }
  auto d = RunCli({"dht", "get", "proc.dict", "--latest", "--initial-peers", addrs[10]});
  ASSERT_EQ(d.code, 0) << d.err;
  auto j = nlohmann::json::parse(d.out);
  EXPECT_EQ(j["subkeys"]["s1"]["value"], "x");
  EXPECT_EQ(j["subkeys"]["s2"]["value"], "y");
  auto missing = RunCli({"dht", "get", "proc.nothing", "--initial-peers", addrs[0]});
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.err.find("no value for key 'proc.nothing'"), std::string::npos) << missing.err;
  // SIGTERM shuts every process down cleanly.
  for (auto& p : procs) p.Signal(SIGTERM);
  for (auto& p : procs) {
    auto code = p.Wait(10s);
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 0);
  }
}

TEST(DhtProcesses, DeadBootstrapPeerGivesAClearError) {
  auto r =
      RunCli({"dht", "get", "x", "--request-timeout", "1", "--initial-peers",
              "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWPLrYxXf8n6itRjt4LH7G7CNH34Hzs5BmPLoqCaX8eNog"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("colony: error: DHT bootstrap failed: none of the 1 initial peers"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("/ip4/127.0.0.1/tcp/1"), std::string::npos) << r.err;
  // A malformed address is a usage error, found as the command line is parsed.
  auto bad = RunCli({"dht", "store", "k", "v", "--initial-peers", "/ip4/nonsense"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("colony: error: --initial-peers"), std::string::npos) << bad.err;
  auto paths =
      RunCli({"dht", "get", "k", "--disjoint-paths", "9", "--initial-peers",
              "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWPLrYxXf8n6itRjt4LH7G7CNH34Hzs5BmPLoqCaX8eNog"});
  EXPECT_EQ(paths.code, 2);
  EXPECT_NE(paths.err.find("--disjoint-paths: Value 9 not in range"), std::string::npos)
      << paths.err;
}

}  // namespace
}  // namespace colony::dht
