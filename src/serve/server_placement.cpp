// Where a server sits in the swarm: its per-block records in the DHT (re-announced every
// announce_period), the blocks a new server takes (the window whose weakest block has the least
// throughput, counting only servers that answer a ping, claims capped, one server per address),
// and moving to weaker blocks when that clearly helps the swarm.
#include <fmt/format.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/use_future.hpp>
#include <cmath>
#include <future>
#include <limits>
#include <map>
#include <random>

#include "core/log.h"
#include "dht/validation.h"
#include "net/source_address.h"
#include "serve/client_internal.h"
#include "serve/server_internal.h"

namespace colony::serve {

int64_t ChooseBestStart(const std::vector<double>& coverage, int64_t num_blocks) {
  const auto total_blocks = static_cast<int64_t>(coverage.size());
  int64_t best = 0;
  double best_min = std::numeric_limits<double>::infinity(), best_sum = best_min;
  for (int64_t s = 0; s + num_blocks <= total_blocks; ++s) {
    double mn = std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t b = s; b < s + num_blocks; ++b) {
      mn = std::min(mn, coverage[static_cast<size_t>(b)]);
      sum += coverage[static_cast<size_t>(b)];
    }
    if (mn < best_min || (mn == best_min && sum < best_sum)) {
      best = s;
      best_min = mn;
      best_sum = sum;
    }
  }
  return best;
}

int64_t ChooseBestStart(const std::vector<ServerRecord>& records, int64_t total_blocks,
                        int64_t num_blocks) {
  std::vector<double> coverage(static_cast<size_t>(std::max<int64_t>(0, total_blocks)), 0.0);
  for (const auto& r : records) {
    if (r.state == ServerState::kOffline) continue;
    for (int64_t b = std::max<int64_t>(0, r.start); b < std::min(r.end, total_blocks); ++b) {
      coverage[static_cast<size_t>(b)] += r.throughput;
    }
  }
  return ChooseBestStart(coverage, num_blocks);
}

double LowerMedian(std::vector<double> values) {
  if (values.empty()) return 0;
  const auto mid = values.begin() + static_cast<std::ptrdiff_t>((values.size() - 1) / 2);
  std::nth_element(values.begin(), mid, values.end());
  return *mid;
}

std::vector<double> CountedCoverage(const std::vector<ServerRecord>& records,
                                    const std::vector<std::string>& address_keys,
                                    int64_t total_blocks, double own_claim) {
  const auto n = static_cast<size_t>(std::max<int64_t>(0, total_blocks));
  std::vector<double> claims;
  for (const auto& r : records) {
    if (r.state != ServerState::kOffline && std::isfinite(r.throughput) && r.throughput > 0) {
      claims.push_back(r.throughput);
    }
  }
  if (own_claim > 0 && std::isfinite(own_claim)) claims.push_back(own_claim);
  const double cap = claims.empty() ? std::numeric_limits<double>::infinity()
                                    : kPlacementClaimCap * LowerMedian(std::move(claims));
  // Per address, per block: the largest claim of its records.
  std::map<std::string, std::vector<double>> per_address;
  std::vector<double> coverage(n, 0.0);
  for (size_t i = 0; i < records.size(); ++i) {
    const ServerRecord& r = records[i];
    if (r.state == ServerState::kOffline || !std::isfinite(r.throughput) || r.throughput <= 0) {
      continue;
    }
    const double claim = std::min(r.throughput, cap);
    const std::string& key = i < address_keys.size() ? address_keys[i] : std::string();
    std::vector<double>* blocks = &coverage;
    if (!key.empty()) {
      auto [it, added] = per_address.try_emplace(key, n, 0.0);
      blocks = &it->second;
    }
    for (int64_t b = std::max<int64_t>(0, r.start); b < std::min(r.end, total_blocks); ++b) {
      double& c = (*blocks)[static_cast<size_t>(b)];
      c = key.empty() ? c + claim : std::max(c, claim);
    }
  }
  for (const auto& [key, blocks] : per_address) {
    for (size_t b = 0; b < n; ++b) coverage[b] += blocks[b];
  }
  return coverage;
}

std::vector<bool> AnsweringRecords(net::Host& host, const std::vector<ServerRecord>& records,
                                   std::chrono::milliseconds deadline) {
  std::vector<std::future<Result<net::PingResult>>> pings;
  for (const auto& r : records) {
    auto addr = AddressOf(r);
    if (!addr.ok()) {
      pings.emplace_back();
      continue;
    }
    pings.push_back(
        asio::co_spawn(host.io_context(), host.Ping(*addr, deadline), asio::use_future));
  }
  std::vector<bool> answered;
  for (auto& ping : pings) answered.push_back(ping.valid() && ping.get().ok());
  return answered;
}

std::vector<ServerRecord> BlockServer::Impl::FetchRecords() {
  std::vector<std::string> keys;
  for (int64_t b = 0; b < config_.num_layers; ++b) keys.push_back(BlockKey(options_.model_name, b));
  auto results = node_.GetManySync(keys, dht::Freshness::kLatest);
  std::map<std::string, ServerRecord> by_peer;
  const double now = dht::Now();
  for (auto& r : results) {
    if (!r.ok() || !r->is_dict) continue;
    for (auto& [subkey, entry] : r->subkeys) {
      auto peer = dht::ParseOwnerMarker(subkey);
      if (!peer || *peer == node_.peer_id() || entry.expiration < now) continue;
      auto rec = ParseServerRecord(*peer, entry.value, config_.num_layers);
      if (!rec.ok()) continue;
      // For pushes to it and pings (Host::SetPeerAddresses).
      node_.host().SetPeerAddresses(*peer, ParseMultiaddrs(rec->addresses));
      by_peer.emplace(peer->ToString(), std::move(*rec));
    }
  }
  std::vector<ServerRecord> out;
  for (auto& [k, v] : by_peer) out.push_back(std::move(v));
  return out;
}

std::vector<double> BlockServer::Impl::PlacementCoverage(double own_claim) {
  std::vector<ServerRecord> records = FetchRecords();
  std::erase_if(records, [](const ServerRecord& r) { return r.state == ServerState::kOffline; });
  // At most kMaxPlacementPings of them, drawn at random (not by peer id, which anyone can grind),
  // pinged at once, each dialled as its record's owner: a record counts only when its server
  // answers at its address, so records of servers that do not exist cost nothing.
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::shuffle(records.begin(), records.end(), rng);
  if (records.size() > kMaxPlacementPings) records.resize(kMaxPlacementPings);
  std::vector<std::string> keys;
  for (const auto& r : records) {
    auto addr = AddressOf(r);
    keys.push_back(addr.ok() && addr->is_ip()
                       ? net::SourceKey(addr->host(), options_.limit_loopback_addresses)
                       : std::string());
  }
  const std::vector<bool> answers = AnsweringRecords(node_.host(), records, options_.ping_timeout);
  std::vector<ServerRecord> answered;
  std::vector<std::string> answered_keys;
  for (size_t i = 0; i < records.size(); ++i) {
    if (!answers[i]) continue;
    answered.push_back(std::move(records[i]));
    answered_keys.push_back(std::move(keys[i]));
  }
  return CountedCoverage(answered, answered_keys, config_.num_layers, own_claim);
}

void BlockServer::Impl::Announce() {
  ServerRecord r;
  {
    std::lock_guard lock(mu_);
    r.state = state_;
    r.start = first_;
    r.end = last_;
    r.throughput = throughput_;
    r.inference_rps = inference_rps_;
    r.cache_tokens_left = CacheTokensLeftLocked();
    r.next_pings = next_pings_;
  }
  for (const auto& a : node_.VisibleAddresses()) r.addresses.push_back(a.ToString());
  r.version = COLONY_VERSION_STRING;
  r.dtype = DTypeLabel(dtype_);
  r.quantization = options_.quantize;
  const std::string value = EncodeServerRecord(r);
  const double expiration = dht::Now() + options_.record_ttl_seconds;
  std::vector<dht::StoreItem> items;
  for (int64_t b = r.start; b < r.end; ++b) {
    items.push_back({.key = BlockKey(options_.model_name, b),
                     .subkey = dht::OwnerMarker(node_.peer_id()),
                     .value = value,
                     .expiration = expiration});
  }
  // The model's entry in the swarm's list of models (what `colony monitor` shows).
  items.push_back({.key = std::string(kModelsKey),
                   .subkey = dht::OwnerMarker(node_.peer_id()),
                   .value = EncodeModelAnnouncement(
                       {.model = options_.model_name, .num_blocks = config_.num_layers}),
                   .expiration = expiration});
  auto statuses = node_.StoreManySync(items);
  for (const auto& st : statuses) {
    if (!st.ok()) {
      COLONY_LOG_DEBUG("serve: announcing blocks failed: {}", st.ToString());
      break;
    }
  }
}

void BlockServer::Impl::AnnounceLoop() {
  int ticks = 0, pings_due = 0;
  std::unique_lock lock(mu_);
  while (!stopped_) {
    cv_.wait_for(lock, options_.announce_period, [&] { return stopped_; });
    if (stopped_) break;
    lock.unlock();
    if (pings_due++ % 3 == 0) MeasureNextPings();
    Announce();
    if (!pinned_ && options_.rebalance && ++ticks % 6 == 0) MaybeRebalance();
    lock.lock();
  }
}

void BlockServer::Impl::MeasureNextPings() {
  int64_t end = 0;
  {
    std::lock_guard lock(mu_);
    end = last_;
  }
  std::vector<ServerRecord> next;
  for (auto& r : FetchRecords()) {
    if (r.state == ServerState::kOnline && r.start == end && !r.addresses.empty()) {
      next.push_back(std::move(r));
    }
  }
  // At most 4 x kMaxNextPings of them, pinged at once (each dialled as its record's owner), so
  // that records with black-holed addresses cost this thread one ping deadline.
  std::vector<std::pair<PeerId, double>> pings;
  std::vector<std::pair<PeerId, std::future<Result<net::PingResult>>>> pending;
  for (const auto& r : next) {
    if (pending.size() == 4 * kMaxNextPings) break;
    auto addr = AddressOf(r);
    if (!addr.ok()) continue;
    pending.emplace_back(
        r.peer, asio::co_spawn(node_.host().io_context(),
                               node_.host().Ping(*addr, options_.ping_timeout), asio::use_future));
  }
  for (auto& [peer, future] : pending) {
    auto ping = future.get();
    if (ping.ok() && pings.size() < kMaxNextPings) {
      pings.emplace_back(peer, std::chrono::duration<double, std::milli>(ping->rtt).count());
    }
  }
  std::lock_guard lock(mu_);
  next_pings_ = std::move(pings);
}

// Moves to weaker blocks when the swarm's weakest block would gain clearly (Petals'
// balance-quality rule), and only while no session holds a cache here.
void BlockServer::Impl::MaybeRebalance() {
  const int64_t n = config_.num_layers, count = last_ - first_;
  const std::vector<double> without = PlacementCoverage(throughput_);
  auto swarm_min = [&](int64_t start) {
    double mn = std::numeric_limits<double>::infinity();
    for (int64_t b = 0; b < n; ++b) {
      double c =
          without[static_cast<size_t>(b)] + ((b >= start && b < start + count) ? throughput_ : 0.0);
      mn = std::min(mn, c);
    }
    return mn;
  };
  const int64_t best = ChooseBestStart(without, count);
  const double now_min = swarm_min(first_), new_min = swarm_min(best);
  if (best == first_ || new_min * options_.balance_quality <= now_min) return;
  {
    std::lock_guard lock(mu_);
    if (!sessions_.empty()) return;
  }
  COLONY_LOG_INFO(
      "serve: moving from blocks [{}, {}) to [{}, {}): the swarm's weakest block "
      "goes from {:.0f} to {:.0f} tokens/s",
      first_, last_, best, best + count, now_min, new_min);
  // Withdraw the old span, then swap blocks on the compute thread (no step runs meanwhile).
  SetState(ServerState::kOffline);
  Announce();
  std::promise<Status> done;
  auto future = done.get_future();
  const bool queued = pool_.Submit(runtime::kPriorityInference, [&](bool ok) {
    if (!ok) {
      done.set_value(Closed("shutting down"));
      return;
    }
    {
      // A session may have opened between the check above and going offline: keep it.
      std::lock_guard lock(mu_);
      if (!sessions_.empty()) {
        done.set_value(FailedPrecondition("an inference session opened meanwhile"));
        return;
      }
    }
    Status st = LoadBlocks(best, best + count);
    if (st.ok()) {
      std::lock_guard lock(mu_);
      first_ = best;
      last_ = best + count;
    }
    done.set_value(st);
  });
  Status st = queued ? future.get() : ResourceExhausted("compute queue full");
  if (!st.ok()) COLONY_LOG_WARN("serve: rebalancing failed, staying: {}", st.ToString());
  SetState(ServerState::kOnline);
  Announce();
}

int64_t BlockServer::Impl::CacheTokensLeftLocked() const {
  const int64_t per = CacheBytesPerToken(config_, dtype_) * std::max<int64_t>(1, last_ - first_);
  return (options_.cache_bytes - cache_used_) / per;
}

}  // namespace colony::serve
