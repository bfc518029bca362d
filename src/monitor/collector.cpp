#include "monitor/collector.h"

#include <fmt/format.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/use_future.hpp>
#include <cmath>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "core/log.h"
#include "dht/validation.h"
#include "serve/records.h"
#include "train/progress_record.h"

namespace colony::monitor {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(std::chrono::nanoseconds d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// The owner-signed, unexpired entries of a dictionary record: (owner, value).
std::vector<std::pair<PeerId, std::string>> OwnedEntries(const Result<dht::Record>& r, double now) {
  std::vector<std::pair<PeerId, std::string>> out;
  if (!r.ok() || !r->is_dict) return out;
  for (const auto& [subkey, entry] : r->subkeys) {
    auto owner = dht::ParseOwnerMarker(subkey);
    if (owner && entry.expiration >= now) out.emplace_back(*owner, entry.value);
  }
  return out;
}

// The direct addresses of a server's record that name the server itself (the monitor dials
// nothing else on a record's word).
std::vector<Multiaddr> DirectAddresses(const PeerId& peer, const std::vector<std::string>& texts,
                                       size_t max) {
  std::vector<Multiaddr> out;
  for (const auto& t : texts) {
    auto a = Multiaddr::Parse(t);
    if (!a.ok() || a->is_relayed()) continue;
    if (a->peer_id() && *a->peer_id() != peer) continue;
    out.push_back(a->WithPeerId(peer));
    if (out.size() == max) break;
  }
  return out;
}

bool AllRelayed(const std::vector<std::string>& texts) {
  if (texts.empty()) return false;
  return std::all_of(texts.begin(), texts.end(), [](const std::string& t) {
    auto a = Multiaddr::Parse(t);
    return a.ok() && a->is_relayed();
  });
}

// Keeps at most `max` points by dropping every other one of the older half (the chart keeps the
// whole run, at a coarser resolution further back).
void Thin(std::vector<HistoryPoint>& h, size_t max) {
  if (h.size() <= max) return;
  const size_t half = h.size() / 2;
  std::vector<HistoryPoint> out;
  out.reserve(max);
  for (size_t i = 0; i < half; i += 2) out.push_back(h[i]);
  out.insert(out.end(), h.begin() + static_cast<std::ptrdiff_t>(half), h.end());
  h = std::move(out);
}

}  // namespace

class Collector::Impl {
 public:
  Impl(dht::Node& node, CollectorOptions options) : node_(node), options_(options) {}

  void Start() {
    Refresh();
    thread_ = std::thread([this] { Loop(); });
  }

  ~Impl() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  SwarmState Snapshot() const {
    std::lock_guard lock(mu_);
    return state_;
  }

  Reachability CheckReachable(const PeerId& peer) const {
    Reachability r;
    std::vector<Multiaddr> candidates;
    {
      std::lock_guard lock(mu_);
      auto it = addresses_.find(peer);
      if (it != addresses_.end()) candidates = it->second;
    }
    for (const auto& c : node_.KnownPeers()) {
      if (c.peer == peer) {
        for (const auto& a : DirectAddresses(peer, c.addrs, 4)) candidates.push_back(a);
      }
    }
    if (candidates.size() > 4) candidates.resize(4);
    r.known = !candidates.empty();
    if (!r.known) {
      r.error =
          "no direct address of this peer is known to the monitor (it is in no server record "
          "and not in the routing table)";
      return r;
    }
    for (const auto& address : candidates) {
      r.address = address.ToString();
      const auto start = Clock::now();
      auto fut =
          asio::co_spawn(node_.host().io_context(), node_.host().Probe(address), asio::use_future);
      if (fut.wait_for(options_.ping_timeout) != std::future_status::ready) {
        r.error = fmt::format("no answer within {} ms", options_.ping_timeout.count());
        continue;
      }
      Status st = fut.get();
      if (st.ok()) {
        r.reachable = true;
        r.error.clear();
        r.rtt_ms = Ms(Clock::now() - start);
        return r;
      }
      r.error = st.ToString();
    }
    return r;
  }

 private:
  struct KnownServer {
    ServerView view;
    Clock::time_point last_seen;
  };
  struct RunMemory {
    std::vector<HistoryPoint> history;
    std::map<int64_t, std::map<std::string, GroupView>> rounds;  // epoch -> group id -> group
  };
  struct DhtCheck {
    std::optional<bool> reachable;
    std::optional<double> rtt_ms;
    double checked_at = 0;
    Clock::time_point when{};
  };

  void Loop() {
    std::unique_lock lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, options_.refresh, [&] { return stop_; });
      if (stop_) break;
      lock.unlock();
      Refresh();
      lock.lock();
    }
  }

  // Pings every address concurrently; the round-trip time of each that answered in time.
  std::vector<std::optional<double>> PingAll(const std::vector<Multiaddr>& addresses) {
    std::vector<std::future<Result<net::PingResult>>> futures;
    futures.reserve(addresses.size());
    for (const auto& a : addresses) {
      futures.push_back(asio::co_spawn(node_.host().io_context(),
                                       node_.host().Ping(a, options_.ping_timeout),
                                       asio::use_future));
    }
    std::vector<std::optional<double>> out(addresses.size());
    const auto deadline = Clock::now() + options_.ping_timeout + std::chrono::seconds(1);
    for (size_t i = 0; i < futures.size(); ++i) {
      if (futures[i].wait_until(deadline) != std::future_status::ready) continue;
      auto r = futures[i].get();
      if (r.ok()) out[i] = Ms(r->rtt);
    }
    return out;
  }

  void Refresh() {
    const CollectorLimits& lim = options_.limits;
    const double now = dht::Now();
    auto lists = node_.GetManySync({std::string(serve::kModelsKey), std::string(train::kRunsKey)},
                                   dht::Freshness::kLatest);

    // Models: each by the depth most of its announcers give (ties: the smaller).
    std::map<std::string, std::map<int64_t, int>> model_votes;
    for (const auto& [owner, value] : OwnedEntries(lists[0], now)) {
      auto a = serve::ParseModelAnnouncement(value);
      if (a.ok()) ++model_votes[a->model][a->num_blocks];
    }
    struct ModelPick {
      std::string name;
      int64_t blocks;
      int votes;
    };
    std::vector<ModelPick> picks;
    for (const auto& [name, votes] : model_votes) {
      auto best = std::max_element(votes.begin(), votes.end(), [](const auto& a, const auto& b) {
        return a.second < b.second || (a.second == b.second && a.first > b.first);
      });
      int total = 0;
      for (const auto& [n, v] : votes) total += v;
      picks.push_back({name, best->first, total});
    }
    std::stable_sort(picks.begin(), picks.end(),
                     [](const ModelPick& a, const ModelPick& b) { return a.votes > b.votes; });
    if (picks.size() > lim.max_models) picks.resize(lim.max_models);
    std::sort(picks.begin(), picks.end(),
              [](const ModelPick& a, const ModelPick& b) { return a.name < b.name; });

    std::vector<std::string> keys;
    std::vector<std::pair<size_t, int64_t>> key_of;  // (model index, block)
    for (size_t m = 0; m < picks.size(); ++m) {
      for (int64_t b = 0; b < picks[m].blocks && keys.size() < lim.max_block_keys; ++b) {
        keys.push_back(serve::BlockKey(picks[m].name, b));
        key_of.emplace_back(m, b);
      }
    }
    auto block_records = node_.GetManySync(keys, dht::Freshness::kLatest);
    std::vector<std::map<PeerId, serve::ServerRecord>> records(picks.size());
    for (size_t k = 0; k < block_records.size() && k < key_of.size(); ++k) {
      const auto [m, block] = key_of[k];
      for (const auto& [owner, value] : OwnedEntries(block_records[k], now)) {
        if (records[m].contains(owner)) continue;
        if (records[m].size() >= lim.max_servers_per_model) break;
        auto rec = serve::ParseServerRecord(owner, value, picks[m].blocks);
        if (rec.ok() && block >= rec->start && block < rec->end) records[m].emplace(owner, *rec);
      }
    }

    // Ping every server that says it is up (each once, whatever it serves).
    std::vector<Multiaddr> to_ping;
    std::map<PeerId, size_t> ping_index;
    std::map<PeerId, std::vector<Multiaddr>> addresses;
    std::set<PeerId> undialable;  // no address that names the server itself
    for (const auto& per_model : records) {
      for (const auto& [peer, rec] : per_model) {
        auto direct = DirectAddresses(peer, rec.addresses, 4);
        if (!direct.empty()) addresses[peer] = direct;
        if (rec.state == serve::ServerState::kOffline || ping_index.contains(peer)) continue;
        if (to_ping.size() >= lim.max_pings) continue;
        std::optional<Multiaddr> target;
        if (!direct.empty()) {
          target = direct.front();
        } else if (!rec.addresses.empty()) {
          auto relayed = Multiaddr::Parse(rec.addresses.front());
          if (relayed.ok() && relayed->peer_id() == peer) target = *relayed;
        }
        if (!target) {
          undialable.insert(peer);
          continue;
        }
        ping_index[peer] = to_ping.size();
        to_ping.push_back(*target);
      }
    }
    // And a few DHT peers whose last check is old.
    auto contacts = node_.KnownPeers();
    std::vector<PeerId> dht_checked;
    {
      std::lock_guard lock(mu_);
      const auto due = Clock::now() - options_.dht_recheck;
      for (const auto& c : contacts) {
        if (dht_checked.size() >= lim.max_dht_checks) break;
        auto it = dht_checks_.find(c.peer);
        if (it != dht_checks_.end() && it->second.when > due) continue;
        auto direct = DirectAddresses(c.peer, c.addrs, 1);
        if (direct.empty()) continue;
        dht_checked.push_back(c.peer);
        to_ping.push_back(direct.front());
      }
    }
    const auto rtts = PingAll(to_ping);
    auto runs = ReadRuns(lists[1], now);

    std::vector<ModelView> models;
    const auto seen_at = Clock::now();
    std::lock_guard lock(mu_);
    for (size_t m = 0; m < picks.size(); ++m) {
      ModelView view;
      view.name = picks[m].name;
      view.num_blocks = picks[m].blocks;
      view.coverage.assign(static_cast<size_t>(view.num_blocks), 0);
      auto& known = known_servers_[view.name];
      for (const auto& [peer, rec] : records[m]) {
        ServerView s;
        s.peer = peer.ToString();
        s.start = rec.start;
        s.end = rec.end;
        s.throughput = rec.throughput;
        s.inference_rps = rec.inference_rps;
        s.cache_tokens_left = rec.cache_tokens_left;
        s.version = rec.version;
        s.dtype = rec.dtype;
        s.quantization = rec.quantization;
        s.addresses = rec.addresses;
        s.relay = AllRelayed(rec.addresses);
        for (const auto& [next, ms] : rec.next_pings)
          s.next_pings.emplace_back(next.ToString(), ms);
        switch (rec.state) {
          case serve::ServerState::kOffline:
            s.state = ServerHealth::kOffline;
            break;
          case serve::ServerState::kJoining:
            s.state = ServerHealth::kJoining;
            break;
          case serve::ServerState::kOnline:
            s.state = ServerHealth::kOnline;
            break;
        }
        // Unreachable: pinged without an answer, or nowhere to ping (over the cap: as it says).
        const auto pinged = ping_index.find(peer);
        if (pinged != ping_index.end()) s.rtt_ms = rtts[pinged->second];
        const bool unreachable =
            pinged != ping_index.end() ? !s.rtt_ms.has_value() : undialable.contains(peer);
        if (s.state != ServerHealth::kOffline && unreachable) s.state = ServerHealth::kUnreachable;
        if (s.state == ServerHealth::kOnline) {
          for (int64_t b = s.start; b < s.end; ++b) ++view.coverage[static_cast<size_t>(b)];
        }
        known[s.peer] = {s, seen_at};
      }
      // Servers whose records are gone: offline for a while, then forgotten.
      for (auto it = known.begin(); it != known.end();) {
        if (seen_at - it->second.last_seen > options_.keep_offline) {
          it = known.erase(it);
          continue;
        }
        if (it->second.last_seen != seen_at) {
          ServerView gone = it->second.view;
          gone.state = ServerHealth::kOffline;
          gone.rtt_ms.reset();
          gone.next_pings.clear();
          view.servers.push_back(std::move(gone));
        } else {
          view.servers.push_back(it->second.view);
        }
        ++it;
      }
      while (known.size() > 2 * lim.max_servers_per_model) known.erase(known.begin());
      models.push_back(std::move(view));
    }
    for (auto it = known_servers_.begin(); it != known_servers_.end();) {
      const bool shown = std::any_of(models.begin(), models.end(),
                                     [&](const ModelView& v) { return v.name == it->first; });
      it = shown ? std::next(it) : known_servers_.erase(it);
    }
    addresses_ = std::move(addresses);

    for (size_t i = 0; i < dht_checked.size(); ++i) {
      const auto& rtt = rtts[ping_index.size() + i];
      dht_checks_[dht_checked[i]] = {
          .reachable = rtt.has_value(), .rtt_ms = rtt, .checked_at = now, .when = seen_at};
    }
    std::vector<DhtPeerView> dht_peers;
    std::set<PeerId> in_table;
    for (const auto& c : contacts) {
      in_table.insert(c.peer);
      if (dht_peers.size() >= lim.max_dht_peers_shown) continue;
      DhtPeerView p{.peer = c.peer.ToString(), .addresses = c.addrs};
      if (p.addresses.size() > 4) p.addresses.resize(4);
      if (auto it = dht_checks_.find(c.peer); it != dht_checks_.end()) {
        p.reachable = it->second.reachable;
        p.rtt_ms = it->second.rtt_ms;
        p.checked_at = it->second.checked_at;
      }
      dht_peers.push_back(std::move(p));
    }
    std::erase_if(dht_checks_, [&](const auto& e) { return !in_table.contains(e.first); });

    state_.version = COLONY_VERSION_STRING;
    state_.updated_at = now;
    state_.refresh_seconds = std::chrono::duration<double>(options_.refresh).count();
    state_.monitor_peer = node_.peer_id().ToString();
    state_.models = std::move(models);
    state_.dht_peers_known = contacts.size();
    state_.dht_peers = std::move(dht_peers);
    state_.runs = std::move(runs);
  }

  // Training runs: announcements, then every run's progress records (called without mu_: it
  // reads the DHT, then takes mu_ for the runs' memory).
  std::vector<RunView> ReadRuns(const Result<dht::Record>& list, double now) {
    const CollectorLimits& lim = options_.limits;
    std::map<std::string, std::map<int64_t, int>> votes;
    for (const auto& [owner, value] : OwnedEntries(list, now)) {
      auto a = train::ParseRunAnnouncement(value);
      if (a.ok()) ++votes[a->run][a->target_batch_size];
    }
    std::vector<std::pair<std::string, int64_t>> runs;  // (run, target batch)
    std::vector<std::pair<int, size_t>> order;          // (announcers, index)
    for (const auto& [run, v] : votes) {
      auto best = std::max_element(v.begin(), v.end(), [](const auto& a, const auto& b) {
        return a.second < b.second || (a.second == b.second && a.first > b.first);
      });
      int total = 0;
      for (const auto& [t, n] : v) total += n;
      order.emplace_back(total, runs.size());
      runs.emplace_back(run, best->first);
    }
    std::stable_sort(order.begin(), order.end(),
                     [](auto& a, auto& b) { return a.first > b.first; });
    if (order.size() > lim.max_runs) order.resize(lim.max_runs);
    std::vector<std::pair<std::string, int64_t>> picked;
    for (const auto& [n, i] : order) picked.push_back(runs[i]);
    std::sort(picked.begin(), picked.end());

    std::vector<std::string> keys;
    for (const auto& [run, target] : picked) keys.push_back(run + ".progress");
    auto progress = node_.GetManySync(keys, dht::Freshness::kLatest);
    std::vector<RunView> out;
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < picked.size(); ++i) {
      RunView view{.run = picked[i].first, .target_batch_size = picked[i].second};
      RunMemory& memory = runs_[view.run];
      double loss_sum = 0;
      int losses = 0;
      bool any_epoch = false;
      for (const auto& [owner, value] : OwnedEntries(progress[i], now)) {
        if (view.peers.size() >= lim.max_peers_per_run) break;
        auto p = train::ParseProgressRecord(owner, value);
        if (!p.ok()) continue;
        TrainerView t{.peer = owner.ToString(),
                      .epoch = p->epoch,
                      .samples_per_second = p->samples_per_second,
                      .mode = p->aux ? "aux" : (p->client ? "client" : "trainer"),
                      .phase = std::string(train::PhaseName(p->phase)),
                      .version = p->version};
        if (std::isfinite(p->loss)) {
          t.loss = p->loss;
          loss_sum += p->loss;
          ++losses;
        }
        if (!p->aux) view.samples_per_second += p->samples_per_second;
        if (!p->aux && p->phase != train::Phase::kLoad) {
          view.epoch = any_epoch ? std::max(view.epoch, p->epoch) : p->epoch;
          any_epoch = true;
        }
        if (p->round.epoch >= 0) {
          auto& groups = memory.rounds[p->round.epoch];
          const std::string id = p->round.group.empty() ? "-" : p->round.group;
          if (groups.contains(id) || groups.size() < lim.max_groups_per_round) {
            GroupView& g = groups[id];
            g.group = id;
            g.size = p->round.size;
            g.ok = p->round.ok;
            if (std::find(g.peers.begin(), g.peers.end(), t.peer) == g.peers.end() &&
                static_cast<int64_t>(g.peers.size()) < std::max<int64_t>(p->round.size, 1)) {
              g.peers.push_back(t.peer);
            }
          }
        }
        view.peers.push_back(std::move(t));
      }
      if (losses > 0) view.loss = loss_sum / losses;
      while (memory.rounds.size() > lim.max_rounds) memory.rounds.erase(memory.rounds.begin());
      for (auto it = memory.rounds.rbegin(); it != memory.rounds.rend(); ++it) {
        RoundView r{.epoch = it->first};
        for (const auto& [id, g] : it->second) r.groups.push_back(g);
        view.rounds.push_back(std::move(r));
      }
      if (!view.peers.empty()) {
        memory.history.push_back({.time = now, .epoch = view.epoch, .loss = view.loss});
        Thin(memory.history, lim.max_history);
      }
      view.history = memory.history;
      out.push_back(std::move(view));
    }
    std::erase_if(runs_, [&](const auto& e) {
      return std::none_of(out.begin(), out.end(),
                          [&](const RunView& v) { return v.run == e.first; });
    });
    return out;
  }

  dht::Node& node_;
  const CollectorOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
  SwarmState state_;
  std::map<std::string, std::map<std::string, KnownServer>> known_servers_;  // model -> peer
  std::map<PeerId, std::vector<Multiaddr>> addresses_;  // servers' direct addresses
  std::map<PeerId, DhtCheck> dht_checks_;
  std::map<std::string, RunMemory> runs_;
};

Collector::Collector(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Collector::~Collector() = default;

Result<std::unique_ptr<Collector>> Collector::Start(dht::Node& node, CollectorOptions options) {
  if (options.refresh.count() <= 0 || options.ping_timeout.count() <= 0) {
    return InvalidArgument("the monitor's refresh period and ping timeout must be positive");
  }
  auto impl = std::make_unique<Impl>(node, options);
  impl->Start();
  return std::unique_ptr<Collector>(new Collector(std::move(impl)));
}

SwarmState Collector::Snapshot() const { return impl_->Snapshot(); }
Reachability Collector::CheckReachable(const PeerId& peer) const {
  return impl_->CheckReachable(peer);
}

}  // namespace colony::monitor
