// Multiaddr-style peer addresses, as printed and accepted by hivemind:
//   /ip4/1.2.3.4/tcp/31337/p2p/12D3KooW…
//   /ip6/::1/tcp/31337
//   /dns/example.org/tcp/31337/p2p/12D3KooW…   (/dns4 and /dns6 restrict the address family)
// The /p2p/ part is optional when listening and required to authenticate the peer when dialing.
// A peer behind NAT is reached through a relay that it holds a reservation with:
//   /ip4/1.2.3.4/tcp/31338/p2p/<relay id>/p2p-circuit/p2p/<peer id>
// host and port are then the relay's circuit port, peer_id() the peer behind it (the one the
// connection authenticates, end to end) and relay_id() the relay.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/identity.h"
#include "core/status.h"

namespace colony {

class Multiaddr {
 public:
  enum class HostKind { kIp4, kIp6, kDns, kDns4, kDns6 };

  Multiaddr() = default;
  Multiaddr(HostKind kind, std::string host, uint16_t port, std::optional<PeerId> peer = {})
      : kind_(kind), host_(std::move(host)), port_(port), peer_(std::move(peer)) {}

  // Parses the text form. Errors say which component is wrong and why.
  static Result<Multiaddr> Parse(std::string_view text);
  // From an IP address literal ("127.0.0.1", "::1") and port.
  static Result<Multiaddr> FromIp(std::string_view ip, uint16_t port,
                                  std::optional<PeerId> peer = {});

  HostKind kind() const { return kind_; }
  bool is_ip() const { return kind_ == HostKind::kIp4 || kind_ == HostKind::kIp6; }
  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }
  const std::optional<PeerId>& peer_id() const { return peer_; }
  // Relayed addresses (/p2p-circuit): the relay's id, when given.
  bool is_relayed() const { return relayed_; }
  const std::optional<PeerId>& relay_id() const { return relay_; }

  Multiaddr WithPeerId(const PeerId& id) const {
    Multiaddr m = *this;
    m.peer_ = id;
    return m;
  }
  Multiaddr WithoutPeerId() const {
    Multiaddr m = *this;
    m.peer_.reset();
    return m;
  }
  Multiaddr WithPort(uint16_t port) const {
    Multiaddr m = *this;
    m.port_ = port;
    return m;
  }
  // This address (a relay's circuit port, with its id if known) as the way to reach `peer`.
  Multiaddr Relaying(const PeerId& peer) const {
    Multiaddr m = *this;
    m.relayed_ = true;
    m.relay_ = relayed_ ? relay_ : peer_;
    m.peer_ = peer;
    return m;
  }

  std::string ToString() const;

  friend bool operator==(const Multiaddr& a, const Multiaddr& b) {
    return a.kind_ == b.kind_ && a.host_ == b.host_ && a.port_ == b.port_ && a.peer_ == b.peer_ &&
           a.relayed_ == b.relayed_ && a.relay_ == b.relay_;
  }

 private:
  HostKind kind_ = HostKind::kIp4;
  std::string host_ = "0.0.0.0";
  uint16_t port_ = 0;
  std::optional<PeerId> peer_;
  bool relayed_ = false;
  std::optional<PeerId> relay_;
};

// The texts that parse, in order (those that do not are left out): a peer's announced addresses.
std::vector<Multiaddr> ParseMultiaddrs(const std::vector<std::string>& texts);

}  // namespace colony
