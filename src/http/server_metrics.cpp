// An HTTP server's counters as Prometheus families.
#include "http/server_metrics.h"

#include "http/prometheus.h"

namespace colony::http {

void AddServerMetrics(const ServerStats& stats, std::string& out) {
  const auto n = [](int64_t v) { return static_cast<double>(v); };
  PrometheusFamily requests("colony_http_requests_total", "counter",
                            "HTTP requests parsed (any path; those then refused as busy too).");
  requests.Add({}, n(stats.requests));
  PrometheusFamily bad("colony_http_bad_requests_total", "counter",
                       "HTTP requests refused as malformed or over a size bound (400, 413, 431).");
  bad.Add({}, n(stats.bad_requests));
  PrometheusFamily busy("colony_http_busy_total", "counter",
                        "HTTP requests refused with 503 before a handler ran, by reason.");
  busy.Add({{"reason", "max_concurrent"}}, n(stats.busy - stats.busy_per_address));
  busy.Add({{"reason", "address_share"}}, n(stats.busy_per_address));
  // (Each its own counter: the server counts a refusal for the handshake rate before the
  // refusal itself, so a difference of the two could go down between scrapes.)
  PrometheusFamily refused("colony_http_refused_connections_total", "counter",
                           "Connections closed at accept (connection caps, TLS handshake rate).");
  refused.Add({}, n(stats.refused_connections));
  PrometheusFamily tls_rate("colony_http_refused_tls_handshake_rate_total", "counter",
                            "Of those, for their address's TLS handshake rate.");
  tls_rate.Add({}, n(stats.tls_rate_refused));
  PrometheusFamily cut("colony_http_cancelled_streams_total", "counter",
                       "Streamed answers cut: the client left, a deadline passed, a write "
                       "failed or the server stopped.");
  cut.Add({}, n(stats.cancelled_streams));
  PrometheusFamily abandoned("colony_http_abandoned_requests_total", "counter",
                             "Requests whose client hung up while their handler ran.");
  abandoned.Add({}, n(stats.abandoned_requests));
  PrometheusFamily tls_failed("colony_http_tls_handshake_failures_total", "counter",
                              "TLS handshakes that failed or timed out (plain HTTP included).");
  tls_failed.Add({}, n(stats.tls_handshake_failures));
  PrometheusFamily reloads("colony_http_tls_reloads_total", "counter",
                           "Renewed certificates taken up.");
  reloads.Add({}, n(stats.tls_reloads));
  for (const PrometheusFamily* f :
       {&requests, &bad, &busy, &refused, &tls_rate, &cut, &abandoned, &tls_failed, &reloads}) {
    f->WriteTo(out);
  }
}

}  // namespace colony::http
