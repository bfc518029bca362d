// The monitor's view of a swarm, refreshed on a thread of its own: the models servers announce
// (serve/records.h) and their block records, the training runs peers announce and their progress
// records (train/progress_record.h), every server pinged (so a killed server shows as unreachable
// at the next refresh, long before its records expire), and DHT peers dialed now and then.
//
//   auto node = dht::Node::Start(KeyPair::Generate(), {... client_mode ...});
//   auto collector = monitor::Collector::Start(**node, {.refresh = 2s});
//   SwarmState s = (*collector)->Snapshot();
//
// Everything read from the DHT is untrusted: records are parsed by their layers' validating
// parsers, and what one refresh reads, dials and keeps is bounded (CollectorLimits).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "core/identity.h"
#include "core/status.h"
#include "dht/node.h"
#include "monitor/swarm_state.h"

namespace colony::monitor {

struct CollectorLimits {
  size_t max_models = 32;        // the most announced ones
  size_t max_block_keys = 8192;  // block records read per refresh, all models together
  size_t max_servers_per_model = 512;
  size_t max_runs = 32;
  size_t max_peers_per_run = 512;
  size_t max_history = 720;  // points per run; older ones are thinned, not dropped
  size_t max_rounds = 8;     // per run
  size_t max_groups_per_round = 64;
  size_t max_pings = 512;      // servers pinged per refresh
  size_t max_dht_checks = 32;  // DHT peers dialed per refresh
  size_t max_dht_peers_shown = 256;
};

struct CollectorOptions {
  std::chrono::milliseconds refresh{2'000};
  std::chrono::milliseconds ping_timeout{2'000};
  // A DHT peer's reachability is checked again after this.
  std::chrono::milliseconds dht_recheck{30'000};
  // A server whose records expired stays on the page as offline this long.
  std::chrono::milliseconds keep_offline{600'000};
  CollectorLimits limits = {};
};

// Can the monitor dial a peer directly (what a server asks at start-up, as Petals servers ask
// health.petals.dev)?
struct Reachability {
  bool known = false;  // the swarm's records or the routing table name addresses for it
  bool reachable = false;
  std::string address;  // the address that answered, or the last one tried
  std::string error;    // why not, when not
  double rtt_ms = 0;
};

class Collector {
 public:
  // The node must outlive the collector. Refreshes once before returning.
  static Result<std::unique_ptr<Collector>> Start(dht::Node& node, CollectorOptions options);
  ~Collector();  // stops the refresh thread
  Collector(const Collector&) = delete;
  Collector& operator=(const Collector&) = delete;

  // The state as of the last refresh.
  SwarmState Snapshot() const;
  // Dials the peer afresh at each of its known direct addresses (at most 4, each within the ping
  // timeout); relayed addresses do not count.
  Reachability CheckReachable(const PeerId& peer) const;

  class Impl;

 private:
  explicit Collector(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace colony::monitor
