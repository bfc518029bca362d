// Declaring and finding experts through DHT nodes on loopback that enforce the swarm's record
// rules: hivemind's declaration example, 1,000 live experts found by beam search exactly as an
// exhaustive search over them ranks them, a stranger that can add its own entries but neither
// junk nor anything in another server's name, and the negative cache of empty prefixes.
#include "moe/discovery.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <thread>

#include "loopback_node.h"
#include "moe/beam_search.h"

namespace colony::moe {
namespace {

using namespace std::chrono_literals;

class ExpertSwarm : public ::testing::Test {
 protected:
  void SetUp() override {
    auto boot = dht::Node::Start(KeyPair::Generate(), test::LoopbackNodeOptions({}));
    ASSERT_TRUE(boot.ok()) << boot.status().ToString();
    nodes_.push_back(std::move(*boot));
    for (int i = 0; i < 4; ++i) {
      auto n = dht::Node::Start(
          KeyPair::Generate(),
          test::LoopbackNodeOptions({nodes_[0]->VisibleAddresses().at(0).ToString()}));
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      nodes_.push_back(std::move(*n));
    }
  }
  void TearDown() override {
    for (auto& n : nodes_) n->Shutdown();
  }
  dht::Node& node(size_t i) { return *nodes_.at(i); }

  std::vector<std::unique_ptr<dht::Node>> nodes_;
};

std::set<int64_t> Coordinates(const std::map<int64_t, std::vector<ServerEntry>>& next) {
  std::set<int64_t> out;
  for (const auto& [c, servers] : next) out.insert(c);
  return out;
}

TEST_F(ExpertSwarm, HivemindsDeclarationExample) {
  // hivemind's test_dht_experts declares these three ids and expects 7 entries: the 3 experts
  // and the prefix/successor pairs (e.1.2., 3), (e.1.2., 5), (e.1., 2), (e.2., 0).
  ASSERT_TRUE(DeclareExperts(node(1), {"e.1.2.3", "e.1.2.5", "e.2.0"}, dht::Now() + 60).ok());
  auto found = GetExperts(node(3), {"e.1.2.3", "e.1.2.5", "e.2.0", "e.1.2.4"});
  ASSERT_EQ(found.size(), 4u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(found[i].has_value()) << i;
    EXPECT_EQ(found[i]->servers, std::vector<PeerId>{node(1).peer_id()});
    EXPECT_EQ(found[i]->addrs.at(0).at(0), node(1).VisibleAddresses().at(0).ToString());
  }
  EXPECT_FALSE(found[3].has_value());
  auto next = GetActiveSuccessors(node(4), {"e.1.2.", "e.1.", "e.2.", "e.4.5.", "e.1.2.3."});
  EXPECT_EQ(Coordinates(next["e.1.2."]), (std::set<int64_t>{3, 5}));
  EXPECT_EQ(Coordinates(next["e.1."]), (std::set<int64_t>{2}));
  EXPECT_EQ(Coordinates(next["e.2."]), (std::set<int64_t>{0}));
  EXPECT_TRUE(next["e.4.5."].empty());
  EXPECT_TRUE(next["e.1.2.3."].empty());
  size_t declared = 3;
  for (const char* p : {"e.1.2.", "e.1.", "e.2."}) declared += next[p].size();
  EXPECT_EQ(declared, 7u);
  // A second server of e.1.2.3 adds itself; the first stays.
  ASSERT_TRUE(DeclareExperts(node(2), {"e.1.2.3", "e.1.2.7"}, dht::Now() + 60).ok());
  auto both = GetExperts(node(3), {"e.1.2.3"});
  ASSERT_TRUE(both[0].has_value());
  EXPECT_EQ(std::set<PeerId>(both[0]->servers.begin(), both[0]->servers.end()),
            (std::set<PeerId>{node(1).peer_id(), node(2).peer_id()}));
  next = GetActiveSuccessors(node(4), {"e.1.2."});
  EXPECT_EQ(Coordinates(next["e.1.2."]), (std::set<int64_t>{3, 5, 7}));
}

TEST_F(ExpertSwarm, BeamSearchOverAThousandLiveExpertsEqualsExhaustiveSearch) {
  const std::vector<int64_t> grid = {16, 16, 16};
  std::mt19937_64 rng(17);
  auto pattern = ParseExpertPattern("ffn.[0:16].[0:16].[0:16]");
  ASSERT_TRUE(pattern.ok());
  const auto uids = pattern->Sample(1000, {}, rng);
  ASSERT_EQ(uids.size(), 1000u);
  std::vector<std::vector<std::string>> per_server(4);
  for (size_t i = 0; i < uids.size(); ++i) per_server[i % 4].push_back(uids[i].ToString());
  for (size_t s = 0; s < 4; ++s) {
    Status st = DeclareExperts(node(s + 1), per_server[s], dht::Now() + 120);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  auto searcher = BeamSearcher::Create(node(0), "ffn", grid);
  ASSERT_TRUE(searcher.ok()) << searcher.status().ToString();
  std::normal_distribution<float> normal(0, 1);
  for (int input = 0; input < 25; ++input) {
    std::vector<std::vector<float>> scores(3, std::vector<float>(16));
    for (auto& dim : scores) {
      for (auto& v : dim) v = normal(rng);
    }
    std::vector<std::pair<double, std::string>> ranked;
    for (const auto& u : uids) {
      double s = 0;
      for (size_t d = 0; d < 3; ++d) s += scores[d][static_cast<size_t>(u.coords[d])];
      ranked.emplace_back(s, u.ToString());
    }
    std::sort(ranked.rbegin(), ranked.rend());
    const size_t k = 4;
    auto best = (*searcher)->FindBestExperts(scores, k);
    ASSERT_TRUE(best.ok()) << best.status().ToString();
    ASSERT_EQ(best->size(), k) << "input " << input;
    for (size_t j = 0; j < k; ++j) {
      EXPECT_EQ((*best)[j].expert.uid, ranked[j].second) << "input " << input << " rank " << j;
      EXPECT_EQ((*best)[j].expert.servers.size(), 1u);
    }
  }
}

TEST_F(ExpertSwarm, AStrangerAddsOnlyItsOwnValidEntries) {
  ASSERT_TRUE(DeclareExperts(node(1), {"ffn.3.4"}, dht::Now() + 60).ok());
  dht::Node& stranger = node(2);
  const std::string marker = dht::OwnerMarker(stranger.peer_id());
  // Junk under an expert's key, a prefix entry under an expert's key, an undeclarable key.
  EXPECT_FALSE(stranger.StoreSync(ExpertKey("ffn.3.4"), "junk", dht::Now() + 60, marker).ok());
  EXPECT_FALSE(stranger
                   .StoreSync(ExpertKey("ffn.3."),
                              EncodeExpertEntry({.addrs = {"/ip4/127.0.0.1/tcp/9"}}),
                              dht::Now() + 60, marker)
                   .ok());
  EXPECT_FALSE(stranger
                   .StoreSync(ExpertKey("ffn."),
                              EncodeExpertEntry({.next = {3}, .addrs = {"/ip4/127.0.0.1/tcp/9"}}),
                              dht::Now() + 60, marker)
                   .ok());
  // A plain value and an entry under no owner's name would wipe or impersonate: refused.
  EXPECT_FALSE(stranger.StoreSync(ExpertKey("ffn.3."), "{}", dht::Now() + 600).ok());
  EXPECT_FALSE(stranger
                   .StoreSync(ExpertKey("ffn.3."),
                              EncodeExpertEntry({.next = {9}, .addrs = {"/ip4/127.0.0.1/tcp/9"}}),
                              dht::Now() + 600, "anyone")
                   .ok());
  // Its own declaration of other experts under the same prefix adds to the server's.
  ASSERT_TRUE(DeclareExperts(stranger, {"ffn.3.9"}, dht::Now() + 60).ok());
  auto next = GetActiveSuccessors(node(3), {"ffn.3."});
  EXPECT_EQ(Coordinates(next["ffn.3."]), (std::set<int64_t>{4, 9}));
  auto found = GetExperts(node(3), {"ffn.3.4"});
  ASSERT_TRUE(found[0].has_value());
  EXPECT_EQ(found[0]->servers, std::vector<PeerId>{node(1).peer_id()});
}

TEST_F(ExpertSwarm, EmptyPrefixesAreNotAskedForAgainUntilTheNegativeCacheExpires) {
  BeamSearchOptions options;
  // (Longer than the first search, a declaration and a second search take on a loaded machine.)
  options.negative_cache = 3000ms;
  auto searcher = BeamSearcher::Create(node(0), "ffn", {4, 4}, options);
  ASSERT_TRUE(searcher.ok());
  std::vector<std::vector<float>> scores = {{4, 3, 2, 1}, {1, 2, 3, 4}};
  ASSERT_TRUE(DeclareExperts(node(1), {"ffn.1.0"}, dht::Now() + 60).ok());
  auto first = (*searcher)->FindBestExperts(scores, 1);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->size(), 1u);
  EXPECT_EQ(first->at(0).expert.uid, "ffn.1.0");
  // ffn.0. was empty: a new expert there is not seen while the cache holds...
  ASSERT_TRUE(DeclareExperts(node(2), {"ffn.0.3"}, dht::Now() + 60).ok());
  auto cached = (*searcher)->FindBestExperts(scores, 1);
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(cached->at(0).expert.uid, "ffn.1.0");
  // ...and is once it expires (ffn.0.3 scores 4 + 4 against 3 + 1).
  std::this_thread::sleep_for(3100ms);
  auto fresh = (*searcher)->FindBestExperts(scores, 1);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->at(0).expert.uid, "ffn.0.3");
}

}  // namespace
}  // namespace colony::moe
