#include "serve/records.h"

#include <gtest/gtest.h>

#include "core/identity.h"

namespace colony::serve {
namespace {

TEST(ServerRecord, RoundTrips) {
  ServerRecord r;
  r.peer = KeyPair::Generate().peer_id();
  r.state = ServerState::kOnline;
  r.start = 2;
  r.end = 5;
  r.throughput = 123.5;
  r.inference_rps = 7.25;
  r.cache_tokens_left = 4096;
  r.addresses = {"/ip4/127.0.0.1/tcp/4000/p2p/" + r.peer.ToString()};
  r.version = "0.1.0";
  r.dtype = "float32";
  auto parsed = ParseServerRecord(r.peer, EncodeServerRecord(r), 8);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->state, ServerState::kOnline);
  EXPECT_EQ(parsed->start, 2);
  EXPECT_EQ(parsed->end, 5);
  EXPECT_DOUBLE_EQ(parsed->throughput, 123.5);
  EXPECT_DOUBLE_EQ(parsed->inference_rps, 7.25);
  EXPECT_EQ(parsed->cache_tokens_left, 4096);
  EXPECT_EQ(parsed->addresses, r.addresses);
  EXPECT_EQ(parsed->peer, r.peer);
}

TEST(ServerRecord, RejectsMalformedAndOutOfRange) {
  const PeerId peer = KeyPair::Generate().peer_id();
  const char* bad[] = {
      "",
      "[]",
      "{\"state\":\"online\"}",
      "{\"state\":\"dancing\",\"start\":0,\"end\":1}",
      "{\"state\":\"online\",\"start\":3,\"end\":3}",
      "{\"state\":\"online\",\"start\":0,\"end\":9}",
      "{\"state\":\"online\",\"start\":-1,\"end\":2}",
      "{\"state\":\"online\",\"start\":0,\"end\":2,\"throughput\":-5}",
      "{\"state\":\"online\",\"start\":0,\"end\":2,\"addresses\":\"x\"}",
      "{\"state\":\"online\",\"start\":0,\"end\":2,\"addresses\":[1,2]}",
      "{\"state\":1,\"start\":0,\"end\":2}",
  };
  for (const char* v : bad) {
    EXPECT_FALSE(ParseServerRecord(peer, v, 8).ok()) << v;
  }
  EXPECT_EQ(BlockKey("llama", 3), "llama.block.3");
}

TEST(ServerRecord, TheDhtFamilyKnowsBlockKeysAndChecksTheSpan) {
  EXPECT_EQ(BlockOfKey(BlockKey("llama", 0)), 0);
  EXPECT_EQ(BlockOfKey(BlockKey("a.block.b", 123456789)), 123456789);
  for (const char* not_block : {"llama.block.", ".block.3", "llama.block.03", "llama.block.3x",
                                "llama.block.-1", "llama.blocks.3", "llama.block.1234567890"}) {
    EXPECT_FALSE(BlockOfKey(not_block).has_value()) << not_block;
  }
  const dht::KeyFamily family = ServerRecordFamily();
  const PeerId peer = KeyPair::Generate().peer_id();
  ServerRecord r;
  r.start = 2;
  r.end = 5;
  const std::string value = EncodeServerRecord(r);
  EXPECT_TRUE(family.matches("m.block.4"));
  EXPECT_FALSE(family.matches("m.progress"));
  EXPECT_TRUE(family.check("m.block.4", peer, value).ok());
  auto outside = family.check("m.block.5", peer, value);
  EXPECT_NE(outside.message().find("not block 5"), std::string::npos) << outside.message();
  EXPECT_FALSE(family.check("m.block.2", peer, "{}").ok());
}

}  // namespace
}  // namespace colony::serve
