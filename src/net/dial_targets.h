// Which addresses a remote peer may make this host dial: hole-punch targets (punch.cpp), the next
// server a block server pushes its outputs to (serve.push), and the like. Never unspecified,
// multicast, broadcast or link-local addresses; loopback only when `reference` (the relay the
// peer came through, or the address its request came from) is loopback too; private ranges
// (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7) only when `reference` is private or
// loopback. A swarm on one machine or one LAN keeps working, and a stranger on the Internet
// cannot aim this host's dials at services on its machine or network.
//
//   if (!DialTargetAllowed(target_ip, caller_ip)) return PermissionDenied(...);
#pragma once

#include <asio/ip/address.hpp>

namespace colony::net {

// 10/8, 172.16/12, 192.168/16, 100.64/10 (carrier-grade NAT) and fc00::/7.
bool IsPrivateAddress(const asio::ip::address& ip);

bool DialTargetAllowed(const asio::ip::address& target, const asio::ip::address& reference);

}  // namespace colony::net
