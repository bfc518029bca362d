// The swarm's state in Prometheus' text exposition format (version 0.0.4), for GET /metrics:
// one family per name with HELP and TYPE lines, label values escaped, names following
// Prometheus' conventions (colony_ prefix, base units: seconds, _total only for counters).
#pragma once

#include <string>

#include "monitor/swarm_state.h"

namespace colony::monitor {

std::string PrometheusText(const SwarmState& state);

}  // namespace colony::monitor
