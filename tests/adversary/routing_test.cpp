// Routing-table slots (issue 15, part 5; the eclipse attack of docs/security.md), through real
// sockets: identities are free, so one machine pings a DHT node with many of them, each claiming
// to serve the DHT, to fill the buckets its lookups and its find replies draw from. The node keeps
// at most max_contacts_per_address_per_bucket contacts reached at one address in each bucket;
// peers from other addresses still enter. The node applies its per-address caps to loopback here,
// so that 127.0.0.2 plays the attacker's machine and 127.0.0.3-5 honest ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "adversary/hostile_peer.h"
#include "dht/node.h"
#include "dht/wire.h"
#include "test_support.h"

namespace colony::dht {
namespace {

using test::DialingFrom;
using test::HostilePeer;

// A dht.ping from `peer` that says it serves the DHT at `addr`: a node that answers puts the
// sender in its routing table.
Status PingAsServer(HostilePeer& peer, const Multiaddr& victim, const std::string& addr) {
  PingRequest request;
  request.sender = {.client_mode = false, .addrs = {addr}};
  request.wall_time = Now();
  return peer.host()
      .CallSync(victim, "dht.ping", net::Message(EncodePingRequest(request)))
      .status();
}

TEST(EclipseAttack, ManyIdentitiesFromOneAddressGetTwoContactsPerBucket) {
  NodeOptions o;
  o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  o.host.limit_loopback_addresses = true;
  KeyPair victim_key = KeyPair::Generate();
  const DhtId self = DhtId::ForPeer(victim_key.peer_id());
  auto victim = Node::Start(std::move(victim_key), o);
  ASSERT_TRUE(victim.ok()) << victim.status().ToString();
  const Multiaddr at = (*victim)->VisibleAddresses().at(0);
  const size_t cap = o.dht.max_contacts_per_address_per_bucket;
  ASSERT_EQ(cap, 2u);

  // 40 identities from one address, each kept connected (a contact whose connection closed is
  // not added). Expected, counted apart: per bucket, min(cap, identities in it).
  std::vector<std::unique_ptr<HostilePeer>> sybils;
  std::map<size_t, size_t> per_bucket;
  size_t expected = 0;
  for (int i = 0; i < 40; ++i) {
    sybils.push_back(std::make_unique<HostilePeer>(DialingFrom("127.0.0.2")));
    HostilePeer& sybil = *sybils.back();
    ASSERT_TRUE(sybil.start_error().ok()) << sybil.start_error().ToString();
    ASSERT_TRUE(PingAsServer(sybil, at, "/ip4/127.0.0.2/tcp/4001").ok());
    const size_t bucket = std::min(self.CommonPrefixBits(DhtId::ForPeer(sybil.id())), kIdBits - 1);
    if (per_bucket[bucket] < cap) ++per_bucket[bucket], ++expected;
  }
  std::printf("40 identities from one address hold %zu routing-table slots in %zu buckets\n",
              (*victim)->RoutingTableSize(), per_bucket.size());
  EXPECT_EQ((*victim)->RoutingTableSize(), expected);
  EXPECT_LT(expected, 40u);  // without the cap each bucket takes up to k = 20 of them
  EXPECT_EQ((*victim)->Stats().contacts_refused_for_address, 40 - expected);

  // Honest peers, one per address, still enter, also in the buckets the attacker filled.
  std::vector<std::unique_ptr<HostilePeer>> honest;
  for (int i = 3; i <= 5; ++i) {
    const std::string ip = "127.0.0." + std::to_string(i);
    honest.push_back(std::make_unique<HostilePeer>(DialingFrom(ip)));
    ASSERT_TRUE(honest.back()->start_error().ok());
    ASSERT_TRUE(PingAsServer(*honest.back(), at, "/ip4/" + ip + "/tcp/4001").ok());
  }
  const auto known = (*victim)->KnownPeers();
  EXPECT_EQ(known.size(), expected + honest.size());
  for (const auto& h : honest) {
    EXPECT_TRUE(std::any_of(known.begin(), known.end(),
                            [&](const Contact& c) { return c.peer == h->id(); }))
        << "honest peer " << h->id().Short() << " is not in the routing table";
  }
  (*victim)->Shutdown();
}

}  // namespace
}  // namespace colony::dht
