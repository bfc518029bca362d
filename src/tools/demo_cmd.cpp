// colony demo: the main job, end to end on one machine.
//
// Until the training layers exist, the demo starts a small swarm of real peer processes on
// loopback: a bootstrap peer, then peers that join the DHT through it, announce their addresses
// there as owner-signed records, find each other's, and ping each other over authenticated,
// encrypted connections. The demo then exchanges tensors with every peer, lets as many new peer
// processes average a tensor each in one group (checking the exact mean), and shuts the swarm
// down cleanly.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>

#include "averaging/averager.h"
#include "core/multiaddr.h"
#include "core/subprocess.h"
#include "dht/node.h"
#include "net/host.h"
#include "tools/commands.h"

namespace colony::cli {

void AddDemoCommand(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands) {
  struct DemoArgs {
    int peers = 4;
    int tensor_mib = 16;
  };
  auto args = std::make_shared<DemoArgs>();
  auto* demo = app.add_subcommand(
      "demo",
      "run a local swarm of peer processes that find and ping each other, exchange tensors and "
      "average them");
  demo->add_option("--peers", args->peers, "number of peer processes")
      ->check(CLI::Range(2, 32))
      ->capture_default_str();
  demo->add_option("--tensor-mib", args->tensor_mib, "size of the tensor echoed by each peer (MiB)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  commands.emplace_back(demo, [args]() -> int {
    using namespace std::chrono;
    const auto t0 = steady_clock::now();
    const std::string self = SelfExecutable();
    std::printf("Colony demo: starting %d peers on loopback as separate processes\n", args->peers);

    std::vector<Subprocess> peers;
    std::vector<Multiaddr> addrs;
    std::string bootstrap;
    int found = 0, expected_found = 0;
    for (int i = 0; i < args->peers; ++i) {
      std::vector<std::string> argv = {self,     "--log-level", "warn",
                                       "listen", "--listen",    "/ip4/127.0.0.1/tcp/0"};
      if (i > 0) {
        argv.push_back("--bootstrap");
        argv.push_back(bootstrap);
      }
      auto p = Subprocess::Spawn(argv);
      if (!p.ok()) return Fail(p.status());
      auto line = p->ReadLine(seconds(10));
      if (!line.ok())
        return Fail(line.status().WithContext("peer " + std::to_string(i) + " did not start"));
      auto addr = Multiaddr::Parse(*line);
      if (!addr.ok()) return Fail(addr.status());
      std::printf("  peer %d  %s\n", i, line->c_str());
      if (i == 0) bootstrap = *line;
      // Peer i learns about the i peers before it from the bootstrap peer and pings each.
      for (int k = 0; k < i; ++k) {
        auto f = p->ReadLine(seconds(15));
        if (!f.ok()) return Fail(f.status().WithContext("peer " + std::to_string(i)));
        std::printf("          %s\n", f->c_str());
        found += f->find(": rtt ") != std::string::npos;
      }
      expected_found += i;
      addrs.push_back(*addr);
      peers.push_back(std::move(*p));
    }
    std::fflush(stdout);

    // Exchange a tensor with every peer: it is encrypted, echoed and checked byte for byte.
    std::printf(
        "\nEchoing a %d MiB float32 tensor through every peer (authenticated, AES-256-GCM):\n",
        args->tensor_mib);
    net::Host host(KeyPair::Generate(), net::HostOptions{});
    if (Status st = host.Start(); !st.ok()) return Fail(st);
    std::vector<float> data(static_cast<size_t>(args->tensor_mib) << 18);
    std::iota(data.begin(), data.end(), 0.0f);
    int ok_echoes = 0;
    for (size_t i = 0; i < addrs.size(); ++i) {
      auto ping = host.PingSync(addrs[i]);
      if (!ping.ok()) return Fail(ping.status());
      net::Message msg("demo");
      net::TensorFrame t;
      t.dtype = DType::kFloat32;
      t.shape = {static_cast<int64_t>(data.size())};
      t.data = ByteSpan(reinterpret_cast<const uint8_t*>(data.data()), data.size() * sizeof(float));
      msg.tensors.push_back(t);
      auto start = steady_clock::now();
      auto reply = host.CallSync(addrs[i], "colony.echo", msg);
      double secs = duration<double>(steady_clock::now() - start).count();
      bool same = reply.ok() && reply->tensors.size() == 1 &&
                  reply->tensors[0].data.size() == t.data.size() &&
                  std::equal(t.data.begin(), t.data.end(), reply->tensors[0].data.begin());
      ok_echoes += same;
      std::printf("  peer %zu  %s  rtt %.3f ms  echo %s, %.0f MB/s round trip\n", i,
                  ping->peer.ToString().c_str(), static_cast<double>(ping->rtt.count()) / 1e6,
                  same ? "verified" : (reply.ok() ? "MISMATCH" : reply.status().ToString().c_str()),
                  2.0 * static_cast<double>(t.data.size()) / 1e6 / secs);
    }
    auto stats = host.TotalStats();
    host.Shutdown();

    // Average one tensor per peer across the swarm: every peer process joins the DHT through
    // the bootstrap peer, they form a group there and run the fault-tolerant butterfly
    // all-reduce; the demo checks every result against the exact mean.
    const uint64_t values = static_cast<uint64_t>(args->tensor_mib) << 18;
    std::printf(
        "\nAveraging a %d MiB float32 tensor across %d new peer processes (DHT matchmaking, "
        "butterfly all-reduce):\n",
        args->tensor_mib, args->peers);
    char start_at[32];
    std::snprintf(start_at, sizeof(start_at), "%.3f",
                  dht::Now() + 2.0 + 0.2 * static_cast<double>(args->peers));
    const std::string tmp = std::filesystem::temp_directory_path().string() + "/colony_demo_" +
                            std::to_string(::getpid()) + "_";
    std::vector<Subprocess> averagers;
    for (int i = 0; i < args->peers; ++i) {
      auto p = Subprocess::Spawn(
          {self, "--log-level", "warn", "average", "--initial-peers", bootstrap, "--values",
           std::to_string(values), "--seed", std::to_string(i), "--target-group-size",
           std::to_string(args->peers), "--min-group-size", std::to_string(args->peers),
           "--start-at", start_at, "--output", tmp + std::to_string(i) + ".bin"});
      if (!p.ok()) return Fail(p.status());
      averagers.push_back(std::move(*p));
    }
    std::vector<double> mean(values, 0.0);
    {
      std::vector<float> v(values);
      for (int i = 0; i < args->peers; ++i) {
        averaging::SyntheticValues(static_cast<uint64_t>(i), 0, v);
        for (uint64_t k = 0; k < values; ++k) mean[k] += v[k] / args->peers;
      }
    }
    int averaged = 0;
    for (int i = 0; i < args->peers; ++i) {
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
        std::ifstream in(tmp + std::to_string(i) + ".bin", std::ios::binary);
        std::vector<float> out(values);
        in.read(reinterpret_cast<char*>(out.data()),
                static_cast<std::streamsize>(values * sizeof(float)));
        double worst = in ? 0.0 : 1e9;
        for (uint64_t k = 0; k < values && in; ++k) {
          worst = std::max(worst, std::abs(out[k] - mean[k]));
        }
        const bool exact = worst < 1e-5;
        averaged += exact;
        char buf[256];
        std::snprintf(buf, sizeof(buf),
                      "group of %d, all-reduce %.3f s, %.1f MB sent; %s (max error %.1e)",
                      j.value("group_size", 0), j.value("allreduce_s", 0.0),
                      static_cast<double>(j.value("bytes_sent", uint64_t{0})) / 1e6,
                      exact ? "exact mean verified" : "WRONG MEAN", worst);
        report = buf;
        break;
      }
      std::remove((tmp + std::to_string(i) + ".bin").c_str());
      std::printf("  averager %d  %s\n", i, report.c_str());
    }
    for (auto& a : averagers) (void)a.Wait(seconds(10));

    std::printf("\nStopping the swarm (SIGTERM):\n");
    int clean = 0;
    for (size_t i = 0; i < peers.size(); ++i) peers[i].Signal(SIGTERM);
    for (size_t i = 0; i < peers.size(); ++i) {
      auto code = peers[i].Wait(seconds(10));
      bool ok = code.ok() && *code == 0;
      clean += ok;
      std::printf("  peer %zu  %s\n", i,
                  ok ? "exited cleanly"
                     : (code.ok() ? ("exit code " + std::to_string(*code)).c_str()
                                  : code.status().ToString().c_str()));
    }
    double total = duration<double>(steady_clock::now() - t0).count();
    std::printf(
        "\nSummary: %d peers; %d of %d discovery pings answered; %d of %zu tensor echoes verified; "
        "%d of %d averaged tensors exact; "
        "%.1f MB sent, %.1f MB received by the demo; %d of %zu peers shut down cleanly; %.1f s\n",
        args->peers, found, expected_found, ok_echoes, addrs.size(), averaged, args->peers,
        static_cast<double>(stats.bytes_sent) / 1e6,
        static_cast<double>(stats.bytes_received) / 1e6, clean, peers.size(), total);
    bool success = found == expected_found && ok_echoes == static_cast<int>(addrs.size()) &&
                   averaged == args->peers && clean == static_cast<int>(peers.size());
    if (!success) return Fail("demo finished with failures (see above)");
    std::printf("Demo finished successfully.\n");
    return 0;
  });
}

}  // namespace colony::cli
