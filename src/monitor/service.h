// The HTTP face of `colony monitor` (docs/monitor.md): the page, /api/v1/state, /metrics and
// /api/v1/is_reachable/<peer id>, over a Collector's snapshots.
#pragma once

#include "http/server.h"
#include "http/server_metrics.h"
#include "monitor/collector.h"

namespace colony::monitor {

// The routes; the collector must outlive the server that serves them. /metrics also shows the
// counts of the server attached to `server_stats` (when given; it must outlive the server too).
http::Router MonitorRoutes(const Collector& collector,
                           const http::ServerStatsSource* server_stats = nullptr);

}  // namespace colony::monitor
