// Rebalancing of SWARM stages (swarm/rebalancing.h) and the run's layout (swarm/layout.h).
// The rule is checked against hand-computed capacities and, for convergence, against the best
// assignment of peers to stages found by exhaustive search; a stage peer is checked on loopback
// (it moves to a stage that lost its peers, reading records a stranger tries to skew).
#include "swarm/rebalancing.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "core/files.h"
#include "dht/validation.h"
#include "loopback_dht.h"
#include "model/checkpoint.h"
#include "model/llama.h"
#include "serve/records.h"
#include "swarm/layout.h"
#include "test_support.h"
#include "tiny_llama.h"

namespace colony::swarm {
namespace {

using namespace std::chrono_literals;

StageLayout Layout(std::vector<std::pair<int64_t, int64_t>> stages) { return {std::move(stages)}; }

// Peers with ids from fixed seeds: which one moves in a round is the same in every run.
std::vector<PeerLoad> Peers(const std::vector<std::pair<size_t, double>>& at) {
  static uint8_t next = 0;
  std::vector<PeerLoad> peers;
  for (const auto& [stage, throughput] : at) {
    std::array<uint8_t, 32> seed{};
    seed[0] = ++next;
    seed[1] = static_cast<uint8_t>(peers.size());
    peers.push_back(
        {.peer = KeyPair::FromSeed(seed).peer_id(), .stage = stage, .throughput = throughput});
  }
  return peers;
}

double PipelineCapacity(const StageLayout& layout, const std::vector<PeerLoad>& peers) {
  const auto caps = StageCapacities(layout, peers);
  return *std::min_element(caps.begin(), caps.end());
}

TEST(StageLayoutTest, EvenLayoutTilesTheModel) {
  auto l = EvenLayout(8, 3);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->ToString(), "0:3,3:6,6:8");
  EXPECT_EQ(l->Find(3, 6), 1u);
  EXPECT_FALSE(l->Find(3, 5).has_value());
  EXPECT_FALSE(EvenLayout(4, 5).ok());
  EXPECT_FALSE(EvenLayout(4, 0).ok());
}

TEST(StageLayoutTest, ReadRefusesWhatItDoesNotUnderstand) {
  const auto dir = test::TempPath("swarm-layout");
  std::filesystem::create_directories(dir);
  EXPECT_EQ(ReadLayout(dir, 4).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(WriteLayout(dir, *EvenLayout(4, 2)).ok());
  auto read = ReadLayout(dir, 4);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->ToString(), "0:2,2:4");
  EXPECT_FALSE(ReadLayout(dir, 6).ok());  // ends at block 4 of 6
  const std::map<std::string, std::string> bad = {
      {R"({"stages": [[0, 2], [2, 4]], "balance": 1})", "unknown field 'balance'"},
      {R"({"stages": [[0, 2], [3, 4]]})", "does not continue"},
      {R"({"stages": [[0, 3], [2, 4]]})", "does not continue"},
      {R"({"stages": [[0, 0], [0, 4]]})", "does not continue"},
      {R"({"stages": [[0, 2, 4]]})", "not a pair"},
      {R"({"stages": []})", "non-empty"},
      {R"([[0, 4]])", "not a JSON object"}};
  for (const auto& [text, why] : bad) {
    std::ofstream(dir / kLayoutFile) << text;
    auto r = ReadLayout(dir, 4);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().ToString();
  }
  RemoveTree(dir);
}

TEST(RebalancingTest, MovesAPeerOnlyWhenThePipelineGainsClearly) {
  const auto layout = Layout({{0, 2}, {2, 4}});
  // 3 + 1 peers of 100 tokens/s per block: stages of 150 and 50; a move gives 100 and 100.
  auto peers = Peers({{0, 100}, {0, 100}, {0, 100}, {1, 100}});
  auto move = PlanMove(layout, peers, 0.75, 1);
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->from, 0u);
  EXPECT_EQ(move->to, 1u);
  EXPECT_DOUBLE_EQ(move->capacity_now, 50);
  EXPECT_DOUBLE_EQ(move->capacity_after, 100);
  // 3 + 2: 150 and 100, within 0.75 of 500 over 4 blocks: nobody moves.
  EXPECT_FALSE(
      PlanMove(layout, Peers({{0, 100}, {0, 100}, {0, 100}, {1, 100}, {1, 100}}), 0.75, 1));
  // 2 + 1 of unequal speeds: 100 + 60 over 2 blocks (80) and 100 over 2 (50): the pipeline's 50
  // is not below 0.75 of what the peers could give (260 over 4 blocks, 65): nobody moves.
  EXPECT_FALSE(PlanMove(layout, Peers({{0, 100}, {0, 60}, {1, 100}}), 0.75, 1));
  // An emptied stage is filled from a stage of two; a lone peer never leaves its stage empty.
  EXPECT_TRUE(PlanMove(layout, Peers({{0, 100}, {0, 100}}), 0.75, 1).has_value());
  EXPECT_FALSE(PlanMove(layout, Peers({{0, 100}}), 0.75, 1).has_value());
  // Stages of unequal lengths: blocks [0, 1) and [1, 4); 2 + 2 peers: 200 and 66.7. Moving one
  // peer gives 100 and 100: the capacity rises 1.5x, so a peer of the short stage moves.
  auto uneven =
      PlanMove(Layout({{0, 1}, {1, 4}}), Peers({{0, 100}, {0, 100}, {1, 100}, {1, 100}}), 0.75, 1);
  ASSERT_TRUE(uneven.has_value());
  EXPECT_EQ(uneven->from, 0u);
  EXPECT_NEAR(uneven->capacity_after, 100, 1e-9);
}

TEST(RebalancingTest, OnePeerMovesPerRoundAndEveryPeerNamesTheSameOne) {
  const auto layout = Layout({{0, 2}, {2, 4}});
  auto peers = Peers({{0, 100}, {0, 100}, {0, 100}, {1, 100}});
  std::set<std::string> movers;
  for (uint64_t round = 0; round < 64; ++round) {
    // Every peer reads the same records, in its own order.
    auto shuffled = peers;
    std::rotate(shuffled.begin(), shuffled.begin() + static_cast<long>(round % 4), shuffled.end());
    auto a = PlanMove(layout, peers, 0.75, round);
    auto b = PlanMove(layout, shuffled, 0.75, round);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->peer, b->peer) << "round " << round;
    movers.insert(a->peer.ToString());
  }
  // The mover changes with the round: a peer that never moves holds the others back one round.
  EXPECT_EQ(movers.size(), 3u);
}

// The stages' capacities in ascending order: what every move must raise (lexicographically).
std::vector<double> Sorted(const StageLayout& layout, const std::vector<PeerLoad>& peers) {
  auto caps = StageCapacities(layout, peers);
  std::sort(caps.begin(), caps.end());
  return caps;
}

// Applying the rule round after round from random placements: every move raises the sorted
// capacities, the rounds settle, and with peers of equal speed (one kind of machine) the pipeline
// ends within balance_quality of the best assignment of those peers to the stages, found by
// trying every assignment. Peers of unequal speeds can settle lower (a swap of two peers may be
// needed, and single moves do not swap): their worst case over these draws is printed.
TEST(RebalancingTest, RoundsSettleNearTheBestAssignment) {
  const auto layout = Layout({{0, 2}, {2, 3}, {3, 6}});
  std::mt19937_64 rng(3);
  double worst_mixed = 1;
  int mixed = 0, mixed_within = 0;
  for (int trial = 0; trial < 80; ++trial) {
    const bool equal = trial % 2 == 0;
    const size_t n = 3 + rng() % 6;  // 3..8 peers
    std::vector<std::pair<size_t, double>> at;
    for (size_t i = 0; i < n; ++i) {
      at.emplace_back(rng() % 3, equal ? 100.0 : 20.0 + static_cast<double>(rng() % 180));
    }
    auto peers = Peers(at);
    double best = 0;
    std::vector<PeerLoad> trial_peers = peers;
    for (size_t code = 0, all = static_cast<size_t>(std::pow(3, n)); code < all; ++code) {
      size_t c = code;
      for (auto& p : trial_peers) {
        p.stage = c % 3;
        c /= 3;
      }
      best = std::max(best, PipelineCapacity(layout, trial_peers));
    }
    int moves = 0;
    for (uint64_t round = 0; round < 200; ++round) {
      auto move = PlanMove(layout, peers, 0.75, round);
      if (!move) break;
      const auto before = Sorted(layout, peers);
      for (auto& p : peers) {
        if (p.peer == move->peer) p.stage = move->to;
      }
      ++moves;
      EXPECT_GT(Sorted(layout, peers), before) << "trial " << trial << ": a move must help";
    }
    ASSERT_FALSE(PlanMove(layout, peers, 0.75, 999).has_value()) << "did not settle";
    const double got = PipelineCapacity(layout, peers);
    EXPECT_GT(got, 0) << "trial " << trial << ": a stage left empty";
    if (equal) {
      EXPECT_GE(got, 0.75 * best) << "trial " << trial << ": " << n << " peers, " << moves
                                  << " moves";
    } else {
      worst_mixed = std::min(worst_mixed, got / best);
      ++mixed;
      mixed_within += got >= 0.75 * best;
    }
  }
  std::printf(
      "[rebalance] unequal peers: %d of %d settled within 0.75 of the best assignment, the "
      "worst at %.2f\n",
      mixed_within, mixed, worst_mixed);
}

// Stage peers on loopback: the tiny model of 4 blocks in stages [0, 2) and [2, 4).
class StagePeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    dir_ = test::TempPath("swarm-rebalance");
    at::manual_seed(1);
    model::LlamaModel m(test::TinyStageModelConfig());
    ASSERT_TRUE(model::SaveLlama(dir_, m).ok());
    ASSERT_TRUE(WriteLayout(dir_, *EvenLayout(4, 2)).ok());
    Status started = dht_.Start();
    ASSERT_TRUE(started.ok()) << started.ToString();
  }

  void TearDown() override {
    peers_.clear();
    dht_.Shutdown();
    RemoveTree(dir_);
  }

  dht::Node& AddNode() { return dht_.Add(); }

  StagePeerOptions Options(int64_t first, int64_t last, std::chrono::milliseconds period) {
    StagePeerOptions o;
    o.stage.run = "run";
    o.stage.model_dir = dir_;
    o.stage.first_block = first;
    o.stage.last_block = last;
    o.stage.server.throughput_override = 100;
    o.stage.server.announce_period = 300ms;
    o.stage.training.collaborative.target_batch_size = 8;
    o.stage.training.collaborative.matchmaking_time = 2s;
    o.stage.training.collaborative.load_state_timeout = 3s;
    o.layout = *ReadLayout(dir_, 4);
    o.rebalance.period = period;
    return o;
  }

  StagePeer& AddPeer(int64_t first, int64_t last, std::chrono::milliseconds period) {
    auto peer = StagePeer::Start(AddNode(), Options(first, last, period));
    EXPECT_TRUE(peer.ok()) << peer.status().ToString();
    peers_.push_back(std::move(*peer));
    return *peers_.back();
  }

  std::filesystem::path dir_;
  test::LoopbackDht dht_;
  std::vector<std::unique_ptr<StagePeer>> peers_;
};

// Options out of range are refused by name before anything starts.
TEST_F(StagePeerTest, OptionsOutOfRangeAreRefused) {
  dht::Node& node = AddNode();
  StagePeerOptions o = Options(0, 2, 60s);
  o.rebalance.ping_timeout = 0ms;  // every record would count for nothing
  auto refused = StagePeer::Start(node, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("ping timeout (0 ms) positive"), std::string::npos)
      << refused.status().ToString();
  o = Options(0, 2, -1ms);
  refused = StagePeer::Start(node, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("period (-1 ms)"), std::string::npos)
      << refused.status().ToString();
}

TEST_F(StagePeerTest, APeerMovesToAStageThatLostItsPeersAndOnlyOneDoes) {
  StagePeer& a = AddPeer(0, 2, 500ms);
  StagePeer& b = AddPeer(0, 2, 500ms);
  // Stage [2, 4) has no peer: the pipeline's capacity is 0 until one of the two moves there.
  ASSERT_TRUE(test::WaitUntil([&] { return a.stats().moves + b.stats().moves >= 1; },
                              test::HangGuard(30s)));
  // A few more rounds: the other one stays (moving back would leave [0, 2) empty).
  const auto rounds_later = std::chrono::steady_clock::now() + 3s;
  ASSERT_TRUE(test::WaitUntil([&] { return std::chrono::steady_clock::now() > rounds_later; },
                              test::HangGuard(10s)));
  const auto sa = a.stats(), sb = b.stats();
  EXPECT_EQ(sa.moves + sb.moves, 1u);
  std::set<std::pair<int64_t, int64_t>> stages = {{sa.first, sa.last}, {sb.first, sb.last}};
  EXPECT_EQ(stages, (std::set<std::pair<int64_t, int64_t>>{{0, 2}, {2, 4}}));
  // The moved peer serves its new blocks (its server holds them and is online).
  const auto& moved = sa.moves == 1 ? sa : sb;
  EXPECT_EQ(moved.server.first, 2);
  EXPECT_EQ(moved.server.last, 4);
  EXPECT_EQ(moved.server.state, serve::ServerState::kOnline);
}

// A peer whose move fails, and the move back too (the checkpoint is gone from its directory for a
// while), is stageless; once the checkpoint is back, a later round joins it to the weakest stage.
TEST_F(StagePeerTest, APeerWhoseMoveAndMoveBackFailJoinsAStageLater) {
  StagePeer& a = AddPeer(0, 2, 500ms);
  StagePeer& b = AddPeer(0, 2, 500ms);
  const std::filesystem::path away = dir_.string() + ".away";
  std::filesystem::rename(dir_, away);
  struct PutBack {
    const std::filesystem::path &from, &to;
    ~PutBack() {
      std::error_code ec;
      if (std::filesystem::exists(from)) std::filesystem::rename(from, to, ec);
    }
  } put_back{away, dir_};
  // Stage [2, 4) has no peer: one of the two moves there, which fails, and so does going back.
  auto lost_peer = [](const StagePeerStats& s) { return s.failed_moves > 0 && s.stageless; };
  ASSERT_TRUE(test::WaitUntil([&] { return lost_peer(a.stats()) || lost_peer(b.stats()); },
                              test::HangGuard(30s)))
      << "no peer tried to move, or its move back did not fail";
  StagePeer& lost = lost_peer(a.stats()) ? a : b;
  StagePeer& stayed = &lost == &a ? b : a;
  std::filesystem::rename(away, dir_);
  ASSERT_TRUE(test::WaitUntil([&] { return !lost.stats().stageless; }, test::HangGuard(30s)))
      << "the stageless peer never joined a stage again";
  const auto sl = lost.stats(), ss = stayed.stats();
  EXPECT_EQ(sl.rejoins, 1u);
  EXPECT_EQ(sl.moves, 0u);
  EXPECT_EQ(sl.failed_moves, 1u);
  EXPECT_EQ((std::pair{sl.first, sl.last}), (std::pair<int64_t, int64_t>{2, 4}));
  EXPECT_EQ(sl.server.first, 2);
  EXPECT_EQ(sl.server.last, 4);
  EXPECT_EQ(sl.server.state, serve::ServerState::kOnline);
  EXPECT_EQ((std::pair{ss.first, ss.last}), (std::pair<int64_t, int64_t>{0, 2}));
}

// A stranger's record claiming blocks [start, 4) at `throughput`, stored by `node` as its own, at
// its address.
void ClaimStage(dht::Node& node, double throughput, int64_t start = 2) {
  serve::ServerRecord claim;
  claim.state = serve::ServerState::kOnline;
  claim.start = start;
  claim.end = 4;
  claim.throughput = throughput;
  claim.addresses = {node.VisibleAddresses().at(0).ToString()};
  ASSERT_TRUE(node.StoreSync(serve::BlockKey("run", 2), serve::EncodeServerRecord(claim),
                             dht::Now() + 60, dht::OwnerMarker(node.peer_id()))
                  .ok());
}

TEST_F(StagePeerTest, AStrangersClaimsCountOnlyAsMuchAsTheyMayAndOffLayoutOnesNotAtAll) {
  StagePeer& honest = AddPeer(0, 2, 300ms);
  dht::Node& stranger = AddNode();
  ClaimStage(stranger, 1e12);
  dht::Node& other = AddNode();
  ClaimStage(other, 1e12, 1);  // blocks [1, 4): not a stage of the layout
  dht::Node& silent = AddNode();
  ClaimStage(silent, 1e12);
  silent.Shutdown();  // its record stays in the DHT; nothing answers at its address
  std::vector<PeerLoad> view;
  ASSERT_TRUE(test::WaitUntil(
      [&] {
        view = honest.LastView();
        return view.size() >= 2;
      },
      test::HangGuard(20s)));
  // The honest peer and the stranger; neither the off-layout record nor the silent one.
  ASSERT_EQ(view.size(), 2u);
  for (const auto& p : view) {
    if (p.peer == stranger.peer_id()) {
      EXPECT_EQ(p.stage, 1u);
      EXPECT_DOUBLE_EQ(p.throughput, 8 * 100.0);  // max_claim_ratio x the honest peer's own
    } else {
      EXPECT_EQ(p.peer, dht_.nodes().front()->peer_id());
      EXPECT_DOUBLE_EQ(p.throughput, 100.0);
    }
  }
  EXPECT_EQ(honest.stats().moves, 0u);  // a lone peer never leaves its stage
}

// A joining peer (no throughput of its own yet) counts only the records of peers that answer a
// ping: stage [2, 4), claimed at 1e12 by identities that do not answer at their addresses, is
// still the empty stage it joins; believing the claims, it joined [0, 2) beside the honest peer.
TEST_F(StagePeerTest, AJoiningPeerDoesNotBelieveClaimsOfPeersThatDoNotAnswer) {
  AddPeer(0, 2, 60s);
  for (int i = 0; i < 3; ++i) {
    dht::Node& silent = AddNode();
    ClaimStage(silent, 1e12);
    silent.Shutdown();  // its record stays in the DHT; nothing answers at its address
  }
  StagePeer& joining = AddPeer(-1, -1, 60s);
  EXPECT_EQ(joining.stats().first, 2);
  EXPECT_EQ(joining.stats().last, 4);
}

}  // namespace
}  // namespace colony::swarm
