// The demo's first stages: `colony listen` peers that find each other through the DHT, a tensor
// echoed through each of them, and `colony average` processes that average one tensor each.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "averaging/averager.h"
#include "core/identity.h"
#include "demo/demo.h"
#include "dht/node.h"
#include "net/host.h"

namespace colony::demo {

using std::chrono::seconds;

Result<LocalSwarm> StartLocalSwarm(const DemoOptions& o, const Output& out) {
  out(fmt::format("Colony demo: starting {} peers on loopback as separate processes\n", o.peers));
  LocalSwarm swarm;
  for (int i = 0; i < o.peers; ++i) {
    std::vector<std::string> argv = {ColonyExecutable(o), "--log-level",         "warn", "listen",
                                     "--listen",          "/ip4/127.0.0.1/tcp/0"};
    if (i > 0) argv.insert(argv.end(), {"--initial-peers", swarm.bootstrap});
    COLONY_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Spawn(argv));
    auto line = p.ReadLine(seconds(10));
    if (!line.ok()) return line.status().WithContext(fmt::format("peer {} did not start", i));
    COLONY_ASSIGN_OR_RETURN(Multiaddr addr, Multiaddr::Parse(*line));
    out(fmt::format("  peer {}  {}\n", i, *line));
    if (i == 0) swarm.bootstrap = *line;
    // Peer i learns about the i peers before it from the bootstrap peer and pings each.
    for (int k = 0; k < i; ++k) {
      auto found = p.ReadLine(seconds(15));
      if (!found.ok()) return found.status().WithContext(fmt::format("peer {}", i));
      out(fmt::format("          {}\n", *found));
      swarm.pings_answered += found->find(": rtt ") != std::string::npos;
    }
    swarm.pings_expected += i;
    swarm.addresses.push_back(addr);
    swarm.peers.push_back(std::move(p));
  }
  return swarm;
}

Result<EchoReport> EchoThroughEveryPeer(const DemoOptions& o, const std::vector<Multiaddr>& addrs,
                                        const Output& out) {
  using namespace std::chrono;
  out(fmt::format(
      "\nEchoing a {} MiB float32 tensor through every peer (authenticated, AES-256-GCM):\n",
      o.tensor_mib));
  net::Host host(KeyPair::Generate(), net::HostOptions{});
  COLONY_RETURN_IF_ERROR(host.Start());
  std::vector<float> data(static_cast<size_t>(o.tensor_mib) << 18);
  std::iota(data.begin(), data.end(), 0.0f);
  EchoReport report;
  for (size_t i = 0; i < addrs.size(); ++i) {
    auto ping = host.PingSync(addrs[i]);
    if (!ping.ok()) {
      host.Shutdown();
      return ping.status();
    }
    net::Message msg("demo");
    net::TensorFrame t;
    t.dtype = DType::kFloat32;
    t.shape = {static_cast<int64_t>(data.size())};
    t.data = ByteSpan(reinterpret_cast<const uint8_t*>(data.data()), data.size() * sizeof(float));
    msg.tensors.push_back(t);
    const auto start = steady_clock::now();
    auto reply = host.CallSync(addrs[i], "colony.echo", msg);
    const double secs = duration<double>(steady_clock::now() - start).count();
    const bool same = reply.ok() && reply->tensors.size() == 1 &&
                      reply->tensors[0].data.size() == t.data.size() &&
                      std::equal(t.data.begin(), t.data.end(), reply->tensors[0].data.begin());
    report.verified += same;
    out(fmt::format("  peer {}  {}  rtt {:.3f} ms  echo {}, {:.0f} MB/s round trip\n", i,
                    ping->peer.ToString(), static_cast<double>(ping->rtt.count()) / 1e6,
                    same ? "verified" : (reply.ok() ? "MISMATCH" : reply.status().ToString()),
                    2.0 * static_cast<double>(t.data.size()) / 1e6 / secs));
  }
  const auto stats = host.TotalStats();
  report.bytes_sent = stats.bytes_sent;
  report.bytes_received = stats.bytes_received;
  host.Shutdown();
  return report;
}

// Every process joins the DHT through the bootstrap peer; they form a group there and run the
// fault-tolerant butterfly all-reduce; each result is checked against the exact mean.
Result<int> AverageAcrossProcesses(const DemoOptions& o, const std::string& bootstrap,
                                   const Output& out) {
  const uint64_t values = static_cast<uint64_t>(o.tensor_mib) << 18;
  out(fmt::format(
      "\nAveraging a {} MiB float32 tensor across {} new peer processes (DHT matchmaking, "
      "butterfly all-reduce):\n",
      o.tensor_mib, o.peers));
  const std::string start_at =
      fmt::format("{:.3f}", dht::Now() + 2.0 + 0.2 * static_cast<double>(o.peers));
  const std::string tmp = std::filesystem::temp_directory_path().string() + "/colony_demo_" +
                          std::to_string(::getpid()) + "_";
  auto output_of = [&](int i) { return tmp + std::to_string(i) + ".bin"; };
  std::vector<Subprocess> averagers;
  for (int i = 0; i < o.peers; ++i) {
    COLONY_ASSIGN_OR_RETURN(
        Subprocess p,
        Subprocess::Spawn({ColonyExecutable(o), "--log-level", "warn", "average", "--initial-peers",
                           bootstrap, "--values", std::to_string(values), "--seed",
                           std::to_string(i), "--target-group-size", std::to_string(o.peers),
                           "--min-group-size", std::to_string(o.peers), "--start-at", start_at,
                           "--output", output_of(i)}));
    averagers.push_back(std::move(p));
  }
  // The reference: the mean of the same synthetic tensors, in double precision.
  std::vector<double> mean(values, 0.0);
  {
    std::vector<float> v(values);
    for (int i = 0; i < o.peers; ++i) {
      averaging::SyntheticValues(static_cast<uint64_t>(i), 0, v);
      for (uint64_t k = 0; k < values; ++k) mean[k] += v[k] / o.peers;
    }
  }
  int exact_results = 0;
  for (int i = 0; i < o.peers; ++i) {
    std::string report = "no result";
    for (;;) {
      auto line = averagers[static_cast<size_t>(i)].ReadLine(seconds(60));
      if (!line.ok()) {
        report = line.status().ToString();
        break;
      }
      auto j = nlohmann::json::parse(*line, nullptr, false);
      if (j.is_discarded() || j.value("event", "") != "round") continue;
      if (!j.value("ok", false)) {
        report = "failed: " + j.value("error", std::string("?"));
        break;
      }
      std::ifstream in(output_of(i), std::ios::binary);
      std::vector<float> result(values);
      in.read(reinterpret_cast<char*>(result.data()),
              static_cast<std::streamsize>(values * sizeof(float)));
      double worst = in ? 0.0 : 1e9;
      for (uint64_t k = 0; k < values && in; ++k) {
        worst = std::max(worst, std::abs(result[k] - mean[k]));
      }
      const bool exact = worst < 1e-5;
      exact_results += exact;
      report =
          fmt::format("group of {}, all-reduce {:.3f} s, {:.1f} MB sent; {} (max error {:.1e})",
                      j.value("group_size", 0), j.value("allreduce_s", 0.0),
                      static_cast<double>(j.value("bytes_sent", uint64_t{0})) / 1e6,
                      exact ? "exact mean verified" : "WRONG MEAN", worst);
      break;
    }
    std::error_code ec;
    std::filesystem::remove(output_of(i), ec);
    out(fmt::format("  averager {}  {}\n", i, report));
  }
  for (auto& a : averagers) (void)a.Wait(seconds(10));
  return exact_results;
}

int StopLocalSwarm(LocalSwarm& swarm, const Output& out) {
  out("\nStopping the swarm (SIGTERM):\n");
  int clean = 0;
  for (auto& p : swarm.peers) p.Signal(SIGTERM);
  for (size_t i = 0; i < swarm.peers.size(); ++i) {
    auto code = swarm.peers[i].Wait(seconds(10));
    const bool ok = code.ok() && *code == 0;
    clean += ok;
    out(fmt::format("  peer {}  {}\n", i,
                    ok          ? std::string("exited cleanly")
                    : code.ok() ? "exit code " + std::to_string(*code)
                                : code.status().ToString()));
  }
  return clean;
}

}  // namespace colony::demo
