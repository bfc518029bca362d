// colony monitor: a web page, JSON state and Prometheus metrics of a swarm (monitor/,
// docs/monitor.md).
#include <fmt/format.h>

#include <cstdio>

#include "core/clock.h"
#include "core/log.h"
#include "dht/node.h"
#include "http/server.h"
#include "monitor/collector.h"
#include "monitor/service.h"
#include "tools/access_options.h"
#include "tools/commands.h"
#include "tools/record_rules.h"

namespace colony::cli {
namespace {

struct MonitorArgs {
  std::vector<std::string> initial_peers;
  std::string http = "127.0.0.1:8080";
  double refresh = 2;
  double ping_timeout = 2;
  int max_concurrent = 16;
  int max_connections = 256;
  AccessArgs access;
  HttpServeArgs serving;
};

int RunMonitor(const MonitorArgs& a) {
  auto where = ParseHostPort(a.http);
  if (!where.ok()) return Fail(where.status());
  auto identity = LoadOrGenerateIdentity(a.access.identity);
  if (!identity.ok()) return Fail(identity.status());
  auto access = MakeSwarmAccess(a.access, identity->peer_id());
  if (!access.ok()) return Fail(access.status());
  BlockTerminationSignals();
  dht::NodeOptions options;
  options.host.access = access->control;
  options.validators = {SwarmRecordRules()};
  options.initial_peers = a.initial_peers;
  options.dht.client_mode = true;  // it reads the swarm; it stores nobody's records
  auto node = dht::Node::Start(std::move(*identity), std::move(options));
  if (!node.ok()) return Fail(node.status().WithContext("joining the DHT"));
  access->Attach(**node);
  auto collector = monitor::Collector::Start(
      **node,
      {.refresh = SecondsToMillis(a.refresh), .ping_timeout = SecondsToMillis(a.ping_timeout)});
  if (!collector.ok()) return Fail(collector.status());
  http::ServerOptions http_options{.host = where->first,
                                   .port = where->second,
                                   .max_body_bytes = 4096,
                                   .max_concurrent_requests = a.max_concurrent,
                                   .max_connections = a.max_connections,
                                   .request_timeout = std::chrono::seconds(30)};
  a.serving.ApplyTo(http_options);
  http::ServerStatsSource server_stats;  // (declared before the server, which uses it)
  auto server =
      http::Server::Start(http_options, monitor::MonitorRoutes(**collector, &server_stats));
  if (!server.ok()) return Fail(server.status().WithContext(a.serving.OptionNames()));
  server_stats.Attach([s = server->get()] { return s->stats(); });
  const std::string url = (*server)->BaseUrl() + "/";
  std::printf("%s\n", url.c_str());
  std::fflush(stdout);
  COLONY_LOG_INFO("monitor: serving {} (refreshing every {} s)", url, a.refresh);
  const std::string sig = WaitForTerminationSignal();
  COLONY_LOG_INFO("monitor: {} received; stopping", sig);
  (*server)->Stop();
  collector->reset();
  access->Stop();
  (*node)->Shutdown();
  return 0;
}

}  // namespace

void AddMonitorCommand(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands) {
  auto a = std::make_shared<MonitorArgs>();
  auto* cmd = app.add_subcommand(
      "monitor",
      "watch a swarm: a live web page, /api/v1/state (JSON) and /metrics (Prometheus) of its "
      "models, servers, training runs and DHT peers (docs/monitor.md)");
  cmd->add_option("--initial-peers", a->initial_peers, "multiaddr of a peer in the swarm")
      ->check(MultiaddrCheck())
      ->required();
  cmd->add_option("--http", a->http,
                  "host:port to listen on (default 127.0.0.1:8080: loopback only; port 0 picks a "
                  "free one, printed on stdout)")
      ->capture_default_str();
  AddHttpServeOptions(cmd, a->serving);
  cmd->add_option("--refresh", a->refresh, "seconds between two reads of the swarm's records")
      ->capture_default_str()
      ->check(CLI::Range(0.2, 3600.0));
  cmd->add_option("--ping-timeout", a->ping_timeout,
                  "seconds a server or DHT peer has to answer a ping before it counts as "
                  "unreachable")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 60.0));
  cmd->add_option("--max-concurrent", a->max_concurrent, "HTTP requests answered at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--max-connections", a->max_connections, "open HTTP connections at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  AddAccessOptions(cmd, a->access);
  commands.emplace_back(cmd, [a] { return RunMonitor(*a); });
}

}  // namespace colony::cli
