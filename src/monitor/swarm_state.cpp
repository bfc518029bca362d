#include "monitor/swarm_state.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace colony::monitor {
namespace {

using Json = nlohmann::json;

template <typename T>
Json OrNull(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

Json ServerJson(const ServerView& s) {
  Json pings = Json::object();
  for (const auto& [peer, ms] : s.next_pings) pings[peer] = ms;
  return {{"peer", s.peer},
          {"state", HealthName(s.state)},
          {"start", s.start},
          {"end", s.end},
          {"throughput", s.throughput},
          {"inference_rps", s.inference_rps},
          {"cache_tokens_left", s.cache_tokens_left},
          {"version", s.version},
          {"dtype", s.dtype},
          {"quantization", s.quantization},
          {"relay", s.relay},
          {"addresses", s.addresses},
          {"rtt_ms", OrNull(s.rtt_ms)},
          {"next_pings", std::move(pings)}};
}

Json RunJson(const RunView& r) {
  Json peers = Json::array();
  for (const auto& p : r.peers) {
    peers.push_back({{"peer", p.peer},
                     {"epoch", p.epoch},
                     {"samples_per_second", p.samples_per_second},
                     {"mode", p.mode},
                     {"phase", p.phase},
                     {"loss", OrNull(p.loss)},
                     {"version", p.version}});
  }
  Json history = Json::array();
  for (const auto& h : r.history) history.push_back(Json::array({h.time, h.epoch, OrNull(h.loss)}));
  Json rounds = Json::array();
  for (const auto& round : r.rounds) {
    Json groups = Json::array();
    for (const auto& g : round.groups) {
      groups.push_back({{"group", g.group}, {"size", g.size}, {"ok", g.ok}, {"peers", g.peers}});
    }
    rounds.push_back({{"epoch", round.epoch}, {"groups", std::move(groups)}});
  }
  return {{"run", r.run},
          {"epoch", r.epoch},
          {"target_batch_size", r.target_batch_size},
          {"samples_per_second", r.samples_per_second},
          {"loss", OrNull(r.loss)},
          {"num_peers", r.peers.size()},
          {"peers", std::move(peers)},
          {"history", std::move(history)},
          {"rounds", std::move(rounds)}};
}

}  // namespace

std::string_view HealthName(ServerHealth health) {
  switch (health) {
    case ServerHealth::kOnline:
      return "online";
    case ServerHealth::kJoining:
      return "joining";
    case ServerHealth::kOffline:
      return "offline";
    case ServerHealth::kUnreachable:
      return "unreachable";
  }
  return "unknown";
}

bool ModelView::healthy() const {
  return !coverage.empty() &&
         std::all_of(coverage.begin(), coverage.end(), [](int c) { return c > 0; });
}
int ModelView::min_coverage() const {
  return coverage.empty() ? 0 : *std::min_element(coverage.begin(), coverage.end());
}
int ModelView::max_coverage() const {
  return coverage.empty() ? 0 : *std::max_element(coverage.begin(), coverage.end());
}

std::string StateJson(const SwarmState& state) {
  Json models = Json::array();
  for (const auto& m : state.models) {
    Json servers = Json::array();
    for (const auto& s : m.servers) servers.push_back(ServerJson(s));
    models.push_back({{"name", m.name},
                      {"num_blocks", m.num_blocks},
                      {"healthy", m.healthy()},
                      {"coverage", m.coverage},
                      {"min_coverage", m.min_coverage()},
                      {"max_coverage", m.max_coverage()},
                      {"servers", std::move(servers)}});
  }
  Json runs = Json::array();
  for (const auto& r : state.runs) runs.push_back(RunJson(r));
  Json peers = Json::array();
  for (const auto& p : state.dht_peers) {
    peers.push_back({{"peer", p.peer},
                     {"addresses", p.addresses},
                     {"reachable", OrNull(p.reachable)},
                     {"rtt_ms", OrNull(p.rtt_ms)},
                     {"checked_at", p.checked_at}});
  }
  const Json j = {{"version", state.version},
                  {"updated_at", state.updated_at},
                  {"refresh_seconds", state.refresh_seconds},
                  {"monitor_peer", state.monitor_peer},
                  {"models", std::move(models)},
                  {"runs", std::move(runs)},
                  {"dht", {{"peers_known", state.dht_peers_known}, {"peers", std::move(peers)}}}};
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace colony::monitor
