// The client's view of the swarm serving a model (routing.h): servers per block from the DHT,
// bans with backoff, round-trip times, and routes by latency (inference) or throughput
// (training).
#include "serve/routing.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <set>

#include "core/log.h"
#include "dht/validation.h"
#include "serve/client_internal.h"

namespace colony::serve {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

SequenceManager::SequenceManager(dht::Node& node, ClientOptions options)
    : node_(node), options_(std::move(options)) {}

Status SequenceManager::Refresh() {
  std::vector<std::string> keys;
  for (int64_t b = 0; b < options_.num_blocks; ++b)
    keys.push_back(BlockKey(options_.model_name, b));
  auto results = node_.GetManySync(keys, dht::Freshness::kLatest);
  std::map<PeerId, ServerRecord> by_peer;
  const double now = dht::Now();
  Status last_error;
  for (auto& r : results) {
    if (!r.ok()) {
      if (r.status().code() != StatusCode::kNotFound) last_error = r.status();
      continue;
    }
    if (!r->is_dict) continue;
    for (auto& [subkey, entry] : r->subkeys) {
      auto peer = dht::ParseOwnerMarker(subkey);
      if (!peer || entry.expiration < now) continue;
      auto rec = ParseServerRecord(*peer, entry.value, options_.num_blocks);
      if (!rec.ok()) {
        COLONY_LOG_DEBUG("serve: ignoring {}'s record: {}", peer->ToString(),
                         rec.status().ToString());
        continue;
      }
      if (rec->state != ServerState::kOnline) continue;
      by_peer[*peer] = std::move(*rec);
    }
  }
  std::lock_guard lock(mu_);
  servers_.clear();
  for (auto& [peer, rec] : by_peer) servers_.push_back(std::move(rec));
  refreshed_ = Clock::now();
  ever_refreshed_ = true;
  if (servers_.empty() && !last_error.ok()) return last_error;
  return Status();
}

std::vector<ServerRecord> SequenceManager::Servers() const {
  std::lock_guard lock(mu_);
  return servers_;
}

bool SequenceManager::IsBanned(const PeerId& peer) const {
  std::lock_guard lock(mu_);
  auto it = bans_.find(peer);
  return it != bans_.end() && it->second.until > Clock::now();
}

void SequenceManager::Ban(const PeerId& peer, const Status& why) {
  std::lock_guard lock(mu_);
  auto& b = bans_[peer];
  ++b.failures;
  auto duration = options_.ban_base * (int64_t{1} << std::min(b.failures - 1, 16));
  if (duration > options_.ban_max) duration = options_.ban_max;
  b.until = Clock::now() + duration;
  rtt_.erase(peer);
  COLONY_LOG_WARN("server {} failed ({}); avoiding it for {:.1f} s", peer.ToString(),
                  why.ToString(), std::chrono::duration<double>(duration).count());
}

void SequenceManager::ReportSuccess(const PeerId& peer) {
  std::lock_guard lock(mu_);
  auto it = bans_.find(peer);
  if (it != bans_.end() && it->second.until <= Clock::now()) bans_.erase(it);
}

double SequenceManager::RttSeconds(const ServerRecord& server) {
  {
    std::lock_guard lock(mu_);
    auto it = rtt_.find(server.peer);
    if (it != rtt_.end()) return it->second;
  }
  double rtt = 1.0;  // unreachable servers look slow rather than absent
  auto addr = AddressOf(server);
  if (addr.ok()) {
    auto ping = node_.host().PingSync(*addr, std::chrono::seconds(2));
    if (ping.ok()) rtt = std::chrono::duration<double>(ping->rtt).count();
  }
  std::lock_guard lock(mu_);
  rtt_[server.peer] = rtt;
  return rtt;
}

Result<std::vector<RouteSpan>> SequenceManager::MakeRoute(int64_t start, int64_t end,
                                                          RoutingMode mode) {
  if (start < 0 || end > options_.num_blocks || start >= end) {
    return InvalidArgument(fmt::format("blocks [{}, {}) are not a range of the model's {} blocks",
                                       start, end, options_.num_blocks));
  }
  for (int pass = 0; pass < 2; ++pass) {
    bool stale;
    {
      std::lock_guard lock(mu_);
      stale = !ever_refreshed_ || Clock::now() - refreshed_ > options_.refresh_period;
    }
    if (stale || pass == 1) {
      Status st = Refresh();
      if (!st.ok()) COLONY_LOG_DEBUG("serve: refreshing servers failed: {}", st.ToString());
    }
    std::vector<ServerRecord> candidates;
    {
      std::lock_guard lock(mu_);
      const auto now = Clock::now();
      for (const auto& r : servers_) {
        auto b = bans_.find(r.peer);
        if (b != bans_.end() && b->second.until > now) continue;
        if (r.end <= start || r.start >= end || r.addresses.empty()) continue;
        candidates.push_back(r);
      }
    }
    std::vector<double> rtt(candidates.size());
    for (size_t i = 0; i < candidates.size(); ++i) rtt[i] = RttSeconds(candidates[i]);
    // Shortest path over block positions (a DAG: every edge moves forward).
    const double inf = std::numeric_limits<double>::infinity();
    const size_t n = static_cast<size_t>(end - start);
    std::vector<double> dist(n + 1, inf);
    std::vector<std::pair<size_t, size_t>> prev(n + 1, {0, 0});  // (from position, server)
    dist[0] = 0;
    for (size_t i = 0; i < n; ++i) {
      if (dist[i] == inf) continue;
      const int64_t block = start + static_cast<int64_t>(i);
      for (size_t s = 0; s < candidates.size(); ++s) {
        const auto& r = candidates[s];
        if (r.start > block || r.end <= block) continue;
        const size_t j = static_cast<size_t>(std::min(r.end, end) - start);
        const double blocks = static_cast<double>(j - i);
        const double cost = mode == RoutingMode::kMinLatency
                                ? rtt[s] + blocks / std::max(r.inference_rps, 1e-9)
                                : blocks / std::max(r.throughput, 1e-9) + 0.1 * rtt[s];
        if (dist[i] + cost < dist[j]) {
          dist[j] = dist[i] + cost;
          prev[j] = {i, s};
        }
      }
    }
    if (dist[n] < inf) {
      std::vector<RouteSpan> route;
      for (size_t j = n; j > 0;) {
        auto [i, s] = prev[j];
        route.push_back(
            {candidates[s], start + static_cast<int64_t>(i), start + static_cast<int64_t>(j)});
        j = i;
      }
      std::reverse(route.begin(), route.end());
      return route;
    }
    if (pass == 1) {
      // Name the first block that no usable server holds.
      int64_t missing = start;
      for (int64_t b = start; b < end; ++b) {
        bool covered = false;
        for (const auto& r : candidates) covered = covered || (r.start <= b && b < r.end);
        if (!covered) {
          missing = b;
          break;
        }
      }
      size_t known, banned = 0;
      {
        std::lock_guard lock(mu_);
        known = servers_.size();
        for (auto& [p, b] : bans_) banned += b.until > Clock::now();
      }
      return Unavailable(fmt::format(
          "no reachable online server holds block {} of model '{}' ({} servers known, {} "
          "temporarily banned); start one with 'colony serve --blocks {}:{}' or wait",
          missing, options_.model_name, known, banned, missing, missing + 1));
    }
  }
  return Unavailable("routing failed");
}

}  // namespace colony::serve
