// An HTTP server's counters (ServerStats) in Prometheus' text format, for the GET /metrics of the
// services behind it (colony api, colony monitor): requests parsed, refused as malformed or too
// large, refused as busy, connections refused, streams cut, requests abandoned, TLS handshakes
// failed and certificates reloaded.
//
//   http::ServerStatsSource source;               // made with the routes, which read it
//   auto server = http::Server::Start(options, Routes(source));
//   source.Attach([s = server->get()] { return s->stats(); });
//   source.AddTo(out);                            // in a /metrics handler
#pragma once

#include <functional>
#include <mutex>
#include <string>

#include "http/server.h"

namespace colony::http {

// Appends the colony_http_* families of `stats` to `out`.
void AddServerMetrics(const ServerStats& stats, std::string& out);

// The server whose counts a /metrics handler shows: its routes are made before the server that
// serves them starts, so the server is attached after (and must outlive its attachment's use:
// a stopped server runs no handlers). Thread-safe.
class ServerStatsSource {
 public:
  void Attach(std::function<ServerStats()> stats);
  // AddServerMetrics of the attached server's counts; nothing before one is attached.
  void AddTo(std::string& out) const;

 private:
  mutable std::mutex mu_;
  std::function<ServerStats()> stats_;
};

}  // namespace colony::http
