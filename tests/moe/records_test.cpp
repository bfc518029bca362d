// Expert ids, grid patterns and the experts' DHT entries: what parses, what is refused and why,
// and the DHT rule that keeps each server to its own entries.
#include <gtest/gtest.h>

#include <set>

#include "dht/validation.h"
#include "moe/expert_records.h"
#include "moe/expert_uid.h"

namespace colony::moe {
namespace {

TEST(ExpertUid, ParsesPrintsAndNamesItsPrefixes) {
  auto uid = ParseExpertUid("ffn.4.17");
  ASSERT_TRUE(uid.ok()) << uid.status().ToString();
  EXPECT_EQ(uid->name, "ffn");
  EXPECT_EQ(uid->coords, (std::vector<int64_t>{4, 17}));
  EXPECT_EQ(uid->ToString(), "ffn.4.17");
  EXPECT_EQ(uid->Prefix(0), "ffn.");
  EXPECT_EQ(uid->Prefix(1), "ffn.4.");
  EXPECT_EQ(uid->Prefix(2), "ffn.4.17.");
  auto prefix = ParseExpertPrefix("e.1.2.");
  ASSERT_TRUE(prefix.ok());
  EXPECT_EQ(prefix->coords, (std::vector<int64_t>{1, 2}));
}

TEST(ExpertUid, RefusesEverythingElseWithTheReason) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"ffn", "coordinates"},
      {"ffn.", "decimal number"},
      {".1", "grid name"},
      {"4ffn.1", "grid name"},
      {"ffn.01", "leading zeros"},
      {"ffn.-1", "not a number"},
      {"ffn.1048576", "not below"},
      {"ffn.1.2.3.4.5.6.7.8.9", "coordinates"},
      {"ffn.1x", "not a number"},
      {"f f.1", "grid name"},
      {std::string(300, 'a'), "longer"}};
  for (const auto& [text, why] : bad) {
    auto r = ParseExpertUid(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(why), std::string::npos)
        << text << ": " << r.status().ToString();
  }
  EXPECT_FALSE(ParseExpertPrefix("ffn.4").ok());
  EXPECT_FALSE(ParseExpertPrefix("ffn.").ok());  // the grid itself is not a declared prefix
  EXPECT_FALSE(ParseExpertUid("ffn.4.").ok());
}

TEST(ExpertPattern, RangesAndSingleCoordinatesAndSamplingFreeCells) {
  auto p = ParseExpertPattern("ffn.[0:16].[4:6].3");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->Size(), 16u * 2 * 1);
  std::vector<ExpertUid> taken = {*ParseExpertUid("ffn.0.4.3"), *ParseExpertUid("ffn.0.5.3")};
  std::mt19937_64 rng(7);
  auto all = p->Sample(1000, taken, rng);
  EXPECT_EQ(all.size(), 30u);  // every free cell, once
  std::set<std::string> seen;
  for (const auto& u : all) {
    EXPECT_TRUE(p->Contains(u)) << u.ToString();
    EXPECT_TRUE(seen.insert(u.ToString()).second);
  }
  EXPECT_FALSE(seen.contains("ffn.0.4.3"));
  // A grid too large to enumerate is sampled without repeats.
  auto big = ParseExpertPattern("e.[0:1000].[0:1000]");
  ASSERT_TRUE(big.ok());
  auto some = big->Sample(500, {}, rng);
  EXPECT_EQ(some.size(), 500u);
  std::set<std::vector<int64_t>> distinct;
  for (const auto& u : some) distinct.insert(u.coords);
  EXPECT_EQ(distinct.size(), 500u);
  for (const char* bad : {"ffn.[3:3]", "ffn.[0-4]", "ffn.[a:4]", "ffn", "ffn.[0:2000000]"}) {
    EXPECT_FALSE(ParseExpertPattern(bad).ok()) << bad;
  }
}

TEST(ExpertEntry, RoundTripsAndRefusesMalformedEntries) {
  const std::string addr =
      "/ip4/127.0.0.1/tcp/4000/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN";
  ExpertEntry e{.next = {3, 5}, .addrs = {addr}};
  auto back = ParseExpertEntry(EncodeExpertEntry(e), /*prefix=*/true);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->next, e.next);
  EXPECT_EQ(back->addrs, e.addrs);
  EXPECT_FALSE(ParseExpertEntry(EncodeExpertEntry(e), /*prefix=*/false).ok());
  const std::vector<std::string> bad = {
      "[]",
      R"({"addrs": []})",
      R"({"addrs": ["not an address"]})",
      R"({"next": [1]})",
      R"({"addrs": [")" + addr + R"("], "next": [5, 3]})",
      R"({"addrs": [")" + addr + R"("], "next": [-1]})",
      R"({"addrs": [")" + addr + R"("], "next": [1048576]})",
      R"({"addrs": [")" + addr + R"("], "next": []})",
      R"({"addrs": [")" + addr + R"("], "next": [1], "extra": 1})",
  };
  for (const auto& v : bad) EXPECT_FALSE(ParseExpertEntry(v, true).ok()) << v;
}

TEST(ExpertFamily, ChecksTheKeyAndTheEntryForItsKind) {
  const auto family = ExpertFamily();
  const PeerId owner = KeyPair::Generate().peer_id();
  const std::string addr = "/ip4/127.0.0.1/tcp/4000";
  const std::string expert = EncodeExpertEntry({.addrs = {addr}});
  const std::string prefix = EncodeExpertEntry({.next = {1}, .addrs = {addr}});
  EXPECT_TRUE(family.matches("colony.moe.ffn.1"));
  EXPECT_FALSE(family.matches("colony.models"));
  EXPECT_TRUE(family.check("colony.moe.ffn.1", owner, expert).ok());
  EXPECT_TRUE(family.check("colony.moe.ffn.1.", owner, prefix).ok());
  EXPECT_FALSE(family.check("colony.moe.ffn.1", owner, prefix).ok());
  EXPECT_FALSE(family.check("colony.moe.ffn.1.", owner, expert).ok());
  EXPECT_FALSE(family.check("colony.moe.ffn.", owner, prefix).ok());
  EXPECT_FALSE(family.check("colony.moe.junk key", owner, expert).ok());
}

}  // namespace
}  // namespace colony::moe
