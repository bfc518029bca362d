// Routing for clients of a served model: the swarm's servers for each block (from the DHT), their
// round-trip times and bans, and routes through them (Petals' sequence manager).
//
//   auto node = dht::Node::Start(KeyPair::Generate(), {.initial_peers = {...}});  // client mode
//   auto manager = std::make_shared<SequenceManager>(**node, ClientOptions{
//       .model_name = "llama", .num_blocks = 32});
//   auto route = manager->MakeRoute(0, 32, RoutingMode::kMinLatency);
//
// Failure handling: a server that fails a request is banned for a while (exponential backoff)
// and the affected blocks are routed to other servers.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "core/status.h"
#include "dht/node.h"
#include "serve/records.h"

namespace colony::serve {

struct ClientOptions {
  std::string model_name;
  int64_t num_blocks = 0;                             // blocks in the whole model
  std::chrono::milliseconds request_timeout{60'000};  // one forward or backward call
  std::chrono::milliseconds step_timeout{30'000};     // one inference step on one server
  std::chrono::milliseconds session_lifetime{3'600'000};
  // Records older than this are re-read from the DHT before routing.
  std::chrono::milliseconds refresh_period{10'000};
  // Attempts per request before giving up (each failure bans a server or waits for one).
  int max_attempts = 8;
  std::chrono::milliseconds retry_backoff{300};
  std::chrono::milliseconds ban_base{2'000};
  std::chrono::milliseconds ban_max{120'000};
  // Ask each server to push its step output straight to the next server (saves half a round
  // trip per hop); the client still sends every step itself, so a lost push costs nothing.
  bool use_push = true;
  // Training through SWARM stages (swarm/pipeline.h): forward and backward calls pick each span's
  // server at random, with probability proportional to its throughput as measured by this client
  // (an exponential moving average over its calls; a server not called yet counts as the best
  // measured one, so a new one is tried at once, or with its announced throughput while none is
  // measured; a measured one keeps at least a tenth of the best one's weight, so that one slow
  // call does not starve it), instead of the fastest route.
  bool stochastic_routing = false;
  uint64_t routing_seed = 0;  // stochastic routing's random choices (0: from the clock)
  // How hidden states and their gradients cross the network in forward and backward calls
  // (serve/wire.h kBoundaryCodecs; SWARM's 8-bit stage boundaries: kBlockwise8). Lossy but
  // kNone; inference sessions always send them raw.
  compression::Codec boundary_codec = compression::Codec::kNone;
};

enum class RoutingMode {
  kMinLatency,     // inference: least (RTT + compute) along the chain
  kMaxThroughput,  // training: least compute time, by announced throughput
  kStochastic,     // SWARM training: each span's server drawn in proportion to its throughput
};

struct RouteSpan {
  ServerRecord server;
  int64_t start = 0, end = 0;
};

// Knows the swarm's servers for one model (from the DHT), their RTTs and bans. Thread-safe;
// shared by the remote sequences and sessions of a client.
class SequenceManager {
 public:
  SequenceManager(dht::Node& node, ClientOptions options);

  // Re-reads every block's records from the DHT.
  Status Refresh();
  // Servers for blocks [start, end), refreshing first when the records are stale. Unavailable
  // (naming the uncovered blocks) when no unbanned online server covers them.
  Result<std::vector<RouteSpan>> MakeRoute(int64_t start, int64_t end, RoutingMode mode);
  // Bans the server for a while (doubling with consecutive failures), for the blocks of the
  // record it was called through: a server that moved to other blocks since (SWARM rebalancing,
  // Petals' load balancing) is not avoided there. The PeerId form bans it for every block.
  void Ban(const ServerRecord& server, const Status& why);
  void Ban(const PeerId& peer, const Status& why);
  void ReportSuccess(const PeerId& peer);
  // A forward or backward call that took `seconds` for `work` (blocks x tokens): updates the
  // server's measured throughput (what stochastic routing weighs by).
  void ReportCall(const PeerId& peer, double work, double seconds);
  // The routing mode of forward and backward calls (kStochastic with stochastic_routing).
  RoutingMode TrainingMode() const {
    return options_.stochastic_routing ? RoutingMode::kStochastic : RoutingMode::kMaxThroughput;
  }
  // The epoch that forward and backward requests carry (a SWARM trainer's; -1: none).
  void SetEpoch(int64_t epoch) { epoch_.store(epoch); }
  int64_t epoch() const { return epoch_.load(); }
  // The microbatch that backward requests carry with the epoch (a SWARM trainer's random id, the
  // same in the microbatch's retries; 0: none), and the blocks whose server took its gradient
  // (later backwards of it there are replays), so that a stage counts it once (serve.fence).
  // The last kMicrobatchesTracked microbatches are remembered.
  static constexpr size_t kMicrobatchesTracked = 64;
  void SetMicrobatch(uint64_t id) { microbatch_.store(id); }
  uint64_t microbatch() const { return microbatch_.load(); }
  void NoteTaken(uint64_t id, int64_t start, int64_t end);
  bool Taken(uint64_t id, int64_t start, int64_t end) const;
  // The number of the next try of a backward of microbatch `id` (1, 2, ...; one count for all its
  // block ranges), which a server's fence of a failed try names.
  uint32_t NextAttempt(uint64_t id);
  bool IsBanned(const PeerId& peer) const;
  // Known online servers (from the last refresh).
  std::vector<ServerRecord> Servers() const;

  net::Host& host() { return node_.host(); }
  dht::Node& node() { return node_; }
  const ClientOptions& options() const { return options_; }

 private:
  // Each server's round-trip time (cached), pinging those not known yet concurrently; nullopt
  // for a server that did not answer (not pinged again for refresh_period).
  std::vector<std::optional<double>> MeasureRtts(const std::vector<ServerRecord>& servers);
  std::optional<std::vector<RouteSpan>> DrawRoute(const std::vector<ServerRecord>& candidates,
                                                  int64_t start, int64_t end);

  dht::Node& node_;
  ClientOptions options_;
  mutable std::mutex mu_;
  std::vector<ServerRecord> servers_;
  std::chrono::steady_clock::time_point refreshed_{};
  bool ever_refreshed_ = false;
  struct BanState {
    std::chrono::steady_clock::time_point until{};
    int failures = 0;
    int64_t start = 0, end = 0;  // the blocks the ban holds for
  };
  void BanSpan(const PeerId& peer, int64_t start, int64_t end, const Status& why);
  std::map<PeerId, BanState> bans_;
  std::map<PeerId, double> rtt_;
  std::map<PeerId, double> measured_;  // throughput (work/s) seen by this client, an EMA
  std::mt19937_64 rng_;
  std::atomic<int64_t> epoch_{-1};
  std::atomic<uint64_t> microbatch_{0};
  // Per microbatch (oldest first): the block ranges whose server took its gradient, and its
  // backwards' tries so far.
  struct MicrobatchState {
    uint64_t id = 0;
    std::vector<std::pair<int64_t, int64_t>> taken;
    uint32_t attempts = 0;
  };
  MicrobatchState& TrackedLocked(uint64_t id);  // mu_ held; tracked from now on
  std::deque<MicrobatchState> microbatches_;
  std::map<PeerId, std::chrono::steady_clock::time_point> unreachable_;  // until then
};

}  // namespace colony::serve
