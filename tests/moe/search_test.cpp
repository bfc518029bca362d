// The best-first beam search over the expert grid, in memory: for random grids, random sets of
// live experts and random gating scores, its answer equals the top k of an exhaustive search over
// the live experts (computed here apart), in order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "moe/beam_search.h"
#include "moe/discovery.h"

namespace colony::moe {
namespace {

// The DHT's content after every server stored its DeclarationItems, as the fetcher returns it.
struct MemorySwarm {
  std::map<std::string, std::vector<ServerEntry>> entries;
  std::vector<std::string> live;
  size_t fetches = 0;
  size_t keys_fetched = 0;

  void Declare(const PeerId& server, const std::vector<std::string>& uids) {
    auto items = DeclarationItems(uids, server, {"/ip4/127.0.0.1/tcp/1"}, 1e12);
    ASSERT_TRUE(items.ok()) << items.status().ToString();
    for (const auto& item : *items) {
      const bool prefix = item.key.back() == '.';
      auto e = ParseExpertEntry(item.value, prefix);
      ASSERT_TRUE(e.ok()) << e.status().ToString();
      entries[item.key].push_back({.server = server, .entry = *e});
    }
    live.insert(live.end(), uids.begin(), uids.end());
  }
  EntryFetcher Fetcher() {
    return [this](const std::vector<std::string>& keys) {
      ++fetches;
      keys_fetched += keys.size();
      std::map<std::string, std::vector<ServerEntry>> out;
      for (const auto& k : keys) {
        auto it = entries.find(k);
        if (it != entries.end()) out[k] = it->second;
      }
      return out;
    };
  }
};

double Score(const std::vector<std::vector<float>>& scores, const std::string& uid) {
  auto u = ParseExpertUid(uid);
  double s = 0;
  for (size_t d = 0; d < u->coords.size(); ++d) s += scores[d][static_cast<size_t>(u->coords[d])];
  return s;
}

// The reference: every live expert scored, sorted; those with a -inf score are ruled out.
std::vector<std::string> Exhaustive(const std::vector<std::vector<float>>& scores,
                                    std::vector<std::string> live, size_t k) {
  std::sort(live.begin(), live.end());
  live.erase(std::unique(live.begin(), live.end()), live.end());
  std::erase_if(live, [&](const std::string& uid) { return std::isinf(Score(scores, uid)); });
  std::sort(live.begin(), live.end(), [&](const std::string& a, const std::string& b) {
    return Score(scores, a) > Score(scores, b);
  });
  if (live.size() > k) live.resize(k);
  return live;
}

// An expert that a thousand identities declare (identities are free) is named with at most
// kMaxServersPerExpert of them, not the record's first ones and the same in every search here;
// a server the caller ranks first (one that answered) is kept whatever its place.
TEST(BeamSearch, AnExpertDeclaredByAThousandIdentitiesNamesAtMostSixteenRankedFirst) {
  MemorySwarm swarm;
  std::vector<PeerId> sybils;
  for (int i = 0; i < 1000; ++i) {
    sybils.push_back(KeyPair::Generate().peer_id());
    swarm.Declare(sybils.back(), {"ffn.3"});
  }
  const PeerId honest = KeyPair::Generate().peer_id();
  swarm.Declare(honest, {"ffn.3", "ffn.5"});
  std::vector<float> scores(8, 0.0f);
  scores[3] = 2;
  scores[5] = 1;
  auto search = [&](const ServerRank& rank) {
    auto best = SearchBestExperts("ffn", {8}, {{scores}}, 2, swarm.Fetcher(), 64, rank);
    EXPECT_TRUE(best.ok()) << best.status().ToString();
    EXPECT_EQ(best->at(0).size(), 2u);
    return best->at(0);
  };
  const auto first = search({});
  ASSERT_EQ(first[0].expert.uid, "ffn.3");
  ASSERT_EQ(first[0].expert.servers.size(), kMaxServersPerExpert);
  EXPECT_EQ(first[0].expert.addrs.size(), kMaxServersPerExpert);
  EXPECT_NE(first[0].expert.servers,
            std::vector<PeerId>(sybils.begin(), sybils.begin() + kMaxServersPerExpert))
      << "the record's first entries were kept";
  EXPECT_EQ(std::set<PeerId>(first[0].expert.servers.begin(), first[0].expert.servers.end()).size(),
            kMaxServersPerExpert);
  EXPECT_EQ(first[1].expert.servers, std::vector<PeerId>{honest});
  EXPECT_EQ(search({})[0].expert.servers, first[0].expert.servers) << "not stable";
  const auto ranked = search([&](const PeerId& p) -> uint64_t { return p == honest ? 7 : 0; });
  ASSERT_EQ(ranked[0].expert.servers.size(), kMaxServersPerExpert);
  EXPECT_EQ(ranked[0].expert.servers[0], honest);
}

TEST(BeamSearch, HivemindsSingleDimensionExample) {
  MemorySwarm swarm;
  const PeerId a = KeyPair::Generate().peer_id();
  swarm.Declare(a, {"expert.1", "expert.2", "expert.3"});
  swarm.Declare(a, {"expert.5", "expert.2"});
  std::vector<float> scores(10);
  for (size_t i = 0; i < 10; ++i) scores[i] = static_cast<float>(i);
  auto best = SearchBestExperts("expert", {10}, {{scores}}, 2, swarm.Fetcher());
  ASSERT_TRUE(best.ok()) << best.status().ToString();
  ASSERT_EQ(best->at(0).size(), 2u);
  EXPECT_EQ(best->at(0)[0].expert.uid, "expert.5");
  EXPECT_EQ(best->at(0)[1].expert.uid, "expert.3");
  EXPECT_EQ(best->at(0)[0].expert.servers, std::vector<PeerId>{a});
}

TEST(BeamSearch, EqualsExhaustiveSearchOnRandomGrids) {
  std::mt19937_64 rng(2024);
  const std::vector<std::vector<int64_t>> grids = {
      {10}, {8, 8}, {16, 16, 16}, {5, 7, 3, 4}, {64, 4}};
  size_t cases = 0;
  for (const auto& grid : grids) {
    for (double alive : {0.02, 0.3, 1.0}) {
      MemorySwarm swarm;
      std::vector<std::vector<std::string>> per_server(3);
      int64_t cells = 1;
      for (int64_t n : grid) cells *= n;
      for (int64_t cell = 0; cell < cells; ++cell) {
        if (std::uniform_real_distribution<double>(0, 1)(rng) >= alive) continue;
        ExpertUid uid{.name = "ffn", .coords = std::vector<int64_t>(grid.size())};
        int64_t rest = cell;
        for (size_t d = grid.size(); d-- > 0;) {
          uid.coords[d] = rest % grid[d];
          rest /= grid[d];
        }
        per_server[rng() % 3].push_back(uid.ToString());
      }
      for (auto& uids : per_server) {
        if (!uids.empty()) swarm.Declare(KeyPair::Generate().peer_id(), uids);
      }
      // Experts outside the searched grid are ignored.
      swarm.Declare(
          KeyPair::Generate().peer_id(),
          {ExpertUid{.name = "ffn", .coords = std::vector<int64_t>(grid.size(), 999)}.ToString()});
      for (size_t k : {1, 4, 16}) {
        for (int input = 0; input < 5; ++input) {
          std::vector<std::vector<float>> scores;
          std::normal_distribution<float> normal(0, 1);
          for (int64_t n : grid) {
            std::vector<float> s(static_cast<size_t>(n));
            for (auto& v : s) v = normal(rng);
            // Half the inputs rule out a third of each dimension's coordinates (grid dropout),
            // keeping at least one.
            for (size_t c = 1; input % 2 == 1 && c < s.size(); ++c) {
              if (rng() % 3 == 0) s[c] = -std::numeric_limits<float>::infinity();
            }
            scores.push_back(std::move(s));
          }
          auto best = SearchBestExperts("ffn", grid, {scores}, k, swarm.Fetcher());
          ASSERT_TRUE(best.ok()) << best.status().ToString();
          std::vector<std::string> live;
          for (const auto& uid : swarm.live) {
            auto u = ParseExpertUid(uid);
            bool inside = true;
            for (size_t d = 0; d < grid.size(); ++d) inside = inside && u->coords[d] < grid[d];
            if (inside) live.push_back(uid);
          }
          const auto expect = Exhaustive(scores, live, k);
          std::vector<std::string> got;
          for (const auto& e : best->at(0)) {
            got.push_back(e.expert.uid);
            EXPECT_NEAR(e.score, Score(scores, e.expert.uid), 1e-4);
          }
          EXPECT_EQ(got, expect) << "grid of " << grid.size() << " dims, alive " << alive << ", k "
                                 << k;
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 5u * 3 * 3 * 5);
}

TEST(BeamSearch, ABatchSharesEachRoundsLookups) {
  std::mt19937_64 rng(5);
  MemorySwarm swarm;
  std::vector<std::string> uids;
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      if ((i * 16 + j) % 3 == 0)
        uids.push_back("ffn." + std::to_string(i) + "." + std::to_string(j));
    }
  }
  swarm.Declare(KeyPair::Generate().peer_id(), uids);
  std::vector<std::vector<std::vector<float>>> batch(32);
  std::normal_distribution<float> normal(0, 1);
  for (auto& in : batch) {
    in.assign(2, std::vector<float>(16));
    for (auto& dim : in) {
      for (auto& v : dim) v = normal(rng);
    }
  }
  auto best = SearchBestExperts("ffn", {16, 16}, batch, 4, swarm.Fetcher());
  ASSERT_TRUE(best.ok());
  for (size_t i = 0; i < batch.size(); ++i) {
    std::vector<std::string> got;
    for (const auto& e : best->at(i)) got.push_back(e.expert.uid);
    EXPECT_EQ(got, Exhaustive(batch[i], uids, 4)) << "input " << i;
  }
  // One lookup per round for the whole batch, each prefix at most once.
  EXPECT_LE(swarm.fetches, 8u);
  EXPECT_LE(swarm.keys_fetched, 16u);
}

TEST(BeamSearch, RefusesScoresThatDoNotFitTheGrid) {
  MemorySwarm swarm;
  const std::vector<float> ten(10, 0.f);
  EXPECT_FALSE(SearchBestExperts("ffn", {10, 10}, {{ten}}, 1, swarm.Fetcher()).ok());
  EXPECT_FALSE(SearchBestExperts("ffn", {10}, {{std::vector<float>(9)}}, 1, swarm.Fetcher()).ok());
  EXPECT_FALSE(SearchBestExperts("ffn", {10}, {{ten}}, 0, swarm.Fetcher()).ok());
  auto nan = ten;
  nan[3] = std::nanf("");
  EXPECT_FALSE(SearchBestExperts("ffn", {10}, {{nan}}, 1, swarm.Fetcher()).ok());
  auto plus_inf = ten;
  plus_inf[3] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(SearchBestExperts("ffn", {10}, {{plus_inf}}, 1, swarm.Fetcher()).ok());
  const std::vector<float> none(10, -std::numeric_limits<float>::infinity());
  auto all_out = SearchBestExperts("ffn", {10}, {{none}}, 1, swarm.Fetcher());
  ASSERT_FALSE(all_out.ok());
  EXPECT_NE(all_out.status().message().find("rules out every coordinate"), std::string::npos)
      << all_out.status().ToString();
  EXPECT_FALSE(SearchBestExperts("ffn", {0}, {{}}, 1, swarm.Fetcher()).ok());
}

}  // namespace
}  // namespace colony::moe
