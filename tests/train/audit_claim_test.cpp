// Audit claims (train/audit.h): what a member's gradient is recomputed from. Round trips,
// run merging, and the decoder's refusals, each for the reason it names.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "train/audit.h"

namespace colony::train {
namespace {

AuditClaim Sample() {
  AuditClaim c;
  c.seed = 0x0123456789abcdefULL;
  c.batch_size = 32;
  for (int64_t i : {10, 11, 12, 20, 21}) EXPECT_TRUE(c.Add(i));
  const std::vector<float> params = {1.0f, 2.0f, 3.0f};
  c.params = ParamsDigest(params);
  return c;
}

TEST(AuditClaim, ConsecutiveBatchesMergeIntoRunsAndRoundTrip) {
  const AuditClaim c = Sample();
  EXPECT_EQ(c.runs, (std::vector<std::pair<int64_t, int64_t>>{{10, 3}, {20, 2}}));
  EXPECT_EQ(c.Batches(), 5);
  auto back = DecodeAuditClaim(EncodeAuditClaim(c));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->seed, c.seed);
  EXPECT_EQ(back->batch_size, 32);
  EXPECT_EQ(back->runs, c.runs);
  EXPECT_EQ(back->params, c.params);
  AuditClaim empty = c;  // a round without samples claims no batches
  empty.runs.clear();
  EXPECT_TRUE(DecodeAuditClaim(EncodeAuditClaim(empty)).ok());
}

TEST(AuditClaim, TheParamsDigestSeesEveryValue) {
  std::vector<float> a = {1.0f, 2.0f, 3.0f}, b = a;
  EXPECT_EQ(ParamsDigest(a), ParamsDigest(b));
  b[2] = std::nextafter(3.0f, 4.0f);
  EXPECT_NE(ParamsDigest(a), ParamsDigest(b));
  EXPECT_EQ(ParamsDigest(a).size(), 16u);
}

TEST(AuditClaim, RunsAreBoundedAndAPeerWithTooManyCannotClaim) {
  AuditClaim c;
  for (size_t r = 0; r < kMaxAuditRuns; ++r) EXPECT_TRUE(c.Add(static_cast<int64_t>(2 * r)));
  EXPECT_FALSE(c.Add(1000));       // a 65th run
  EXPECT_TRUE(c.Add(2 * 63 + 1));  // extends the last one
}

TEST(AuditClaim, TheDecoderRefusesWhatIsNotAClaim) {
  const std::string good = EncodeAuditClaim(Sample());
  auto refused = [](const std::string& bytes, const std::string& why) {
    auto r = DecodeAuditClaim(bytes);
    EXPECT_FALSE(r.ok()) << why;
    if (!r.ok()) {
      EXPECT_FALSE(r.status().message().empty()) << why;
    }
  };
  refused("", "empty");
  refused(good.substr(0, 20), "truncated header");
  refused(good.substr(0, good.size() - 1), "truncated run");
  refused(good + "x", "trailing bytes");
  std::string bad = good;
  bad[0] = 2;
  refused(bad, "another version");
  AuditClaim c = Sample();
  c.batch_size = 0;
  refused(EncodeAuditClaim(c), "batch size 0");
  c = Sample();
  c.batch_size = kMaxAuditBatchSize + 1;
  refused(EncodeAuditClaim(c), "batch size over the bound");
  c = Sample();
  c.runs = {{20, 2}, {10, 3}};
  refused(EncodeAuditClaim(c), "runs out of order");
  c.runs = {{10, 3}, {12, 1}};
  refused(EncodeAuditClaim(c), "overlapping runs");
  c.runs = {{10, 0}};
  refused(EncodeAuditClaim(c), "an empty run");
  c.runs = {{-5, 1}};
  refused(EncodeAuditClaim(c), "a negative index");
  c.runs = {{int64_t{1} << 62, int64_t{1} << 62}};
  refused(EncodeAuditClaim(c), "a run whose end overflows");
  c.runs.assign(kMaxAuditRuns + 1, {0, 1});
  for (size_t r = 0; r < c.runs.size(); ++r) c.runs[r] = {static_cast<int64_t>(2 * r), 1};
  refused(EncodeAuditClaim(c), "too many runs");
}

// The data stream the run gives a peer at an epoch, against a value computed apart (Python's
// hashlib and the cryptography package, from the format audit.h states):
//   pub = Ed25519PrivateKey.from_private_bytes(bytes([7]) * 32).public_key() (raw bytes)
//   id = b"\x00\x24\x08\x01\x12\x20" + pub
//   m = b"colony.audit-data.v1" + le64(len(run)) + run + le64(len(id)) + id + le64(epoch)
//   int.from_bytes(hashlib.blake2b(m, digest_size=8).digest(), "little")
TEST(AuditDataSeed, IsTheDigestOfTheRunThePeerAndTheEpoch) {
  const std::vector<uint8_t> seed(32, 7);
  const PeerId peer = KeyPair::FromSeed(seed).peer_id();
  EXPECT_EQ(AuditDataSeed("fmnist-1", peer, 3), 0xfac40a94b5b5ddbeULL);
  EXPECT_EQ(AuditDataSeed("fmnist-1", peer, 4), 0xf8909a92d36ec1d7ULL);
  const PeerId other = KeyPair::FromSeed(std::vector<uint8_t>(32, 8)).peer_id();
  EXPECT_NE(AuditDataSeed("fmnist-1", other, 3), AuditDataSeed("fmnist-1", peer, 3));
  EXPECT_NE(AuditDataSeed("fmnist-2", peer, 3), AuditDataSeed("fmnist-1", peer, 3));
}

}  // namespace
}  // namespace colony::train
