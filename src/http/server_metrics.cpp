// An HTTP server's counters as Prometheus families.
#include "http/server_metrics.h"

#include "http/prometheus.h"

namespace colony::http {

void AddServerMetrics(const ServerStats& stats, std::string& out) {
  const auto n = [](int64_t v) { return static_cast<double>(v); };
  PrometheusFamily requests("colony_http_requests_total", "counter",
                            "HTTP requests parsed and routed.");
  requests.Add({}, n(stats.requests));
  PrometheusFamily bad("colony_http_bad_requests_total", "counter",
                       "HTTP requests refused as malformed or over a size bound (400, 413, 431).");
  bad.Add({}, n(stats.bad_requests));
  PrometheusFamily busy("colony_http_busy_total", "counter",
                        "HTTP requests refused with 503 before a handler ran, by reason.");
  busy.Add({{"reason", "max_concurrent"}}, n(stats.busy - stats.busy_per_address));
  busy.Add({{"reason", "address_share"}}, n(stats.busy_per_address));
  PrometheusFamily refused("colony_http_refused_connections_total", "counter",
                           "Connections closed at accept, by reason.");
  refused.Add({{"reason", "connection_limits"}},
              n(stats.refused_connections - stats.tls_rate_refused));
  refused.Add({{"reason", "tls_handshake_rate"}}, n(stats.tls_rate_refused));
  PrometheusFamily cut("colony_http_cancelled_streams_total", "counter",
                       "Streamed answers cut: the client went away or a deadline passed.");
  cut.Add({}, n(stats.cancelled_streams));
  PrometheusFamily abandoned("colony_http_abandoned_requests_total", "counter",
                             "Requests whose client hung up while their handler ran.");
  abandoned.Add({}, n(stats.abandoned_requests));
  PrometheusFamily tls_failed("colony_http_tls_handshake_failures_total", "counter",
                              "TLS connections closed before a request.");
  tls_failed.Add({}, n(stats.tls_handshake_failures));
  PrometheusFamily reloads("colony_http_tls_reloads_total", "counter",
                           "Renewed certificates taken up.");
  reloads.Add({}, n(stats.tls_reloads));
  for (const PrometheusFamily* f :
       {&requests, &bad, &busy, &refused, &cut, &abandoned, &tls_failed, &reloads}) {
    f->WriteTo(out);
  }
}

}  // namespace colony::http
