// The serve.* RPC messages (serve/wire.h): honest messages round-trip; what a hostile peer can put
// on the wire is refused as a protocol error that says what is wrong.
#include "serve/wire.h"

#include <gtest/gtest.h>

#include "serve/serve.pb.h"

namespace colony::serve {
namespace {

const std::string kId(kSessionIdBytes, 'x');
const std::string kAddr =
    "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWHPUig7ModyZZ5Fidp7253rW4mSZgx6NR2Ag91pmH6F5k";
const std::string kPeer = "12D3KooWHPUig7ModyZZ5Fidp7253rW4mSZgx6NR2Ag91pmH6F5k";

template <typename T>
std::string Error(const Result<T>& r) {
  if (r.ok()) return "accepted";
  EXPECT_EQ(r.status().code(), StatusCode::kProtocolError) << r.status().ToString();
  return r.status().message();
}

TEST(ServeWire, HonestMessagesRoundTrip) {
  BlockRequest b{.start = 2, .end = 5};
  b.tuning = {
      .prompt_length = 3, .lora_rank = 4, .lora_targets = {"q_proj", "v_proj"}, .lora_scale = 0.5};
  auto b2 = DecodeBlockRequest(EncodeBlockRequest(b));
  ASSERT_TRUE(b2.ok()) << b2.status().ToString();
  EXPECT_EQ(b2->start, 2);
  EXPECT_EQ(b2->end, 5);
  EXPECT_EQ(b2->tuning.lora_targets, b.tuning.lora_targets);
  EXPECT_EQ(b2->tuning.lora_scale, 0.5);
  EXPECT_EQ(b2->epoch, -1);  // an inference client's request carries no epoch
  b.epoch = 42;
  auto b3 = DecodeBlockRequest(EncodeBlockRequest(b));
  ASSERT_TRUE(b3.ok()) << b3.status().ToString();
  EXPECT_EQ(b3->epoch, 42);
  EXPECT_EQ(b3->boundary_codec, compression::Codec::kNone);
  b.boundary_codec = compression::Codec::kBlockwise8;
  auto b4 = DecodeBlockRequest(EncodeBlockRequest(b));
  ASSERT_TRUE(b4.ok()) << b4.status().ToString();
  EXPECT_EQ(b4->boundary_codec, compression::Codec::kBlockwise8);
  EXPECT_EQ(b4->microbatch, 0u);
  EXPECT_FALSE(b4->replay);
  b.microbatch = 0xfedcba9876543210;
  b.replay = true;
  b.attempt = 3;
  auto b5 = DecodeBlockRequest(EncodeBlockRequest(b));
  ASSERT_TRUE(b5.ok()) << b5.status().ToString();
  EXPECT_EQ(b5->microbatch, 0xfedcba9876543210);
  EXPECT_TRUE(b5->replay);
  EXPECT_EQ(b5->attempt, 3u);
  auto f = DecodeFence(EncodeFence({.start = 2, .end = 4, .microbatch = 9, .attempt = 2}));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->start, 2);
  EXPECT_EQ(f->end, 4);
  EXPECT_EQ(f->microbatch, 9u);
  EXPECT_EQ(f->attempt, 2u);
  auto fr = DecodeFenceReply(EncodeFenceReply({.taken = true}));
  ASSERT_TRUE(fr.ok() && fr->taken);

  OpenSessionRequest o{.session_id = kId,
                       .start = 0,
                       .end = 4,
                       .max_length = 64,
                       .batch_size = 2,
                       .next = {kAddr, kId},
                       .upstream = kPeer};
  auto o2 = DecodeOpenSession(EncodeOpenSession(o));
  ASSERT_TRUE(o2.ok()) << o2.status().ToString();
  EXPECT_EQ(o2->next.address, kAddr);
  EXPECT_EQ(o2->upstream, kPeer);
  EXPECT_EQ(o2->tuning.lora_rank, 0);

  StepRequest s{.step_id = 7, .position = 12, .has_hypo_ids = true, .next = PushTarget{}};
  auto s2 = DecodeStep(EncodeStep(s));
  ASSERT_TRUE(s2.ok()) << s2.status().ToString();
  ASSERT_TRUE(s2->next.has_value());  // present and empty: stop pushing
  EXPECT_TRUE(s2->next->empty());
  EXPECT_FALSE(s2->upstream.has_value());  // absent: the session keeps its upstream
  s.upstream = "";
  s2 = DecodeStep(EncodeStep(s));
  ASSERT_TRUE(s2.ok() && s2->upstream.has_value());  // present and empty: accept no pushes
  EXPECT_TRUE(s2->upstream->empty());
  EXPECT_FALSE(s2->last_position_at.has_value());  // absent: every position comes back
  s.upstream.reset();
  s.last_position_at = 24;
  auto p2 = DecodePush(EncodePush({.session_id = kId, .step = s}));
  ASSERT_TRUE(p2.ok()) << p2.status().ToString();
  EXPECT_FALSE(p2->step.next.has_value());    // a push never carries the next hop
  EXPECT_EQ(p2->step.last_position_at, 24u);  // but the end of the chain, which trims its reply
}

TEST(ServeWire, WhatAHostilePeerSendsIsRefusedByName) {
  pb::BlockRequest b;
  b.set_start(3);
  b.set_end(3);
  EXPECT_NE(Error(DecodeBlockRequest(b.SerializeAsString())).find("not a range"),
            std::string::npos);
  b.set_end(4);
  b.set_lora_rank(300);
  b.add_lora_targets("q_proj");
  EXPECT_NE(Error(DecodeBlockRequest(b.SerializeAsString())).find("rank 300"), std::string::npos);
  b.set_lora_rank(2);
  b.add_lora_targets("q_proj");
  EXPECT_NE(Error(DecodeBlockRequest(b.SerializeAsString())).find("listed twice"),
            std::string::npos);
  b.clear_lora_targets();
  b.add_lora_targets("rm_rf");
  EXPECT_NE(Error(DecodeBlockRequest(b.SerializeAsString())).find("unknown LoRA projection"),
            std::string::npos);
  b.clear_lora_targets();
  EXPECT_NE(Error(DecodeBlockRequest(b.SerializeAsString())).find("1 to 7"), std::string::npos);
  b.set_lora_rank(0);
  b.add_lora_targets("q_proj");
  EXPECT_NE(Error(DecodeBlockRequest(b.SerializeAsString())).find("without a rank"),
            std::string::npos);
  b.clear_lora_targets();
  b.set_epoch(uint64_t{1} << 60);  // a SWARM trainer's epoch far past any run's
  EXPECT_NE(Error(DecodeBlockRequest(b.SerializeAsString())).find("epoch"), std::string::npos);
  b.clear_epoch();
  // Hidden states only in codecs that decode to at most 4x their bytes: not top-k (a few bytes
  // for a whole tensor), not an id that names no codec.
  for (uint32_t codec : {8u, 9u, 200u, 1u << 20}) {
    b.set_boundary_codec(codec);
    EXPECT_NE(Error(DecodeBlockRequest(b.SerializeAsString())).find("boundary codec"),
              std::string::npos)
        << codec;
  }
  b.set_boundary_codec(6);
  EXPECT_TRUE(DecodeBlockRequest(b.SerializeAsString()).ok());
  // A microbatch id belongs to a trainer's (tagged) request, and a replay names its microbatch.
  b.set_microbatch(5);
  EXPECT_NE(Error(DecodeBlockRequest(b.SerializeAsString())).find("without a trainer's epoch"),
            std::string::npos);
  b.set_epoch(3);
  EXPECT_TRUE(DecodeBlockRequest(b.SerializeAsString()).ok());
  b.set_microbatch(0);
  b.set_replay(true);
  EXPECT_NE(Error(DecodeBlockRequest(b.SerializeAsString())).find("without a microbatch id"),
            std::string::npos);
  b.clear_replay();
  b.set_attempt(2);
  EXPECT_NE(Error(DecodeBlockRequest(b.SerializeAsString())).find("without a microbatch id"),
            std::string::npos);
  b.clear_epoch();
  b.clear_attempt();
  pb::FenceRequest fence;
  fence.set_start(2);
  fence.set_end(2);
  fence.set_microbatch(1);
  EXPECT_NE(Error(DecodeFence(fence.SerializeAsString())).find("not a range"), std::string::npos);
  fence.set_end(3);
  fence.set_microbatch(0);
  fence.set_attempt(1);
  EXPECT_NE(Error(DecodeFence(fence.SerializeAsString())).find("no microbatch id"),
            std::string::npos);
  fence.set_microbatch(1);
  fence.set_attempt(0);
  EXPECT_NE(Error(DecodeFence(fence.SerializeAsString())).find("no try number"), std::string::npos);

  pb::OpenSession o;
  o.set_session_id("short");
  o.set_end(4);
  o.set_max_length(8);
  o.set_batch_size(1);
  EXPECT_NE(Error(DecodeOpenSession(o.SerializeAsString())).find("session ids"), std::string::npos);
  o.set_session_id(kId);
  o.mutable_next()->set_address("not an address");
  o.mutable_next()->set_session_id(kId);
  EXPECT_NE(Error(DecodeOpenSession(o.SerializeAsString())).find("not a multiaddr"),
            std::string::npos);
  o.mutable_next()->set_address("");
  EXPECT_NE(Error(DecodeOpenSession(o.SerializeAsString())).find("no address"), std::string::npos);
  o.clear_next();
  o.set_upstream("12D3KooWnot-a-peer");
  EXPECT_NE(Error(DecodeOpenSession(o.SerializeAsString())).find("upstream is not a peer id"),
            std::string::npos);
  o.clear_upstream();
  o.set_batch_size(0);
  EXPECT_NE(Error(DecodeOpenSession(o.SerializeAsString())).find("at least 1"), std::string::npos);

  pb::Step s;
  s.set_step_id(0);
  EXPECT_NE(Error(DecodeStep(s.SerializeAsString())).find("start at 1"), std::string::npos);
  s.set_step_id(1);
  s.set_position(-5);
  EXPECT_NE(Error(DecodeStep(s.SerializeAsString())).find("negative position"), std::string::npos);

  pb::PushRequest p;
  p.set_session_id(kId);
  p.mutable_step()->set_step_id(1);
  p.mutable_step()->mutable_next()->set_address(kAddr);
  p.mutable_step()->mutable_next()->set_session_id(kId);
  EXPECT_NE(Error(DecodePush(p.SerializeAsString())).find("does not choose the next hop"),
            std::string::npos);
  p.mutable_step()->clear_next();
  p.mutable_step()->set_upstream(kPeer);
  EXPECT_NE(Error(DecodePush(p.SerializeAsString())).find("does not choose who may push"),
            std::string::npos);

  pb::InfoResponse info;
  info.set_end(1);
  info.set_throughput(-1);
  EXPECT_NE(Error(DecodeInfo(info.SerializeAsString())).find("finite and non-negative"),
            std::string::npos);
  EXPECT_NE(Error(DecodeStep("\xff\xff\xff")).find("malformed Step"), std::string::npos);
}

}  // namespace
}  // namespace colony::serve
