// colony listen | ping: run a peer, and check that a peer answers.
#include <cinttypes>
#include <cstdio>
#include <memory>

#include "core/identity.h"
#include "core/log.h"
#include "core/multiaddr.h"
#include "dht/node.h"
#include "net/host.h"
#include "tools/access_options.h"
#include "tools/commands.h"
#include "tools/record_rules.h"

namespace colony::cli {
namespace {

Result<std::vector<Multiaddr>> ParseAll(const std::vector<std::string>& texts) {
  std::vector<Multiaddr> out;
  for (const auto& t : texts) {
    auto a = Multiaddr::Parse(t);
    if (!a.ok()) return a.status();
    out.push_back(*a);
  }
  return out;
}

double Millis(std::chrono::nanoseconds d) { return static_cast<double>(d.count()) / 1e6; }

// Peers announce their address in the DHT under this key, each at a subkey that names it as the
// owner, so only that peer can write its entry (the value carries its signature).
constexpr char kPeersKey[] = "colony.peers";
constexpr double kAnnounceTtl = 600;

}  // namespace

void AddPeerCommands(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands) {
  struct ListenArgs {
    std::vector<std::string> listen{"/ip4/127.0.0.1/tcp/0"};
    std::vector<std::string> initial_peers;
    std::string identity;
  };
  auto la = std::make_shared<ListenArgs>();
  auto* listen = app.add_subcommand(
      "listen",
      "run a peer: print the addresses others can dial (one per line), serve until SIGINT/SIGTERM");
  listen->add_option("--listen", la->listen, "address to listen on (repeatable; port 0 = any)")
      ->check(MultiaddrCheck())
      ->capture_default_str();
  listen
      ->add_option("--initial-peers,--bootstrap", la->initial_peers,
                   "peer to join the DHT through (alias: --bootstrap); we announce our address "
                   "there and ping every "
                   "peer announced so far (repeatable)")
      ->check(MultiaddrCheck());
  listen->add_option("--identity", la->identity, "identity file (default: a new random identity)");
  commands.emplace_back(listen, [la]() -> int {
    auto listen_addrs = ParseAll(la->listen);
    if (!listen_addrs.ok()) return Fail(listen_addrs.status());
    auto bootstrap = ParseAll(la->initial_peers);
    if (!bootstrap.ok()) return Fail(bootstrap.status());
    auto identity = LoadOrGenerateIdentity(la->identity);
    if (!identity.ok()) return Fail(identity.status());

    BlockTerminationSignals();
    net::HostOptions options;
    options.listen = *listen_addrs;
    auto host = std::make_shared<net::Host>(std::move(*identity), options);
    host->RegisterUnary(
        "colony.echo",
        [](net::CallContext&, net::Message m) -> asio::awaitable<Result<net::Message>> {
          co_return m;
        });
    if (Status st = host->Start(); !st.ok()) return Fail(st);
    if (host->ListenAddresses().empty()) return Fail("no usable listen address");
    for (const auto& a : host->ListenAddresses()) std::printf("%s\n", a.ToString().c_str());
    std::fflush(stdout);

    dht::NodeOptions dht_options;
    dht_options.validators = {SwarmRecordRules()};
    for (const auto& b : *bootstrap) dht_options.initial_peers.push_back(b.ToString());
    auto node = dht::Node::Attach(host, std::move(dht_options));
    if (!node.ok()) {
      host->Shutdown();
      return Fail(node.status());
    }
    const std::string self = host->ListenAddresses().front().ToString();
    if (Status st = (*node)->StoreSync(kPeersKey, self, dht::Now() + kAnnounceTtl,
                                       dht::OwnerMarker(host->peer_id()));
        !st.ok()) {
      std::fprintf(stderr, "colony: warning: could not announce ourselves in the DHT: %s\n",
                   st.ToString().c_str());
    }
    if (!bootstrap->empty()) {
      auto peers = (*node)->GetSync(kPeersKey, dht::Freshness::kLatest);
      if (!peers.ok()) {
        std::fprintf(stderr, "colony: warning: no peers announced in the DHT: %s\n",
                     peers.status().ToString().c_str());
      } else {
        for (const auto& [owner, entry] : peers->subkeys) {
          auto addr = Multiaddr::Parse(entry.value);
          if (!addr.ok() || (addr->peer_id() && *addr->peer_id() == host->peer_id())) continue;
          auto ping = host->PingSync(*addr);
          if (ping.ok()) {
            std::printf("found %s: rtt %.3f ms, protocol %u.%u\n", ping->peer.ToString().c_str(),
                        Millis(ping->rtt), ping->version_major, ping->version_minor);
          } else {
            std::printf("found %s: unreachable: %s\n", entry.value.c_str(),
                        ping.status().ToString().c_str());
          }
          std::fflush(stdout);
        }
      }
    }
    std::string sig = WaitForTerminationSignal();
    COLONY_LOG_INFO("received {}, shutting down", sig);
    (*node)->Shutdown();
    host->Shutdown();
    return 0;
  });

  struct PingArgs {
    std::string address;
    int count = 1;
    double timeout = 5;
  };
  auto pa = std::make_shared<PingArgs>();
  auto* ping =
      app.add_subcommand("ping", "dial a peer, authenticate it, and measure the round-trip time");
  ping->add_option("address", pa->address,
                   "peer address, e.g. /ip4/1.2.3.4/tcp/31337/p2p/12D3KooW...")
      ->check(MultiaddrCheck())
      ->required();
  ping->add_option("-c,--count", pa->count, "number of pings")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  ping->add_option("--timeout", pa->timeout, "seconds to wait for the peer")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str();
  commands.emplace_back(ping, [pa]() -> int {
    auto addr = Multiaddr::Parse(pa->address);
    if (!addr.ok()) return Fail(addr.status());
    net::HostOptions options;
    options.dial_timeout = std::chrono::milliseconds(static_cast<int64_t>(pa->timeout * 1000));
    net::Host host(KeyPair::Generate(), options);
    if (Status st = host.Start(); !st.ok()) return Fail(st);
    for (int i = 0; i < pa->count; ++i) {
      auto r = host.PingSync(*addr, options.dial_timeout);
      if (!r.ok()) return Fail(r.status());
      if (i == 0) {
        std::printf("peer %s\nprotocol %u.%u (%s)\n", r->peer.ToString().c_str(), r->version_major,
                    r->version_minor, r->agent.c_str());
      }
      std::printf("rtt %.3f ms\n", Millis(r->rtt));
      std::fflush(stdout);
    }
    host.Shutdown();
    return 0;
  });
}

}  // namespace colony::cli
