#include "net/source_address.h"

#include "core/address_key.h"
#include "net/stream.h"

namespace colony::net {

asio::ip::address Unmapped(const asio::ip::address& ip) {
  if (ip.is_v6() && ip.to_v6().is_v4_mapped()) {
    return asio::ip::make_address_v4(asio::ip::v4_mapped, ip.to_v6());
  }
  return ip;
}

std::string SourceKey(const asio::ip::address& ip, bool limit_loopback) {
  if (Unmapped(ip).is_loopback() && !limit_loopback) return {};
  // One IPv6 subscriber (a home, a VM) gets a /64 or more: 2^64 addresses cost it nothing.
  return SourceAddressKey(ip.to_string());
}

std::string SourceKey(const std::string& ip_text, bool limit_loopback) {
  std::error_code ec;
  const auto ip = asio::ip::make_address(ip_text, ec);
  if (ec) return {};
  return SourceKey(ip, limit_loopback);
}

std::string SourceKey(const CallContext& ctx, bool limit_loopback) {
  const Multiaddr remote = ctx.remote_address();
  if (remote.is_relayed()) return "relayed " + ctx.peer().ToString();
  return SourceKey(remote.host(), limit_loopback);
}

Multiaddr EndpointAddress(const asio::ip::tcp::endpoint& ep) {
  const asio::ip::address addr = Unmapped(ep.address());
  return Multiaddr(addr.is_v4() ? Multiaddr::HostKind::kIp4 : Multiaddr::HostKind::kIp6,
                   addr.to_string(), ep.port());
}

}  // namespace colony::net
