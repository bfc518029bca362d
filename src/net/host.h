// Host: a peer's presence on the network. It listens, dials, authenticates, keeps a pool of
// connections (one per peer by default, more on request), and serves registered RPC methods.
//
//   colony::net::Host host(KeyPair::Generate(), {.listen =
//   {*Multiaddr::Parse("/ip4/0.0.0.0/tcp/0")}}); host.RegisterUnary("echo", [](CallContext&,
//   Message m) -> asio::awaitable<Result<Message>> {
//     co_return m;
//   });
//   COLONY_RETURN_IF_ERROR(host.Start());
//   Result<Message> reply = host.CallSync(peer_addr, "echo", Message("hi"));
//
// Threading: the host runs `io_threads` threads of its own. Coroutine methods may be awaited from
// any executor; the *Sync conveniences block and must not be called from the host's threads.
// Every call has a deadline (CallOptions::timeout, else HostOptions::default_call_timeout).
#pragma once

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/identity.h"
#include "core/multiaddr.h"
#include "core/status.h"
#include "core/token_buckets.h"
#include "net/connection.h"
#include "net/observed_addresses.h"
#include "net/peer_address_book.h"
#include "net/stream.h"
#include "net/wire.h"

namespace colony::net {

struct HostOptions {
  // Addresses to listen on (port 0: any free port). Empty: dial out only (client mode).
  std::vector<Multiaddr> listen;
  ConnectionOptions connection;
  // I/O threads. One is enough for most peers; math never runs on them.
  size_t io_threads = 1;
  std::chrono::milliseconds dial_timeout{10'000};
  // Dialing a peer at several addresses (ConnectAny): how long one address may go without
  // connecting before the next is dialed beside it (RFC 8305's "connection attempt delay").
  std::chrono::milliseconds dial_stagger{250};
  std::chrono::milliseconds default_call_timeout{30'000};
  size_t max_connections = 1024;
  size_t max_connections_per_peer = 8;
  // Slots one source address may hold (docs/security.md): inbound connections, handshaking or
  // open, and handshakes in progress from one IP address. Identities cost nothing to create, so
  // caps that hold are per address. At max_connections, a newcomer from an address that holds
  // fewer inbound connections than the heaviest address evicts one of the heaviest's.
  size_t max_connections_per_address = 128;
  size_t max_handshakes_per_address = 32;
  // Handshakes one source address may start: `handshake_burst_per_address` at once, then
  // `handshakes_per_second_per_address` on average (a token bucket; 0 per second: no limit).
  // Each costs this host a key agreement and signature operations on an I/O thread, so an
  // address that completes handshakes in a loop, within its slots, would otherwise keep that
  // thread busy and every other peer's traffic waiting.
  double handshakes_per_second_per_address = 20;
  double handshake_burst_per_address = 64;
  // A swarm on one machine shares 127.0.0.1, so loopback sources are exempt unless this is set.
  bool limit_loopback_addresses = false;
  // The local IP address outgoing dials are made from (a multi-homed machine; tests that play a
  // second machine from 127.0.0.2). Empty: the kernel's choice.
  std::string dial_from = {};
  // Memory that remote peers can make this host hold, over all its connections (each connection
  // also has its own limits in ConnectionOptions): replies its handlers are sending (held until
  // the peer gives credit and the bytes are sealed), and incoming messages (from their first
  // byte until the application has read them; each also counts kHeldMessageOverhead). What would
  // exceed them is refused with ResourceExhausted and its stream reset. docs/security.md.
  uint64_t max_reply_bytes = 1ull << 30;
  uint64_t max_received_bytes = 1ull << 30;
  // Of those, what the connections from one source address may hold together (loopback exempt
  // unless limit_loopback_addresses; the peers behind one relay share the relay's), so that one
  // machine opening many connections cannot take the whole host budget from the others.
  uint64_t max_reply_bytes_per_address = 256ull << 20;
  uint64_t max_received_bytes_per_address = 256ull << 20;
  std::string agent = "colony/" COLONY_VERSION_STRING;
  // Hole punching: when a peer reaches us through a relay (AdoptRelayed), try to replace the
  // relayed connection with a direct one (TCP simultaneous open through both NATs, timed over
  // the relay); and take part when a peer we reached through a relay asks. When it fails, the
  // relayed connection simply stays. See docs/nat.md.
  bool hole_punching = true;
  // A private swarm (access_control.h): who may connect, and the token this host shows. Null:
  // anyone may connect. Every connection, in both directions, is checked at the handshake.
  std::shared_ptr<AccessControl> access;
  // For tests of version negotiation only: advertise this major version instead of ours.
  uint32_t protocol_major = kProtocolMajor;
};

struct CallOptions {
  std::chrono::milliseconds timeout{0};  // 0: HostOptions::default_call_timeout
  // Connection lane to the peer: 0 is the shared connection; other lanes open further
  // connections, for streams that need throughput of their own.
  size_t lane = 0;
};

struct PingResult {
  PeerId peer;
  uint32_t version_major = 0;
  uint32_t version_minor = 0;
  std::string agent;
  std::chrono::nanoseconds rtt{0};
  Multiaddr address;
};

using UnaryHandler = std::function<asio::awaitable<Result<Message>>(CallContext&, Message)>;
// Writes any number of responses with ctx.stream().Write().
using ServerStreamingHandler = std::function<asio::awaitable<Status>(CallContext&, Message)>;
// Reads requests with ctx.stream().Read() until std::nullopt; returns the single response.
using ClientStreamingHandler = std::function<asio::awaitable<Result<Message>>(CallContext&)>;
// Reads and writes freely.
using BidiStreamingHandler = std::function<asio::awaitable<Status>(CallContext&)>;

class Host {
 public:
  Host(KeyPair identity, HostOptions options);
  ~Host();  // Shutdown()
  Host(const Host&) = delete;
  Host& operator=(const Host&) = delete;

  // Binds the listen addresses and starts the I/O threads.
  Status Start();
  // Closes listeners and connections; in-flight calls fail with Closed. Idempotent.
  void Shutdown();

  const PeerId& peer_id() const { return identity_.peer_id(); }
  const KeyPair& identity() const { return identity_; }
  // Bound listen addresses, with /p2p/<our id>. Wildcard binds (0.0.0.0, ::) are expanded to
  // loopback so that the printed address can be dialed on this machine.
  std::vector<Multiaddr> ListenAddresses() const;
  struct MemoryUsage {
    uint64_t reply_bytes = 0, reply_peak = 0;        // replies waiting to be sent
    uint64_t received_bytes = 0, received_peak = 0;  // incoming messages not read yet
  };
  // What the host-wide budgets (HostOptions::max_reply_bytes, max_received_bytes) hold.
  MemoryUsage memory_usage() const;
  // Private swarms: shows `token` (validated as AccessControl::SetOwnToken does) to every peer
  // from now on, on the connections already open as well (a TOKEN frame), so renewing a token
  // before it expires fails no call. FailedPrecondition without HostOptions::access.
  Status SetAccessToken(Bytes token);
  const std::shared_ptr<AccessControl>& access() const { return options_.access; }
  // Whether services on this host apply their per-address caps to loopback callers too
  // (HostOptions::limit_loopback_addresses).
  bool limits_loopback() const { return options_.limit_loopback_addresses; }
  struct AccessRefusals {
    uint64_t count = 0;  // incoming handshakes this host refused
    std::string last;    // the last one's reason
  };
  AccessRefusals access_refusals() const;
  struct SlotRefusals {
    uint64_t per_address = 0;  // inbound connections refused: their address held its cap
    uint64_t handshakes = 0;   // refused: their address had its cap of handshakes running
    uint64_t rate = 0;         // refused: their address started handshakes beyond its rate
    uint64_t full = 0;         // refused at max_connections (no heavier address to evict)
    uint64_t evicted = 0;      // connections closed to make room for a lighter address
  };
  SlotRefusals slot_refusals() const;
  // Refuses `peer` for the host's lifetime (e.g. a peer that averaging verification banned):
  // its open connections close now and later ones right after their handshake, with `reason`
  // (the peer is told), and dials to it fail at once. At most kMaxBlockedPeers are held (beyond,
  // Block returns false and the peer is not blocked).
  static constexpr size_t kMaxBlockedPeers = 65'536;
  // Source addresses whose handshake rates are remembered at once (TokenBuckets::max_keys).
  static constexpr size_t kMaxRateAddresses = 65'536;
  bool Block(const PeerId& peer, std::string reason);
  // Why `peer` is blocked, if it is.
  std::optional<std::string> BlockedReason(const PeerId& peer) const;
  // Our address as peers have reported seeing it: at most kMaxObservedAddresses, those that
  // more peers reported first (observed_addresses.h).
  std::vector<std::string> ObservedAddresses() const;

  // Registration; may be called before or after Start(). A later registration replaces one.
  void RegisterUnary(const std::string& method, UnaryHandler handler);
  void RegisterServerStreaming(const std::string& method, ServerStreamingHandler handler);
  void RegisterClientStreaming(const std::string& method, ClientStreamingHandler handler);
  void RegisterBidiStreaming(const std::string& method, BidiStreamingHandler handler);

  // A connection to the peer at `address` (reused when one is open on that lane). Without
  // /p2p/<id> in the address, any peer that completes the handshake is accepted. With it, and
  // addresses of that peer held by SetPeerAddresses, those are dialed too (as ConnectAny, the
  // given address first). Waits at most `timeout` (when nonzero; the dial is bounded by
  // HostOptions::dial_timeout in any case): a dial that outlasts the wait goes on, shared with
  // other callers, and pools its connection.
  asio::awaitable<Result<std::shared_ptr<Connection>>> Connect(
      Multiaddr address, size_t lane = 0, std::chrono::milliseconds timeout = {});
  // A connection to `peer` at any of `addrs` (reused when one is open on that lane). Dials them
  // in order: the next when the one before failed, or went HostOptions::dial_stagger without
  // connecting (that one keeps going); the first to complete the handshake as `peer` wins. An
  // address naming another peer is skipped; one where another peer answers fails like an
  // unreachable one. The error, when none got through, gives each address's failure.
  asio::awaitable<Result<std::shared_ptr<Connection>>> ConnectAny(
      PeerId peer, std::vector<Multiaddr> addrs, size_t lane = 0,
      std::chrono::milliseconds timeout = {});
  // Where `peer` said it can be reached (its signed record, its averaging announcement; never a
  // third party's word about it), for Connect to fall back on: a peer listening on every
  // interface announces loopback and LAN addresses first, and from another machine they lead
  // elsewhere. Replaces what was held for `peer`; bounded (peer_address_book.h).
  void SetPeerAddresses(const PeerId& peer, const std::vector<Multiaddr>& addrs);
  // An open connection to `peer` (e.g. one that dialed us), if any.
  std::shared_ptr<Connection> FindConnection(const PeerId& peer, size_t lane = 0) const;

  // A call's timeout bounds all of it: connecting (when no connection is open yet), the request,
  // and the reply or stream.
  asio::awaitable<Result<Message>> Call(Multiaddr address, std::string method, Message request,
                                        CallOptions options = {});
  asio::awaitable<Result<std::shared_ptr<Stream>>> OpenStream(Multiaddr address, std::string method,
                                                              CallOptions options = {});
  asio::awaitable<Result<PingResult>> Ping(
      Multiaddr address, std::chrono::milliseconds timeout = std::chrono::seconds(5));

  // Reachability. Probe dials `address` afresh (never a pooled connection), completes the
  // handshake (so the peer there is the one named) and hangs up: OK when it got through.
  asio::awaitable<Status> Probe(Multiaddr address);
  // Asks the peer at `helper` to dial this host back (the "net.dialback" RPC every host serves):
  // it dials the IP it sees our connection come from, at each of our listen ports. The address
  // it got through at (we accept connections from the Internet there: behind a router that
  // forwards the port, the router's public address, which none of our interfaces has), nullopt
  // when it got through nowhere (we are behind NAT or a firewall), an error when the question
  // could not be asked or the answer names an address we did not ask about.
  asio::awaitable<Result<std::optional<Multiaddr>>> CheckReachability(Multiaddr helper);
  Result<std::optional<Multiaddr>> CheckReachabilitySync(const Multiaddr& helper);

  // Coroutine parameters are taken by value so that a call may outlive its arguments.
  // Blocking conveniences. Never call them from the host's own threads.
  Result<Message> CallSync(const Multiaddr& address, const std::string& method, Message request,
                           CallOptions options = {});
  Result<PingResult> PingSync(const Multiaddr& address,
                              std::chrono::milliseconds timeout = std::chrono::seconds(5));

  // Takes a TCP connection that a relay set up (a circuit, see relay.h) and treats it as an
  // incoming connection: the handshake runs as responder, with the same limits as for accepted
  // sockets. `strand` is the socket's executor; `relay` the relay's circuit port with its id (the
  // connection's remote address becomes relay.Relaying(peer)). With hole_punching on, this host
  // then tries to reach the peer directly.
  void AdoptRelayed(asio::ip::tcp::socket socket, Strand strand, Multiaddr relay);

  asio::io_context& io_context() { return io_; }
  size_t connection_count() const;
  // Bytes sent/received over all connections, open and closed.
  Connection::Stats TotalStats() const;

 private:
  asio::awaitable<void> AcceptLoop(std::shared_ptr<asio::ip::tcp::acceptor> acceptor);
  // Reserves a slot for an inbound connection from `ip` (held until its handshake fails or the
  // connection closes): an error naming the cap when none is free. `key` receives the address
  // the slot is counted under (empty: exempt). `evict` receives a connection to close (after
  // releasing mu_) to make room. Called with mu_ held.
  Status ReserveInbound(const asio::ip::address& ip, std::string* key,
                        std::shared_ptr<Connection>* evict);
  // The handshake from `key` ended: with `conn` open, or failed (null).
  void EndInboundHandshake(const std::string& key, const std::shared_ptr<Connection>& conn);
  asio::awaitable<void> HandleIncoming(asio::ip::tcp::socket socket, Strand strand,
                                       std::optional<Multiaddr> relay,
                                       std::string inbound_key = {});
  // Why a dial on `lane` cannot start now (shut down, not started, lane out of range), if so.
  Status DialPrecondition(size_t lane) const;
  struct PendingDial;  // one dial and its waiters (host.cpp)
  asio::awaitable<Result<std::shared_ptr<Connection>>> ConnectOnDialStrand(
      Multiaddr address, size_t lane, std::chrono::steady_clock::time_point wait_until);
  // Runs one dial to its end, whoever still waits for it, and hands its result to the waiters.
  asio::awaitable<void> RunPendingDial(std::shared_ptr<PendingDial> pending, std::string key,
                                       Multiaddr address, size_t lane);
  asio::awaitable<Result<std::shared_ptr<Connection>>> Dial(Multiaddr address, size_t lane);
  // ConnectAny on dial_strand_ (dial_any.cpp).
  asio::awaitable<Result<std::shared_ptr<Connection>>> RaceDials(
      PeerId peer, std::vector<Multiaddr> addrs, size_t lane,
      std::chrono::steady_clock::time_point wait_until);
  HandshakeOptions MakeHandshakeOptions(Role role, std::optional<PeerId> expected,
                                        const std::string& observed) const;
  // Pools `conn` on `lane` and returns the connection that new streams on that lane use: `conn`
  // itself, or, when this peer and `conn`'s dialed each other at once, the one both ends keep
  // (the one the smaller peer id dialed).
  std::shared_ptr<Connection> AddConnection(const std::shared_ptr<Connection>& conn, size_t lane);
  // The peer that dialed `conn`: this one or the other.
  const PeerId& DialedBy(const Connection& conn) const;
  void OnConnectionClosed(Connection* conn);
  StreamHandler LookupHandler(const std::string& method) const;
  asio::awaitable<Result<Message>> ServeDialback(CallContext& ctx, Message request);
  void RegisterStream(const std::string& method, StreamHandler handler);
  // Hole punching (punch.cpp): the side that a relayed connection reached starts it; the side
  // that dialed through the relay serves "net.punch". Both end in FinishPunch (on the port's
  // strand), which connects, runs the handshake and pools the direct connection.
  asio::awaitable<void> PunchThroughRelay(std::shared_ptr<Connection> relayed);
  asio::awaitable<Status> ServePunch(CallContext& ctx);
  struct PunchPort;
  asio::awaitable<void> FinishPunch(std::shared_ptr<PunchPort> port, asio::ip::tcp::endpoint target,
                                    Role role, PeerId peer);
  // Marks `peer` as being punched to; false when a punch to it is already running.
  bool BeginPunch(const PeerId& peer);
  void EndPunch(const PeerId& peer);
  std::chrono::milliseconds TimeoutFor(const CallOptions& options) const;

  KeyPair identity_;
  HostOptions options_;
  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::vector<std::thread> threads_;
  std::vector<std::shared_ptr<asio::ip::tcp::acceptor>> acceptors_;
  std::vector<Multiaddr> bound_;
  bool started_ = false;
  bool shut_down_ = false;

  mutable std::mutex mu_;
  // Open connections per peer; index = lane. Null entries are free lanes.
  std::unordered_map<PeerId, std::vector<std::shared_ptr<Connection>>> pool_;
  std::unordered_map<PeerId, std::string> blocked_;  // Block(); at most kMaxBlockedPeers
  AccessRefusals refusals_;
  std::unordered_map<std::string, StreamHandler> handlers_;
  // Dials in progress, so that concurrent calls to one peer share one connection. Touched only
  // on dial_strand_.
  Strand dial_strand_;
  std::unordered_map<std::string, std::shared_ptr<PendingDial>> pending_dials_;
  // Peer ids learned by dialing addresses given without /p2p/ (guarded by mu_).
  std::unordered_map<std::string, PeerId> peer_at_address_;
  PeerAddressBook peer_addresses_;  // SetPeerAddresses (guarded by mu_)
  ObservedAddressBook observed_;
  size_t connection_count_ = 0;
  // Inbound slots by source IP address (guarded by mu_).
  struct InboundAddress {
    size_t handshakes = 0;
    std::vector<std::weak_ptr<Connection>> open;
  };
  std::unordered_map<std::string, InboundAddress> inbound_;
  // Handshakes started per source address (HostOptions::handshakes_per_second_per_address;
  // guarded by mu_; unset when there is no limit).
  std::optional<TokenBuckets> handshake_rate_;
  std::unordered_map<const Connection*, std::string> inbound_address_of_;
  // The memory budgets of each source address's connections, shared by them and freed with the
  // last (guarded by mu_; expired entries are swept as the map grows).
  struct AddressBudgets {
    std::weak_ptr<ByteBudget> replies, received;
  };
  std::unordered_map<std::string, AddressBudgets> address_budgets_;
  size_t budget_sweep_at_ = 0;  // sweep expired entries when the map grows past this
  // options_.connection with the budgets of source address `key` ("": exempt). Takes mu_.
  ConnectionOptions ConnectionOptionsFor(const std::string& key);
  // The key of connections relayed by the relay at `relay_ip`: every peer behind one relay
  // shares one address's budgets (we cannot see their addresses; identities are free).
  std::string RelayedKey(const asio::ip::address& relay_ip) const;
  SlotRefusals slot_refusals_;
  std::condition_variable all_closed_;
  size_t dialbacks_in_flight_ = 0;       // net.dialback probes running (guarded by mu_)
  std::unordered_set<PeerId> punching_;  // peers a hole punch runs to (guarded by mu_)
  uint64_t closed_bytes_sent_ = 0, closed_bytes_received_ = 0;
};

}  // namespace colony::net
