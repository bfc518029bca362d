// A forged progress record (issue 15): a peer that runs a plain DHT node and publishes, under its
// own owner-signed subkey, a well-formed record claiming the whole target batch at the swarm's
// epoch, and never averages. Every honest peer then believes the swarm has the target: it stops
// computing at once, goes to the round with a few batches, and waits there for the forger until
// the matchmaking time runs out. Before the defence that happened at every epoch (2 honest peers:
// steps of 48 samples instead of 200, each after a 5 s wait); now a peer that claimed samples and
// did not come to a round with room for it is set aside for 1, 2, 4, ... epochs
// (ProgressTracker::NoteRound), the penalty growing with every such round, set aside or not, so
// a forger that keeps claiming fools the swarm at its first epoch only.
// And a forged state donor (ForgedDonor below): a state advertised at the top priority that
// claims an epoch far ahead of the swarm, with poisoned parameters.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "adversary/attack_measurements.h"
#include "averaging/averager.h"
#include "dht/node.h"
#include "dht/validation.h"
#include "test_support.h"
#include "train/collaborative_swarm.h"
#include "train/progress_record.h"

namespace colony::train {
namespace {

using namespace std::chrono_literals;
using test::Gradient;
using test::Swarm;
using test::Train;

constexpr int64_t kTarget = 200;

// Publishes a record claiming the whole target at the newest epoch it reads, every 100 ms.
class Forger {
 public:
  explicit Forger(const std::string& bootstrap) {
    dht::NodeOptions o;
    o.initial_peers = {bootstrap};
    o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
    auto node = dht::Node::Start(KeyPair::Generate(), o);
    EXPECT_TRUE(node.ok()) << node.status().ToString();
    node_ = std::move(*node);
    thread_ = std::thread([this] { Run(); });
  }
  ~Forger() {
    stop_ = true;
    thread_.join();
    node_->Shutdown();
  }
  int64_t published() const { return published_; }

 private:
  void Run() {
    const std::string key = "test.run.progress";
    while (!stop_) {
      int64_t epoch = 0;
      auto record = node_->GetSync(key, dht::Freshness::kLatest);
      if (record.ok() && record->is_dict) {
        for (const auto& [subkey, entry] : record->subkeys) {
          auto peer = dht::ParseOwnerMarker(subkey);
          if (!peer || *peer == node_->peer_id()) continue;
          auto p = ParseProgressRecord(*peer, entry.value);
          if (p.ok()) epoch = std::max(epoch, p->epoch);
        }
      }
      PeerProgress forged;
      forged.peer = node_->peer_id();
      forged.epoch = epoch;
      forged.samples = kTarget;
      forged.samples_per_second = 1000;
      forged.batch = 4;
      forged.time = dht::Now();
      forged.phase = Phase::kTrain;
      if (node_
              ->StoreSync(key, EncodeProgressRecord(forged), dht::Now() + 15,
                          dht::OwnerMarker(node_->peer_id()))
              .ok()) {
        ++published_;
      }
      std::this_thread::sleep_for(100ms);
    }
  }

  std::unique_ptr<dht::Node> node_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> published_{0};
  std::thread thread_;
};

TEST(ForgedProgress, AClaimOfTheWholeTargetFoolsTheSwarmOnceNotAtEveryEpoch) {
  Swarm swarm;
  for (int i = 0; i < 2; ++i) swarm.Add({.target_batch_size = kTarget});
  Forger forger(swarm.bootstrap_address());
  // Let the forged record be out before the honest peers start.
  const auto published_by = std::chrono::steady_clock::now() + 10s;
  while (forger.published() == 0 && std::chrono::steady_clock::now() < published_by) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_GT(forger.published(), 0) << "the forger could not publish its record";

  constexpr int kEpochs = 8;
  std::vector<std::future<std::vector<StepReport>>> runs;
  for (int i = 0; i < 2; ++i) {
    runs.push_back(std::async(std::launch::async, [&, i] {
      return Train(*swarm.peers()[i], Gradient(i), /*batch=*/4, kEpochs);
    }));
  }
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    const std::vector<StepReport> steps = runs[i].get();
    ASSERT_EQ(steps.size(), static_cast<size_t>(kEpochs));
    int full = 0;
    std::string realized;
    for (const StepReport& r : steps) {
      full += r.realized_batch >= kTarget;
      realized += std::to_string(r.realized_batch) + " ";
    }
    std::printf("peer %d: realized batches %s(target %lld)\n", i, realized.c_str(),
                static_cast<long long>(kTarget));
    // Fooled at the first epoch only (seen: 16, then 200 at every epoch); one more short step is
    // allowed for a round that an honest peer reached late. Without the defence, none reached
    // the target (48 or 56 samples per step).
    EXPECT_GE(full, kEpochs - 2) << "the forged record cut the honest steps short: " << realized;
    EXPECT_EQ(swarm.peers()[i]->co->counters().failed_rounds, 0);
  }
  ::testing::Test::RecordProperty("attack", "forged progress record claiming the target");
}

// A forged state donor: a plain DHT node with an averager under the run's prefix, advertising a
// state whose header is right in every other way (this run, the model's one float32 parameter,
// no optimizer state, as the honest SGD peers' states) but claims epoch 1,000,000, at the top
// priority, with poisoned parameters (all 1e6). A newcomer asks donors in priority order and
// checks each header before any tensor data: the forged claim is refused, naming the epochs, and
// an honest donor serves. Before the check, the newcomer installed the poisoned parameters at
// epoch 1,000,000, and the swarm would have followed it there (the epoch of the newest peer
// leads).
TEST(ForgedDonor, AStateClaimingAnEpochFarAheadOfTheSwarmIsRefused) {
  Swarm swarm;
  for (int i = 0; i < 2; ++i) swarm.Add({.target_batch_size = 100});
  {
    std::vector<std::future<std::vector<StepReport>>> runs;
    for (int i = 0; i < 2; ++i) {
      runs.push_back(std::async(std::launch::async, [&, i] {
        return Train(*swarm.peers()[i], Gradient(i), /*batch=*/5, /*epochs=*/3);
      }));
    }
    for (auto& r : runs) ASSERT_EQ(r.get().size(), 3u);
  }

  dht::NodeOptions o;
  o.initial_peers = {swarm.bootstrap_address()};
  o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  auto node = dht::Node::Start(KeyPair::Generate(), o);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  std::vector<float> unused(test::kSize);
  averaging::AveragerOptions a;
  a.prefix = "test.run.grads";  // where the run's peers share their state
  auto forged = averaging::Averager::Create(**node, {unused}, a);
  ASSERT_TRUE(forged.ok()) << forged.status().ToString();
  constexpr int64_t kClaimed = 1'000'000;
  const nlohmann::json metadata = {
      {"epoch", kClaimed},
      {"inner_step", 0},
      {"diverged", false},
      {"run_id", "test.run"},
      {"tensors", nlohmann::json::array(
                      {{{"name", "param.0"}, {"dtype", "Float"}, {"shape", {test::kSize}}}})}};
  std::atomic<int> served{0};
  (*forged)->ShareState(
      [&]() -> Result<averaging::SharedState> {
        ++served;
        return averaging::SharedState{metadata.dump(), {std::vector<float>(test::kSize, 1e6f)}};
      },
      static_cast<double>(kClaimed) + 0.5);

  // The forged advert must be out before the newcomer looks for donors.
  const PeerId forger = (*node)->peer_id();
  ASSERT_TRUE(colony::test::WaitUntil(
      [&] {
        auto r = (*node)->GetSync("test.run.grads.state", dht::Freshness::kLatest);
        if (!r.ok() || !r->is_dict) return false;
        for (const auto& [subkey, entry] : r->subkeys) {
          if (dht::ParseOwnerMarker(subkey) == forger) return true;
        }
        return false;
      },
      colony::test::HangGuard(20s)))
      << "the forged donor's advert never appeared";
  test::Peer& late = swarm.Add({.target_batch_size = 100});
  Status st = late.co->LoadStateFromPeers();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(late.co->local_epoch(), 3);
  EXPECT_TRUE(at::equal(late.Host(), swarm.peers()[0]->Host()));
  EXPECT_LT(late.Host().abs().max().item<float>(), 1e3f) << "the poisoned parameters came in";
  EXPECT_GE(served.load(), 1)
      << "the newcomer never asked the forged donor (the test proves nothing)";
  (*forged)->Shutdown();
  (*node)->Shutdown();
  ::testing::Test::RecordProperty("attack", "forged state donor claiming a far epoch");
}

}  // namespace
}  // namespace colony::train
