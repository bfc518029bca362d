// Multiaddr-style peer addresses, as printed and accepted by hivemind:
//   /ip4/1.2.3.4/tcp/31337/p2p/12D3KooW…
//   /ip6/::1/tcp/31337
//   /dns/example.org/tcp/31337/p2p/12D3KooW…   (/dns4 and /dns6 restrict the address family)
// The /p2p/ part is optional when listening and required to authenticate the peer when dialing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

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

  Multiaddr WithPeerId(const PeerId& id) const { return {kind_, host_, port_, id}; }
  Multiaddr WithoutPeerId() const { return {kind_, host_, port_, std::nullopt}; }
  Multiaddr WithPort(uint16_t port) const { return {kind_, host_, port, peer_}; }

  std::string ToString() const;

  friend bool operator==(const Multiaddr& a, const Multiaddr& b) {
    return a.kind_ == b.kind_ && a.host_ == b.host_ && a.port_ == b.port_ && a.peer_ == b.peer_;
  }

 private:
  HostKind kind_ = HostKind::kIp4;
  std::string host_ = "0.0.0.0";
  uint16_t port_ = 0;
  std::optional<PeerId> peer_;
};

}  // namespace colony
