// dht::Node: a DHT peer on the real network — the protocol core (dht/protocol.h) driven over a
// net::Host. It serves "dht.ping", "dht.store" and "dht.find" (unless in client mode), and
// offers coroutine and blocking store/get.
//
//   auto node = dht::Node::Start(KeyPair::Generate(), {.listen = {*Multiaddr::Parse(
//       "/ip4/0.0.0.0/tcp/0")}, .initial_peers = {"/ip4/10.0.0.5/tcp/31337/p2p/12D3KooW..."}});
//   if (!node.ok()) ...  // names every initial peer that failed, and why
//   (*node)->StoreSync("run1.progress", "{...}", dht::Now() + 60, "12D3KooW...");
//   Result<dht::Record> r = (*node)->GetSync("run1.progress", dht::Freshness::kLatest);
//
// Every request has a deadline (DhtOptions::request_timeout) and every lookup one
// (DhtOptions::lookup_timeout), so every operation ends.
// The blocking conveniences must not be called from the host's I/O threads.
#pragma once

#include <asio/awaitable.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/identity.h"
#include "core/multiaddr.h"
#include "core/status.h"
#include "dht/protocol.h"
#include "net/host.h"
#include "net/relay.h"

namespace colony::dht {

struct NodeOptions {
  // Where to listen when the node makes its own host (empty: client mode is implied).
  std::vector<Multiaddr> listen;
  // Where others should dial this node, given instead of its listen addresses (hivemind's
  // announce_maddrs): behind a router that forwards a port, or on a cloud machine whose public
  // address none of its interfaces has. Direct TCP addresses, each with this node's /p2p/ id or
  // none. The operator vouches for them: the dial-back check is skipped (the node is a DHT
  // server unless `reachability` is kPrivate). Without them, a node whose initial peers dial it
  // back at an address it does not listen on (a port-forwarding router's) adds that address
  // to the ones it gives others, after its loopback addresses.
  std::vector<Multiaddr> announce;
  // Peers to bootstrap from (multiaddrs; /p2p/<id> is checked when present).
  std::vector<std::string> initial_peers;
  DhtOptions dht;
  // Validators added to every node's built-in owner-signature check.
  std::vector<std::shared_ptr<const RecordValidator>> validators;
  // For the node's own host.
  net::HostOptions host;
  // Run a circuit relay for peers behind NAT (net/relay.h), with circuits on relay->listen.
  std::optional<net::RelayOptions> relay_service;
  // Relays (multiaddrs with /p2p/) to hold reservations with. A node without listen addresses
  // is then reachable through them: VisibleAddresses() lists the relayed addresses, so that its
  // RPC services (averaging, serving blocks) accept calls. Its DHT stays in client mode (nobody
  // routes DHT traffic through a relay).
  std::vector<std::string> relays;
  // Whether others can dial this node. kAuto: a listening node asks its initial peers to dial it
  // back (Host::CheckReachability) and, when they cannot, runs as a DHT client reachable through
  // a relay: one from `relays`, else one announced in the DHT (kRelaysKey), else an initial peer
  // that runs one. Nodes that listen on loopback only skip the check (a local swarm).
  enum class Reachability { kAuto, kPublic, kPrivate };
  Reachability reachability = Reachability::kAuto;
  // A node that picked its relay by itself (none in `relays`) moves to another one when it has
  // held no reservation for this long (the relay died or stopped relaying).
  std::chrono::milliseconds relay_failover{20'000};
  // A node that found itself public by the dial-back (kAuto, no `announce`) asks again this
  // often (0: never), its initial peers first, else peers of its routing table: a home router's
  // public address changes now and then. When a helper reaches it at another address (an initial
  // peer's word, or two other peers that agree), that address replaces the one it gives others:
  // in VisibleAddresses() and its DHT contact, whose nearest peers it tells at once. When its
  // initial peers answer that they cannot reach it any more (a router stopped forwarding its
  // port), it reserves with a relay and runs as a DHT client reachable through it, as a node that
  // starts behind NAT does, until one of them reaches it again: then it serves the DHT again.
  // Routing-table peers' word alone never changes its mode (any peer could lie): it only warns.
  std::chrono::milliseconds reachability_recheck{600'000};
  // Called (on the node's own thread) with VisibleAddresses() after they changed that way: a new
  // address, the relayed one behind a relay, its own again.
  std::function<void(const std::vector<Multiaddr>&)> on_addresses_changed;
  // Replies the node has built for remote callers but not yet handed to their connections
  // (whose budgets, net::HostOptions::max_reply_bytes, count them from then on): a caller that
  // opens hundreds of finds at once would otherwise have them all built at once. A reply that
  // would exceed this is refused with ResourceExhausted (one reply of any size always fits).
  uint64_t max_replies_in_transit_bytes = 64ull << 20;
};

// Relays announce themselves under this key (subkey: the relay's owner marker, value: the
// relay's direct address with its /p2p/ id), checked by RelayFamily() on every node.
inline constexpr char kRelaysKey[] = "_colony.relays";
KeyFamily RelayFamily();

// Wall-clock seconds since the Unix epoch (the time base of expirations).
double Now();

class Node {
 public:
  // Starts a host of its own, then bootstraps.
  static Result<std::unique_ptr<Node>> Start(KeyPair identity, NodeOptions options);
  // Runs on an already started host shared with other services (its RPC methods are added).
  static Result<std::unique_ptr<Node>> Attach(std::shared_ptr<net::Host> host, NodeOptions options);
  ~Node();  // Shutdown()
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Stops serving and fails pending operations with Closed; shuts the host down if it is the
  // node's own. Idempotent.
  void Shutdown();

  const PeerId& peer_id() const;
  // Addresses others can use to reach this node: NodeOptions::announce when given, else its
  // listen addresses (with the address its initial peers dialed it back at, when none of them
  // is that one; the latest such address, NodeOptions::reachability_recheck); in client mode the
  // relayed addresses of its active relay reservations (empty without any).
  std::vector<Multiaddr> VisibleAddresses() const;
  // The relay this node runs (null without NodeOptions::relay_service).
  const net::Relay* relay() const { return relay_.get(); }
  // False when the node found (or was told) that others cannot dial it directly (at start, or
  // since its initial peers could not dial it back: NodeOptions::reachability_recheck).
  bool publicly_reachable() const { return publicly_reachable_; }
  net::Host& host() { return *host_; }
  bool client_mode() const;

  asio::awaitable<std::vector<Status>> StoreMany(std::vector<StoreItem> items);
  asio::awaitable<Status> Store(std::string key, std::string value, double expiration,
                                std::optional<std::string> subkey = std::nullopt);
  // Freshness::kLatest visits the nearest replicas and returns the newest version; kAnyCopy may
  // answer from this node's storage or cache.
  asio::awaitable<std::vector<Result<Record>>> GetMany(std::vector<std::string> keys,
                                                       Freshness freshness = Freshness::kAnyCopy);
  asio::awaitable<Result<Record>> Get(std::string key, Freshness freshness = Freshness::kAnyCopy);

  std::vector<Status> StoreManySync(std::vector<StoreItem> items);
  Status StoreSync(std::string key, std::string value, double expiration,
                   std::optional<std::string> subkey = std::nullopt);
  std::vector<Result<Record>> GetManySync(std::vector<std::string> keys,
                                          Freshness freshness = Freshness::kAnyCopy);
  Result<Record> GetSync(std::string key, Freshness freshness = Freshness::kAnyCopy);

  // Bootstraps again from the initial peers it started with (e.g. after seeing nobody for a
  // while: they may have restarted); returns the routing table's size. FailedPrecondition when
  // the node started without initial peers. Blocking: not from the host's I/O threads.
  Result<size_t> Rejoin();

  // Snapshots taken on the node's strand.
  DhtStats Stats() const;
  size_t RoutingTableSize() const;
  std::vector<Contact> KnownPeers() const;

  class Impl;

 private:
  explicit Node(std::shared_ptr<Impl> impl, std::shared_ptr<net::Host> host);
  // Keeps this node's relay listed under kRelaysKey until shutdown.
  void AnnounceRelay();
  // Relays to try when picking one by itself: those announced in the DHT, then `fallback`.
  std::vector<std::string> FindRelays(const std::vector<std::string>& fallback);
  // Reserves with the first of `candidates` that grants a reservation, skipping relays whose
  // id is in `avoid`; the reservation is added to reservations_ and its address returned.
  // Refusals are logged as warnings and collected when `refusals` is given.
  std::optional<Multiaddr> ReserveWithOneOf(const std::vector<std::string>& candidates,
                                            const std::vector<PeerId>& avoid,
                                            std::vector<std::string>* refusals);
  // The thread behind NodeOptions::relay_failover.
  void WatchRelay(std::vector<std::string> fallback, std::chrono::milliseconds failover);
  // The thread behind NodeOptions::reachability_recheck: `listen` are the direct addresses
  // before any address a dial-back found.
  void WatchAddress(std::vector<Multiaddr> listen, std::chrono::milliseconds every,
                    std::function<void(const std::vector<Multiaddr>&)> changed);
  // WatchAddress's changes of mode; false when Shutdown() began meanwhile. MoveBehindRelay
  // reserves with a relay (as a node that starts behind NAT does), then runs the DHT as a
  // client; ServeDirectlyAgain serves it at `direct` again and drops the reservations.
  bool MoveBehindRelay(const std::function<bool()>& stop);
  bool ServeDirectlyAgain(const std::vector<Multiaddr>& direct, const std::function<bool()>& stop);
  // DhtCore::SetAddresses on the strand, waited for; false when Shutdown() began meanwhile.
  bool TellDhtAddresses(std::vector<std::string> addrs, const std::function<bool()>& stop);
  // Whether Shutdown() has begun (for the watchers).
  bool WatcherStopping() const;
  // Declared first so that it is destroyed last: impl_ holds a strand of the host's io_context.
  std::shared_ptr<net::Host> host_;
  std::shared_ptr<Impl> impl_;
  bool owns_host_ = false;
  std::atomic<bool> publicly_reachable_{true};  // also set by WatchAddress
  std::vector<std::string> initial_peers_;
  std::chrono::milliseconds relay_failover_{0};  // NodeOptions::relay_failover
  std::unique_ptr<net::Relay> relay_;
  mutable std::mutex reservations_mu_;
  std::vector<std::unique_ptr<net::RelayReservation>> reservations_;  // guarded by the mutex
  std::thread relay_watcher_;
  std::thread address_watcher_;
  std::condition_variable watcher_wake_;
  bool watcher_stop_ = false;  // guarded by reservations_mu_
};

}  // namespace colony::dht
