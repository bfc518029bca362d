// DHT benchmark: N real nodes on loopback, each with its own host and encrypted connections,
// spread over worker processes of 16 nodes (one process per node would not fit 2 cores; one
// process for all would run out of file descriptors, since each connection costs one on both
// ends). Stores one record per node from random nodes, kills 10% of the nodes with SIGKILL (the
// doomed nodes live in worker processes of their own, so that killing those processes kills
// exactly them, without a goodbye), then gets every record from random survivors. Any get that
// fails or returns a wrong value fails the benchmark. Workers are driven over Colony RPC; latencies
// are measured inside the workers, around the DHT call alone.
//
// Reference, measured in the same run: one encrypted RPC round trip between two nodes, so
// dht_get_vs_rpc_rtt says how many round trips a get costs. hivemind's published figure for
// 1,024 peers (older script): get 100% ok, mean 6.6 ms; store mean 14.9 ms.
//
// The last lines are RESULT key=value pairs (see scripts/bench).
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "core/log.h"
#include "core/subprocess.h"
#include "dht/node.h"

using namespace colony;
using Steady = std::chrono::steady_clock;

namespace {

constexpr size_t kNodesPerWorker = 16;
constexpr char kControl[] = "bench.dht.control";

double Ms(Steady::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

template <typename F>
void Parallel(size_t n, size_t threads, F fn) {
  std::atomic<size_t> next{0};
  std::vector<std::thread> ts;
  for (size_t t = 0; t < threads; ++t) {
    ts.emplace_back([&] {
      for (size_t i; (i = next++) < n;) fn(i);
    });
  }
  for (auto& t : ts) t.join();
}

// Every node's lookups use this many disjoint paths (--disjoint-paths).
size_t g_disjoint_paths = dht::DhtOptions{}.disjoint_paths;

dht::NodeOptions Options(std::vector<std::string> initial) {
  dht::NodeOptions o;
  o.dht.disjoint_paths = g_disjoint_paths;
  o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  o.initial_peers = std::move(initial);
  o.host.io_threads = 1;
  return o;
}

// Worker: runs `count` nodes, prints "node <addr>" for each, then serves control calls on its
// first node's host until SIGTERM.
int Worker(size_t count, const std::string& bootstrap) {
  std::vector<std::unique_ptr<dht::Node>> nodes(count);
  // The first node's host also serves the control calls, which block on the other nodes (and
  // on it): give it a second I/O thread.
  dht::NodeOptions first_options =
      Options(bootstrap.empty() ? std::vector<std::string>{} : std::vector{bootstrap});
  first_options.host.io_threads = 2;
  auto first = dht::Node::Start(KeyPair::Generate(), first_options);
  if (!first.ok()) {
    std::fprintf(stderr, "worker: %s\n", first.status().ToString().c_str());
    return 1;
  }
  nodes[0] = std::move(*first);
  const std::string via =
      bootstrap.empty() ? nodes[0]->VisibleAddresses().at(0).ToString() : bootstrap;
  std::atomic<bool> failed{false};
  Parallel(count - 1, 2, [&](size_t i) {
    auto n = dht::Node::Start(KeyPair::Generate(), Options({via}));
    if (n.ok()) {
      nodes[i + 1] = std::move(*n);
    } else {
      std::fprintf(stderr, "worker: %s\n", n.status().ToString().c_str());
      failed = true;
    }
  });
  if (failed) return 1;
  auto control = [&](net::CallContext&, net::Message m) -> asio::awaitable<Result<net::Message>> {
    std::istringstream in(m.meta);
    std::string op;
    size_t idx = 0;
    in >> op >> idx;
    if (idx >= count) co_return InvalidArgument("no such node");
    std::ostringstream out;
    if (op == "stats") {
      uint64_t lookups = 0, hops = 0;
      std::thread([&] {
        for (size_t i = 0; i < count; ++i) {
          auto s = nodes[i]->Stats();
          lookups += s.lookups;
          hops += s.lookup_hops;
        }
      }).join();
      out << lookups << " " << hops;
      co_return net::Message(out.str());
    }
    dht::Node& node = *nodes[idx];
    std::string key, value;
    double expiration = 0;
    int latest = 0;
    if (op == "store") {
      in >> key >> value >> expiration;
      const auto s = Steady::now();
      Status st = co_await node.Store(key, value, expiration);
      out << (st.ok() ? "ok " : "err ") << Ms(Steady::now() - s);
    } else if (op == "get") {
      in >> key >> latest;
      const auto s = Steady::now();
      auto r =
          co_await node.Get(key, latest != 0 ? dht::Freshness::kLatest : dht::Freshness::kAnyCopy);
      out << (r.ok() ? "ok " : "err ") << Ms(Steady::now() - s);
      if (r.ok() && !r->is_dict) out << " " << r->value.value << " " << r->value.expiration;
    } else {
      co_return InvalidArgument("unknown command");
    }
    co_return net::Message(out.str());
  };
  nodes[0]->host().RegisterUnary(kControl, control);
  for (auto& n : nodes) std::printf("node %s\n", n->VisibleAddresses().at(0).ToString().c_str());
  std::printf("ready\n");
  std::fflush(stdout);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  for (auto& n : nodes) n->Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("DHT store/get over N real nodes on loopback, with 10% of them killed");
  size_t nodes = 256, keys = 0, clients = 8, worker_nodes = 0;
  double kill = 0.1;
  std::string worker_bootstrap;
  bool worker = false;
  app.add_option("--nodes", nodes, "nodes in the swarm")
      ->check(CLI::Range(16, 1024))
      ->capture_default_str();
  app.add_option("--keys", keys, "records stored (default: one per node)");
  app.add_option("--kill", kill, "fraction of nodes killed (SIGKILL) between stores and gets")
      ->check(CLI::Range(0.0, 0.5))
      ->capture_default_str();
  app.add_option("--clients", clients, "concurrent store/get callers")->capture_default_str();
  app.add_option("--disjoint-paths", g_disjoint_paths,
                 "disjoint paths of each lookup (DhtOptions::disjoint_paths)")
      ->check(CLI::Range(size_t{1}, dht::kMaxDisjointPaths))
      ->capture_default_str();
  app.add_flag("--worker", worker, "(internal) run nodes for the coordinating process");
  app.add_option("--worker-nodes", worker_nodes, "(internal)");
  app.add_option("--worker-bootstrap", worker_bootstrap, "(internal)");
  CLI11_PARSE(app, argc, argv);
  (void)InitLogging("error");
  if (worker) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    return Worker(worker_nodes, worker_bootstrap);
  }
  if (keys == 0) keys = nodes;

  // The nodes killed before the gets live in worker processes of their own (started last), so
  // that SIGKILL on those processes kills exactly them. Worker 0 holds the bootstrap node.
  const size_t killed = static_cast<size_t>(kill * static_cast<double>(nodes));
  std::vector<size_t> plan;  // nodes per worker
  for (size_t left = nodes - killed; left > 0; left -= plan.back()) {
    plan.push_back(std::min(kNodesPerWorker, left));
  }
  const size_t doomed_from = plan.size();  // workers from here on are killed
  for (size_t left = killed; left > 0; left -= plan.back()) {
    plan.push_back(std::min(kNodesPerWorker, left));
  }
  const size_t workers = plan.size();
  std::printf("starting %zu DHT nodes on loopback in %zu worker processes...\n", nodes, workers);
  std::fflush(stdout);
  const auto t0 = Steady::now();
  std::vector<Subprocess> procs;
  std::vector<Multiaddr> control;                // per worker
  std::vector<std::string> addresses;            // per node
  std::vector<std::pair<size_t, size_t>> where;  // node -> (worker, local index)
  for (size_t w = 0; w < workers; ++w) {
    std::vector<std::string> args{SelfExecutable(),   "--worker",
                                  "--worker-nodes",   std::to_string(plan[w]),
                                  "--disjoint-paths", std::to_string(g_disjoint_paths)};
    if (w > 0) {
      args.push_back("--worker-bootstrap");
      args.push_back(addresses[0]);
    }
    auto p = Subprocess::Spawn(args);
    if (!p.ok()) {
      std::fprintf(stderr, "bench_dht: %s\n", p.status().ToString().c_str());
      return 1;
    }
    for (size_t l = 0;; ++l) {
      auto line = p->ReadLine(std::chrono::seconds(60));
      if (!line.ok()) {
        std::fprintf(stderr, "bench_dht: worker %zu: %s\n", w, line.status().ToString().c_str());
        return 1;
      }
      if (*line == "ready") break;
      addresses.push_back(line->substr(5));
      where.emplace_back(w, l);
      if (l == 0) control.push_back(*Multiaddr::Parse(addresses.back()));
    }
    procs.push_back(std::move(*p));
  }
  std::printf("swarm of %zu up in %.1f s\n", nodes,
              std::chrono::duration<double>(Steady::now() - t0).count());

  net::Host driver(KeyPair::Generate(), net::HostOptions{});
  if (!driver.Start().ok()) return 1;
  auto command = [&](size_t node, const std::string& op, const std::string& args) {
    auto [w, l] = where[node];
    auto r = driver.CallSync(control[w], kControl,
                             net::Message(op + " " + std::to_string(l) + " " + args),
                             {.timeout = std::chrono::seconds(120)});
    return r.ok() ? r->meta : "err " + r.status().ToString();
  };
  auto stats = [&] {  // over the surviving workers
    uint64_t lookups = 0, hops = 0;
    for (size_t w = 0; w < doomed_from; ++w) {
      auto r = driver.CallSync(control[w], kControl, net::Message("stats 0"));
      std::istringstream in(r.ok() ? r->meta : "0 0");
      uint64_t a = 0, b = 0;
      in >> a >> b;
      lookups += a;
      hops += b;
    }
    return std::make_pair(lookups, hops);
  };

  // Reference: an encrypted RPC round trip from the driver to a node (connection open).
  std::vector<double> rtt;
  for (int i = 0; i < 200; ++i) {
    auto r = driver.PingSync(*Multiaddr::Parse(addresses[1]));
    if (r.ok()) rtt.push_back(static_cast<double>(r->rtt.count()) / 1e6);
  }

  std::mt19937 rng(1);
  const double expiration = dht::Now() + 3600;
  std::vector<double> store_ms, get_ms, warm_ms;
  std::mutex mu;
  std::atomic<size_t> stored{0}, got{0}, wrong{0};
  // A found value must be the one stored under its key: "ok <ms> <value> <expiration>".
  auto check_value = [&](const std::string& reply, size_t i) {
    std::istringstream in(reply);
    std::string status, ms, value;
    in >> status >> ms >> value;
    if (status != "ok") return false;
    if (value != "value-" + std::to_string(i)) {
      ++wrong;
      return false;
    }
    return true;
  };
  auto parse_ms = [](const std::string& reply) {
    std::istringstream in(reply);
    std::string status;
    double ms = -1;
    in >> status >> ms;
    return std::make_pair(status == "ok", ms);
  };
  std::vector<size_t> writer(keys);
  for (auto& w : writer) w = std::uniform_int_distribution<size_t>(0, nodes - 1)(rng);
  Parallel(keys, clients, [&](size_t i) {
    auto [ok, ms] = parse_ms(command(writer[i], "store",
                                     "bench.key." + std::to_string(i) + " value-" +
                                         std::to_string(i) + " " + std::to_string(expiration)));
    std::lock_guard lock(mu);
    store_ms.push_back(ms);
    if (ok) ++stored;
  });

  // Kill the doomed workers' nodes: SIGKILL, so they close nothing and say no goodbye.
  std::vector<bool> dead(nodes, false);
  for (size_t w = doomed_from; w < workers; ++w) {
    procs[w].Signal(SIGKILL);
    (void)procs[w].Wait(std::chrono::seconds(20));
  }
  for (size_t i = 0; i < nodes; ++i) dead[i] = where[i].first >= doomed_from;
  std::vector<size_t> alive;
  for (size_t i = 0; i < nodes; ++i) {
    if (!dead[i]) alive.push_back(i);
  }
  std::vector<size_t> reader(keys);
  for (auto& r : reader) r = alive[std::uniform_int_distribution<size_t>(0, alive.size() - 1)(rng)];

  const auto [lookups0, hops0] = stats();
  // The stored expiration travels as decimal text through the control channel; compare values.
  Parallel(keys, clients, [&](size_t i) {
    const std::string reply = command(reader[i], "get", "bench.key." + std::to_string(i) + " 0");
    auto [ok, ms] = parse_ms(reply);
    std::lock_guard lock(mu);
    get_ms.push_back(ms);
    if (ok && check_value(reply, i)) ++got;
  });
  const auto [lookups1, hops1] = stats();
  // Again with latest=true (no local or cached answers; every lookup visits the nearest nodes).
  Parallel(keys, clients, [&](size_t i) {
    const std::string reply = command(reader[i], "get", "bench.key." + std::to_string(i) + " 1");
    auto [ok, ms] = parse_ms(reply);
    if (ok) check_value(reply, i);
    std::lock_guard lock(mu);
    if (ok) warm_ms.push_back(ms);
  });

  const double hops = lookups1 > lookups0 ? static_cast<double>(hops1 - hops0) /
                                                static_cast<double>(lookups1 - lookups0)
                                          : 0;
  const double store_ok = static_cast<double>(stored) / static_cast<double>(keys);
  const double get_ok = static_cast<double>(got) / static_cast<double>(keys);
  const double rtt_p50 = Percentile(rtt, 0.5);
  const double get_p50 = Percentile(get_ms, 0.5);
  std::printf("nodes %zu, keys %zu, nodes killed (SIGKILL) before the gets: %zu\n", nodes, keys,
              killed);
  std::printf("store:         %.4f ok, p50 %.2f ms, p99 %.2f ms\n", store_ok,
              Percentile(store_ms, 0.5), Percentile(store_ms, 0.99));
  std::printf("get:           %.4f ok, p50 %.2f ms, p99 %.2f ms, mean hops %.2f (%llu lookups)\n",
              get_ok, get_p50, Percentile(get_ms, 0.99), hops,
              static_cast<unsigned long long>(lookups1 - lookups0));
  std::printf("get --latest:  p50 %.2f ms, p99 %.2f ms\n", Percentile(warm_ms, 0.5),
              Percentile(warm_ms, 0.99));
  std::printf("reference: encrypted RPC round trip p50 %.3f ms\n", rtt_p50);
  std::printf("hivemind (published, 1024 peers): get mean 6.6 ms, store mean 14.9 ms\n");
  std::fflush(stdout);
  driver.Shutdown();
  for (size_t w = 0; w < doomed_from; ++w) procs[w].Signal(SIGTERM);
  for (size_t w = 0; w < doomed_from; ++w) (void)procs[w].Wait(std::chrono::seconds(20));
  if (wrong > 0) {
    std::printf("FAILED: %zu gets returned a value other than the one stored under the key\n",
                wrong.load());
    return 1;
  }
  if (stored < keys || got < keys) {
    std::printf("FAILED: %zu of %zu stores and %zu of %zu gets succeeded\n", stored.load(), keys,
                got.load(), keys);
    return 1;
  }
  std::printf("RESULT dht_store_success=%.4f\n", store_ok);
  std::printf("RESULT dht_get_success=%.4f\n", get_ok);
  std::printf("RESULT dht_store_p50_ms=%.3f\n", Percentile(store_ms, 0.5));
  std::printf("RESULT dht_get_p50_ms=%.3f\n", get_p50);
  std::printf("RESULT dht_hops_mean=%.3f\n", hops);
  std::printf("RESULT dht_get_vs_rpc_rtt=%.2f\n", rtt_p50 > 0 ? get_p50 / rtt_p50 : 0);
  return 0;
}
