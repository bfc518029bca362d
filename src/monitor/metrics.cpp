#include "monitor/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "http/prometheus.h"

namespace colony::monitor {
namespace {

using Family = http::PrometheusFamily;

// The q-quantile of sorted values (nearest rank).
double Quantile(const std::vector<double>& sorted, double q) {
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

}  // namespace

std::string PrometheusText(const SwarmState& state) {
  Family servers("colony_servers", "gauge", "Block servers of a model by state.");
  Family blocks("colony_model_blocks", "gauge", "Blocks in the model.");
  Family cov_min("colony_model_block_coverage_min", "gauge",
                 "Online reachable servers of the model's least covered block.");
  Family cov_max("colony_model_block_coverage_max", "gauge",
                 "Online reachable servers of the model's most covered block.");
  Family healthy("colony_model_healthy", "gauge",
                 "1 when every block of the model has an online reachable server.");
  Family ping("colony_server_ping_seconds", "summary",
              "Round-trip time from the monitor to the model's reachable servers.");
  Family versions("colony_server_versions", "gauge", "Servers (not offline) by Colony version.");
  Family epoch("colony_training_epoch", "gauge",
               "The newest epoch a live peer of the run trains at.");
  Family sps("colony_training_samples_per_second", "gauge", "The run's swarm throughput.");
  Family loss("colony_training_loss", "gauge", "Mean of the run's live peers' reported losses.");
  Family peers("colony_training_peers", "gauge", "Live peers of the run.");
  Family target("colony_training_target_batch_size", "gauge", "The run's target global batch.");
  Family dht_known("colony_dht_peers_known", "gauge", "Peers in the monitor's DHT routing table.");
  Family dht_reachable("colony_dht_peers_reachable", "gauge",
                       "DHT peers the monitor could dial at its last check.");
  Family updated("colony_monitor_last_refresh_timestamp_seconds", "gauge",
                 "Wall clock of the monitor's last refresh of the swarm's state.");

  std::map<std::string, int> by_version;
  for (const auto& m : state.models) {
    std::map<ServerHealth, int> by_state = {{ServerHealth::kOnline, 0},
                                            {ServerHealth::kJoining, 0},
                                            {ServerHealth::kOffline, 0},
                                            {ServerHealth::kUnreachable, 0}};
    std::vector<double> rtts;
    for (const auto& s : m.servers) {
      ++by_state[s.state];
      if (s.rtt_ms) rtts.push_back(*s.rtt_ms / 1000.0);
      if (s.state != ServerHealth::kOffline)
        ++by_version[s.version.empty() ? "unknown" : s.version];
    }
    for (const auto& [st, n] : by_state) {
      servers.Add({{"model", m.name}, {"state", std::string(HealthName(st))}}, n);
    }
    blocks.Add({{"model", m.name}}, static_cast<double>(m.num_blocks));
    cov_min.Add({{"model", m.name}}, m.min_coverage());
    cov_max.Add({{"model", m.name}}, m.max_coverage());
    healthy.Add({{"model", m.name}}, m.healthy() ? 1 : 0);
    std::sort(rtts.begin(), rtts.end());
    if (!rtts.empty()) {
      for (double q : {0.5, 0.9, 0.99}) {
        ping.Add({{"model", m.name}, {"quantile", fmt::format("{}", q)}}, Quantile(rtts, q));
      }
    }
    double sum = 0;
    for (double r : rtts) sum += r;
    ping.Add({{"model", m.name}}, sum, "_sum");
    ping.Add({{"model", m.name}}, static_cast<double>(rtts.size()), "_count");
  }
  for (const auto& [v, n] : by_version) versions.Add({{"version", v}}, n);
  for (const auto& r : state.runs) {
    epoch.Add({{"run", r.run}}, static_cast<double>(r.epoch));
    sps.Add({{"run", r.run}}, r.samples_per_second);
    if (r.loss) loss.Add({{"run", r.run}}, *r.loss);
    peers.Add({{"run", r.run}}, static_cast<double>(r.peers.size()));
    target.Add({{"run", r.run}}, static_cast<double>(r.target_batch_size));
  }
  dht_known.Add({}, static_cast<double>(state.dht_peers_known));
  dht_reachable.Add({}, static_cast<double>(std::count_if(
                            state.dht_peers.begin(), state.dht_peers.end(),
                            [](const DhtPeerView& p) { return p.reachable.value_or(false); })));
  updated.Add({}, state.updated_at);

  std::string out;
  for (const Family* f : {&servers, &blocks, &cov_min, &cov_max, &healthy, &ping, &versions, &epoch,
                          &sps, &loss, &peers, &target, &dht_known, &dht_reachable, &updated}) {
    f->WriteTo(out);
  }
  return out;
}

}  // namespace colony::monitor
