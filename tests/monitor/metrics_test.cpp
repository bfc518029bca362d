// The monitor's outputs from a state built by hand: /metrics in Prometheus' text format (every
// line parsed by a grammar written here from the format's specification, label values escaped,
// figures equal to ones computed apart) and /api/v1/state's JSON.
#include "monitor/metrics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "http/prometheus.h"
#include "monitor/swarm_state.h"

namespace colony::monitor {
namespace {

SwarmState Example() {
  SwarmState s;
  s.version = "0.1.0";
  s.updated_at = 1795321820.5;
  s.refresh_seconds = 2;
  s.monitor_peer = "12D3KooWmonitor";
  ModelView m;
  m.name = "llama \"7b\"\nx\\y";  // a hostile name: quotes, a newline, a backslash
  m.num_blocks = 4;
  m.coverage = {2, 1, 1, 0};
  const double rtts[] = {4.0, 1.0, 3.0, 2.0};
  for (int i = 0; i < 4; ++i) {
    ServerView v;
    v.peer = "peer" + std::to_string(i);
    v.state = i == 3 ? ServerHealth::kUnreachable : ServerHealth::kOnline;
    v.start = 0;
    v.end = 2;
    v.version = i == 0 ? "0.0.9" : "0.1.0";
    if (i < 3) v.rtt_ms = rtts[i];
    m.servers.push_back(v);
  }
  s.models.push_back(m);
  RunView r;
  r.run = "run1";
  r.epoch = 12;
  r.target_batch_size = 256;
  r.samples_per_second = 610.5;
  r.loss = 4.25;
  r.peers.resize(3);
  r.history = {{.time = 1.0, .epoch = 11, .loss = 4.5}, {.time = 2.0, .epoch = 12, .loss = {}}};
  r.rounds = {
      {.epoch = 11, .groups = {{.group = "ab", .size = 2, .ok = true, .peers = {"p", "q"}}}}};
  s.runs.push_back(r);
  s.dht_peers_known = 3;
  s.dht_peers = {{.peer = "a", .reachable = true, .rtt_ms = 0.5},
                 {.peer = "b", .reachable = false},
                 {.peer = "c"}};
  return s;
}

// sample := name [ "{" label "=" quoted ("," label "=" quoted)* "}" ] " " value
const std::regex kSample(
    R"re(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*")*\})? ([-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|NaN|Inf)))re");

TEST(Metrics, EveryLineFollowsTheTextFormatAndFamiliesAreWhole) {
  const std::string text = PrometheusText(Example());
  std::istringstream in(text);
  std::string line, family;
  std::map<std::string, int> typed;
  int samples = 0;
  while (std::getline(in, line)) {
    if (line.starts_with("# HELP ")) continue;
    if (line.starts_with("# TYPE ")) {
      family = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_EQ(typed[family]++, 0) << "family " << family << " declared twice";
      continue;
    }
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, kSample)) << "not a sample line: " << line;
    const std::string name = m[1];
    EXPECT_TRUE(name == family || name == family + "_sum" || name == family + "_count")
        << name << " outside its family " << family;
    EXPECT_TRUE(name.starts_with("colony_")) << name;
    ++samples;
  }
  EXPECT_GT(samples, 20);
}

// The value of the sample with exactly this name and label text.
double Value(const std::string& text, const std::string& series) {
  const auto at = text.find("\n" + series + " ");
  EXPECT_NE(at, std::string::npos) << series << " missing in\n" << text;
  if (at == std::string::npos) return -1;
  const auto start = at + 1 + series.size() + 1;
  return std::stod(text.substr(start, text.find('\n', start) - start));
}

TEST(Metrics, FiguresEqualThoseComputedApartAndLabelsAreEscaped) {
  const SwarmState s = Example();
  const std::string text = PrometheusText(s);
  const std::string model = R"(model="llama \"7b\"\nx\\y")";
  EXPECT_EQ(Value(text, "colony_model_block_coverage_min{" + model + "}"), 0);
  EXPECT_EQ(Value(text, "colony_model_block_coverage_max{" + model + "}"), 2);
  EXPECT_EQ(Value(text, "colony_model_healthy{" + model + "}"), 0);
  EXPECT_EQ(Value(text, "colony_model_blocks{" + model + "}"), 4);
  EXPECT_EQ(Value(text, "colony_servers{" + model + ",state=\"online\"}"), 3);
  EXPECT_EQ(Value(text, "colony_servers{" + model + ",state=\"unreachable\"}"), 1);
  EXPECT_EQ(Value(text, "colony_servers{" + model + ",state=\"offline\"}"), 0);
  // Pings 1, 3, 4 ms (the unreachable server has none): nearest-rank quantiles.
  EXPECT_DOUBLE_EQ(Value(text, "colony_server_ping_seconds{" + model + ",quantile=\"0.5\"}"),
                   0.003);
  EXPECT_DOUBLE_EQ(Value(text, "colony_server_ping_seconds{" + model + ",quantile=\"0.99\"}"),
                   0.004);
  EXPECT_DOUBLE_EQ(Value(text, "colony_server_ping_seconds_sum{" + model + "}"), 0.008);
  EXPECT_EQ(Value(text, "colony_server_ping_seconds_count{" + model + "}"), 3);
  EXPECT_EQ(Value(text, "colony_server_versions{version=\"0.1.0\"}"), 3);
  EXPECT_EQ(Value(text, "colony_server_versions{version=\"0.0.9\"}"), 1);
  EXPECT_EQ(Value(text, "colony_training_epoch{run=\"run1\"}"), 12);
  EXPECT_DOUBLE_EQ(Value(text, "colony_training_samples_per_second{run=\"run1\"}"), 610.5);
  EXPECT_DOUBLE_EQ(Value(text, "colony_training_loss{run=\"run1\"}"), 4.25);
  EXPECT_EQ(Value(text, "colony_training_peers{run=\"run1\"}"), 3);
  EXPECT_EQ(Value(text, "colony_dht_peers_known"), 3);
  EXPECT_EQ(Value(text, "colony_dht_peers_reachable"), 1);
  EXPECT_EQ(http::EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(StateJson, HoldsTheDocumentedFields) {
  const auto j = nlohmann::json::parse(StateJson(Example()));
  EXPECT_EQ(j["version"], "0.1.0");
  EXPECT_EQ(j["refresh_seconds"], 2.0);
  const auto& m = j["models"][0];
  EXPECT_EQ(m["name"], "llama \"7b\"\nx\\y");
  EXPECT_EQ(m["healthy"], false);
  EXPECT_EQ(m["coverage"], nlohmann::json({2, 1, 1, 0}));
  EXPECT_EQ(m["min_coverage"], 0);
  EXPECT_EQ(m["max_coverage"], 2);
  EXPECT_EQ(m["servers"][3]["state"], "unreachable");
  EXPECT_TRUE(m["servers"][3]["rtt_ms"].is_null());
  EXPECT_EQ(m["servers"][1]["rtt_ms"], 1.0);
  const auto& r = j["runs"][0];
  EXPECT_EQ(r["num_peers"], 3);
  EXPECT_EQ(r["history"][0], nlohmann::json({1.0, 11, 4.5}));
  EXPECT_TRUE(r["history"][1][2].is_null());
  EXPECT_EQ(r["rounds"][0]["groups"][0]["peers"], nlohmann::json({"p", "q"}));
  EXPECT_EQ(j["dht"]["peers_known"], 3);
  EXPECT_TRUE(j["dht"]["peers"][2]["reachable"].is_null());
  EXPECT_EQ(j["dht"]["peers"][1]["reachable"], false);
}

}  // namespace
}  // namespace colony::monitor
