// SourceAddressKey: the key that caps and rates per address count a client under, written out
// for each kind of address by hand (not by the function under test).
#include "core/address_key.h"

#include <gtest/gtest.h>

#include <utility>

namespace colony {
namespace {

TEST(SourceAddressKey, AnIpv6SubscribersSlash64IsOneKeyAndOtherAddressesTheirOwn) {
  const std::pair<const char*, const char*> cases[] = {
      // Every address of one /64, in any spelling, is one key; a scope does not make a global
      // address another client.
      {"2001:db8:1:2::1", "2001:db8:1:2::/64"},
      {"2001:DB8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"},
      {"2001:0db8:0001:0002:0:0:0:9", "2001:db8:1:2::/64"},
      {"2001:db8:1:2::1%3", "2001:db8:1:2::/64"},
      {"2001:db8:1:3::1", "2001:db8:1:3::/64"},
      // Link-local addresses (fe80::/10) share their /64 with the whole link: each is its own
      // key, with its scope; so is loopback.
      {"fe80::1", "fe80::1"},
      {"fe80::1%2", "fe80::1%2"},
      {"febf::7", "febf::7"},
      {"::1", "::1"},
      // IPv4, also mapped into IPv6, is the address itself.
      {"203.0.113.7", "203.0.113.7"},
      {"::ffff:203.0.113.7", "203.0.113.7"},
      {"::FFFF:cb00:7107", "203.0.113.7"},
      {"127.0.0.2", "127.0.0.2"},
      // Not an address: no key.
      {"", ""},
      {"not an address", ""},
      {"203.0.113.7:80", ""},
      {"203.0.113.7%1", ""},
      {"[::1]", ""},
      {"2001:db8::1::2", ""},
      {"1.2.3.256", ""},
  };
  for (const auto& [ip, key] : cases) EXPECT_EQ(SourceAddressKey(ip), key) << ip;
}

}  // namespace
}  // namespace colony
