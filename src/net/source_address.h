// The address a remote peer is counted under by the caps per source address (connections and
// handshakes at a host, reservations and circuits at a relay, inference sessions at a block
// server): identities are free to create, addresses are not.
//
//   const std::string key = net::SourceKey(ip, options.limit_loopback_addresses);
//   if (!key.empty() && held[key] >= cap) return ResourceExhausted(...);
#pragma once

#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <string>

#include "core/multiaddr.h"

namespace colony::net {

class CallContext;

// An IPv4 peer on a dual-stack listener (::ffff:a.b.c.d) as its IPv4 address; others unchanged.
asio::ip::address Unmapped(const asio::ip::address& ip);

// The key `ip` is capped under, or "" when it is exempt: loopback, unless `limit_loopback` (a
// swarm on one machine shares 127.0.0.1; tests play a second machine from 127.0.0.2 with the caps
// applied). An IPv4 address (also one mapped into IPv6) is its own key; an IPv6 address counts
// under its /64 ("2001:db8:1:2::/64"), what one subscriber is handed, except a link-local one
// (fe80::/10, whose /64 every host on a link shares), which is its own key.
std::string SourceKey(const asio::ip::address& ip, bool limit_loopback);
// The same for an address in text; "" also when it does not parse.
std::string SourceKey(const std::string& ip_text, bool limit_loopback);

// The key the caller of `ctx` is capped under: its source address's key, or, for a caller that
// came through a relay (which caps circuits per source address itself), "relayed <peer id>".
std::string SourceKey(const CallContext& ctx, bool limit_loopback);

// `ep` as an /ip4/ or /ip6/ multiaddr, unmapped.
Multiaddr EndpointAddress(const asio::ip::tcp::endpoint& ep);

}  // namespace colony::net
