// Attacks on DHT records (issue 15, part 1), through real sockets: a forger tries to replace,
// wipe, fill or park records that owners signed, on nodes with the record rules every command
// installs, while honest peers keep storing and reading beside it. And the attack of the issue,
// typed as a user would, against real `colony dht` processes.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <nlohmann/json.hpp>
#include <thread>

#include "adversary/attack_measurements.h"
#include "adversary/hostile_peer.h"
#include "dht/node.h"
#include "serve/records.h"
#include "test_support.h"
#include "tools/record_rules.h"

namespace colony::dht {
namespace {

using namespace std::chrono_literals;
using test::DialingFrom;
using test::HostilePeer;

constexpr double kDay = 24 * 3600.0;

NodeOptions GuardedOptions(std::vector<std::string> initial) {
  NodeOptions o;
  o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  o.initial_peers = std::move(initial);
  o.dht.request_timeout = 2s;
  // Small enough that filling a dictionary takes a few requests; the rule does not depend on it.
  o.dht.storage.max_subkeys = 64;
  o.validators = {cli::SwarmRecordRules()};
  return o;
}

// Honest peers storing and reading their own keys in a loop, timing each store+get.
class HonestLoad {
 public:
  HonestLoad(Node& writer, Node& reader) : writer_(writer), reader_(reader) {}
  ~HonestLoad() { Stop(); }
  // Runs `n` rounds on this thread (the unattacked baseline).
  void RunRounds(int n) {
    for (int i = 0; i < n; ++i) Round(latencies_before_);
  }
  void StartInBackground() {
    thread_ = std::thread([this] {
      while (!stop_.load()) Round(latencies_during_);
    });
  }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int failures() const { return failures_.load(); }
  const std::vector<double>& before() const { return latencies_before_; }
  const std::vector<double>& during() const { return latencies_during_; }

 private:
  void Round(std::vector<double>& latencies) {
    const std::string key = "honest." + std::to_string(round_++);
    const auto t0 = std::chrono::steady_clock::now();
    Status stored = writer_.StoreSync(key, "v", Now() + 60);
    auto got = reader_.GetSync(key, Freshness::kLatest);
    latencies.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (!stored.ok() || !got.ok() || got->value.value != "v") ++failures_;
  }
  Node& writer_;
  Node& reader_;
  int round_ = 0;
  std::atomic<int> failures_{0};
  std::atomic<bool> stop_{false};
  std::vector<double> latencies_before_, latencies_during_;
  std::thread thread_;
};

class AttackedSwarm : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 5; ++i) {
      std::vector<std::string> initial;
      if (i > 0) initial.push_back(nodes[0]->VisibleAddresses().at(0).ToString());
      auto n = Node::Start(KeyPair::Generate(), GuardedOptions(initial));
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      nodes.push_back(std::move(*n));
    }
    ASSERT_TRUE(attacker.start_error().ok()) << attacker.start_error().ToString();
  }
  // The attacker sends the same request to every node: it does not matter which are replicas.
  std::vector<std::vector<Status>> AtEveryNode(const std::vector<StoreItem>& items) {
    std::vector<std::vector<Status>> out;
    for (const auto& n : nodes) {
      auto r = attacker.Store(n->VisibleAddresses().at(0), items);
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      out.push_back(r.ok() ? *r : std::vector<Status>{});
    }
    return out;
  }
  void ExpectBenign(const HonestLoad& load) {
    EXPECT_EQ(load.failures(), 0);
    ASSERT_FALSE(load.during().empty());
    const double slowdown = test::RecordHonestSlowdown(load.before(), load.during());
    std::printf("honest store+get: median %.1f ms unattacked, %.1f ms under attack (%zu rounds)\n",
                1e3 * test::Median(load.before()), 1e3 * test::Median(load.during()),
                load.during().size());
    EXPECT_LT(slowdown, 10) << "the honest workload slowed down more than 10x";
  }
  std::vector<std::unique_ptr<Node>> nodes;
  HostilePeer attacker;
};

serve::ServerRecord AServer() {
  serve::ServerRecord r;
  r.state = serve::ServerState::kOnline;
  r.start = 0;
  r.end = 2;
  r.throughput = 100;
  r.addresses = {"/ip4/127.0.0.1/tcp/4000"};
  return r;
}

TEST_F(AttackedSwarm, NobodyCanReplaceWipeOrFillAnOwnersRecords) {
  Node& owner = *nodes[1];
  const std::string mark = OwnerMarker(owner.peer_id());
  ASSERT_TRUE(owner.StoreSync("wipe.key", "alice", Now() + 300, mark).ok());
  ASSERT_TRUE(
      owner.StoreSync("m.block.0", serve::EncodeServerRecord(AServer()), Now() + 300, mark).ok());
  HonestLoad load(*nodes[2], *nodes[3]);
  load.RunRounds(10);
  load.StartInBackground();

  // 1. A plain value, with the longest expiration a node accepts, on both keys.
  for (const auto& r : AtEveryNode({{"wipe.key", std::nullopt, "junk", Now() + kDay}})) {
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].code(), StatusCode::kAlreadyExists) << r[0].ToString();
    EXPECT_NE(r[0].message().find("a plain value cannot replace it"), std::string::npos);
  }
  for (const auto& r : AtEveryNode({{"m.block.0", std::nullopt, "junk", Now() + kDay}})) {
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].code(), StatusCode::kPermissionDenied) << r[0].ToString();
    EXPECT_NE(r[0].message().find("server records"), std::string::npos) << r[0].message();
  }
  // 2. Unsigned junk subkeys until the dictionary is full (64 on these nodes).
  for (int batch = 0; batch < 4; ++batch) {
    std::vector<StoreItem> junk;
    for (int i = 0; i < 16; ++i) {
      junk.push_back({"wipe.key", "junk" + std::to_string(batch * 16 + i), "x", Now() + kDay});
    }
    AtEveryNode(junk);
  }
  // ... which does not keep another owner out, nor the owner from refreshing its entry.
  Node& second = *nodes[4];
  EXPECT_TRUE(second.StoreSync("wipe.key", "bob", Now() + 300, OwnerMarker(second.peer_id())).ok());
  EXPECT_TRUE(owner.StoreSync("wipe.key", "alice2", Now() + 301, mark).ok());
  // 3. On a server-record key: an unsigned subkey, the owner's subkey signed by the forger, and
  // the forger's own entry that is not a server record.
  for (const auto& r : AtEveryNode({{"m.block.0", "junk", "{}", Now() + 60}})) {
    EXPECT_EQ(r.at(0).code(), StatusCode::kPermissionDenied) << r.at(0).ToString();
  }
  StoreItem forged =
      HostilePeer::SignedBy(attacker.identity(), {"m.block.0", OwnerMarker(attacker.id()), "", 0});
  forged = {"m.block.0", mark, forged.value, Now() + 60};
  for (const auto& r : AtEveryNode({forged})) {
    EXPECT_EQ(r.at(0).code(), StatusCode::kPermissionDenied) << r.at(0).ToString();
  }
  const StoreItem not_a_record = HostilePeer::SignedBy(
      attacker.identity(), {"m.block.0", OwnerMarker(attacker.id()), "{\"state\":1}", Now() + 60});
  for (const auto& r : AtEveryNode({not_a_record})) {
    EXPECT_EQ(r.at(0).code(), StatusCode::kPermissionDenied) << r.at(0).ToString();
    EXPECT_NE(r.at(0).message().find("is not one of server records"), std::string::npos)
        << r.at(0).message();
  }
  load.Stop();

  // Readers see the owners' entries, and nothing of the attacker's on the server-record key.
  auto wipe = nodes[0]->GetSync("wipe.key", Freshness::kLatest);
  ASSERT_TRUE(wipe.ok()) << wipe.status().ToString();
  ASSERT_TRUE(wipe->is_dict);
  EXPECT_EQ(wipe->subkeys.at(mark).value, "alice2");
  EXPECT_EQ(wipe->subkeys.at(OwnerMarker(second.peer_id())).value, "bob");
  auto block = nodes[3]->GetSync("m.block.0", Freshness::kLatest);
  ASSERT_TRUE(block.ok()) << block.status().ToString();
  ASSERT_EQ(block->subkeys.size(), 1u);
  EXPECT_TRUE(block->subkeys.contains(mark));
  ExpectBenign(load);
}

TEST_F(AttackedSwarm, FarExpirationsAreRefusedAndAForgedBatchStopsAtItsFirstItem) {
  for (const auto& r : AtEveryNode({{"parked", std::nullopt, "v", Now() + 7 * kDay}})) {
    EXPECT_EQ(r.at(0).code(), StatusCode::kInvalidArgument) << r.at(0).ToString();
    EXPECT_NE(r.at(0).message().find("at most 86400 s"), std::string::npos) << r.at(0).message();
  }
  // A batch whose first item carries a bad signature: the node does not check the other 15.
  std::vector<StoreItem> batch{{"k.0", OwnerMarker(nodes[0]->peer_id()), "v", Now() + 60}};
  for (int i = 1; i < 16; ++i)
    batch.push_back({"k." + std::to_string(i), std::nullopt, "v", Now() + 60});
  for (const auto& r : AtEveryNode(batch)) {
    ASSERT_EQ(r.size(), 16u);
    EXPECT_EQ(r[0].code(), StatusCode::kPermissionDenied);
    for (size_t i = 1; i < r.size(); ++i) EXPECT_EQ(r[i].code(), StatusCode::kAborted);
  }
  EXPECT_EQ(nodes[2]->GetSync("k.5").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(nodes[2]->GetSync("parked").status().code(), StatusCode::kNotFound);
}

TEST_F(AttackedSwarm, EveryLayersKeysTakeOnlyTheirOwnersWellFormedEntries) {
  // One key of each family the commands' nodes enforce; the attacker tries a plain value and its
  // own signed entry with a value the layer cannot parse.
  const std::vector<std::pair<std::string, std::string>> keys{
      {"llama.block.7", "server records"},
      {"run1.progress", "training progress records"},
      {"run1.grads.0b0110", "averaging group declarations"},
      {"run1.grads.0b", "averaging group declarations"},
      {"run1.state", "state donor adverts"},
      {"run1.grads.bans", "averaging bans"},
      {kRelaysKey, "relay announcements"},
      {"colony.models", "model announcements"},
      {"colony.runs", "training run announcements"},
      {"colony.moe.ffn.3.4", "expert declarations"},
      {"colony.moe.ffn.3.", "expert declarations"},
      {"colony.moe.not an expert", "expert declarations"}};
  for (const auto& [key, family] : keys) {
    for (const auto& r : AtEveryNode({{key, std::nullopt, "junk", Now() + 60}})) {
      EXPECT_EQ(r.at(0).code(), StatusCode::kPermissionDenied) << key;
      EXPECT_NE(r.at(0).message().find(family), std::string::npos) << r.at(0).message();
    }
    const StoreItem own = HostilePeer::SignedBy(
        attacker.identity(), {key, OwnerMarker(attacker.id()), "junk", Now() + 60});
    for (const auto& r : AtEveryNode({own})) {
      EXPECT_EQ(r.at(0).code(), StatusCode::kPermissionDenied) << key;
      EXPECT_NE(r.at(0).message().find("is not one of " + family), std::string::npos)
          << r.at(0).message();
    }
  }
  // A relay announcing someone else's address is refused too.
  const StoreItem hijack = HostilePeer::SignedBy(
      attacker.identity(), {kRelaysKey, OwnerMarker(attacker.id()),
                            nodes[0]->VisibleAddresses().at(0).ToString(), Now() + 60});
  for (const auto& r : AtEveryNode({hijack})) {
    EXPECT_EQ(r.at(0).code(), StatusCode::kPermissionDenied) << r.at(0).ToString();
  }
}

// The sequence of the issue, typed at a shell against a real `colony dht` process.
// A replica that answers a lookup with more than any node stores (the wire allows 64 MiB and
// 65,536 subkeys) is ignored before any of its entries is validated: the reader gets the honest
// copy, holds no more than the storage limits however the replies merge, and checks no
// signature of the liar's 65,536 owner-marked entries (each would be one Ed25519 check on the
// DHT thread: seconds of it).
TEST_F(AttackedSwarm, AReplicaAnsweringMoreThanANodeStoresIsIgnored) {
  const std::string key = "crowded.key";
  const std::string honest_subkey = OwnerMarker(nodes[1]->peer_id());
  ASSERT_TRUE(nodes[1]->StoreSync(key, "mine", Now() + 600, honest_subkey).ok());
  net::HostOptions listening;
  listening.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  HostilePeer replica(listening);
  ASSERT_TRUE(replica.start_error().ok()) << replica.start_error().ToString();
  std::atomic<int> lies{0};
  replica.host().RegisterUnary(
      "dht.ping", [](net::CallContext&, net::Message) -> asio::awaitable<Result<net::Message>> {
        PingResponse pong;
        pong.wall_time = Now();
        co_return net::Message(EncodePingResponse(pong));
      });
  replica.host().RegisterUnary(
      "dht.find",
      [&lies, key](net::CallContext&, net::Message m) -> asio::awaitable<Result<net::Message>> {
        auto request = DecodeFindRequest(m.meta);
        if (!request.ok()) co_return request.status();
        FindResponse response;
        for (const DhtId& id : request->ids) {
          FindResult result;
          if (id == DhtId::ForKey(key)) {
            Record junk;
            junk.is_dict = true;
            // Owner-marked, with a well-formed (wrong) signature: each a signature to check.
            const std::string marker = OwnerMarker(KeyPair::Generate().peer_id());
            const std::string value = "x[signature:" + std::string(86, 'A') + "==]";
            for (int i = 0; i < 65'536; ++i) {
              junk.subkeys[marker + std::to_string(i)] = {value, Now() + 600};
            }
            result.record = std::move(junk);
            ++lies;
          }
          response.results.push_back(std::move(result));
        }
        co_return net::Message(EncodeFindResponse(response));
      });
  // The victim knows the lying replica from the start (it is one of its initial peers).
  auto victim = Node::Start(KeyPair::Generate(),
                            GuardedOptions({replica.host().ListenAddresses().at(0).ToString(),
                                            nodes[0]->VisibleAddresses().at(0).ToString()}));
  ASSERT_TRUE(victim.ok()) << victim.status().ToString();
  const uint64_t checks_before = SignatureChecks();
  auto got = (*victim)->GetSync(key, Freshness::kLatest);
  const uint64_t checks = SignatureChecks() - checks_before;
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_GT(lies.load(), 0) << "the lookup never asked the lying replica";
  // The honest copy and the nodes' own traffic, not the liar's 65,536 entries.
  EXPECT_LT(checks, 1000u) << "signature checks during the lookup";
  ASSERT_EQ(got->subkeys.size(), 1u);
  EXPECT_EQ(got->subkeys.begin()->second.value, "mine");
  (*victim)->Shutdown();
}

TEST(StorageAttack, ManyIdentitiesFromOneAddressHoldOnlyThatAddresssQuota) {
  // The victim applies its per-address caps to loopback, so that 127.0.0.2 plays the attacker's
  // machine and 127.0.0.3 an honest one. Six identities could each fill a quarter of its
  // storage; together they get the address's half, and the honest peer still stores.
  NodeOptions o = GuardedOptions({});
  o.host.limit_loopback_addresses = true;
  o.dht.storage.per_peer_quota_bytes = 1u << 20;
  o.dht.storage.per_source_quota_bytes = 2u << 20;
  o.dht.storage.capacity_bytes = 4u << 20;
  auto victim = Node::Start(KeyPair::Generate(), o);
  ASSERT_TRUE(victim.ok()) << victim.status().ToString();
  const Multiaddr at = (*victim)->VisibleAddresses().at(0);
  const std::string value(256u << 10, 'v');
  const size_t entry = value.size() + 100;  // a key and the storage's bookkeeping, at most
  size_t accepted = 0;
  Status refusal;
  for (int id = 0; id < 6; ++id) {
    HostilePeer sybil(DialingFrom("127.0.0.2"));
    ASSERT_TRUE(sybil.start_error().ok()) << sybil.start_error().ToString();
    for (int i = 0; i < 4; ++i) {
      const std::string key = "fill." + std::to_string(id) + "." + std::to_string(i);
      auto r = sybil.Store(at, {{key, std::nullopt, value, Now() + 600}});
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      if (r->at(0).ok()) {
        ++accepted;
      } else {
        refusal = r->at(0);
      }
    }
  }
  std::printf("6 identities from one address stored %zu of 24 values of 256 KiB\n", accepted);
  EXPECT_LE(accepted * value.size(), o.dht.storage.per_source_quota_bytes);
  EXPECT_GE(accepted * entry, o.dht.storage.per_source_quota_bytes - entry);  // it was used
  EXPECT_EQ(refusal.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refusal.message().find("address 127.0.0.2"), std::string::npos) << refusal.message();

  HostilePeer honest(DialingFrom("127.0.0.3"));
  ASSERT_TRUE(honest.start_error().ok()) << honest.start_error().ToString();
  for (int i = 0; i < 3; ++i) {
    const std::string key = "honest." + std::to_string(i);
    auto r = honest.Store(at, {{key, std::nullopt, value, Now() + 600}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->at(0).ok()) << r->at(0).ToString();
    auto got = (*victim)->GetSync(key, Freshness::kLatest);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->value.value.size(), value.size());
  }
  (*victim)->Shutdown();
}

TEST(StorageAttack, OneAddressFillsAtMostItsShareOfADictionary) {
  // 127.0.0.2 plays the attacker's machine, 127.0.0.3 an honest one (per-address caps applied to
  // loopback). Each of 16 identities signs its own entry of one key: without a per-address share
  // of the dictionary they fill it (16 subkeys here), and the honest owner's entry is refused.
  NodeOptions o = GuardedOptions({});
  o.host.limit_loopback_addresses = true;
  o.dht.storage.max_subkeys = 16;
  o.dht.storage.dictionary_share_per_source = 0.25;
  auto victim = Node::Start(KeyPair::Generate(), o);
  ASSERT_TRUE(victim.ok()) << victim.status().ToString();
  const Multiaddr at = (*victim)->VisibleAddresses().at(0);
  auto signed_entry = [](HostilePeer& peer, const std::string& value) {
    return HostilePeer::SignedBy(peer.identity(),
                                 {"family.key", OwnerMarker(peer.id()), value, Now() + 600});
  };
  size_t accepted = 0;
  Status refusal;
  for (int id = 0; id < 16; ++id) {
    HostilePeer sybil(DialingFrom("127.0.0.2"));
    ASSERT_TRUE(sybil.start_error().ok()) << sybil.start_error().ToString();
    auto r = sybil.Store(at, {signed_entry(sybil, "sybil")});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (r->at(0).ok()) {
      ++accepted;
    } else {
      refusal = r->at(0);
    }
  }
  EXPECT_EQ(accepted, 4u);
  EXPECT_EQ(refusal.code(), StatusCode::kResourceExhausted) << refusal.ToString();
  EXPECT_NE(refusal.message().find("one address may hold 4"), std::string::npos)
      << refusal.message();

  HostilePeer honest(DialingFrom("127.0.0.3"));
  ASSERT_TRUE(honest.start_error().ok()) << honest.start_error().ToString();
  auto r = honest.Store(at, {signed_entry(honest, "honest")});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->at(0).ok()) << r->at(0).ToString();
  auto got = (*victim)->GetSync("family.key", Freshness::kLatest);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->subkeys.size(), 5u);
  EXPECT_EQ(got->subkeys.at(OwnerMarker(honest.id())).value, "honest");
  // One entry larger than an address's share of the bytes is stored, and refreshed.
  const std::string large(o.dht.storage.max_record_bytes * 3 / 8, 'h');
  for (double later : {0.0, 1.0}) {
    auto big = HostilePeer::SignedBy(
        honest.identity(), {"large.key", OwnerMarker(honest.id()), large, Now() + 600 + later});
    auto stored = honest.Store(at, {big});
    ASSERT_TRUE(stored.ok()) << stored.status().ToString();
    EXPECT_TRUE(stored->at(0).ok()) << stored->at(0).ToString();
  }
  (*victim)->Shutdown();
  for (double bad : {0.0, 1.5, std::nan("")}) {
    o.dht.storage.dictionary_share_per_source = bad;
    auto refused = Node::Start(KeyPair::Generate(), o);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("dictionary_share_per_source"), std::string::npos);
  }
}

TEST(AttackedSwarmCli, TheForgerGetsAClearRefusalAndTheOwnersRecordStays) {
  test::TempDir dir("adversary-cli");
  auto boot = test::SpawnLocalDht();
  ASSERT_TRUE(boot.ok()) << boot.status().ToString();
  const std::string addr = boot->address;
  const std::string key_file = (dir.path() / "a.key").string();
  ASSERT_EQ(test::RunCli({"identity", "new", "--out", key_file}).code, 0);
  auto shown = test::RunCli({"identity", "show", key_file});
  ASSERT_EQ(shown.code, 0);
  const std::string a = shown.out.substr(0, shown.out.find('\n'));
  const std::string mark = "[owner:" + a + "]";

  auto stored = test::RunCli({"dht", "store", "wipe.key", "alice", "--subkey", mark, "--ttl", "300",
                              "--identity", key_file, "--initial-peers", addr});
  ASSERT_EQ(stored.code, 0) << stored.err;
  auto wipe =
      test::RunCli({"dht", "store", "wipe.key", "junk", "--ttl", "86400", "--initial-peers", addr});
  EXPECT_EQ(wipe.code, 1) << wipe.out;
  EXPECT_NE(wipe.err.find("a plain value cannot replace it"), std::string::npos) << wipe.err;
  auto too_long = test::RunCli(
      {"dht", "store", "wipe.key", "junk", "--ttl", "100000", "--initial-peers", addr});
  EXPECT_EQ(too_long.code, 2);
  EXPECT_NE(too_long.err.find("--ttl"), std::string::npos) << too_long.err;
  auto block = test::RunCli({"dht", "store", "m.block.0", "junk", "--initial-peers", addr});
  EXPECT_EQ(block.code, 1);
  EXPECT_NE(block.err.find("server records"), std::string::npos) << block.err;

  auto got = test::RunCli({"dht", "get", "wipe.key", "--latest", "--initial-peers", addr});
  ASSERT_EQ(got.code, 0) << got.err;
  auto j = nlohmann::json::parse(got.out);
  EXPECT_EQ(j["subkeys"][mark]["value"], "alice") << got.out;
  EXPECT_EQ(j["subkeys"].size(), 1u) << got.out;
  auto again = test::RunCli({"dht", "store", "wipe.key", "alice2", "--subkey", mark, "--ttl", "300",
                             "--identity", key_file, "--initial-peers", addr});
  EXPECT_EQ(again.code, 0) << again.err;
  auto code = boot->Stop();
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
}

}  // namespace
}  // namespace colony::dht
