// The client's view of the swarm serving a model (routing.h): servers per block from the DHT,
// bans with backoff, round-trip times, and routes by latency (inference) or throughput
// (training).
#include "serve/routing.h"

#include <fmt/format.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/use_future.hpp>
#include <cmath>
#include <future>
#include <limits>
#include <set>

#include "core/log.h"
#include "dht/validation.h"
#include "serve/client_internal.h"

namespace colony::serve {
namespace {

using Clock = std::chrono::steady_clock;

bool Covers(const std::vector<ServerRecord>& servers, int64_t start, int64_t end) {
  for (int64_t b = start; b < end; ++b) {
    bool covered = false;
    for (const auto& r : servers) covered = covered || (r.start <= b && b < r.end);
    if (!covered) return false;
  }
  return true;
}

// Throughputs are what servers say of themselves: a claim above 4x the candidates' median
// counts as 4x the median, so that one record cannot draw every route by boasting.
void BoundClaims(std::vector<ServerRecord>& servers) {
  auto bound = [&servers](double ServerRecord::*field) {
    std::vector<double> v;
    for (const auto& r : servers) {
      if (r.*field > 0) v.push_back(r.*field);
    }
    if (v.empty()) return;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    const double cap = 4 * v[v.size() / 2];
    for (auto& r : servers) r.*field = std::min(r.*field, cap);
  };
  bound(&ServerRecord::throughput);
  bound(&ServerRecord::inference_rps);
}

// The route of least cost over block positions (a DAG: every edge moves forward): by RTT and
// inference speed, or by training throughput. nullopt when some position has no candidate.
std::optional<std::vector<RouteSpan>> ShortestRoute(const std::vector<ServerRecord>& candidates,
                                                    const std::vector<double>& rtt, int64_t start,
                                                    int64_t end, RoutingMode mode) {
  const double inf = std::numeric_limits<double>::infinity();
  const size_t n = static_cast<size_t>(end - start);
  std::vector<double> dist(n + 1, inf);
  std::vector<std::pair<size_t, size_t>> prev(n + 1, {0, 0});  // (from position, server)
  dist.front() = 0;
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
  if (!(dist[n] < inf)) return std::nullopt;
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

}  // namespace

SequenceManager::SequenceManager(dht::Node& node, ClientOptions options)
    : node_(node),
      options_(std::move(options)),
      rng_(options_.routing_seed != 0
               ? options_.routing_seed
               : static_cast<uint64_t>(Clock::now().time_since_epoch().count())) {}

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
      // All of them: the first may lead elsewhere from this machine (Host::SetPeerAddresses).
      host().SetPeerAddresses(*peer, ParseMultiaddrs(rec->addresses));
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

void SequenceManager::Ban(const ServerRecord& server, const Status& why) {
  BanSpan(server.peer, server.start, server.end, why);
}

void SequenceManager::Ban(const PeerId& peer, const Status& why) {
  BanSpan(peer, 0, std::numeric_limits<int64_t>::max(), why);
}

void SequenceManager::BanSpan(const PeerId& peer, int64_t start, int64_t end, const Status& why) {
  std::lock_guard lock(mu_);
  auto& b = bans_[peer];
  if (b.failures > 0 && (b.start != start || b.end != end)) b.failures = 0;  // other blocks now
  b.start = start;
  b.end = end;
  ++b.failures;
  auto duration = options_.ban_base * (int64_t{1} << std::min(b.failures - 1, 16));
  if (duration > options_.ban_max) duration = options_.ban_max;
  b.until = Clock::now() + duration;
  rtt_.erase(peer);
  COLONY_LOG_WARN(
      "server {} failed on blocks [{}, {}) ({}); avoiding it there for {:.1f} s", peer.ToString(),
      start, end == std::numeric_limits<int64_t>::max() ? std::string("end") : std::to_string(end),
      why.ToString(), std::chrono::duration<double>(duration).count());
}

void SequenceManager::ReportSuccess(const PeerId& peer) {
  std::lock_guard lock(mu_);
  auto it = bans_.find(peer);
  if (it != bans_.end() && it->second.until <= Clock::now()) bans_.erase(it);
}

void SequenceManager::ReportCall(const PeerId& peer, double work, double seconds) {
  if (!(work > 0) || !(seconds > 0) || !std::isfinite(work / seconds)) return;
  const double rate = work / seconds;
  std::lock_guard lock(mu_);
  auto [it, fresh] = measured_.try_emplace(peer, rate);
  if (!fresh) it->second = 0.8 * it->second + 0.2 * rate;
}

std::vector<std::optional<double>> SequenceManager::MeasureRtts(
    const std::vector<ServerRecord>& servers) {
  std::vector<std::optional<double>> out(servers.size());
  std::vector<size_t> unknown;
  {
    std::lock_guard lock(mu_);
    const auto now = Clock::now();
    // Entries whose time is up are forgotten: the map holds only peers that failed a ping
    // within the last refresh period, not one entry per fake record ever seen.
    std::erase_if(unreachable_, [now](const auto& kv) { return kv.second <= now; });
    for (size_t i = 0; i < servers.size(); ++i) {
      if (auto it = rtt_.find(servers[i].peer); it != rtt_.end()) {
        out[i] = it->second;
      } else if (auto u = unreachable_.find(servers[i].peer);
                 u == unreachable_.end() || u->second <= now) {
        unknown.push_back(i);
      }
    }
  }
  // Concurrently, so that records with black-holed addresses cost one ping deadline per batch
  // rather than one each.
  constexpr size_t kConcurrentPings = 128;
  constexpr auto kPingTimeout = std::chrono::seconds(2);
  for (size_t begin = 0; begin < unknown.size(); begin += kConcurrentPings) {
    const size_t end = std::min(unknown.size(), begin + kConcurrentPings);
    std::vector<std::future<Result<net::PingResult>>> pings(end - begin);
    for (size_t k = begin; k < end; ++k) {
      auto addr = AddressOf(servers[unknown[k]]);
      if (!addr.ok()) continue;
      pings[k - begin] = asio::co_spawn(node_.host().io_context(),
                                        node_.host().Ping(*addr, kPingTimeout), asio::use_future);
    }
    // Every answer first (up to a ping deadline), then the lock.
    std::vector<Result<net::PingResult>> answers;
    for (auto& ping : pings) {
      answers.push_back(ping.valid() ? ping.get()
                                     : Result<net::PingResult>(Unavailable("no usable address")));
    }
    std::lock_guard lock(mu_);
    for (size_t k = begin; k < end; ++k) {
      const ServerRecord& server = servers[unknown[k]];
      const Result<net::PingResult>& r = answers[k - begin];
      if (r.ok()) {
        out[unknown[k]] = rtt_[server.peer] = std::chrono::duration<double>(r->rtt).count();
        unreachable_.erase(server.peer);
      } else {
        COLONY_LOG_DEBUG("serve: server {} does not answer pings: {}", server.peer.ToString(),
                         r.status().ToString());
        unreachable_[server.peer] = Clock::now() + options_.refresh_period;
      }
    }
  }
  return out;
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
        if (b != bans_.end() && b->second.until > now && b->second.start < r.end &&
            r.start < b->second.end) {
          continue;
        }
        if (r.end <= start || r.start >= end || r.addresses.empty()) continue;
        candidates.push_back(r);
      }
    }
    // Servers that answered a ping first; the rest (which may only be slow, or not exist at
    // all) only when no route avoids them, and then as if they took a second to answer.
    const std::vector<std::optional<double>> measured = MeasureRtts(candidates);
    std::vector<double> rtt(candidates.size());
    std::vector<ServerRecord> reachable;
    std::vector<double> reachable_rtt;
    for (size_t i = 0; i < candidates.size(); ++i) {
      rtt[i] = measured[i].value_or(1.0);
      if (measured[i]) {
        reachable.push_back(candidates[i]);
        reachable_rtt.push_back(rtt[i]);
      }
    }
    if (!reachable.empty() && Covers(reachable, start, end)) {
      candidates = std::move(reachable);
      rtt = std::move(reachable_rtt);
    }
    BoundClaims(candidates);
    if (mode == RoutingMode::kStochastic) {
      auto route = DrawRoute(candidates, start, end);
      if (route) return *route;
      if (pass == 0) continue;
    }
    if (mode != RoutingMode::kStochastic) {
      auto route = ShortestRoute(candidates, rtt, start, end, mode);
      if (route) return *route;
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

constexpr double kMinShareOfBest = 0.1;

// SWARM's stochastic wiring: from each position, a server holding it, drawn with probability
// proportional to its measured throughput, up to the end of its span. nullopt when some position
// has no candidate.
std::optional<std::vector<RouteSpan>> SequenceManager::DrawRoute(
    const std::vector<ServerRecord>& candidates, int64_t start, int64_t end) {
  std::vector<RouteSpan> route;
  std::lock_guard lock(mu_);
  for (int64_t pos = start; pos < end;) {
    std::vector<size_t> holders;
    std::vector<double> weights;  // measured; -1: not called yet
    double best = 0;
    for (size_t s = 0; s < candidates.size(); ++s) {
      const auto& r = candidates[s];
      if (r.start > pos || r.end <= pos) continue;
      auto m = measured_.find(r.peer);
      holders.push_back(s);
      weights.push_back(m != measured_.end() ? m->second : -1);
      if (m != measured_.end()) best = std::max(best, m->second);
    }
    if (holders.empty()) return std::nullopt;
    // A server not called yet counts as the best measured one (so it is tried at once, and its
    // own measurement decides from then on); with none measured, announced throughputs decide.
    // A measured server keeps at least a tenth of the best one's weight, so that one slow call
    // (its first one pays for the connection, or found the stage at an epoch boundary) does not
    // starve it of the calls that would correct its estimate.
    for (size_t k = 0; k < holders.size(); ++k) {
      if (weights[k] < 0) weights[k] = best > 0 ? best : candidates[holders[k]].throughput;
      if (best > 0) weights[k] = std::max(weights[k], kMinShareOfBest * best);
      if (!std::isfinite(weights[k]) || weights[k] <= 0) weights[k] = 1e-9;
    }
    std::discrete_distribution<size_t> pick(weights.begin(), weights.end());
    const ServerRecord& r = candidates[holders[pick(rng_)]];
    const int64_t stop = std::min(r.end, end);
    route.push_back({r, pos, stop});
    pos = stop;
  }
  return route;
}

namespace {

// The tracked state of microbatch `id` in `tracked` (const or not), or null.
template <typename Deque>
auto* FindMicrobatch(Deque& tracked, uint64_t id) {
  auto it =
      std::find_if(tracked.begin(), tracked.end(), [id](const auto& m) { return m.id == id; });
  return it != tracked.end() ? &*it : nullptr;
}

}  // namespace

SequenceManager::MicrobatchState& SequenceManager::TrackedLocked(uint64_t id) {
  if (auto* m = FindMicrobatch(microbatches_, id)) return *m;
  if (microbatches_.size() >= kMicrobatchesTracked) microbatches_.pop_front();
  microbatches_.push_back({.id = id, .taken = {}, .attempts = 0});
  return microbatches_.back();
}

void SequenceManager::NoteTaken(uint64_t id, int64_t start, int64_t end) {
  std::lock_guard lock(mu_);
  auto& taken = TrackedLocked(id).taken;
  if (std::find(taken.begin(), taken.end(), std::pair{start, end}) == taken.end()) {
    taken.emplace_back(start, end);
  }
}

bool SequenceManager::Taken(uint64_t id, int64_t start, int64_t end) const {
  std::lock_guard lock(mu_);
  const MicrobatchState* m = FindMicrobatch(microbatches_, id);
  return m != nullptr &&
         std::find(m->taken.begin(), m->taken.end(), std::pair{start, end}) != m->taken.end();
}

uint32_t SequenceManager::NextAttempt(uint64_t id) {
  std::lock_guard lock(mu_);
  return ++TrackedLocked(id).attempts;
}

}  // namespace colony::serve
