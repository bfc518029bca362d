// Circuit relays: how peers behind NAT (no port forwarding) accept connections.
//
// A public peer runs a Relay. A peer behind NAT holds a RelayReservation with it: an ordinary
// outbound, authenticated connection to the relay carrying a `relay.reserve` stream. It then
// announces the relayed address
//     /ip4/<relay>/tcp/<circuit port>/p2p/<relay id>/p2p-circuit/p2p/<its id>
// and a peer that dials it (Host::Connect does this by itself for /p2p-circuit addresses):
//   1. opens a TCP connection to the relay's circuit port and asks for the peer (relay_wire.h);
//   2. the relay tells the reserved peer over its reservation stream (a circuit id and a one-time
//      token); the reserved peer opens its own TCP connection to the circuit port and presents
//      them (so nobody else can take the circuit);
//   3. the relay answers OK to both and from then on copies bytes between the two sockets;
//   4. the two peers run the normal secure handshake through it, end to end: the dialer checks
//      the reserved peer's identity, the relay sees only ciphertext and cannot forge a byte.
// Limits per relay: reservations (in all and per source address), circuits (in all, per reserved
// peer, per source address, and how fast one address opens them), bytes per second per circuit
// and in all, how long a reserved peer may take to answer, and how long a circuit may stay
// silent or half-closed.
//
// The relay splices TCP sockets rather than tunnelling streams of its own connections: the
// relayed connection is then an ordinary Connection on both ends (flow control, keepalive,
// encryption unchanged), and relaying costs the relay one copy per byte and no crypto.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "core/identity.h"
#include "core/multiaddr.h"
#include "core/status.h"
#include "net/host.h"

namespace colony::net {

inline constexpr char kRelayReserveMethod[] = "relay.reserve";

struct RelayOptions {
  // The circuit port (port 0: any free port).
  Multiaddr listen = Multiaddr(Multiaddr::HostKind::kIp4, "0.0.0.0", 0);
  size_t max_reservations = 128;
  size_t max_circuits = 64;          // open or being set up, in all
  size_t max_circuits_per_peer = 8;  // per reserved peer
  double max_circuit_rate = 0;       // bytes per second per circuit and direction (0: unlimited)
  double max_total_rate = 0;         // bytes per second over every circuit (0: unlimited)
  // How long a reserved peer may take to come for a circuit, and a dialer to send its request.
  std::chrono::milliseconds accept_timeout{10'000};
  // A reservation lasts this long; holders renew it (RelayReservation does).
  std::chrono::milliseconds reservation_ttl{30 * 60 * 1000};
  // What one source IP address may hold (identities are free; addresses are not): reservations,
  // and sockets on the circuit port (sending their request, waiting for the reserved peer, or
  // spliced). A swarm on one machine shares 127.0.0.1, so loopback is exempt unless
  // limit_loopback_addresses is set.
  size_t max_reservations_per_address = 8;
  size_t max_circuit_sockets_per_address = 32;
  // Circuits one source address may ask for: circuit_burst_per_address at once, then
  // circuits_per_second_per_address on average (a token bucket; 0 per second: no limit). Each
  // circuit costs the reserved peer a connection back to the relay and a handshake, so an
  // address opening them in a loop would keep that peer's I/O thread busy as a public host's
  // handshake rate (HostOptions::handshakes_per_second_per_address) keeps it from doing directly.
  double circuits_per_second_per_address = 20;
  double circuit_burst_per_address = 64;
  bool limit_loopback_addresses = false;
  // A circuit that carried no byte either way for this long is closed (a Colony connection pings
  // every 15 s when idle, so only a silent or dead one is), and so is one that one side
  // half-closed and the other did not follow within half_closed_timeout.
  std::chrono::milliseconds circuit_idle_timeout{120'000};
  std::chrono::milliseconds half_closed_timeout{10'000};
};

struct RelayStats {
  size_t reservations = 0;
  size_t circuits = 0;          // open now
  uint64_t circuits_total = 0;  // established since start
  uint64_t rejected = 0;        // requests refused (no reservation, limits, bad token, timeouts)
  uint64_t rate_refused = 0;    // of them, circuits refused for their address's rate
  uint64_t reclaimed = 0;       // circuits closed for silence or a half-close left hanging
  uint64_t bytes_relayed = 0;
};

// The relay service of a public peer, on top of its host (which serves `relay.reserve`).
class Relay {
 public:
  static Result<std::unique_ptr<Relay>> Start(Host& host, RelayOptions options = {});
  ~Relay();  // closes the circuit port, every circuit and every reservation
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  // The circuit port's address with /p2p/<relay id> (wildcard binds shown as loopback).
  Multiaddr address() const;
  RelayStats stats() const;

  struct Impl;

 private:
  explicit Relay(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

// A reservation held with one relay by a peer that cannot accept connections itself; circuits
// that arrive through it become ordinary incoming connections of the host. Renews itself, and
// reconnects (with backoff) when the relay goes away.
class RelayReservation {
 public:
  // `relay`: the relay peer's address (its host's listen address, with /p2p/<id>). Returns once
  // the relay has granted the first reservation, or with the relay's refusal or a timeout.
  static Result<std::unique_ptr<RelayReservation>> Start(
      Host& host, Multiaddr relay,
      std::chrono::milliseconds timeout = std::chrono::milliseconds(10'000));
  ~RelayReservation();
  RelayReservation(const RelayReservation&) = delete;
  RelayReservation& operator=(const RelayReservation&) = delete;

  // How others reach this host: .../p2p/<relay>/p2p-circuit/p2p/<this host>.
  Multiaddr address() const;
  // Whether the reservation is held right now.
  bool active() const;
  // Circuits accepted through the relay so far.
  uint64_t circuits_accepted() const;

  struct Impl;

 private:
  explicit RelayReservation(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

// Dialer side of step 1 on a connected socket: asks the relay for `target` and waits for its
// answer. The caller bounds it with a deadline (by closing the socket).
asio::awaitable<Status> RequestCircuit(asio::ip::tcp::socket& socket, const PeerId& target,
                                       const std::string& relay_desc);

}  // namespace colony::net
