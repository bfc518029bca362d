#include "net/dial_targets.h"

namespace colony::net {

bool IsPrivateAddress(const asio::ip::address& ip) {
  if (ip.is_v4()) {
    const auto b = ip.to_v4().to_bytes();
    return b[0] == 10 || (b[0] == 172 && (b[1] & 0xF0) == 16) || (b[0] == 192 && b[1] == 168) ||
           (b[0] == 100 && (b[1] & 0xC0) == 64);
  }
  return (ip.to_v6().to_bytes()[0] & 0xFE) == 0xFC;
}

bool DialTargetAllowed(const asio::ip::address& target, const asio::ip::address& reference) {
  if (target.is_v4() != reference.is_v4()) return false;
  if (target.is_unspecified() || target.is_multicast()) return false;
  if (target.is_v4()) {
    const auto b = target.to_v4().to_bytes();
    if (b[0] == 255 || (b[0] == 169 && b[1] == 254)) return false;
  } else if (target.to_v6().is_link_local() || target.to_v6().is_v4_mapped()) {
    return false;
  }
  if (target.is_loopback()) return reference.is_loopback();
  if (IsPrivateAddress(target)) return reference.is_loopback() || IsPrivateAddress(reference);
  return true;
}

}  // namespace colony::net
