// What `colony monitor` knows of a swarm at one refresh, and its JSON form (the /api/v1/state
// schema in docs/monitor.md). Plain data, torch- and I/O-free: the collector (collector.h) fills
// it from DHT records and pings; the page, /api/v1/state and /metrics (metrics.h) read it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace colony::monitor {

// online | joining | offline (said so, or its records expired) | unreachable (says online, but
// the monitor cannot dial it).
enum class ServerHealth { kOnline, kJoining, kOffline, kUnreachable };
std::string_view HealthName(ServerHealth health);

struct ServerView {
  std::string peer = {};
  ServerHealth state = ServerHealth::kJoining;
  int64_t start = 0, end = 0;
  double throughput = 0;
  double inference_rps = 0;
  int64_t cache_tokens_left = 0;
  std::string version = {}, dtype = {};
  std::string quantization = {};  // "none", "int8", "nf4"; "" from servers that do not say
  bool relay = false;             // every address it gave goes through a relay
  std::vector<std::string> addresses = {};
  std::optional<double> rtt_ms = {};                            // the monitor's ping
  std::vector<std::pair<std::string, double>> next_pings = {};  // the server's own, ms
};

struct ModelView {
  std::string name = {};
  int64_t num_blocks = 0;
  std::vector<int> coverage = {};  // online, reachable servers per block
  std::vector<ServerView> servers = {};
  bool healthy() const;  // every block has a server
  int min_coverage() const;
  int max_coverage() const;
};

struct TrainerView {
  std::string peer = {};
  int64_t epoch = 0;
  double samples_per_second = 0;
  std::string mode = {};   // trainer | client | aux
  std::string phase = {};  // idle | train | wait | round | load
  std::optional<double> loss = {};
  std::string version = {};
};

struct GroupView {
  std::string group = {};  // short id
  int64_t size = 0;
  bool ok = false;
  std::vector<std::string> peers = {};  // the members that reported this group
};
struct RoundView {
  int64_t epoch = 0;
  std::vector<GroupView> groups = {};
};

struct HistoryPoint {
  double time = 0;
  int64_t epoch = 0;
  std::optional<double> loss = {};
};

struct RunView {
  std::string run = {};
  int64_t epoch = 0;
  int64_t target_batch_size = 0;
  double samples_per_second = 0;
  std::optional<double> loss = {};
  std::vector<TrainerView> peers = {};
  std::vector<HistoryPoint> history = {};  // oldest first
  std::vector<RoundView> rounds = {};      // newest first
};

struct DhtPeerView {
  std::string peer = {};
  std::vector<std::string> addresses = {};
  std::optional<bool> reachable = {};  // unknown until checked
  std::optional<double> rtt_ms = {};
  double checked_at = 0;
};

struct SwarmState {
  std::string version = {};
  double updated_at = 0;
  double refresh_seconds = 0;
  std::string monitor_peer = {};
  std::vector<ModelView> models = {};
  std::vector<RunView> runs = {};
  size_t dht_peers_known = 0;
  std::vector<DhtPeerView> dht_peers = {};
};

// The /api/v1/state document (one line of JSON; strings from the swarm are escaped by the JSON
// writer, invalid UTF-8 replaced).
std::string StateJson(const SwarmState& state);

}  // namespace colony::monitor
