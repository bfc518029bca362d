// The HTTP face of `colony monitor` (docs/monitor.md): the page, /api/v1/state, /metrics and
// /api/v1/is_reachable/<peer id>, over a Collector's snapshots.
#pragma once

#include "http/server.h"
#include "monitor/collector.h"

namespace colony::monitor {

// The routes; the collector must outlive the server that serves them.
http::Router MonitorRoutes(const Collector& collector);

}  // namespace colony::monitor
