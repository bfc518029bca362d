#include "core/multiaddr.h"

#include <gtest/gtest.h>

#include <string>

namespace colony {
namespace {

using HostKind = Multiaddr::HostKind;

PeerId TestPeer(uint8_t fill = 5) { return KeyPair::FromSeed(Bytes(32, fill)).peer_id(); }

Multiaddr MustParse(std::string_view text) {
  auto r = Multiaddr::Parse(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().ToString();
  return r.ok() ? *r : Multiaddr();
}

// Expects Parse(text) to fail with InvalidArgument and a message containing `fragment`.
void ExpectRejected(std::string_view text, std::string_view fragment) {
  auto r = Multiaddr::Parse(text);
  ASSERT_FALSE(r.ok()) << "accepted: " << text << " as " << r->ToString();
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(fragment), std::string::npos)
      << "input: " << text << "\nmessage: " << r.status().message()
      << "\nexpected fragment: " << fragment;
}

TEST(MultiaddrTest, ParsesIp4Tcp) {
  Multiaddr a = MustParse("/ip4/1.2.3.4/tcp/31337");
  EXPECT_EQ(a.kind(), HostKind::kIp4);
  EXPECT_TRUE(a.is_ip());
  EXPECT_EQ(a.host(), "1.2.3.4");
  EXPECT_EQ(a.port(), 31337);
  EXPECT_FALSE(a.peer_id().has_value());
  EXPECT_EQ(a.ToString(), "/ip4/1.2.3.4/tcp/31337");
}

TEST(MultiaddrTest, ParsesPortBounds) {
  EXPECT_EQ(MustParse("/ip4/0.0.0.0/tcp/0").port(), 0);
  EXPECT_EQ(MustParse("/ip4/255.255.255.255/tcp/65535").port(), 65535);
}

TEST(MultiaddrTest, ParsesPeerId) {
  PeerId peer = TestPeer();
  std::string text = "/ip4/10.0.0.1/tcp/4001/p2p/" + peer.ToString();
  Multiaddr a = MustParse(text);
  ASSERT_TRUE(a.peer_id().has_value());
  EXPECT_EQ(*a.peer_id(), peer);
  EXPECT_EQ(a.port(), 4001);
  EXPECT_EQ(a.ToString(), text);
}

TEST(MultiaddrTest, AcceptsLegacyIpfsComponentAndPrintsP2p) {
  PeerId peer = TestPeer();
  Multiaddr a = MustParse("/ip4/10.0.0.1/tcp/4001/ipfs/" + peer.ToString());
  ASSERT_TRUE(a.peer_id().has_value());
  EXPECT_EQ(*a.peer_id(), peer);
  EXPECT_EQ(a.ToString(), "/ip4/10.0.0.1/tcp/4001/p2p/" + peer.ToString());
}

TEST(MultiaddrTest, ParsesIp6InCanonicalForm) {
  Multiaddr a = MustParse("/ip6/::1/tcp/8080");
  EXPECT_EQ(a.kind(), HostKind::kIp6);
  EXPECT_TRUE(a.is_ip());
  EXPECT_EQ(a.host(), "::1");
  EXPECT_EQ(a.ToString(), "/ip6/::1/tcp/8080");

  Multiaddr b = MustParse("/ip6/0:0:0:0:0:0:0:1/tcp/8080");
  EXPECT_EQ(b.host(), "::1");
  EXPECT_EQ(a, b);

  Multiaddr c = MustParse("/ip6/2001:DB8:0:0:0:0:0:0001/tcp/1");
  EXPECT_EQ(c.host(), "2001:db8::1");
  EXPECT_EQ(c.ToString(), "/ip6/2001:db8::1/tcp/1");
}

TEST(MultiaddrTest, ParsesDnsNames) {
  Multiaddr a = MustParse("/dns/example.org/tcp/443");
  EXPECT_EQ(a.kind(), HostKind::kDns);
  EXPECT_FALSE(a.is_ip());
  EXPECT_EQ(a.host(), "example.org");
  EXPECT_EQ(a.port(), 443);
  EXPECT_EQ(a.ToString(), "/dns/example.org/tcp/443");

  Multiaddr b = MustParse("/dns4/bootstrap-1.colony.example/tcp/31337");
  EXPECT_EQ(b.kind(), HostKind::kDns4);
  EXPECT_EQ(b.ToString(), "/dns4/bootstrap-1.colony.example/tcp/31337");

  Multiaddr c = MustParse("/dns6/localhost/tcp/1");
  EXPECT_EQ(c.kind(), HostKind::kDns6);
  EXPECT_EQ(c.host(), "localhost");
  EXPECT_EQ(c.ToString(), "/dns6/localhost/tcp/1");

  PeerId peer = TestPeer();
  Multiaddr d = MustParse("/dns/example.org/tcp/31337/p2p/" + peer.ToString());
  ASSERT_TRUE(d.peer_id().has_value());
  EXPECT_EQ(*d.peer_id(), peer);
}

TEST(MultiaddrTest, ToleratesOneTrailingSlash) {
  EXPECT_EQ(MustParse("/ip4/1.2.3.4/tcp/5/"), MustParse("/ip4/1.2.3.4/tcp/5"));
}

TEST(MultiaddrTest, RoundTripsThroughToString) {
  PeerId peer = TestPeer();
  for (std::string text :
       {std::string("/ip4/127.0.0.1/tcp/1"), std::string("/ip6/fe80::1/tcp/2"),
        std::string("/ip6/::ffff:1.2.3.4/tcp/3"), std::string("/dns/a.b.c/tcp/4"),
        std::string("/dns4/x/tcp/5"), std::string("/dns6/y.z/tcp/65535"),
        "/ip4/8.8.8.8/tcp/53/p2p/" + peer.ToString(), "/ip6/::/tcp/0/p2p/" + peer.ToString()}) {
    Multiaddr a = MustParse(text);
    EXPECT_EQ(a.ToString(), text);
    auto again = Multiaddr::Parse(a.ToString());
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(*again, a);
  }
}

TEST(MultiaddrTest, EqualityLooksAtEveryField) {
  PeerId peer = TestPeer();
  Multiaddr a(HostKind::kIp4, "1.2.3.4", 5);
  EXPECT_EQ(a, Multiaddr(HostKind::kIp4, "1.2.3.4", 5));
  EXPECT_FALSE(a == Multiaddr(HostKind::kDns, "1.2.3.4", 5));
  EXPECT_FALSE(a == Multiaddr(HostKind::kIp4, "1.2.3.5", 5));
  EXPECT_FALSE(a == a.WithPort(6));
  EXPECT_FALSE(a == a.WithPeerId(peer));
  EXPECT_EQ(a.WithPeerId(peer).WithoutPeerId(), a);
  EXPECT_EQ(a.WithPeerId(peer).peer_id(), peer);
  EXPECT_EQ(a.WithPort(6).port(), 6);
}

TEST(MultiaddrTest, RejectsEmpty) { ExpectRejected("", "empty"); }

TEST(MultiaddrTest, RejectsMissingLeadingSlash) {
  ExpectRejected("ip4/1.2.3.4/tcp/1", "must start with '/'");
  ExpectRejected("1.2.3.4:31337", "must start with '/'");
}

TEST(MultiaddrTest, RejectsBadIpAddresses) {
  ExpectRejected("/ip4/1.2.3/tcp/1", "'1.2.3' is not an IPv4 address");
  ExpectRejected("/ip4/256.1.1.1/tcp/1", "not an IPv4 address");
  ExpectRejected("/ip4/::1/tcp/1", "not an IPv4 address");
  ExpectRejected("/ip4/localhost/tcp/1", "not an IPv4 address");
  ExpectRejected("/ip6/1.2.3.4/tcp/1", "'1.2.3.4' is not an IPv6 address");
  ExpectRejected("/ip6/:::1/tcp/1", "not an IPv6 address");
  ExpectRejected("/ip6/fe80::1%eth0/tcp/1", "not an IPv6 address");
}

TEST(MultiaddrTest, RejectsHostsWithEmbeddedNul) {
  // inet_pton stops at a NUL; the text after it must not be smuggled into host().
  ExpectRejected(std::string_view("/ip4/1.2.3.4\0evil/tcp/1", 23), "host contains a NUL");
  ExpectRejected(std::string_view("/ip6/::1\0evil/tcp/1", 19), "host contains a NUL");
  ExpectRejected(std::string_view("/dns/a\0b/tcp/1", 14), "host contains a NUL");
}

TEST(MultiaddrTest, RejectsBadDnsNames) {
  ExpectRejected("/dns/exa mple.org/tcp/1", "not a valid DNS name");
  ExpectRejected("/dns/a..b/tcp/1", "not a valid DNS name");
  ExpectRejected("/dns/.a/tcp/1", "not a valid DNS name");
  ExpectRejected("/dns4/" + std::string(64, 'a') + ".org/tcp/1", "not a valid DNS name");
  ExpectRejected("/dns6/" + std::string(254, 'a') + "/tcp/1", "not a valid DNS name");
}

TEST(MultiaddrTest, RejectsEmptyHost) { ExpectRejected("/ip4//tcp/1", "empty host"); }

TEST(MultiaddrTest, RejectsBadPorts) {
  ExpectRejected("/ip4/1.2.3.4/tcp/65536", "port '65536'");
  ExpectRejected("/ip4/1.2.3.4/tcp/99999999999999999999", "port '99999999999999999999'");
  ExpectRejected("/ip4/1.2.3.4/tcp/01", "port '01'");
  ExpectRejected("/ip4/1.2.3.4/tcp/00", "port '00'");
  ExpectRejected("/ip4/1.2.3.4/tcp/abc", "port 'abc'");
  ExpectRejected("/ip4/1.2.3.4/tcp/-1", "port '-1'");
  ExpectRejected("/ip4/1.2.3.4/tcp/+1", "port '+1'");
  ExpectRejected("/ip4/1.2.3.4/tcp/1x", "port '1x'");
  ExpectRejected("/ip4/1.2.3.4/tcp/ 1", "port ' 1'");
  ExpectRejected("/ip4/1.2.3.4/tcp//", "port ''");
}

TEST(MultiaddrTest, RejectsUnknownProtocols) {
  ExpectRejected("/foo/bar/tcp/1", "unsupported protocol '/foo'");
  ExpectRejected("/unix/tmp/tcp/1", "unsupported protocol '/unix'");
  ExpectRejected("/IP4/1.2.3.4/tcp/1", "unsupported protocol '/IP4'");
}

TEST(MultiaddrTest, RejectsOtherTransports) {
  ExpectRejected("/ip4/1.2.3.4/udp/1", "transport /udp is not supported");
  ExpectRejected("/ip4/1.2.3.4/udp/1/quic-v1", "transport /udp is not supported");
  ExpectRejected("/ip4/1.2.3.4/quic/1", "transport /quic is not supported");
  ExpectRejected("/ip4/1.2.3.4/sctp/1", "expected /tcp/<port>");
}

TEST(MultiaddrTest, RejectsMissingPort) {
  ExpectRejected("/ip4/1.2.3.4", "/tcp/<port>");
  ExpectRejected("/ip4/1.2.3.4/tcp", "/tcp/<port>");
  ExpectRejected("/ip4/1.2.3.4/tcp/", "/tcp/<port>");
  ExpectRejected("/", "/tcp/<port>");
}

TEST(MultiaddrTest, RejectsTrailingGarbage) {
  PeerId peer = TestPeer();
  ExpectRejected("/ip4/1.2.3.4/tcp/1/ws", "unexpected component '/ws'");
  ExpectRejected("/ip4/1.2.3.4/tcp/1/p2p/" + peer.ToString() + "/x",
                 "unexpected trailing component '/x'");
  ExpectRejected("/ip4/1.2.3.4/tcp/1//", "unexpected component '/'");
}

TEST(MultiaddrTest, RejectsBadPeerIds) {
  ExpectRejected("/ip4/1.2.3.4/tcp/1/p2p/notapeerid0", "invalid base58 character '0'");
  ExpectRejected("/ip4/1.2.3.4/tcp/1/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N",
                 "SHA-256");
  ExpectRejected("/ip4/1.2.3.4/tcp/1/p2p/abc", "not an Ed25519");
}

TEST(MultiaddrTest, RejectsP2pWithoutId) {
  ExpectRejected("/ip4/1.2.3.4/tcp/1/p2p", "/p2p/ must be followed by a peer id");
  ExpectRejected("/ip4/1.2.3.4/tcp/1/p2p/", "/p2p/ must be followed by a peer id");
}

TEST(MultiaddrTest, RejectsOverlongText) {
  std::string text = "/dns/" + std::string(1100, 'a') + "/tcp/1";
  ExpectRejected(text, "longer than 1024");
  // The message quotes a bounded prefix of the input, not all of it.
  auto r = Multiaddr::Parse(text);
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.status().message().size(), 600u);
}

TEST(MultiaddrTest, ErrorsShowTheInputAndAnExample) {
  auto r = Multiaddr::Parse("/ip4/1.2.3.4/tcp/x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'/ip4/1.2.3.4/tcp/x'"), std::string::npos);
  EXPECT_NE(r.status().message().find("expected e.g. /ip4/"), std::string::npos);
}

TEST(MultiaddrTest, FromIpV4) {
  auto a = Multiaddr::FromIp("127.0.0.1", 31337);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->kind(), HostKind::kIp4);
  EXPECT_EQ(a->ToString(), "/ip4/127.0.0.1/tcp/31337");
}

TEST(MultiaddrTest, FromIpV6IsCanonical) {
  auto a = Multiaddr::FromIp("0:0:0:0:0:0:0:1", 80);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kind(), HostKind::kIp6);
  EXPECT_EQ(a->ToString(), "/ip6/::1/tcp/80");
  auto b = Multiaddr::FromIp("FE80:0000::0001", 80);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host(), "fe80::1");
}

TEST(MultiaddrTest, FromIpMapsIpv4MappedIpv6ToIp4) {
  auto a = Multiaddr::FromIp("::ffff:10.1.2.3", 9000);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kind(), HostKind::kIp4);
  EXPECT_EQ(a->host(), "10.1.2.3");
  EXPECT_EQ(a->ToString(), "/ip4/10.1.2.3/tcp/9000");
  auto b = Multiaddr::FromIp("::FFFF:0a01:0203", 9000);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, *b);
}

TEST(MultiaddrTest, FromIpKeepsThePeerId) {
  PeerId peer = TestPeer();
  auto a = Multiaddr::FromIp("1.2.3.4", 1, peer);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->peer_id(), peer);
  EXPECT_EQ(a->ToString(), "/ip4/1.2.3.4/tcp/1/p2p/" + peer.ToString());
  auto parsed = Multiaddr::Parse(a->ToString());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, *a);
}

TEST(MultiaddrTest, FromIpRejectsNonIps) {
  for (std::string_view bad : {"", "localhost", "1.2.3", "::g", "1.2.3.4:80"}) {
    auto r = Multiaddr::FromIp(bad, 1);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("not an IPv4 or IPv6 address"), std::string::npos);
  }
  auto nul = Multiaddr::FromIp(std::string_view("127.0.0.1\0x", 11), 1);
  EXPECT_FALSE(nul.ok());
}

TEST(MultiaddrTest, RelayedAddressesRoundTrip) {
  const PeerId relay = TestPeer(7);
  const PeerId peer = TestPeer(9);
  const std::string text =
      "/ip4/1.2.3.4/tcp/4002/p2p/" + relay.ToString() + "/p2p-circuit/p2p/" + peer.ToString();
  Multiaddr a = MustParse(text);
  EXPECT_TRUE(a.is_relayed());
  EXPECT_EQ(a.relay_id(), relay);
  EXPECT_EQ(a.peer_id(), peer);
  EXPECT_EQ(a.host(), "1.2.3.4");
  EXPECT_EQ(a.port(), 4002);
  EXPECT_EQ(a.ToString(), text);
  // Built from the relay's address, the same.
  EXPECT_EQ(MustParse("/ip4/1.2.3.4/tcp/4002/p2p/" + relay.ToString()).Relaying(peer), a);
  // Without the relay's id.
  Multiaddr anonymous = MustParse("/ip4/1.2.3.4/tcp/4002/p2p-circuit/p2p/" + peer.ToString());
  EXPECT_TRUE(anonymous.is_relayed());
  EXPECT_FALSE(anonymous.relay_id().has_value());
  EXPECT_EQ(anonymous.peer_id(), peer);
  EXPECT_NE(anonymous, a);
  EXPECT_FALSE(MustParse("/ip4/1.2.3.4/tcp/4002/p2p/" + peer.ToString()).is_relayed());
  // The peer behind the relay is required; nothing may follow it.
  for (const std::string& bad :
       {std::string("/ip4/1.2.3.4/tcp/4002/p2p-circuit"),
        "/ip4/1.2.3.4/tcp/4002/p2p/" + relay.ToString() + "/p2p-circuit",
        "/ip4/1.2.3.4/tcp/4002/p2p-circuit/p2p-circuit/p2p/" + peer.ToString(),
        "/ip4/1.2.3.4/tcp/4002/p2p-circuit/p2p/" + peer.ToString() + "/p2p-circuit"}) {
    EXPECT_FALSE(Multiaddr::Parse(bad).ok()) << bad;
  }
}

TEST(MultiaddrTest, DefaultAddress) {
  Multiaddr a;
  EXPECT_EQ(a.ToString(), "/ip4/0.0.0.0/tcp/0");
}

}  // namespace
}  // namespace colony
