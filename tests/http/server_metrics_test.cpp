// An HTTP server's counters in Prometheus' text format, for counts set by hand, against the
// exposition written out (the busy refusals split by reason).
#include "http/server_metrics.h"

#include <gtest/gtest.h>

namespace colony::http {
namespace {

TEST(ServerMetrics, EveryCounterByReason) {
  ServerStats s;
  s.requests = 120;
  s.bad_requests = 3;
  s.busy = 7;
  s.busy_per_address = 2;
  s.refused_connections = 9;
  s.tls_rate_refused = 4;
  s.cancelled_streams = 5;
  s.abandoned_requests = 6;
  s.tls_handshake_failures = 1;
  s.tls_reloads = 8;
  std::string out = "before\n";
  AddServerMetrics(s, out);
  EXPECT_EQ(out, R"(before
# HELP colony_http_requests_total HTTP requests parsed (any path; those then refused as busy too).
# TYPE colony_http_requests_total counter
colony_http_requests_total 120
# HELP colony_http_bad_requests_total HTTP requests refused as malformed or over a size bound (400, 413, 431).
# TYPE colony_http_bad_requests_total counter
colony_http_bad_requests_total 3
# HELP colony_http_busy_total HTTP requests refused with 503 before a handler ran, by reason.
# TYPE colony_http_busy_total counter
colony_http_busy_total{reason="max_concurrent"} 5
colony_http_busy_total{reason="address_share"} 2
# HELP colony_http_refused_connections_total Connections closed at accept (connection caps, TLS handshake rate).
# TYPE colony_http_refused_connections_total counter
colony_http_refused_connections_total 9
# HELP colony_http_refused_tls_handshake_rate_total Of those, for their address's TLS handshake rate.
# TYPE colony_http_refused_tls_handshake_rate_total counter
colony_http_refused_tls_handshake_rate_total 4
# HELP colony_http_cancelled_streams_total Streamed answers cut: the client left, a deadline passed, a write failed or the server stopped.
# TYPE colony_http_cancelled_streams_total counter
colony_http_cancelled_streams_total 5
# HELP colony_http_abandoned_requests_total Requests whose client hung up while their handler ran.
# TYPE colony_http_abandoned_requests_total counter
colony_http_abandoned_requests_total 6
# HELP colony_http_tls_handshake_failures_total TLS handshakes that failed or timed out (plain HTTP included).
# TYPE colony_http_tls_handshake_failures_total counter
colony_http_tls_handshake_failures_total 1
# HELP colony_http_tls_reloads_total Renewed certificates taken up.
# TYPE colony_http_tls_reloads_total counter
colony_http_tls_reloads_total 8
)");
}

}  // namespace
}  // namespace colony::http
