// colony demo: the main job, end to end on one machine.
//
// Until the training layers exist, the demo starts a small swarm of real peer processes on
// loopback: a bootstrap peer, then peers that join the DHT through it, announce their addresses
// there as owner-signed records, find each other's, and ping each other over authenticated, encrypted connections. The demo then exchanges tensors
// with every peer and shuts the swarm down cleanly.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>

#include "core/multiaddr.h"
#include "core/subprocess.h"
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
      "demo", "run a local swarm of peer processes that find and ping each other");
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
        "%.1f MB sent, %.1f MB received by the demo; %d of %zu peers shut down cleanly; %.1f s\n",
        args->peers, found, expected_found, ok_echoes, addrs.size(),
        static_cast<double>(stats.bytes_sent) / 1e6,
        static_cast<double>(stats.bytes_received) / 1e6, clean, peers.size(), total);
    bool success = found == expected_found && ok_echoes == static_cast<int>(addrs.size()) &&
                   clean == static_cast<int>(peers.size());
    if (!success) return Fail("demo finished with failures (see above)");
    std::printf("Demo finished successfully.\n");
    return 0;
  });
}

}  // namespace colony::cli
