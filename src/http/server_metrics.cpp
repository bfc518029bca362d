// An HTTP server's counters as Prometheus families.
#include "http/server_metrics.h"

#include "http/prometheus.h"

namespace colony::http {

void AddServerMetrics(const ServerStats& stats, std::string& out) {
  const auto n = [](int64_t v) { return static_cast<double>(v); };
  WritePrometheusSample(out, "colony_http_requests_total", "counter",
                        "HTTP requests parsed (any path; those then refused as busy too).",
                        n(stats.requests));
  WritePrometheusSample(out, "colony_http_bad_requests_total", "counter",
                        "HTTP requests refused as malformed or over a size bound (400, 413, 431).",
                        n(stats.bad_requests));
  PrometheusFamily busy("colony_http_busy_total", "counter",
                        "HTTP requests refused with 503 before a handler ran, by reason.");
  busy.Add({{"reason", "max_concurrent"}}, n(stats.busy - stats.busy_per_address));
  busy.Add({{"reason", "address_share"}}, n(stats.busy_per_address));
  busy.WriteTo(out);
  // (Each its own counter: the server counts a refusal for the handshake rate before the
  // refusal itself, so a difference of the two could go down between scrapes.)
  WritePrometheusSample(out, "colony_http_refused_connections_total", "counter",
                        "Connections closed at accept (connection caps, TLS handshake rate).",
                        n(stats.refused_connections));
  WritePrometheusSample(out, "colony_http_refused_tls_handshake_rate_total", "counter",
                        "Of those, for their address's TLS handshake rate.",
                        n(stats.tls_rate_refused));
  WritePrometheusSample(out, "colony_http_cancelled_streams_total", "counter",
                        "Streamed answers cut: the client left, a deadline passed, a write "
                        "failed or the server stopped.",
                        n(stats.cancelled_streams));
  WritePrometheusSample(out, "colony_http_abandoned_requests_total", "counter",
                        "Requests whose client hung up while their handler ran.",
                        n(stats.abandoned_requests));
  WritePrometheusSample(out, "colony_http_tls_handshake_failures_total", "counter",
                        "TLS handshakes that failed or timed out (plain HTTP included).",
                        n(stats.tls_handshake_failures));
  WritePrometheusSample(out, "colony_http_tls_reloads_total", "counter",
                        "Renewed certificates taken up.", n(stats.tls_reloads));
}

void ServerStatsSource::Attach(std::function<ServerStats()> stats) {
  const std::scoped_lock lock(mu_);
  stats_ = std::move(stats);
}

void ServerStatsSource::AddTo(std::string& out) const {
  const std::scoped_lock lock(mu_);
  if (stats_) AddServerMetrics(stats_(), out);
}

}  // namespace colony::http
