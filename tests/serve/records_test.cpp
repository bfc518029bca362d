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
  r.quantization = "int8";
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
  EXPECT_EQ(parsed->dtype, "float32");
  EXPECT_EQ(parsed->quantization, "int8");
  // A record from a server older than the field says nothing of it.
  auto older = ParseServerRecord(r.peer, R"({"state":"online","start":0,"end":2})", 8);
  ASSERT_TRUE(older.ok()) << older.status().ToString();
  EXPECT_EQ(older->quantization, "");
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
      // Numbers that are not integers (1e300 does not fit int64: converting it is undefined).
      "{\"state\":\"online\",\"start\":0,\"end\":1e300}",
      "{\"state\":\"online\",\"start\":0.5,\"end\":2}",
      "{\"state\":\"online\",\"start\":0,\"end\":2,\"cache_tokens_left\":1e300}",
      // Terminal escape sequences and other control characters in what readers print.
      "{\"state\":\"online\",\"start\":0,\"end\":2,\"version\":\"\\u001b[2J\"}",
      "{\"state\":\"online\",\"start\":0,\"end\":2,\"dtype\":\"f32\\n\"}",
      "{\"state\":\"online\",\"start\":0,\"end\":2,\"quantization\":\"int8\\u0007\"}",
      "{\"state\":\"online\",\"start\":0,\"end\":2,\"quantization\":\"int8-and-more-than-16\"}",
      "{\"state\":\"online\",\"start\":0,\"end\":2,\"version\":\"caf\u00e9\"}",
  };
  for (const char* v : bad) {
    EXPECT_FALSE(ParseServerRecord(peer, v, 8).ok()) << v;
  }
  EXPECT_EQ(BlockKey("llama", 3), "llama.block.3");
}

TEST(ServerRecord, NextPingsRoundTripAndAreBounded) {
  ServerRecord r;
  r.peer = KeyPair::Generate().peer_id();
  r.state = ServerState::kOnline;
  r.start = 0;
  r.end = 2;
  const PeerId next = KeyPair::Generate().peer_id();
  r.next_pings = {{next, 0.75}};
  auto parsed = ParseServerRecord(r.peer, EncodeServerRecord(r), 8);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_EQ(parsed->next_pings.size(), 1u);
  EXPECT_EQ(parsed->next_pings[0].first, next);
  EXPECT_DOUBLE_EQ(parsed->next_pings[0].second, 0.75);

  const std::string head = R"({"state":"online","start":0,"end":2,"next_pings":)";
  std::string nine = "{";
  for (int i = 0; i < 9; ++i) {
    nine += (i ? "," : "") + ("\"" + KeyPair::Generate().peer_id().ToString() + "\":1");
  }
  nine += "}";
  for (const std::string& pings :
       std::vector<std::string>{"[1]", "{\"not-a-peer\":1}", "{\"" + next.ToString() + "\":-1}",
                                "{\"" + next.ToString() + "\":\"fast\"}", nine}) {
    EXPECT_FALSE(ParseServerRecord(r.peer, head + pings + "}", 8).ok()) << pings;
  }
}

TEST(ModelAnnouncement, RoundTripsAndRefusesWhatItDoesNotUnderstand) {
  auto a = ParseModelAnnouncement(EncodeModelAnnouncement({.model = "llama-7b", .num_blocks = 32}));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->model, "llama-7b");
  EXPECT_EQ(a->num_blocks, 32);
  auto error = [](const std::string& v) {
    auto r = ParseModelAnnouncement(v);
    return r.ok() ? std::string("accepted") : r.status().message();
  };
  EXPECT_NE(error(R"({"model":"m","num_blocks":2,"extra":1})").find("unknown field 'extra'"),
            std::string::npos);
  EXPECT_NE(error(R"({"model":"m","num_blocks":0})").find("num_blocks"), std::string::npos);
  EXPECT_NE(error(R"({"model":"m","num_blocks":4097})").find("num_blocks"), std::string::npos);
  EXPECT_NE(error(R"({"model":"m","num_blocks":2.5})").find("integer"), std::string::npos);
  EXPECT_NE(error(R"({"model":"","num_blocks":2})").find("printable"), std::string::npos);
  EXPECT_NE(error(R"({"model":"a b","num_blocks":2})").find("printable"), std::string::npos);
  EXPECT_NE(
      error("{\"model\":\"" + std::string(129, 'm') + "\",\"num_blocks\":2}").find("printable"),
      std::string::npos);
  EXPECT_NE(error("[]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(error(std::string(600, ' ')).find("longer"), std::string::npos);
  const dht::KeyFamily family = ModelsFamily();
  EXPECT_TRUE(family.matches(kModelsKey));
  EXPECT_FALSE(family.matches("colony.models2"));
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
