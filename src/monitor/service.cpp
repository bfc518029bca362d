#include "monitor/service.h"

#include <nlohmann/json.hpp>

#include "monitor/metrics.h"
#include "monitor/web_assets.h"

namespace colony::monitor {
namespace {

constexpr std::string_view kReachablePrefix = "/api/v1/is_reachable/";

http::Reply Text(std::string_view content_type, std::string body) {
  http::Reply r;
  r.content_type = std::string(content_type);
  r.body = std::move(body);
  return r;
}

// Snapshots change every refresh: caches and proxies must not keep them.
http::Reply Fresh(http::Reply r) {
  r.headers.emplace_back("Cache-Control", "no-store");
  return r;
}

}  // namespace

http::Router MonitorRoutes(const Collector& collector,
                           const http::ServerStatsSource* server_stats) {
  http::Router router;
  for (const WebAsset& asset : WebAssets()) {
    router.Add("GET", std::string(asset.path), [&asset](const http::Request&) {
      http::Reply r = Text(asset.content_type, std::string(asset.body));
      r.headers.emplace_back("X-Content-Type-Options", "nosniff");
      // The page runs only its own inline script and the monitor's files.
      if (asset.path == "/") {
        r.headers.emplace_back("Content-Security-Policy",
                               "default-src 'self'; script-src 'self' 'unsafe-inline'; "
                               "style-src 'self' 'unsafe-inline'; img-src 'self' data:");
      }
      return r;
    });
  }
  router.Add("GET", "/api/v1/state", [&collector](const http::Request&) {
    return Fresh(http::Json(200, StateJson(collector.Snapshot())));
  });
  router.Add("GET", "/metrics", [&collector, server_stats](const http::Request&) {
    std::string text = PrometheusText(collector.Snapshot());
    if (server_stats != nullptr) server_stats->AddTo(text);
    return Fresh(Text("text/plain; version=0.0.4; charset=utf-8", std::move(text)));
  });
  router.AddPrefix("GET", std::string(kReachablePrefix), [&collector](const http::Request& req) {
    const std::string_view id = std::string_view(req.path).substr(kReachablePrefix.size());
    auto peer = PeerId::Parse(id);
    if (!peer.ok()) {
      return http::JsonError(400, "not a peer id: " + std::string(peer.status().message()),
                             "invalid_request_error", "bad_peer_id");
    }
    const Reachability r = collector.CheckReachable(*peer);
    nlohmann::json j = {
        {"peer", peer->ToString()},
        {"success", r.reachable},
        {"known", r.known},
        {"address", r.address.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.address)},
        {"rtt_ms", r.reachable ? nlohmann::json(r.rtt_ms) : nlohmann::json(nullptr)},
        {"error", r.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.error)}};
    return Fresh(http::Json(200, j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
  });
  return router;
}

}  // namespace colony::monitor
