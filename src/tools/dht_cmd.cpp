// colony dht: run a DHT node, or store and get records from the command line.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/identity.h"
#include "core/log.h"
#include "core/multiaddr.h"
#include "dht/node.h"
#include "tools/access_options.h"
#include "tools/commands.h"
#include "tools/record_rules.h"

namespace colony::cli {
namespace {

struct CommonArgs {
  std::vector<std::string> initial_peers;
  double timeout = 5;
  size_t disjoint_paths = dht::DhtOptions{}.disjoint_paths;
  AccessArgs access;
};

void AddCommon(CLI::App* cmd, CommonArgs& a, bool peers_required) {
  auto* opt = cmd->add_option("--initial-peers", a.initial_peers,
                              "multiaddr of a DHT peer to join through (repeatable)")
                  ->check(MultiaddrCheck());
  if (peers_required) opt->required();
  cmd->add_option("--request-timeout", a.timeout, "seconds to wait for each DHT request")
      ->check(CLI::Range(0.01, 600.0))
      ->capture_default_str();
  cmd->add_option("--disjoint-paths", a.disjoint_paths,
                  "disjoint paths of each DHT lookup (S/Kademlia): hostile peers capture only "
                  "the paths they are on; each costs up to one more lookup's requests")
      ->check(CLI::Range(size_t{1}, dht::kMaxDisjointPaths))
      ->capture_default_str();
  AddAccessOptions(cmd, a.access);
}

Status CheckAddrs(const std::vector<std::string>& addrs) {
  for (const auto& a : addrs) {
    auto m = Multiaddr::Parse(a);
    if (!m.ok()) return m.status();
  }
  return Status::Ok();
}

// A short-lived client-mode node for one store or get (its token lives longer than it does).
Result<std::unique_ptr<dht::Node>> ClientNode(const CommonArgs& a) {
  COLONY_RETURN_IF_ERROR(CheckAddrs(a.initial_peers));
  COLONY_ASSIGN_OR_RETURN(KeyPair identity, LoadOrGenerateIdentity(a.access.identity));
  COLONY_ASSIGN_OR_RETURN(SwarmAccess access, MakeSwarmAccess(a.access, identity.peer_id()));
  dht::NodeOptions options;
  options.host.access = access.control;
  options.validators = {SwarmRecordRules()};
  options.initial_peers = a.initial_peers;
  options.dht.client_mode = true;
  options.dht.request_timeout =
      std::chrono::duration_cast<Duration>(std::chrono::duration<double>(a.timeout));
  options.dht.disjoint_paths = a.disjoint_paths;
  return dht::Node::Start(std::move(identity), std::move(options));
}

}  // namespace

void AddDhtCommands(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands) {
  auto* dht = app.add_subcommand(
      "dht",
      "run a DHT node: print the addresses others can use (one per line), serve until "
      "SIGINT/SIGTERM; or store/get records");

  // colony dht store
  struct StoreArgs {
    CommonArgs common;
    std::string key, value;
    std::optional<std::string> subkey;
    double ttl = 600;
  };
  auto sa = std::make_shared<StoreArgs>();
  auto* store = dht->add_subcommand("store", "store KEY = VALUE (or a subkey of KEY) in the DHT");
  store->add_option("key", sa->key, "the record's key")->required();
  store->add_option("value", sa->value, "the value (stored as given)")->required();
  store->add_option("--subkey", sa->subkey, "store into the dictionary under KEY at this subkey");
  store
      ->add_option("--ttl", sa->ttl,
                   "seconds until the record expires (at most a day: store again to keep it)")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  AddCommon(store, sa->common, true);
  commands.emplace_back(store, [sa]() -> int {
    auto node = ClientNode(sa->common);
    if (!node.ok()) return Fail(node.status());
    const double expiration = dht::Now() + sa->ttl;
    Status st = (*node)->StoreSync(sa->key, sa->value, expiration, sa->subkey);
    if (!st.ok()) return Fail(st.WithContext("store '" + sa->key + "' failed"));
    nlohmann::json j{{"key", sa->key}, {"stored", true}, {"expiration", expiration}};
    if (sa->subkey) j["subkey"] = *sa->subkey;
    std::printf("%s\n", Dump(j).c_str());
    return 0;
  });

  // colony dht get
  struct GetArgs {
    CommonArgs common;
    std::string key;
    bool latest = false;
  };
  auto ga = std::make_shared<GetArgs>();
  auto* get = dht->add_subcommand(
      "get", "get KEY from the DHT and print it as JSON (value or dictionary, with expirations)");
  get->add_option("key", ga->key, "the record's key")->required();
  get->add_flag("--latest", ga->latest, "search the nearest nodes for the newest value");
  AddCommon(get, ga->common, true);
  commands.emplace_back(get, [ga]() -> int {
    auto node = ClientNode(ga->common);
    if (!node.ok()) return Fail(node.status());
    auto r =
        (*node)->GetSync(ga->key, ga->latest ? dht::Freshness::kLatest : dht::Freshness::kAnyCopy);
    if (!r.ok()) return Fail(r.status());
    nlohmann::json j{{"key", ga->key}, {"expiration", r->Expiration()}};
    if (r->is_dict) {
      nlohmann::json subs = nlohmann::json::object();
      for (const auto& [sub, v] : r->subkeys) {
        subs[sub] = {{"value", v.value}, {"expiration", v.expiration}};
      }
      j["subkeys"] = std::move(subs);
    } else {
      j["value"] = r->value.value;
    }
    std::printf("%s\n", Dump(j).c_str());
    return 0;
  });

  // colony dht (serve)
  struct ServeArgs {
    CommonArgs common;
    std::vector<std::string> listen{"/ip4/0.0.0.0/tcp/0"};
    std::vector<std::string> announce;
    bool client_mode = false;
    std::vector<std::string> relays;
    std::string relay_listen;
    bool no_hole_punching = false;
    double reachability_recheck = 600;
  };
  auto va = std::make_shared<ServeArgs>();
  dht->add_option("--listen", va->listen, "address to listen on (repeatable; port 0 = any)")
      ->check(MultiaddrCheck())
      ->capture_default_str();
  AddAnnounceOption(dht, va->announce);
  dht->add_flag("--client-mode", va->client_mode,
                "do not accept connections: store and get only (behind NAT)");
  dht->add_option("--relay", va->relays,
                  "behind NAT: be reachable through this relay peer (its multiaddr; repeatable; "
                  "implies --client-mode)")
      ->check(MultiaddrCheck());
  dht->add_option("--relay-listen", va->relay_listen,
                  "also run a relay for peers behind NAT, with circuits on this address")
      ->check(MultiaddrCheck());
  dht->add_flag("--no-hole-punching", va->no_hole_punching,
                "keep relayed connections instead of trying to replace them with direct ones");
  dht->add_option("--reachability-recheck", va->reachability_recheck,
                  "seconds between dial-back checks of a node by its initial peers: when a "
                  "router's public address changes, the node gives others the new one; when "
                  "they can no longer reach it, it moves behind a relay until they can again; a "
                  "node behind a relay (also one found behind NAT at start, without --relay) "
                  "serves the DHT once they reach it, and doubles its wait after each check that "
                  "leaves it there, up to 8 times this; it prints its addresses again after each "
                  "change (0: never check)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  AddCommon(dht, va->common, false);
  commands.emplace_back(dht, [va]() -> int {
    if (Status st = CheckAddrs(va->common.initial_peers); !st.ok()) return Fail(st);
    if (Status st = CheckAddrs(va->relays); !st.ok()) return Fail(st);
    auto identity = LoadOrGenerateIdentity(va->common.access.identity);
    if (!identity.ok()) return Fail(identity.status());
    auto access = MakeSwarmAccess(va->common.access, identity->peer_id());
    if (!access.ok()) return Fail(access.status());
    dht::NodeOptions options;
    options.validators = {SwarmRecordRules()};
    options.host.access = access->control;
    options.relays = va->relays;
    options.host.hole_punching = !va->no_hole_punching;
    if (!va->relays.empty()) va->client_mode = true;
    if (!va->relay_listen.empty()) {
      auto relay_listen = Multiaddr::Parse(va->relay_listen);
      if (!relay_listen.ok()) return Fail(relay_listen.status());
      options.relay_service = net::RelayOptions{};
      options.relay_service->listen = *relay_listen;
    }
    if (!va->client_mode) {
      for (const auto& l : va->listen) {
        auto m = Multiaddr::Parse(l);
        if (!m.ok()) return Fail(m.status());
        options.listen.push_back(*m);
      }
    }
    options.dht.client_mode = va->client_mode;
    auto announce = ParseAnnounce(va->announce);
    if (!announce.ok()) return Fail(announce.status());
    options.announce = std::move(*announce);
    options.initial_peers = va->common.initial_peers;
    options.dht.request_timeout =
        std::chrono::duration_cast<Duration>(std::chrono::duration<double>(va->common.timeout));
    options.dht.disjoint_paths = va->common.disjoint_paths;
    if (va->reachability_recheck > 0 && va->reachability_recheck < 0.1) {
      return Fail(InvalidArgument(
          fmt::format("--reachability-recheck {}: give at least 0.1 seconds, or 0 for never",
                      va->reachability_recheck)));
    }
    options.reachability_recheck = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::duration<double>(va->reachability_recheck));
    options.on_addresses_changed = [](const std::vector<Multiaddr>& now) {
      for (const auto& a : now) std::printf("%s\n", a.ToString().c_str());
      std::fflush(stdout);
    };

    BlockTerminationSignals();
    auto node = dht::Node::Start(std::move(*identity), std::move(options));
    if (!node.ok()) return Fail(node.status());
    SwarmAccess swarm_access = std::move(*access);  // stops before the node goes
    swarm_access.Attach(**node);
    for (const auto& a : (*node)->VisibleAddresses()) std::printf("%s\n", a.ToString().c_str());
    std::fflush(stdout);
    if ((*node)->relay() != nullptr) {
      COLONY_LOG_INFO(
          "relaying for peers behind NAT: circuits on {}; they reserve with --relay "
          "<this node's address>",
          (*node)->relay()->address().ToString());
    }
    COLONY_LOG_INFO("DHT node {} is up ({}), {} peers known", (*node)->peer_id().ToString(),
                    (*node)->client_mode() ? "client mode" : "serving",
                    (*node)->RoutingTableSize());
    std::string sig = WaitForTerminationSignal();
    COLONY_LOG_INFO("received {}, shutting down", sig);
    swarm_access.Stop();
    (*node)->Shutdown();
    return 0;
  });
}

}  // namespace colony::cli
