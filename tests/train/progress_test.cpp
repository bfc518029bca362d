// Progress records (parsed as hostile input), the readiness rule (DecideEpoch) on views built by
// hand, and progress trackers on real DHT nodes in one process.
#include "train/progress.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "test_support.h"

namespace colony::train {
namespace {

using namespace std::chrono_literals;

PeerId SomePeer() { return KeyPair::Generate().peer_id(); }

PeerProgress Record(int64_t epoch, int64_t samples, Phase phase = Phase::kTrain) {
  PeerProgress p;
  p.peer = SomePeer();
  p.epoch = epoch;
  p.samples = samples;
  p.samples_per_second = 1000.5;
  p.batch = 16;
  p.time = 1795321820.25;
  p.phase = phase;
  return p;
}

TEST(ProgressRecord, RoundTripsEveryField) {
  for (Phase phase : {Phase::kTrain, Phase::kWait, Phase::kRound, Phase::kLoad}) {
    PeerProgress p = Record(12, 480, phase);
    p.client = phase == Phase::kWait;
    auto back = ParseProgressRecord(p.peer, EncodeProgressRecord(p));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->peer, p.peer);
    EXPECT_EQ(back->epoch, 12);
    EXPECT_EQ(back->samples, 480);
    EXPECT_EQ(back->samples_per_second, 1000.5);
    EXPECT_EQ(back->batch, 16);
    EXPECT_EQ(back->time, p.time);
    EXPECT_EQ(back->client, p.client);
    EXPECT_FALSE(back->aux);
    EXPECT_EQ(back->phase, phase);
  }
  // A freshly started peer: no rate, no samples yet.
  PeerProgress fresh = Record(0, 0);
  fresh.samples_per_second = 0;
  fresh.batch = 0;
  EXPECT_TRUE(ParseProgressRecord(fresh.peer, EncodeProgressRecord(fresh)).ok());
}

TEST(ProgressRecord, MonitorFieldsRoundTripAndAreChecked) {
  PeerProgress p;
  p.peer = SomePeer();
  p.epoch = 7;
  p.loss = 2.5;
  p.version = "0.1.0";
  p.round = {.epoch = 6, .group = "9f2c01ab", .size = 3, .ok = true};
  auto parsed = ParseProgressRecord(p.peer, EncodeProgressRecord(p));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_DOUBLE_EQ(parsed->loss, 2.5);
  EXPECT_EQ(parsed->version, "0.1.0");
  EXPECT_EQ(parsed->round.epoch, 6);
  EXPECT_EQ(parsed->round.group, "9f2c01ab");
  EXPECT_EQ(parsed->round.size, 3);
  EXPECT_TRUE(parsed->round.ok);
  // Without them (an older peer's record) they stay unknown.
  PeerProgress plain;
  plain.peer = p.peer;
  auto old = ParseProgressRecord(plain.peer, EncodeProgressRecord(plain));
  ASSERT_TRUE(old.ok());
  EXPECT_TRUE(std::isnan(old->loss));
  EXPECT_EQ(old->round.epoch, -1);

  const std::string head =
      R"({"epoch":1,"samples":2,"sps":3.5,"batch":4,"time":5.5,"client":false,"aux":false,"phase":"train",)";
  for (const std::string& extra : std::vector<std::string>{
           R"("loss":"low")", R"("loss":1e300)", R"("version":"")", R"("version":"a b")",
           R"("version":7)", R"("round":[1])", R"("round":{"epoch":1,"group":"ab","size":2})",
           R"("round":{"epoch":1,"group":"XY","size":2,"ok":true})",
           R"("round":{"epoch":1,"group":"ab","size":0,"ok":true})",
           R"("round":{"epoch":1,"group":"ab","size":5000,"ok":true})",
           R"("round":{"epoch":-2,"group":"ab","size":2,"ok":true})",
           R"("round":{"epoch":1,"group":"ab","size":2,"ok":true,"x":1})"}) {
    EXPECT_FALSE(ParseProgressRecord(p.peer, head + extra + "}").ok()) << extra;
  }
}

TEST(RunAnnouncement, RoundTripsAndRefusesWhatItDoesNotUnderstand) {
  auto a = ParseRunAnnouncement(EncodeRunAnnouncement({.run = "run1", .target_batch_size = 256}));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->run, "run1");
  EXPECT_EQ(a->target_batch_size, 256);
  for (const char* bad :
       {R"({"run":"r","target_batch_size":1,"x":2})", R"({"run":"r","target_batch_size":0})",
        R"({"run":"","target_batch_size":1})", R"({"run":"r r","target_batch_size":1})",
        R"({"run":"r"})", "[]", "7"}) {
    EXPECT_FALSE(ParseRunAnnouncement(bad).ok()) << bad;
  }
}

TEST(ProgressRecord, RejectsWhatItDoesNotUnderstandNamingIt) {
  const PeerId peer = SomePeer();
  auto error = [&](const std::string& value) {
    auto r = ParseProgressRecord(peer, value);
    return r.ok() ? std::string("accepted") : r.status().message();
  };
  const std::string ok =
      R"({"epoch":1,"samples":2,"sps":3.5,"batch":4,"time":5.5,"client":false,"aux":false,"phase":"train"})";
  ASSERT_EQ(error(ok), "accepted");
  EXPECT_NE(
      error(
          R"({"epoch":1,"samples":2,"sps":3.5,"batch":4,"time":5.5,"client":false,"aux":false,"phase":"train","extra":1})")
          .find("unknown field 'extra'"),
      std::string::npos);
  EXPECT_NE(
      error(
          R"({"epoch":1,"samples":2,"sps":3.5,"batch":4,"time":5.5,"client":false,"aux":false,"phase":"sleep"})")
          .find("unknown phase 'sleep'"),
      std::string::npos);
  EXPECT_NE(
      error(
          R"({"epoch":-1,"samples":2,"sps":3.5,"batch":4,"time":5.5,"client":false,"aux":false,"phase":"train"})")
          .find("'epoch' is out of range"),
      std::string::npos);
  EXPECT_NE(
      error(
          R"({"epoch":1.5,"samples":2,"sps":3.5,"batch":4,"time":5.5,"client":false,"aux":false,"phase":"train"})")
          .find("integer 'epoch'"),
      std::string::npos);
  EXPECT_NE(
      error(
          R"({"epoch":1,"samples":2,"sps":-3,"batch":4,"time":5.5,"client":false,"aux":false,"phase":"train"})")
          .find("out of range"),
      std::string::npos);
  EXPECT_NE(
      error(
          R"({"epoch":1,"samples":2,"sps":3.5,"batch":4,"time":5.5,"client":"no","aux":false,"phase":"train"})")
          .find("boolean 'client'"),
      std::string::npos);
  EXPECT_NE(
      error(
          R"({"epoch":1,"samples":2,"sps":3.5,"batch":4,"time":5.5,"client":false,"aux":true,"phase":"wait"})")
          .find("auxiliary peer reports no samples"),
      std::string::npos);
  EXPECT_NE(error("[1,2]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(error(std::string(2000, ' ')).find("too large"), std::string::npos);
  EXPECT_NE(error(R"({"epoch":1})").find("lacks"), std::string::npos);
}

// A view at epoch 5 with a target of 100, built by hand.
GlobalProgress View(int64_t reported, int64_t expected) {
  GlobalProgress g;
  g.epoch = 5;
  g.target_batch_size = 100;
  g.samples_reported = reported;
  g.samples_expected = expected;
  g.num_peers = g.num_peers_at_epoch = 4;
  g.num_growing_at_epoch = 3;
  g.samples_per_second_at_epoch = 400;
  g.own_samples_per_second = 100;
  return g;
}

TEST(DecideEpoch, ExtrapolationDecidesWhenToWaitReportsWhenToAverage) {
  // Far from the target: compute.
  EXPECT_EQ(DecideEpoch(View(10, 40), 5, 0, Standing::kComputing).action, EpochAction::kTrain);
  // The estimate reaches the target, the reports do not: stop and confirm, never average.
  EXPECT_EQ(DecideEpoch(View(60, 100), 5, 0, Standing::kComputing).action, EpochAction::kWait);
  EXPECT_EQ(DecideEpoch(View(99, 5000), 5, 0, Standing::kWaiting).action, EpochAction::kWait);
  // The reports reach it: average.
  EXPECT_EQ(DecideEpoch(View(100, 100), 5, 0, Standing::kWaiting).action, EpochAction::kAverage);
  // Another peer began the epoch's round: join it whatever the counts say.
  GlobalProgress started = View(10, 20);
  started.round_started = true;
  EXPECT_EQ(DecideEpoch(started, 5, 0, Standing::kComputing).action, EpochAction::kAverage);
}

TEST(DecideEpoch, PeersThatAllStoppedShortShareTheShortfallByThroughput) {
  GlobalProgress g = View(60, 60);
  g.num_growing_at_epoch = 0;  // everyone waits, 40 samples short
  const EpochDecision d = DecideEpoch(g, 5, 0, Standing::kWaiting);
  EXPECT_EQ(d.action, EpochAction::kTrain);
  EXPECT_EQ(d.quota, 10);  // a quarter of the throughput: a quarter of the shortfall
  // A peer that computes (not waiting) needs no quota: its own count is exact.
  EXPECT_EQ(DecideEpoch(g, 5, 0, Standing::kComputing).quota, 0);
  // Unknown rates: equal shares, at least one sample.
  g.samples_per_second_at_epoch = 0;
  g.own_samples_per_second = 0;
  EXPECT_EQ(DecideEpoch(g, 5, 0, Standing::kWaiting).quota, 10);
  g.samples_reported = g.samples_expected = 99;
  EXPECT_EQ(DecideEpoch(g, 5, 0, Standing::kWaiting).quota, 1);
}

// Waiting peers whose estimate fell short all resume at about the same moment, each seeing the
// others as stopped: each takes its share of the estimated gap, not the whole gap.
TEST(DecideEpoch, WaitingPeersThatResumeShareTheEstimatedGapByThroughput) {
  GlobalProgress g = View(50, 60);  // 40 short by the estimate; one peer still seen computing
  const EpochDecision d = DecideEpoch(g, 5, 0, Standing::kWaiting);
  EXPECT_EQ(d.action, EpochAction::kTrain);
  EXPECT_EQ(d.quota, 10);  // a quarter of the throughput: a quarter of the estimated gap
  // A peer that was computing goes on without a quota: it re-estimates after every batch.
  EXPECT_EQ(DecideEpoch(g, 5, 0, Standing::kComputing).quota, 0);
  // Its own rate above the swarm's (the others' rates not known yet): the whole gap at most.
  g.own_samples_per_second = 1000;
  EXPECT_EQ(DecideEpoch(g, 5, 0, Standing::kWaiting).quota, 40);
  // A peer that already computed a share at this epoch does not take another on an estimate:
  // the peer seen computing may be another one still on its share.
  EXPECT_EQ(DecideEpoch(g, 5, 0, Standing::kWaitingAfterShare).action, EpochAction::kWait);
  // Once nobody is seen computing, the reports are exact: it takes its share of the shortfall.
  g.num_growing_at_epoch = 0;
  g.own_samples_per_second = 100;
  const EpochDecision again = DecideEpoch(g, 5, 0, Standing::kWaitingAfterShare);
  EXPECT_EQ(again.action, EpochAction::kTrain);
  EXPECT_EQ(again.quota, 13);  // a quarter of the 50 reported short, rounded up
}

// Half a batch short with nobody else computing: no reason to wait for anyone (a peer alone
// would otherwise wait out the averaging timeout every epoch).
TEST(DecideEpoch, APeerShortOfTheTargetWithNobodyElseComputingComputesOn) {
  GlobalProgress g = View(96, 96);
  g.own_batch = 32;
  g.num_growing_at_epoch = 0;
  EXPECT_EQ(DecideEpoch(g, 5, 0, Standing::kComputing).action, EpochAction::kTrain);
  EXPECT_EQ(DecideEpoch(g, 5, 0, Standing::kComputing).quota, 0);
  // With others computing, the same view means: stop and confirm.
  g.num_growing_at_epoch = 1;
  EXPECT_EQ(DecideEpoch(g, 5, 0, Standing::kComputing).action, EpochAction::kWait);
}

TEST(DecideEpoch, APeerBehindTheSwarmCatchesUpUnlessItsRoundStillRuns) {
  GlobalProgress g = View(0, 0);
  g.epoch = 7;
  EXPECT_EQ(DecideEpoch(g, 6, 0, Standing::kComputing).action, EpochAction::kCatchUp);
  EXPECT_EQ(DecideEpoch(g, 5, 1, Standing::kComputing).action, EpochAction::kCatchUp);
  // With delayed averaging the swarm reports epoch 7 while its round for 6 runs: join it.
  EXPECT_EQ(DecideEpoch(g, 6, 1, Standing::kComputing).action, EpochAction::kAverage);
}

// ---- trackers on real DHT nodes -----------------------------------------------------------------

class Trackers : public ::testing::Test {
 protected:
  void SetUp() override {
    dht::NodeOptions o;
    o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
    auto boot = dht::Node::Start(KeyPair::Generate(), o);
    ASSERT_TRUE(boot.ok()) << boot.status().ToString();
    boot_ = std::move(*boot);
  }

  ProgressTracker& Add(ProgressOptions po) {
    dht::NodeOptions o;
    o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
    o.initial_peers = {boot_->VisibleAddresses().at(0).ToString()};
    auto node = dht::Node::Start(KeyPair::Generate(), o);
    EXPECT_TRUE(node.ok()) << node.status().ToString();
    nodes_.push_back(std::move(*node));
    po.run_id = "progress-test";
    auto t = ProgressTracker::Create(*nodes_.back(), po);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    trackers_.push_back(std::move(*t));
    return *trackers_.back();
  }

  // Refreshes `t` until `pred` holds for its view (at most 10 s); the last view.
  GlobalProgress Until(ProgressTracker& t, const std::function<bool(const GlobalProgress&)>& pred) {
    GlobalProgress g;
    test::WaitUntil(
        [&] {
          g = t.Refresh(2s);
          return pred(g);
        },
        10s);
    return g;
  }

  std::unique_ptr<dht::Node> boot_;
  std::vector<std::unique_ptr<dht::Node>> nodes_;
  std::vector<std::unique_ptr<ProgressTracker>> trackers_;
};

TEST_F(Trackers, SeeEachOtherAndCountOnlyReportedSamplesAsReported) {
  ProgressTracker& a = Add({.target_batch_size = 1000});
  ProgressTracker& b = Add({.target_batch_size = 1000});
  GlobalProgress g = Until(a, [](const GlobalProgress& v) { return v.num_peers == 2; });
  EXPECT_EQ(g.num_peers, 2u);
  EXPECT_EQ(g.num_growing_at_epoch, 0u);  // b has not computed anything yet
  // (a expects b's next report 2 s after this one, batch / rate: a read of it, however late on a
  // slow machine, finds it stalled only 8 s after it)
  b.Report({.epoch = 0, .samples = 300, .samples_per_second = 1e6, .batch = 2'000'000});
  a.Report({.epoch = 0, .samples = 200, .samples_per_second = 1e6, .batch = 10});
  g = Until(a, [](const GlobalProgress& v) { return v.samples_reported == 500; });
  EXPECT_EQ(g.samples_reported, 500);
  EXPECT_EQ(g.num_growing_at_epoch, 1u);
  // b computes fast: a's estimate runs ahead of the reports, but only the reports are reported.
  std::this_thread::sleep_for(20ms);
  g = a.Global();
  EXPECT_EQ(g.samples_reported, 500);
  EXPECT_GT(g.samples_expected, 1000);
  EXPECT_EQ(DecideEpoch(g, 0, 0, Standing::kComputing).action, EpochAction::kWait);
  // b stops: a stops extrapolating it at once, whatever its rate.
  b.Report({.epoch = 0,
            .samples = 400,
            .samples_per_second = 1e6,
            .batch = 2'000'000,
            .phase = Phase::kWait});
  g = Until(a, [](const GlobalProgress& v) {
    return v.num_growing_at_epoch == 0 && v.samples_reported == 600;
  });
  EXPECT_EQ(g.samples_reported, 600);
  EXPECT_EQ(g.samples_expected, 600);
}

TEST_F(Trackers, LoadingPeersAreExpectedAtTheirEpochButDoNotMoveTheSwarm) {
  ProgressTracker& a = Add({.target_batch_size = 1000});
  ProgressTracker& b = Add({.target_batch_size = 1000});
  a.Report({.epoch = 3, .samples = 10, .samples_per_second = 100, .batch = 10});
  b.Report({.epoch = 9, .samples = 0, .phase = Phase::kLoad});
  GlobalProgress g = Until(a, [](const GlobalProgress& v) { return v.num_peers == 2; });
  EXPECT_EQ(g.epoch, 3);  // b announced epoch 9 while loading: it is not there yet
  b.Report({.epoch = 3, .samples = 0, .phase = Phase::kLoad});
  g = Until(a, [](const GlobalProgress& v) { return v.num_peers_at_epoch == 2; });
  EXPECT_EQ(g.num_peers_at_epoch, 2u);
  EXPECT_EQ(g.num_growing_at_epoch, 0u);
}

// Auxiliary peers follow the swarm's epoch rather than lead it (one left at an old run's epoch
// must not hold a restarted run hostage), and an epoch that no donor could serve can be set
// aside for a while.
TEST_F(Trackers, AuxiliaryPeersAndDistrustedEpochsDoNotMoveTheSwarm) {
  ProgressTracker& a = Add({.target_batch_size = 1000});
  ProgressTracker& aux = Add({.target_batch_size = 1000, .aux = true});
  ProgressTracker& far = Add({.target_batch_size = 1000});
  a.Report({.epoch = 3, .samples = 10, .samples_per_second = 100, .batch = 10});
  aux.Report({.epoch = 100, .phase = Phase::kWait});
  GlobalProgress g = Until(a, [](const GlobalProgress& v) { return v.num_peers == 3; });
  ASSERT_EQ(g.num_peers, 3u);
  EXPECT_EQ(g.epoch, 3);
  far.Report({.epoch = 50, .samples = 0, .samples_per_second = 100, .batch = 10});
  g = Until(a, [](const GlobalProgress& v) { return v.epoch == 50; });
  EXPECT_EQ(g.epoch, 50);
  a.DistrustEpochsFrom(50, 10s);
  EXPECT_EQ(a.Global().epoch, 3);
  a.DistrustEpochsFrom(50, 0ms);  // the window ended
  EXPECT_EQ(a.Global().epoch, 50);
}

TEST_F(Trackers, APeerThatStopsReportingIsNoLongerExtrapolated) {
  ProgressTracker& a = Add({.target_batch_size = 1'000'000, .min_refresh = 20ms});
  ProgressTracker& b = Add({.target_batch_size = 1'000'000, .min_refresh = 20ms});
  b.Report({.epoch = 0, .samples = 70, .samples_per_second = 1000, .batch = 10});
  GlobalProgress g = Until(a, [](const GlobalProgress& v) { return v.samples_reported == 70; });
  ASSERT_EQ(g.samples_reported, 70);
  // b never reports again (its tracker keeps the record alive, as a stalled peer's would): once
  // its report is overdue when read (twice its 20 ms report period, twice), a neither
  // extrapolates it nor counts its samples (a dead peer brings none to the round), but it is
  // still expected in the round (it may only be paused).
  g = Until(a, [](const GlobalProgress& v) { return v.num_growing_at_epoch == 0; });
  EXPECT_EQ(g.num_growing_at_epoch, 0u);
  EXPECT_EQ(g.samples_reported, 0);
  EXPECT_EQ(g.samples_expected, 0);
  EXPECT_EQ(g.num_peers_at_epoch, 2u);
}

}  // namespace
}  // namespace colony::train
