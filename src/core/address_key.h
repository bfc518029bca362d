// The key a source address is counted under by caps and rates per address (connections, rates
// and handshakes at the HTTP server and the API's gate, and, through net::SourceKey, at hosts,
// relays and servers): identities are free to create, and so are the 2^64 IPv6 addresses of
// one subscriber's /64.
//
//   const std::string key = SourceAddressKey(address.to_string());
//   if (!key.empty() && open[key] >= cap) refuse();
#pragma once

#include <string>
#include <string_view>

namespace colony {

// An IPv4 address (also one mapped into IPv6, ::ffff:a.b.c.d) is its own key; an IPv6 address
// counts under its /64 ("2001:db8:1:2::/64"), what one subscriber is handed, except loopback
// (::1) and link-local ones (fe80::/10, whose /64 every host on a link shares, kept with their
// "%scope"), which are their own keys. "" when `ip` is not an IP address in text.
std::string SourceAddressKey(std::string_view ip);

}  // namespace colony
