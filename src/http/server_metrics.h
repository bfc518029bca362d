// An HTTP server's counters (ServerStats) in Prometheus' text format, for the GET /metrics of the
// services behind it (colony api): requests routed, refused as malformed or too large, refused as
// busy, connections refused, streams cut, requests abandoned, TLS handshakes failed and
// certificates reloaded.
//
//   std::string out = api_metrics_text;
//   http::AddServerMetrics(server->stats(), out);
#pragma once

#include <string>

#include "http/server.h"

namespace colony::http {

// Appends the colony_http_* families of `stats` to `out`.
void AddServerMetrics(const ServerStats& stats, std::string& out);

}  // namespace colony::http
