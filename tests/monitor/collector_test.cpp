// The monitor's collector against an in-process swarm of real DHT nodes on loopback: what it
// shows must equal what the test computes from the records it stored (coverage per block, the
// run's epoch, throughput and loss, the averaging groups), a server that goes away must show as
// unreachable at once and as offline when its records expire, and records that lie (another
// peer's address, more models than shown) must not make it dial or show what they say. Its HTTP
// routes are asked with curl.
#include "monitor/collector.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "dht/node.h"
#include "dht/validation.h"
#include "loopback_node.h"
#include "monitor/service.h"
#include "serve/records.h"
#include "test_support.h"
#include "tools/record_rules.h"
#include "train/progress_record.h"

namespace colony::monitor {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

class MonitoredSwarm : public ::testing::Test {
 protected:
  void SetUp() override {
    auto boot = dht::Node::Start(KeyPair::Generate(), test::LoopbackNodeOptions({}));
    ASSERT_TRUE(boot.ok()) << boot.status().ToString();
    boot_ = std::move(*boot);
    for (int i = 0; i < 3; ++i) {
      auto n = dht::Node::Start(KeyPair::Generate(), test::LoopbackNodeOptions({BootAddress()}));
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      peers_.push_back(std::move(*n));
    }
    dht::NodeOptions client;
    client.initial_peers = {BootAddress()};
    client.dht.request_timeout = 2s;
    client.dht.client_mode = true;
    client.validators = {cli::SwarmRecordRules()};
    auto monitor = dht::Node::Start(KeyPair::Generate(), client);
    ASSERT_TRUE(monitor.ok()) << monitor.status().ToString();
    monitor_node_ = std::move(*monitor);
  }
  void TearDown() override {
    collector_.reset();
    if (monitor_node_) monitor_node_->Shutdown();
    for (auto& p : peers_) {
      if (p) p->Shutdown();
    }
    if (boot_) boot_->Shutdown();
  }
  std::string BootAddress() const { return boot_->VisibleAddresses().at(0).ToString(); }

  // Node i announces itself as a server of `model` for blocks [start, end).
  void Serve(dht::Node& n, const std::string& model, int64_t blocks, int64_t start, int64_t end,
             double ttl = 60, std::vector<std::string> addresses = {},
             const std::string& quantization = "none") {
    serve::ServerRecord r;
    r.state = serve::ServerState::kOnline;
    r.start = start;
    r.end = end;
    r.throughput = 100;
    r.version = "0.1.0";
    r.dtype = "float32";
    r.quantization = quantization;
    if (addresses.empty()) {
      for (const auto& a : n.VisibleAddresses()) addresses.push_back(a.ToString());
    }
    r.addresses = addresses;
    const double expiration = dht::Now() + ttl;
    std::vector<dht::StoreItem> items;
    for (int64_t b = start; b < end; ++b) {
      items.push_back({serve::BlockKey(model, b), dht::OwnerMarker(n.peer_id()),
                       serve::EncodeServerRecord(r), expiration});
    }
    items.push_back({std::string(serve::kModelsKey), dht::OwnerMarker(n.peer_id()),
                     serve::EncodeModelAnnouncement({.model = model, .num_blocks = blocks}),
                     expiration});
    for (const Status& st : n.StoreManySync(items)) ASSERT_TRUE(st.ok()) << st.ToString();
  }

  void Train(dht::Node& n, train::PeerProgress p) {
    p.peer = n.peer_id();
    p.time = dht::Now();
    const double expiration = dht::Now() + 60;
    std::vector<dht::StoreItem> items = {
        {"run1.progress", dht::OwnerMarker(n.peer_id()), train::EncodeProgressRecord(p),
         expiration},
        {std::string(train::kRunsKey), dht::OwnerMarker(n.peer_id()),
         train::EncodeRunAnnouncement({.run = "run1", .target_batch_size = 128}), expiration}};
    for (const Status& st : n.StoreManySync(items)) ASSERT_TRUE(st.ok()) << st.ToString();
  }

  void StartCollector(CollectorLimits limits = {}) {
    auto c = Collector::Start(
        *monitor_node_,
        {.refresh = 200ms, .ping_timeout = 1000ms, .keep_offline = 60s, .limits = limits});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    collector_ = std::move(*c);
  }

  // Waits until the snapshot satisfies `pred` (bounded); returns the last snapshot.
  SwarmState WaitFor(const std::function<bool(const SwarmState&)>& pred,
                     std::chrono::milliseconds limit = 20s) {
    SwarmState s;
    test::WaitUntil(
        [&] {
          s = collector_->Snapshot();
          return pred(s);
        },
        limit);
    return s;
  }

  static const ModelView* FindModel(const SwarmState& s, const std::string& name) {
    for (const auto& m : s.models) {
      if (m.name == name) return &m;
    }
    return nullptr;
  }
  static const ServerView* FindServer(const ModelView& m, const PeerId& peer) {
    for (const auto& v : m.servers) {
      if (v.peer == peer.ToString()) return &v;
    }
    return nullptr;
  }

  std::unique_ptr<dht::Node> boot_, monitor_node_;
  std::vector<std::unique_ptr<dht::Node>> peers_;
  std::unique_ptr<Collector> collector_;
};

// Online servers per block, computed from the spans (the reference for the collector's figure).
std::vector<int> Coverage(int64_t blocks, const std::vector<std::pair<int64_t, int64_t>>& spans) {
  std::vector<int> c(static_cast<size_t>(blocks), 0);
  for (const auto& [s, e] : spans) {
    for (int64_t b = s; b < e; ++b) ++c[static_cast<size_t>(b)];
  }
  return c;
}

TEST_F(MonitoredSwarm, ShowsCoverageAndAServerThatWentAwayAtTheNextRefresh) {
  Serve(*peers_[0], "m", 4, 0, 2, 60, {}, "int8");
  Serve(*peers_[1], "m", 4, 0, 4, /*ttl=*/8);
  StartCollector();
  const auto before = Coverage(4, {{0, 2}, {0, 4}});
  SwarmState s = WaitFor([&](const SwarmState& st) {
    const ModelView* m = FindModel(st, "m");
    return m != nullptr && m->coverage == before;
  });
  const ModelView* m = FindModel(s, "m");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->coverage, before);
  EXPECT_TRUE(m->healthy());
  EXPECT_EQ(m->num_blocks, 4);
  for (int i = 0; i < 2; ++i) {
    const ServerView* v = FindServer(*m, peers_[i]->peer_id());
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(v->state, ServerHealth::kOnline);
    ASSERT_TRUE(v->rtt_ms.has_value());
    EXPECT_GE(*v->rtt_ms, 0);
    EXPECT_FALSE(v->relay);
    EXPECT_EQ(v->dtype, "float32");
    EXPECT_EQ(v->quantization, i == 0 ? "int8" : "none");
  }

  // The second server goes away: unreachable (and not counted) within two refreshes.
  const PeerId gone = peers_[1]->peer_id();
  peers_[1]->Shutdown();
  peers_[1].reset();
  const auto after = Coverage(4, {{0, 2}});
  const auto t0 = std::chrono::steady_clock::now();
  s = WaitFor([&](const SwarmState& st) {
    const ModelView* mm = FindModel(st, "m");
    return mm != nullptr && mm->coverage == after;
  });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m = FindModel(s, "m");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->coverage, after);
  EXPECT_FALSE(m->healthy());
  const ServerView* v = FindServer(*m, gone);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->state, ServerHealth::kUnreachable);
  EXPECT_FALSE(v->rtt_ms.has_value());
  std::printf("a server that went away was shown unreachable after %.2f s\n", took);
  // Its records expire (ttl 8 s): it stays listed, as offline.
  s = WaitFor([&](const SwarmState& st) {
    const ModelView* mm = FindModel(st, "m");
    const ServerView* sv = mm ? FindServer(*mm, gone) : nullptr;
    return sv != nullptr && sv->state == ServerHealth::kOffline;
  });
  m = FindModel(s, "m");
  ASSERT_NE(m, nullptr);
  v = FindServer(*m, gone);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->state, ServerHealth::kOffline);
  EXPECT_EQ(m->coverage, after);

  // is_reachable: a live server yes, the gone one no, a stranger unknown.
  const Reachability live = collector_->CheckReachable(peers_[0]->peer_id());
  EXPECT_TRUE(live.known);
  EXPECT_TRUE(live.reachable) << live.error;
  const Reachability dead = collector_->CheckReachable(gone);
  EXPECT_FALSE(dead.reachable);
  const Reachability stranger = collector_->CheckReachable(KeyPair::Generate().peer_id());
  EXPECT_FALSE(stranger.known);
  EXPECT_FALSE(stranger.reachable);
  EXPECT_FALSE(stranger.error.empty());
}

TEST_F(MonitoredSwarm, ARecordNamingAnotherPeersAddressIsRefusedAndJunkModelsAreCapped) {
  Serve(*peers_[0], "real", 2, 0, 2);
  Serve(*peers_[1], "real", 2, 0, 2);
  // peers_[2] claims peers_[0]'s address as its own: every node refuses the record (so the
  // monitor never dials it as the liar's), and "junk" is announced without a server.
  {
    serve::ServerRecord r;
    r.state = serve::ServerState::kOnline;
    r.end = 3;
    r.addresses = {peers_[0]->VisibleAddresses().at(0).ToString()};
    EXPECT_EQ(peers_[2]
                  ->StoreSync(serve::BlockKey("junk", 0), serve::EncodeServerRecord(r),
                              dht::Now() + 60, dht::OwnerMarker(peers_[2]->peer_id()))
                  .code(),
              StatusCode::kPermissionDenied);
    ASSERT_TRUE(peers_[2]
                    ->StoreSync(std::string(serve::kModelsKey),
                                serve::EncodeModelAnnouncement({.model = "junk", .num_blocks = 3}),
                                dht::Now() + 60, dht::OwnerMarker(peers_[2]->peer_id()))
                    .ok());
  }
  Serve(*boot_, "junk2", 4096, 0, 1);
  StartCollector({.max_models = 2, .max_block_keys = 64});
  SwarmState s = WaitFor([&](const SwarmState& st) {
    const ModelView* m = FindModel(st, "real");
    return m != nullptr && m->coverage == std::vector<int>{2, 2} && st.models.size() == 2;
  });
  ASSERT_EQ(s.models.size(), 2u) << "at most max_models models";
  const ModelView* real = FindModel(s, "real");
  ASSERT_NE(real, nullptr) << "the model most servers announce is kept";
  EXPECT_EQ(real->coverage, (std::vector<int>{2, 2}));
  const ModelView* junk = FindModel(s, "junk");
  const ModelView* junk2 = FindModel(s, "junk2");
  ASSERT_TRUE(junk != nullptr || junk2 != nullptr);
  if (junk != nullptr) {
    EXPECT_EQ(FindServer(*junk, peers_[2]->peer_id()), nullptr);
    EXPECT_EQ(junk->coverage, (std::vector<int>{0, 0, 0}));
  }
  if (junk2 != nullptr) {
    // 4096 blocks claimed: only max_block_keys keys are read in all.
    EXPECT_EQ(junk2->num_blocks, 4096);
    EXPECT_EQ(junk2->min_coverage(), 0);
  }
}

TEST_F(MonitoredSwarm, ATrainingRunShowsItsEpochThroughputLossAndGroups) {
  train::PeerProgress a;
  a.epoch = 6;
  a.samples = 10;
  a.samples_per_second = 100;
  a.batch = 8;
  a.loss = 2.0;
  a.round = {.epoch = 5, .group = "aa11", .size = 2, .ok = true};
  train::PeerProgress b = a;
  b.samples_per_second = 50;
  b.loss = 3.0;
  train::PeerProgress c = a;
  c.epoch = 5;
  c.samples = 0;
  c.samples_per_second = 25;
  c.loss = std::nan("");
  c.round = {.epoch = 4, .group = "bb22", .size = 1, .ok = false};
  train::PeerProgress loading;
  loading.epoch = 40;
  loading.phase = train::Phase::kLoad;
  Train(*peers_[0], a);
  Train(*peers_[1], b);
  Train(*peers_[2], c);
  Train(*boot_, loading);
  StartCollector();
  SwarmState s = WaitFor([&](const SwarmState& st) {
    return st.runs.size() == 1 && st.runs[0].peers.size() == 4 && st.runs[0].rounds.size() == 2;
  });
  ASSERT_EQ(s.runs.size(), 1u);
  const RunView& r = s.runs[0];
  EXPECT_EQ(r.run, "run1");
  EXPECT_EQ(r.target_batch_size, 128);
  EXPECT_EQ(r.epoch, 6) << "the newest epoch of a peer that trains (not one still loading)";
  EXPECT_DOUBLE_EQ(r.samples_per_second, 100 + 50 + 25 + 0);
  ASSERT_TRUE(r.loss.has_value());
  EXPECT_DOUBLE_EQ(*r.loss, (2.0 + 3.0) / 2);
  ASSERT_EQ(r.rounds.size(), 2u);
  EXPECT_EQ(r.rounds[0].epoch, 5);
  ASSERT_EQ(r.rounds[0].groups.size(), 1u);
  EXPECT_EQ(r.rounds[0].groups[0].group, "aa11");
  EXPECT_EQ(r.rounds[0].groups[0].peers.size(), 2u);
  EXPECT_TRUE(r.rounds[0].groups[0].ok);
  EXPECT_EQ(r.rounds[1].epoch, 4);
  EXPECT_FALSE(r.rounds[1].groups.at(0).ok);
  ASSERT_FALSE(r.history.empty());
  EXPECT_EQ(r.history.back().epoch, 6);

  // The HTTP routes, asked by curl.
  http::ServerStatsSource server_stats;
  auto server = http::Server::Start({}, MonitorRoutes(*collector_, &server_stats));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  server_stats.Attach([s = server->get()] { return s->stats(); });
  const std::string base = "http://127.0.0.1:" + std::to_string((*server)->port());
  auto curl = [&](const std::string& path) {
    const std::string cmd =
        "curl -sS --max-time 20 -w '\\n%{http_code} %{content_type}' '" + base + path + "'";
    std::string out;
    FILE* f = ::popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n = 0;
    while (f != nullptr && (n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    if (f != nullptr) ::pclose(f);
    return out;
  };
  const std::string page = curl("/");
  EXPECT_NE(page.find("<html"), std::string::npos);
  EXPECT_NE(page.find("\n200 text/html"), std::string::npos);
  const std::string chart = curl("/static/dygraph.min.js");
  EXPECT_GT(chart.size(), 10000u);
  EXPECT_NE(chart.find("\n200 text/javascript"), std::string::npos);
  EXPECT_NE(curl("/static/LICENSE.dygraphs").find("MIT"), std::string::npos);
  const std::string state = curl("/api/v1/state");
  const auto j = json::parse(state.substr(0, state.rfind('\n')), nullptr, false);
  ASSERT_TRUE(j.is_object()) << state;
  EXPECT_EQ(j["runs"][0]["epoch"], 6);
  const std::string metrics = curl("/metrics");
  EXPECT_NE(metrics.find("colony_training_epoch{run=\"run1\"} 6\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\n200 text/plain; version=0.0.4"), std::string::npos);
  // The HTTP server's own counts: the four requests above and this one, none of them bad.
  EXPECT_NE(metrics.find("\ncolony_http_requests_total 5\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\ncolony_http_bad_requests_total 0\n"), std::string::npos) << metrics;
  const std::string bad = curl("/api/v1/is_reachable/not-a-peer");
  EXPECT_NE(bad.find("\n400 "), std::string::npos) << bad;
  const std::string reach =
      curl("/api/v1/is_reachable/" + KeyPair::Generate().peer_id().ToString());
  const auto rj = json::parse(reach.substr(0, reach.rfind('\n')), nullptr, false);
  ASSERT_TRUE(rj.is_object()) << reach;
  EXPECT_EQ(rj["success"], false);
  EXPECT_EQ(rj["known"], false);
  EXPECT_NE(curl("/nothing").find("\n404 "), std::string::npos);
  (*server)->Stop();
}

}  // namespace
}  // namespace colony::monitor
