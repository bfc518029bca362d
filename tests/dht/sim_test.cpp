// The DHT protocol core in the deterministic simulation: lookups against brute force, churn,
// replication, record semantics across nodes, validation, client mode, caching and abuse.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "dht/simulation.h"

namespace colony::dht {
namespace {

using namespace std::chrono_literals;

StoreItem Item(std::string key, std::string value, double expiration,
               std::optional<std::string> subkey = std::nullopt) {
  return {std::move(key), std::move(subkey), std::move(value), expiration};
}

// A swarm of n nodes, each bootstrapped from a random earlier one.
void Grow(Simulation& sim, size_t n, DhtOptions options = {}, uint64_t seed = 7) {
  std::mt19937_64 rng(seed);
  const size_t first = sim.size();
  for (size_t i = 0; i < n; ++i) sim.AddNode(options);
  for (size_t i = first; i < sim.size(); ++i) {
    if (i == 0) {
      ASSERT_TRUE(sim.Bootstrap(0, {}).ok());
      continue;
    }
    const size_t via = std::uniform_int_distribution<size_t>(0, i - 1)(rng);
    auto r = sim.Bootstrap(i, {sim.address(via)});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
}

// Live, non-client nodes sorted by XOR distance to `target`.
std::vector<PeerId> BruteForceNearest(Simulation& sim, const DhtId& target) {
  std::vector<size_t> live;
  for (size_t i = 0; i < sim.size(); ++i) {
    if (sim.alive(i) && !sim.node(i).options().client_mode) live.push_back(i);
  }
  std::sort(live.begin(), live.end(),
            [&](size_t a, size_t b) { return Closer(target, sim.node(a).id(), sim.node(b).id()); });
  std::vector<PeerId> out;
  for (size_t i : live) out.push_back(sim.node(i).peer_id());
  return out;
}

// The first node other than `node` whose routing table lists it: looking up `node`'s own id, it
// must ask `node`.
size_t NodeListing(Simulation& sim, size_t node) {
  size_t i = 0;
  while (i == node || !sim.node(i).routing_table().Find(sim.node(node).peer_id())) ++i;
  return i;
}

size_t CountHolders(Simulation& sim, const std::string& key) {
  size_t n = 0;
  for (size_t i = 0; i < sim.size(); ++i) {
    if (sim.alive(i) && sim.node(i).storage().KeyOf(DhtId::ForKey(key)) != nullptr) ++n;
  }
  return n;
}

TEST(DhtSimulation, ThousandNodesLookupsMatchBruteForceAndSurviveChurn) {
  Simulation sim({.seed = 11});
  Grow(sim, 1000);
  std::mt19937_64 rng(5);
  auto random_live = [&] {
    for (;;) {
      size_t i = std::uniform_int_distribution<size_t>(0, sim.size() - 1)(rng);
      if (sim.alive(i)) return i;
    }
  };

  // Nearest-node lookups against brute force.
  const size_t kTargets = 200, k = 20;
  size_t top1 = 0;
  double jaccard_sum = 0;
  for (size_t t = 0; t < kTargets; ++t) {
    const DhtId target = DhtId::Random(rng);
    std::optional<Result<std::vector<Contact>>> found;
    sim.node(random_live()).FindNodes(target, [&](auto r) { found = std::move(r); });
    ASSERT_TRUE(sim.RunUntil([&] { return found.has_value(); }));
    ASSERT_TRUE(found->ok());
    const auto truth = BruteForceNearest(sim, target);
    std::vector<PeerId> got;
    for (const Contact& c : **found) got.push_back(c.peer);
    // The searching node does not list itself; brute force must skip it too only when it is
    // among the nearest, so compare sets of the k nearest others.
    ASSERT_FALSE(got.empty());
    if (got[0] == truth[0] || (truth.size() > 1 && got[0] == truth[1])) ++top1;
    std::set<PeerId> a(got.begin(), got.begin() + static_cast<long>(std::min(k, got.size())));
    std::set<PeerId> b(truth.begin(), truth.begin() + static_cast<long>(k + 1));
    size_t inter = 0;
    for (const PeerId& p : a) inter += b.count(p);
    // `b` has k+1 entries to allow for the searcher itself being among the truth.
    jaccard_sum += static_cast<double>(inter) / static_cast<double>(a.size());
  }
  const double top1_accuracy = static_cast<double>(top1) / kTargets;
  const double jaccard = jaccard_sum / kTargets;
  RecordProperty("top1_accuracy", std::to_string(top1_accuracy));
  RecordProperty("topk_jaccard", std::to_string(jaccard));
  EXPECT_GE(top1_accuracy, 0.99);
  EXPECT_GE(jaccard, 0.95);

  // Store 300 keys, kill 10% of the nodes, get every key from a random survivor.
  const double exp = sim.clock().WallSeconds() + 3600;
  const size_t kKeys = 300;
  for (size_t i = 0; i < kKeys; ++i) {
    auto st =
        sim.Store(random_live(), Item("key" + std::to_string(i), "value" + std::to_string(i), exp));
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  for (size_t i = 0; i < kKeys; ++i) {
    EXPECT_EQ(CountHolders(sim, "key" + std::to_string(i)), 5u) << "key" << i;
  }
  std::vector<size_t> order(sim.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t i = 0; i < sim.size() / 10; ++i) sim.Kill(order[i]);

  size_t ok = 0;
  for (size_t i = 0; i < kKeys; ++i) {
    auto r = sim.Get(random_live(), "key" + std::to_string(i));
    if (r.ok() && !r->is_dict && r->value.value == "value" + std::to_string(i) &&
        r->value.expiration == exp) {
      ++ok;
    }
  }
  EXPECT_EQ(ok, kKeys);
  const DhtStats& s = sim.node(random_live()).stats();
  EXPECT_GT(s.lookups, 0u);
}

class SmallSwarm : public ::testing::Test {
 protected:
  void SetUp() override { Grow(sim, 30); }
  double In(double seconds) { return sim.clock().WallSeconds() + seconds; }
  Simulation sim{{.seed = 3}};
};

TEST_F(SmallSwarm, ReplicaCountEqualsNumReplicas) {
  for (int i = 0; i < 20; ++i) {
    const std::string key = "replicated" + std::to_string(i);
    ASSERT_TRUE(sim.Store(static_cast<size_t>(i), Item(key, "v", In(60))).ok());
    EXPECT_EQ(CountHolders(sim, key), 5u) << key;
  }
}

TEST_F(SmallSwarm, ExactExpirationPreservedAndLatestSeesOverwrites) {
  const double e1 = In(100.123456789);
  ASSERT_TRUE(sim.Store(3, Item("k", "first", e1)).ok());
  auto r = sim.Get(17, "k");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->value.value, "first");
  EXPECT_EQ(r->value.expiration, e1);  // bit-exact

  const double e2 = e1 + 1;
  ASSERT_TRUE(sim.Store(9, Item("k", "second", e2)).ok());
  auto latest = sim.Get(17, "k", dht::Freshness::kLatest);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->value.value, "second");
  EXPECT_EQ(latest->value.expiration, e2);

  // An older expiration is rejected by every replica.
  auto st = sim.Store(5, Item("k", "stale", e1 - 10));
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists) << st.ToString();
  EXPECT_EQ(sim.Get(20, "k", Freshness::kLatest)->value.value, "second");
}

TEST_F(SmallSwarm, SubkeysFromTwoNodesMergeIntoOneDictionary) {
  ASSERT_TRUE(sim.Store(1, Item("group", "from1", In(50), "peer1")).ok());
  ASSERT_TRUE(sim.Store(2, Item("group", "from2", In(60), "peer2")).ok());
  auto r = sim.Get(25, "group", Freshness::kLatest);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->is_dict);
  ASSERT_EQ(r->subkeys.size(), 2u);
  EXPECT_EQ(r->subkeys.at("peer1").value, "from1");
  EXPECT_EQ(r->subkeys.at("peer2").value, "from2");
  EXPECT_EQ(r->Expiration(), r->subkeys.at("peer2").expiration);

  // An older value for an existing subkey is rejected; a newer one replaces it.
  EXPECT_EQ(sim.Store(3, Item("group", "old", In(10), "peer1")).code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(sim.Store(3, Item("group", "newer", In(70), "peer1")).ok());
  r = sim.Get(26, "group", Freshness::kLatest);
  EXPECT_EQ(r->subkeys.at("peer1").value, "newer");
}

TEST_F(SmallSwarm, AReplicaWithAPartialDictionaryKeepsWhatALatestGetFound) {
  // A node that joins after the first owner stored its subkey, and is among the key's nearest:
  // the second owner's store reaches it, the first one's did not.
  const size_t late = sim.AddNode();
  std::string key;
  for (int i = 0; key.empty(); ++i) {
    const std::string k = "group" + std::to_string(i);
    const DhtId id = DhtId::ForKey(k);
    size_t nearer = 0;
    for (size_t n = 0; n + 1 < sim.size(); ++n) {
      nearer += Closer(id, sim.node(n).id(), sim.node(late).id());
    }
    if (nearer < 3) key = k;
  }
  ASSERT_TRUE(sim.Store(1, Item(key, "from1", In(50), "peer1")).ok());
  ASSERT_TRUE(sim.Bootstrap(late, {sim.address(0)}).ok());
  ASSERT_TRUE(sim.Store(2, Item(key, "from2", In(60), "peer2")).ok());
  auto r = sim.Get(late, key);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->subkeys.size(), 1u) << "the scenario needs a partial copy on the late node";
  r = sim.Get(late, key, Freshness::kLatest);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->subkeys.size(), 2u);
  // Its later reads of any copy, its own first, now see both owners.
  r = sim.Get(late, key);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->subkeys.size(), 2u);
}

TEST_F(SmallSwarm, ExpiredRecordsDisappear) {
  ASSERT_TRUE(sim.Store(1, Item("short", "v", In(2))).ok());
  ASSERT_TRUE(sim.Get(8, "short", Freshness::kLatest).ok());
  sim.RunFor(3s);
  auto r = sim.Get(9, "short", Freshness::kLatest);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();
}

TEST_F(SmallSwarm, OwnerRecordsCannotBeOverwrittenEvenAfterTheOwnerLeaves) {
  const size_t owner = 4, attacker = 12;
  const std::string key = "profile" + OwnerMarker(sim.node(owner).peer_id());
  ASSERT_TRUE(sim.Store(owner, Item(key, "genuine", In(100))).ok());
  auto r = sim.Get(20, key, Freshness::kLatest);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->value.value, "genuine");  // signature stripped
  sim.Kill(owner);

  // The attacker's own node refuses to sign for someone else...
  auto st = sim.Store(attacker, Item(key, "forged", In(200)));
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
  // ...and replicas refuse a forged signature sent directly, and a copy of the genuine
  // signature reused with a newer expiration.
  const Record* held = nullptr;
  size_t replica = 0;
  for (size_t i = 0; i < sim.size() && !held; ++i) {
    if (sim.alive(i) && (held = sim.node(i).storage().Peek(DhtId::ForKey(key)))) replica = i;
  }
  ASSERT_NE(held, nullptr);
  const std::string genuine_signed = held->value.value;
  for (const std::string& value :
       {std::string("forged[signature:") + std::string(88, 'A') + "]",
        "forged" + genuine_signed.substr(genuine_signed.find("[signature:")), genuine_signed}) {
    StoreRequest req;
    req.items.push_back({Item(key, value, In(300)), false});
    auto reply = sim.node(replica).HandleStore(sim.node(attacker).peer_id(), req);
    ASSERT_TRUE(reply.ok());
    EXPECT_EQ(reply->results[0].code(), StatusCode::kPermissionDenied)
        << reply->results[0].ToString();
  }
  r = sim.Get(21, key, Freshness::kLatest);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->value.value, "genuine");
}

TEST_F(SmallSwarm, SchemaRejectsWrongTypes) {
  auto schema = std::make_shared<SchemaValidator>(std::vector<ValueSchema>{
      {"progress",
       JsonType::kObject,
       {{"epoch", JsonType::kInt}, {"samples_per_second", JsonType::kNumber}},
       true}});
  for (size_t i = 0; i < sim.size(); ++i) sim.node(i).AddValidator(schema);
  EXPECT_TRUE(
      sim.Store(2, Item("progress", R"({"epoch": 3, "samples_per_second": 12.5})", In(30), "peerA"))
          .ok());
  auto st = sim.Store(
      2, Item("progress", R"({"epoch": 779.0, "samples_per_second": 1})", In(30), "peerB"));
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(st.message().find("must be int"), std::string::npos) << st.message();
  EXPECT_EQ(sim.Store(2, Item("progress", "not json", In(30), "peerC")).code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(
      sim.Store(2, Item("progress", R"({"epoch": 1, "samples_per_second": 1})", In(30))).code(),
      StatusCode::kPermissionDenied);  // must be a dictionary
  auto r = sim.Get(7, "progress", Freshness::kLatest);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->subkeys.size(), 1u);
}

TEST_F(SmallSwarm, ClientModeNodesStoreAndGetButStayOutOfRoutingTables) {
  DhtOptions client;
  client.client_mode = true;
  const size_t c = sim.AddNode(client);
  ASSERT_TRUE(sim.Bootstrap(c, {sim.address(0)}).ok());
  ASSERT_TRUE(sim.Store(c, Item("from-client", "hi", In(60))).ok());
  auto r = sim.Get(c, "from-client", Freshness::kLatest);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->value.value, "hi");
  EXPECT_EQ(sim.Get(5, "from-client")->value.value, "hi");
  for (size_t i = 0; i < c; ++i) {
    EXPECT_FALSE(sim.node(i).routing_table().Find(sim.node(c).peer_id()).has_value()) << i;
  }
  EXPECT_EQ(sim.node(c).storage().size(), 0u);
  // It serves nothing.
  EXPECT_EQ(sim.node(c).HandleFind(sim.node(0).peer_id(), {}).status().code(),
            StatusCode::kUnavailable);
}

TEST_F(SmallSwarm, ConcurrentGetsOfOneKeyShareOneLookup) {
  ASSERT_TRUE(sim.Store(1, Item("hot", "v", In(60))).ok());
  DhtCore& n = sim.node(22);
  const uint64_t lookups = n.stats().lookups;
  int answered = 0;
  for (int i = 0; i < 5; ++i) {
    n.Get({"hot"}, Freshness::kLatest, [&](std::vector<Result<Record>> r) {
      EXPECT_TRUE(r[0].ok());
      ++answered;
    });
  }
  ASSERT_TRUE(sim.RunUntil([&] { return answered == 5; }));
  EXPECT_EQ(n.stats().lookups, lookups + 1);
  EXPECT_EQ(n.stats().shared_gets, 4u);
}

TEST_F(SmallSwarm, GetManySharesFindRequestsAcrossKeys) {
  std::vector<std::string> keys;
  for (int i = 0; i < 16; ++i) {
    keys.push_back("batch" + std::to_string(i));
    ASSERT_TRUE(
        sim.Store(static_cast<size_t>(i), Item(keys.back(), std::to_string(i), In(60))).ok());
  }
  DhtCore& n = sim.node(20);
  // One key at a time...
  uint64_t before = n.stats().requests_sent;
  for (const std::string& k : keys) ASSERT_TRUE(sim.Get(20, k, dht::Freshness::kLatest).ok());
  const uint64_t one_by_one = n.stats().requests_sent - before;
  // ...and all at once: the lookups run together and share requests to the same peers.
  before = n.stats().requests_sent;
  auto all = sim.Get(20, keys, dht::Freshness::kLatest);
  const uint64_t together = n.stats().requests_sent - before;
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(all[i].ok()) << all[i].status().ToString();
    EXPECT_EQ(all[i]->value.value, std::to_string(i));
  }
  RecordProperty("requests_one_by_one", static_cast<int>(one_by_one));
  RecordProperty("requests_together", static_cast<int>(together));
  EXPECT_LT(together * 2, one_by_one) << together << " vs " << one_by_one;
}

TEST_F(SmallSwarm, FoundValuesAreCachedLocallyAndOnTheNearestNodeThatLackedThem) {
  ASSERT_TRUE(sim.Store(1, Item("cached", "v", In(60))).ok());
  ASSERT_TRUE(sim.Get(23, "cached", Freshness::kLatest).ok());
  sim.RunFor(1s);  // the copy sent to the nearest node that lacked it is on its way
  const DhtId id = DhtId::ForKey("cached");
  EXPECT_NE(sim.node(23).cache().KeyOf(id), nullptr);
  size_t cachers = 0;
  for (size_t i = 0; i < sim.size(); ++i) {
    if (i != 23 && sim.node(i).cache().KeyOf(id) != nullptr) ++cachers;
  }
  EXPECT_GE(cachers, 1u);
  // A second get is answered locally: no new lookup.
  const uint64_t lookups = sim.node(23).stats().lookups;
  ASSERT_TRUE(sim.Get(23, "cached").ok());
  EXPECT_EQ(sim.node(23).stats().lookups, lookups);
}

TEST_F(SmallSwarm, UnresponsiveNodesAreBackedOffThenDropped) {
  const size_t victim = 6;
  const size_t asker = NodeListing(sim, victim);
  const PeerId dead = sim.node(victim).peer_id();
  const DhtId target = sim.node(victim).id();
  sim.Kill(victim);
  DhtCore& n = sim.node(asker);
  auto lookup = [&] {
    std::optional<Result<std::vector<Contact>>> r;
    n.FindNodes(target, [&](auto x) { r = std::move(x); });
    ASSERT_TRUE(sim.RunUntil([&] { return r.has_value(); }));
  };
  const uint64_t failed0 = n.stats().requests_failed;
  lookup();
  EXPECT_GT(n.stats().requests_failed, failed0);          // timed out once
  EXPECT_TRUE(n.routing_table().Find(dead).has_value());  // one failure is forgiven
  const uint64_t failed1 = n.stats().requests_failed;
  lookup();
  EXPECT_EQ(n.stats().requests_failed, failed1);  // backed off: not asked again
  sim.RunFor(2s);                                 // the backoff passes
  lookup();
  EXPECT_GT(n.stats().requests_failed, failed1);
  EXPECT_FALSE(n.routing_table().Find(dead).has_value());  // second failure: dropped
  // A store still reaches exactly num_replicas live nodes.
  ASSERT_TRUE(sim.Store(asker, Item("after-death", "v", In(60))).ok());
  EXPECT_EQ(CountHolders(sim, "after-death"), 5u);
}

TEST_F(SmallSwarm, BusyNodesAreBackedOffButStayInTheRoutingTable) {
  // The same lookups as above, at a node that answers "busy" (its rate limits, or replies it
  // holds for an attacker) instead of not answering: it is alive, and its callers keep it.
  const size_t busy = 6;
  const size_t asker = NodeListing(sim, busy);
  const PeerId peer = sim.node(busy).peer_id();
  const DhtId target = sim.node(busy).id();
  bool overloaded = true;
  sim.ScriptFinds(busy, [&](const PeerId& from, const FindRequest& request) {
    if (overloaded) return Result<FindResponse>(ResourceExhausted("busy, try again later"));
    return sim.node(busy).HandleFind(from, request);
  });
  DhtCore& n = sim.node(asker);
  auto lookup = [&] {
    std::optional<Result<std::vector<Contact>>> r;
    n.FindNodes(target, [&](auto x) { r = std::move(x); });
    ASSERT_TRUE(sim.RunUntil([&] { return r.has_value(); }));
  };
  uint64_t failed = n.stats().requests_failed;
  for (int i = 0; i < 4; ++i) {
    lookup();
    EXPECT_GT(n.stats().requests_failed, failed) << "lookup " << i << " did not ask it";
    failed = n.stats().requests_failed;
    lookup();
    EXPECT_EQ(n.stats().requests_failed, failed) << "lookup " << i << ": not backed off";
    sim.RunFor(std::chrono::seconds(1 << (i + 1)));  // the backoff doubles, and passes
  }
  EXPECT_TRUE(n.routing_table().Find(peer).has_value()) << "four busy answers dropped it";
  overloaded = false;
  lookup();
  EXPECT_EQ(n.stats().requests_failed, failed);  // asked again, and it answered
  EXPECT_TRUE(n.routing_table().Find(peer).has_value());
}

TEST_F(SmallSwarm, OperationsEndByTheLookupDeadlineWhenNodesStopAnswering) {
  ASSERT_TRUE(sim.Store(1, Item("deadline", "v", In(600))).ok());
  DhtOptions patient;
  patient.request_timeout = std::chrono::hours(1);  // requests alone would wait "forever"
  patient.lookup_timeout = std::chrono::seconds(10);
  const size_t n = sim.AddNode(patient);
  ASSERT_TRUE(sim.Bootstrap(n, {sim.address(0)}).ok());
  for (size_t i = 0; i < n; ++i) sim.Kill(i);
  const SteadyTime start = sim.clock().Now();
  auto r = sim.Get(n, "deadline", Freshness::kLatest);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();
  EXPECT_LE(sim.clock().Now() - start, std::chrono::seconds(11));
  EXPECT_GE(sim.clock().Now() - start, std::chrono::seconds(10));
  // A store also ends by the deadline (kept on this node only: it is the nearest live one).
  const SteadyTime store_start = sim.clock().Now();
  EXPECT_TRUE(sim.Store(n, Item("deadline2", "v", In(600))).ok());
  EXPECT_LE(sim.clock().Now() - store_start, std::chrono::seconds(11));
  EXPECT_EQ(sim.node(n).storage().size(), 1u);
}

TEST_F(SmallSwarm, LimitsGiveClearErrors) {
  std::string big(2u << 20, 'x');
  auto st = sim.Store(1, Item("big", big, In(60)));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("limit"), std::string::npos) << st.message();
  EXPECT_EQ(sim.Store(1, Item(std::string(5000, 'k'), "v", In(60))).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(sim.Store(1, Item("past", "v", In(-1))).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sim.Store(1, Item("nan", "v", std::nan(""))).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sim.Get(1, "").status().code(), StatusCode::kInvalidArgument);
}

TEST_F(SmallSwarm, RateLimitRefusesFloods) {
  DhtCore& target = sim.node(3);
  const PeerId flooder = sim.node(4).peer_id();
  size_t refused = 0;
  for (int i = 0; i < 5000; ++i) {
    if (target.HandleFind(flooder, {}).status().code() == StatusCode::kResourceExhausted) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 3000u);
  // Another peer is unaffected.
  EXPECT_TRUE(target.HandleFind(sim.node(5).peer_id(), {}).ok());
}

TEST_F(SmallSwarm, RateLimitPerSourceAddressHoldsWhateverIdentitiesItUses) {
  DhtCore& target = sim.node(3);
  const double per_source = target.options().max_requests_per_second_per_source;
  ASSERT_LT(300, 2 * target.options().max_requests_per_second);  // each within its own bucket
  // 20 identities at one address, 300 requests each (the clock stands still): the address's
  // bucket of 2x its rate serves 4,000, and refuses the rest naming the address.
  size_t served = 0;
  Status refusal;
  for (int id = 0; id < 20; ++id) {
    const PeerId sybil = KeyPair::Generate().peer_id();
    for (int i = 0; i < 300; ++i) {
      auto r = target.HandleFind(sybil, {}, "10.0.0.2");
      if (r.ok()) {
        ++served;
      } else {
        refusal = r.status();
      }
    }
  }
  EXPECT_EQ(served, static_cast<size_t>(2 * per_source));
  EXPECT_EQ(refusal.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refusal.message().find("address 10.0.0.2"), std::string::npos) << refusal.message();
  // Another address, and an exempt caller (loopback: ""), are unaffected.
  EXPECT_TRUE(target.HandleFind(KeyPair::Generate().peer_id(), {}, "10.0.0.3").ok());
  EXPECT_TRUE(target.HandleFind(KeyPair::Generate().peer_id(), {}, "").ok());
}

TEST_F(SmallSwarm, PerPeerQuotaBoundsWhatOnePeerCanMakeANodeHold) {
  DhtCore& target = sim.node(3);
  const PeerId greedy = sim.node(4).peer_id();
  const size_t quota = target.options().storage.per_peer_quota_bytes;
  const std::string value(512u << 10, 'v');
  size_t accepted = 0;
  Status last;
  for (int i = 0; i < 100; ++i) {
    StoreRequest req;
    req.items.push_back({Item("fill" + std::to_string(i), value, In(60)), false});
    auto reply = target.HandleStore(greedy, req);
    ASSERT_TRUE(reply.ok());
    if (reply->results[0].ok()) ++accepted;
    last = reply->results[0];
  }
  EXPECT_LE(target.storage().usage_of(greedy), quota);
  EXPECT_LT(accepted, 100u);
  EXPECT_EQ(last.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(last.message().find("quota"), std::string::npos) << last.message();
}

// Attacks on a lookup (docs/security.md, "eclipse"): a peer near a key answers finds for it with
// contacts ground next to the key, so that they take the nearest slots of every lookup passing
// through it. Identities are free, so the contacts are real identities; what the attacker cannot
// have is many addresses. The victim asks one peer at a time (alpha 1), which makes the order of
// requests, and so the outcome without the defences, the same on every run; honest replicas of
// the key stand just behind the ground identities. Victims run one beam (not the default's
// disjoint paths, which find the key before these defences are needed) unless a test says so.
DhtOptions OneBeam() {
  DhtOptions o;
  o.disjoint_paths = 1;
  return o;
}

class LookupAttack : public ::testing::Test {
 protected:
  static constexpr const char* kKey = "eclipsed";

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(Grow(sim_, 120));
    ASSERT_TRUE(sim_.Store(1, Item(kKey, "\"the value\"", sim_.clock().WallSeconds() + 600)).ok());
    target_ = DhtId::ForKey(kKey);
    nearest_ = BruteForceNearest(sim_, target_);
  }
  // n identities nearer to the key than the rank-th nearest honest node (0: every one), ground
  // as an attacker grinds them.
  std::vector<KeyPair> Ground(size_t n, size_t rank = 0, uint8_t tag = 0xe1) {
    const DhtId bound = sim_.node(Index(nearest_[rank])).id() ^ target_;
    std::vector<KeyPair> out;
    for (uint64_t seed = 1; out.size() < n; ++seed) {
      std::array<uint8_t, 32> bytes{};
      std::memcpy(bytes.data(), &seed, sizeof(seed));
      bytes[31] = tag;
      KeyPair k = KeyPair::FromSeed({bytes.data(), bytes.size()});
      if ((DhtId::ForPeer(k.peer_id()) ^ target_) < bound) out.push_back(std::move(k));
    }
    return out;
  }
  size_t Index(const PeerId& peer) {
    for (size_t i = 0; i < sim_.size(); ++i) {
      if (sim_.identity(i).peer_id() == peer) return i;
    }
    ADD_FAILURE() << "no node " << peer.Short();
    return 0;
  }
  // The victim: a new node asking one peer at a time, that joins through `first` and an honest
  // node. Its id is near the key's (among the 8 nearest), so its routing table keeps every
  // node that near, the attacker included, which a lookup of the key asks first.
  size_t AddVictim(size_t first, DhtOptions o = OneBeam(), uint8_t tag = 0x77) {
    o.alpha = 1;
    const size_t v = sim_.AddNodeAs(std::move(Ground(1, 8, tag)[0]), {}, o);
    EXPECT_TRUE(sim_.Bootstrap(v, {sim_.address(first), sim_.address(60)}).ok());
    // The lookups that follow a join end first: a lookup's request to a peer carries the ids
    // of the other lookups asking it, which would ask the key's replicas on the side.
    sim_.RunFor(10s);
    const auto known = sim_.node(v).routing_table().Nearest(target_, 1);
    EXPECT_TRUE(!known.empty() && known[0].peer == sim_.identity(first).peer_id())
        << "the scenario needs the victim to know the attacker as the nearest to the key";
    return v;
  }
  // Finds for the key answered with `contacts`, other finds with nothing, never a record.
  Simulation::FindScript Answer(std::vector<Contact> contacts) {
    return [contacts, target = target_](const PeerId&, const FindRequest& request) {
      FindResponse response;
      for (const DhtId& id : request.ids) {
        FindResult& result = response.results.emplace_back();
        if (id == target) result.nearest = contacts;
      }
      return Result<FindResponse>(response);
    };
  }
  // The get's value and the virtual time it took.
  std::pair<Result<Record>, Duration> TimedGet(size_t v) {
    const SteadyTime start = sim_.clock().Now();
    Result<Record> got = sim_.Get(v, kKey);
    return {std::move(got), sim_.clock().Now() - start};
  }

  Simulation sim_{{.seed = 23}};
  DhtId target_;
  std::vector<PeerId> nearest_;
};

TEST_F(LookupAttack, AReferrerOfContactsThatNeverAnswerCostsThreeTimeouts) {
  // The attacker is the node nearest the key (a replica that says it has nothing): it names 64
  // ground identities (what the wire allows) at addresses that never answer.
  const size_t attacker = Index(nearest_[0]);
  std::vector<Contact> fakes;
  for (const KeyPair& k : Ground(64)) {
    fakes.push_back(
        {k.peer_id(), DhtId::ForPeer(k.peer_id()), {fmt::format("sim/nowhere-{}", fakes.size())}});
  }
  const size_t v = AddVictim(attacker);
  sim_.ScriptFinds(attacker, Answer(fakes));
  auto [got, took] = TimedGet(v);
  // Without the defences the ground contacts fill the lookup's nearest slots one timeout after
  // another, and the lookup ends at its deadline (20 s) without the value. With them, it takes
  // the 20 nearest of the reply, stops asking the attacker's contacts after 3 failed, and the
  // honest replicas behind them answer.
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->value.value, "\"the value\"");
  const Duration timeout = sim_.node(v).options().request_timeout;
  EXPECT_LT(took, 4 * timeout)
      << "ms: " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
  EXPECT_GE(sim_.node(v).stats().candidates_refused, 64u - 3u);
}

TEST_F(LookupAttack, IdentitiesOnOneMachineCountAsTwoAnswersAndCannotHideTheKey) {
  // 20 identities on one machine, ground next to the key, each answering every find for it with
  // all 20 and no value: without a cap per address they are the 20 nearest a lookup hears from,
  // and it ends there, all of them saying the key holds nothing. With it, two of their answers
  // count and the others are ignored.
  std::vector<size_t> sybils;
  for (KeyPair& k : Ground(20)) sybils.push_back(sim_.AddNodeAs(std::move(k), "evil"));
  std::vector<Contact> all;
  for (size_t i : sybils) {
    all.push_back({sim_.identity(i).peer_id(), sim_.node(i).id(), {sim_.address(i)}});
  }
  const size_t v = AddVictim(sybils[0]);
  for (size_t i : sybils) sim_.ScriptFinds(i, Answer(all));
  auto [got, took] = TimedGet(v);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->value.value, "\"the value\"");
  EXPECT_GE(sim_.node(v).stats().candidates_refused, 20u - 2u - 1u);
}

// 20 identities ground next to the key, each on a machine of its own (so each answer counts),
// each answering every find for the key with all 20 and no value: they are the 20 nearest a
// one-beam lookup hears from, and it ends there. A lookup over 3 disjoint paths (the default)
// loses the path the attacker is on (all 20 join it, the first to hear of them), while the
// other two, which never ask a peer of that path, reach the honest replicas behind them.
TEST_F(LookupAttack, IdentitiesOnManyMachinesCaptureOneDisjointPathNotTheOthers) {
  std::vector<size_t> sybils;
  for (KeyPair& k : Ground(20)) {
    sybils.push_back(sim_.AddNodeAs(std::move(k), fmt::format("evil-{}", sybils.size())));
  }
  std::vector<Contact> all;
  for (size_t i : sybils) {
    all.push_back({sim_.identity(i).peer_id(), sim_.node(i).id(), {sim_.address(i)}});
  }
  const size_t one_beam = AddVictim(sybils[0]);
  ASSERT_EQ(DhtOptions{}.disjoint_paths, 3u);
  const size_t three_paths = AddVictim(sybils[0], DhtOptions{}, 0x78);
  for (size_t i : sybils) sim_.ScriptFinds(i, Answer(all));

  auto [lost, lost_took] = TimedGet(one_beam);
  EXPECT_FALSE(lost.ok()) << "the attack needs to work on a one-beam lookup";
  auto [got, took] = TimedGet(three_paths);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->value.value, "\"the value\"");
  // Within the lookup's deadline: no path waited on another.
  EXPECT_LT(took, sim_.node(three_paths).options().lookup_timeout);
}

// The attacker is the node nearest the key (a replica that says it has nothing). It names the
// next `n` honest replicas first, each at an address where nothing answers, so that the victim
// dials them there.
class WrongAddressAttack : public LookupAttack {
 protected:
  std::vector<PeerId> Misdirect(size_t attacker, size_t n) {
    std::vector<Contact> wrong;
    std::vector<PeerId> named;
    for (size_t rank = 1; rank <= n; ++rank) {
      const PeerId& p = nearest_[rank];
      wrong.push_back({p, DhtId::ForPeer(p), {fmt::format("sim/nowhere-{}", rank)}});
      named.push_back(p);
    }
    sim_.ScriptFinds(attacker, Answer(wrong));
    return named;
  }
  // A new node (alpha 1) that joins through the attacker and an honest node and knows none of
  // the key's replicas but the attacker: the attacker's word is the first it hears of them.
  // Joining fills its table from all over the swarm, so strangers are added until one's table
  // holds none of them (the others stay, as honest nodes).
  size_t AddStranger(size_t attacker, DhtOptions o = OneBeam()) {
    o.alpha = 1;
    for (int tries = 0; tries < 40; ++tries) {
      const size_t v = sim_.AddNode(o);
      EXPECT_TRUE(sim_.Bootstrap(v, {sim_.address(attacker), sim_.address(60)}).ok());
      sim_.RunFor(10s);
      const RoutingTable& table = sim_.node(v).routing_table();
      const auto known = table.Nearest(target_, 1);
      bool knows_a_replica = false;
      for (size_t rank = 1; rank < 5; ++rank) {
        knows_a_replica |= table.Find(nearest_[rank]).has_value();
      }
      if (!knows_a_replica && !known.empty() &&
          known[0].peer == sim_.identity(attacker).peer_id()) {
        return v;
      }
    }
    ADD_FAILURE() << "no stranger knew the attacker and none of the replicas";
    return 0;
  }
  std::vector<PeerId> FindNodes(size_t v) {
    std::optional<Result<std::vector<Contact>>> r;
    sim_.node(v).FindNodes(target_, [&](auto x) { r = std::move(x); });
    EXPECT_TRUE(sim_.RunUntil([&] { return r.has_value(); }));
    std::vector<PeerId> out;
    if (r && r->ok()) {
      for (const Contact& c : **r) out.push_back(c.peer);
    }
    return out;
  }
  static bool Has(const std::vector<PeerId>& peers, const PeerId& p) {
    return std::find(peers.begin(), peers.end(), p) != peers.end();
  }
};

TEST_F(WrongAddressAttack, HonestContactsNamedFirstAtWrongAddressesAreAskedWhereOthersSayTheyAre) {
  const size_t attacker = Index(nearest_[0]);
  const size_t v = AddStranger(attacker);
  const std::vector<PeerId> named = Misdirect(attacker, 4);
  // The dials at the wrong addresses fail. Without offers, each of those replicas was out of
  // the lookup for good, though the honest nodes asked next named it at its own address; with
  // them, it is asked there, answers, and is among the nearest the lookup returns.
  const std::vector<PeerId> found = FindNodes(v);
  for (size_t rank = 1; rank <= named.size(); ++rank) {
    EXPECT_TRUE(Has(found, named[rank - 1])) << "replica " << rank << " is missing";
  }
}

TEST_F(WrongAddressAttack, AFailureAtAWrongAddressDoesNotBackOffTheContactAtItsOwn) {
  // Failed peers are skipped for a minute: long enough for the second lookup below to meet the
  // backoff of the first.
  DhtOptions o = OneBeam();
  o.backoff_base = 60s;
  const size_t attacker = Index(nearest_[0]);
  const size_t v = AddStranger(attacker, o);
  const std::vector<PeerId> named = Misdirect(attacker, 3);
  // The misdirected replicas fail at the wrong addresses; then honest nodes name them at their
  // own, the nearest is asked there and has the value, and the get stops: the others are left
  // backed off.
  auto [got, took] = TimedGet(v);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->value.value, "\"the value\"");
  EXPECT_GE(sim_.node(v).stats().requests_failed, named.size());
  // The attacker goes quiet; honest nodes name the replicas at their own addresses. Backed off
  // as peers, they were skipped there for a minute; backed off at the addresses they failed
  // at, they are asked.
  sim_.ScriptFinds(attacker, nullptr);
  const std::vector<PeerId> found = FindNodes(v);
  for (size_t rank = 1; rank <= named.size(); ++rank) {
    EXPECT_TRUE(Has(found, named[rank - 1])) << "replica " << rank << " is missing";
  }
}

// Merge attacks: 60 nodes, and kHonest subkeys of `key` stored by honest nodes, expiring in 600 s.
constexpr size_t kHonest = 6;
void GrowWithHonestEntries(Simulation& sim, const std::string& key) {
  ASSERT_NO_FATAL_FAILURE(Grow(sim, 60));
  const double now = sim.clock().WallSeconds();
  for (size_t i = 0; i < kHonest; ++i) {
    const std::string sub = fmt::format("honest-{}", i);
    ASSERT_TRUE(sim.Store(10 + i, Item(key, "\"served\"", now + 600, sub)).ok()) << sub;
  }
}
// How many of a dictionary's subkeys are honest ones, and how many the attacker's.
std::pair<size_t, size_t> HonestAndFake(const Record& record) {
  size_t honest = 0;
  for (const auto& [sub, v] : record.subkeys) honest += sub.starts_with("honest-") ? 1 : 0;
  return {honest, record.subkeys.size() - honest};
}

// A replica of a dictionary answers a full lookup with a full dictionary of its own (entries are
// free to write, and its own identities could sign each one), all expiring after the honest
// entries. The reader merges the replicas' copies and trims the union to its limits: by
// expiration alone that dropped every honest entry; ranked by how many sources held each entry,
// the honest entries, which every honest replica holds, are kept, and what the liar alone claims
// fills only what is left.
TEST(MergeAttack, AReplicaAnsweringWithAFullDictionaryOfItsOwnCannotPushOutHonestEntries) {
  Simulation sim({.seed = 29});
  const std::string key = "experts";
  ASSERT_NO_FATAL_FAILURE(GrowWithHonestEntries(sim, key));
  const double now = sim.clock().WallSeconds();
  const DhtId target = DhtId::ForKey(key);
  const auto nearest = BruteForceNearest(sim, target);
  size_t liar = 0;
  while (sim.identity(liar).peer_id() != nearest[0]) ++liar;
  DhtOptions reader_options;
  reader_options.storage.max_subkeys = 16;  // what the reader keeps of a merged dictionary
  std::vector<Contact> honest_nearest;
  for (size_t i = 0; i < sim.size(); ++i) {
    if (i != liar && std::find(nearest.begin() + 1, nearest.begin() + 21,
                               sim.identity(i).peer_id()) != nearest.begin() + 21) {
      honest_nearest.push_back({sim.identity(i).peer_id(), sim.node(i).id(), {sim.address(i)}});
    }
  }
  Record fakes;
  fakes.is_dict = true;
  for (size_t i = 0; i < reader_options.storage.max_subkeys; ++i) {
    fakes.subkeys[fmt::format("fake-{:02}", i)] = {"\"mine\"", now + 20 * 3600};
  }
  size_t lies = 0;
  sim.ScriptFinds(liar, [&](const PeerId&, const FindRequest& request) {
    FindResponse response;
    for (const DhtId& id : request.ids) {
      FindResult& result = response.results.emplace_back();
      result.nearest = honest_nearest;
      if (id == target) {
        result.record = fakes;
        ++lies;
      }
    }
    return Result<FindResponse>(response);
  });
  const size_t reader = sim.AddNode(reader_options);
  ASSERT_TRUE(sim.Bootstrap(reader, {sim.address(0)}).ok());
  const Result<Record> got = sim.Get(reader, key, Freshness::kLatest);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_GE(lies, 1u) << "the scenario needs the reader to hear the liar";
  const auto [honest, fake] = HonestAndFake(*got);
  // Without the ranking: 0 honest, 16 fakes.
  EXPECT_EQ(honest, kHonest);
  EXPECT_EQ(fake, reader_options.storage.max_subkeys - kHonest);
}

// The same attack on the reader's own copy: a peer stores a full dictionary of its own entries,
// expiring last, on the reader itself (any node takes cached copies). A get merges that copy
// with what the lookup found; the union must keep to the reader's limits (not grow to two
// dictionaries' worth), and the reader's copy counts as one source, so the entries the replicas
// hold are kept and the stored fakes fill only what is left.
TEST(MergeAttack, FakesStoredOnTheReaderItselfCannotPushOutTheEntriesTheReplicasHold) {
  Simulation sim({.seed = 31});
  const std::string key = "experts";
  ASSERT_NO_FATAL_FAILURE(GrowWithHonestEntries(sim, key));
  const double now = sim.clock().WallSeconds();
  DhtOptions reader_options;
  reader_options.storage.max_subkeys = 16;
  const size_t reader = sim.AddNode(reader_options);
  ASSERT_TRUE(sim.Bootstrap(reader, {sim.address(0)}).ok());
  // One address may hold 4 entries of a key there: the attacker uses 4 addresses.
  for (size_t a = 0; a < 4; ++a) {
    StoreRequest fakes;
    for (size_t i = 0; i < 4; ++i) {
      fakes.items.push_back(
          {Item(key, "\"mine\"", now + 20 * 3600, fmt::format("fake-{}-{}", a, i)), true});
    }
    auto stored =
        sim.node(reader).HandleStore(sim.node(3 + a).peer_id(), fakes, fmt::format("evil-{}", a));
    ASSERT_TRUE(stored.ok()) << stored.status().ToString();
    for (const Status& st : stored->results) ASSERT_TRUE(st.ok()) << st.ToString();
  }
  ASSERT_EQ(sim.node(reader).cache().Peek(DhtId::ForKey(key))->subkeys.size(),
            reader_options.storage.max_subkeys);
  const Result<Record> got = sim.Get(reader, key, Freshness::kLatest);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  const auto [honest, fake] = HonestAndFake(*got);
  // Untrimmed: 6 honest and 16 fakes; trimmed by expiration alone: 0 honest and 16 fakes.
  EXPECT_EQ(honest, kHonest);
  EXPECT_EQ(fake, reader_options.storage.max_subkeys - kHonest);
}

TEST(DhtSimulationBootstrap, DeadInitialPeersGiveAnErrorNamingEachAddress) {
  Simulation sim;
  sim.AddNode();
  sim.AddNode();
  sim.Kill(0);
  auto r = sim.Bootstrap(1, {sim.address(0), "sim/99"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("sim/0"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("sim/99"), std::string::npos);
  EXPECT_NE(r.status().message().find("did not answer"), std::string::npos);
}

TEST(DhtSimulationBootstrap, PeersWithSkewedClocksAreRefused) {
  Simulation sim;
  sim.AddNode();
  ASSERT_TRUE(sim.Bootstrap(0, {}).ok());
  // A node whose clock is 60 s ahead cannot join through node 0: node 0 refuses its ping, and
  // it would refuse node 0's answer.
  const size_t ahead = sim.AddNode({}, 60);
  auto r = sim.Bootstrap(ahead, {sim.address(0)});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("clock"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("sim/0"), std::string::npos) << r.status().message();
  EXPECT_FALSE(sim.node(0).routing_table().Find(sim.node(ahead).peer_id()).has_value());
  // A node 2 s off joins (within the allowed skew).
  const size_t close = sim.AddNode({}, 2);
  EXPECT_TRUE(sim.Bootstrap(close, {sim.address(0)}).ok());
  // The joiner itself refuses a bootstrap peer whose clock is off, even if that peer would
  // answer: node 3 is 60 s behind and lenient.
  DhtOptions lenient;
  lenient.max_clock_skew_seconds = 1000;
  const size_t behind = sim.AddNode(lenient, -60);
  ASSERT_TRUE(sim.Bootstrap(behind, {}).ok());
  const size_t joiner = sim.AddNode();
  auto refused = sim.Bootstrap(joiner, {sim.address(behind)});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("its clock differs from ours by -60"),
            std::string::npos)
      << refused.status().message();
}

TEST(DhtSimulationBootstrap, ManyNodesStartingAtOnceFromOneBootstrapFormOneSwarm) {
  Simulation sim({.seed = 21});
  sim.AddNode();
  ASSERT_TRUE(sim.Bootstrap(0, {}).ok());
  const size_t n = 100;
  size_t booted = 0;
  for (size_t i = 1; i <= n; ++i) {
    sim.AddNode();
    sim.node(i).Bootstrap({sim.address(0)}, [&](Result<size_t> r) {
      EXPECT_TRUE(r.ok());
      ++booted;
    });
  }
  ASSERT_TRUE(sim.RunUntil([&] { return booted == n; }));
  // Let the swarm settle: each node refreshes its sparse buckets once shortly after joining.
  sim.RunFor(5s);
  // Every node publishes a record at once; then every node finds every other's.
  size_t stored = 0;
  const double exp = sim.clock().WallSeconds() + 600;
  for (size_t i = 1; i <= n; ++i) {
    sim.node(i).Store({Item("node" + std::to_string(i), std::to_string(i), exp)},
                      [&](std::vector<Status> st) {
                        EXPECT_TRUE(st[0].ok()) << st[0].ToString();
                        ++stored;
                      });
  }
  ASSERT_TRUE(sim.RunUntil([&] { return stored == n; }));
  size_t found = 0, answered = 0, failures = 0;
  for (size_t i = 1; i <= n; ++i) {
    std::vector<std::string> keys;
    for (size_t j = 1; j <= n; ++j) keys.push_back("node" + std::to_string(j));
    sim.node(i).Get(keys, Freshness::kAnyCopy, [&, i](std::vector<Result<Record>> rs) {
      for (size_t j = 0; j < rs.size(); ++j) {
        if (rs[j].ok() && rs[j]->value.value == std::to_string(j + 1)) {
          ++found;
        } else if (failures++ < 5) {
          ADD_FAILURE() << "node " << i << " key " << j + 1 << ": " << rs[j].status().ToString();
        }
      }
      ++answered;
    });
  }
  ASSERT_TRUE(sim.RunUntil([&] { return answered == n; }));
  EXPECT_EQ(found, n * n);
}

}  // namespace
}  // namespace colony::dht
