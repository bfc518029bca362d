// SourceAddressKey: the key that caps and rates per address count a client under, written out
// for each kind of address by hand (not by the function under test).
#include "core/address_key.h"

#include <gtest/gtest.h>

namespace colony {
namespace {

TEST(SourceAddressKey, AnIpv6SubscribersSlash64IsOneKeyAndOtherAddressesTheirOwn) {
  // Every address of one /64, in any spelling, is one key.
  EXPECT_EQ(SourceAddressKey("2001:db8:1:2::1"), "2001:db8:1:2::/64");
  EXPECT_EQ(SourceAddressKey("2001:DB8:1:2:ffff:ffff:ffff:ffff"), "2001:db8:1:2::/64");
  EXPECT_EQ(SourceAddressKey("2001:0db8:0001:0002:0:0:0:9"), "2001:db8:1:2::/64");
  EXPECT_EQ(SourceAddressKey("2001:db8:1:3::1"), "2001:db8:1:3::/64");
  // A scope does not make a global address another client.
  EXPECT_EQ(SourceAddressKey("2001:db8:1:2::1%3"), "2001:db8:1:2::/64");
  // Link-local addresses (fe80::/10) share their /64 with the whole link: each is its own key,
  // with its scope; so is loopback.
  EXPECT_EQ(SourceAddressKey("fe80::1"), "fe80::1");
  EXPECT_EQ(SourceAddressKey("fe80::1%2"), "fe80::1%2");
  EXPECT_EQ(SourceAddressKey("febf::7"), "febf::7");
  EXPECT_EQ(SourceAddressKey("::1"), "::1");
  // IPv4, also mapped into IPv6, is the address itself.
  EXPECT_EQ(SourceAddressKey("203.0.113.7"), "203.0.113.7");
  EXPECT_EQ(SourceAddressKey("::ffff:203.0.113.7"), "203.0.113.7");
  EXPECT_EQ(SourceAddressKey("::FFFF:cb00:7107"), "203.0.113.7");
  EXPECT_EQ(SourceAddressKey("127.0.0.2"), "127.0.0.2");
  // Not an address: no key.
  for (const char* text : {"", "not an address", "203.0.113.7:80", "203.0.113.7%1", "[::1]",
                           "2001:db8::1::2", "1.2.3.256"}) {
    EXPECT_EQ(SourceAddressKey(text), "") << text;
  }
}

}  // namespace
}  // namespace colony
