// Unit tests of the averaging layer's pure parts: load balancing, group keys, reductions and
// the wire decoders.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>

#include "averaging/ban_evidence.h"
#include "averaging/group_key.h"
#include "averaging/load_balance.h"
#include "averaging/reduce.h"
#include "averaging/verify_math.h"
#include "averaging/wire.h"

namespace colony::averaging {
namespace {

uint64_t Sum(const std::vector<uint64_t>& v) { return std::accumulate(v.begin(), v.end(), 0ull); }

TEST(LoadBalance, EqualPeersGetEqualSpans) {
  std::vector<PeerLoad> peers(4, PeerLoad{100, true, true});
  auto spans = LoadBalance(1000, peers);
  ASSERT_TRUE(spans.ok());
  for (uint64_t s : *spans) EXPECT_EQ(s, 250u);
}

TEST(LoadBalance, ClientsOwnNothingAndFasterPeersOwnMore) {
  std::vector<PeerLoad> peers = {
      {100, true, true}, {400, true, true}, {100, true, false}, {100, false, true}};
  auto spans = LoadBalance(1'000'003, peers);
  ASSERT_TRUE(spans.ok());
  EXPECT_EQ(Sum(*spans), 1'000'003u);
  EXPECT_EQ((*spans)[2], 0u);
  EXPECT_GT((*spans)[1], (*spans)[0]);
  // The allocation is no worse than an even split over the reducers.
  std::vector<uint64_t> even = {333'334, 333'334, 0, 333'335};
  EXPECT_LE(MaxTransferTime(1'000'003, peers, *spans),
            MaxTransferTime(1'000'003, peers, even) * 1.0001);
}

TEST(LoadBalance, OptimalForTwoSpeeds) {
  // 3 senders: a node's time is (N + x) / b. With b = 1 and 3, the optimum equalises
  // (N + x1) / 1 = (N + x2) / 3 with x1 + x2 = N ... but x1 >= 0 binds: x1 = 0 gives N vs 2N/3,
  // so the slow peer gets nothing and the fast one everything.
  std::vector<PeerLoad> peers = {{1, true, true}, {3, true, true}, {1, true, false}};
  auto spans = LoadBalance(900, peers);
  ASSERT_TRUE(spans.ok());
  EXPECT_EQ((*spans)[0], 0u);
  EXPECT_EQ((*spans)[1], 900u);
}

TEST(LoadBalance, ErrorsAreClear) {
  std::vector<PeerLoad> clients(3, PeerLoad{100, true, false});
  auto r = LoadBalance(10, clients);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("node or aux"), std::string::npos);
  std::vector<PeerLoad> bad = {{0, true, true}};
  EXPECT_FALSE(LoadBalance(10, bad).ok());
  std::vector<PeerLoad> one = {{5, true, true}};
  EXPECT_EQ((*LoadBalance(0, one))[0], 0u);
}

// Bandwidths are self-declared: above 8x the group's lower median they count as 8x, and a group
// whose spans a leader skewed (here: all to itself) is refused by the members that check it.
TEST(LoadBalance, SelfDeclaredBandwidthsAreBoundedAndSkewedSpansRefused) {
  std::vector<PeerLoad> peers(6, PeerLoad{100, true, true});
  peers[5].bandwidth = 1e15;  // the liar
  BoundBandwidths(peers);
  EXPECT_EQ(peers[5].bandwidth, 100 * kMaxBandwidthRatio);
  EXPECT_EQ(peers[0].bandwidth, 100);
  const uint64_t total = 1'000'000;
  auto spans = LoadBalance(total, peers);
  ASSERT_TRUE(spans.ok());
  // The liar's span is capped at 4x an even split, short of the whole vector.
  EXPECT_LE((*spans)[5], total * 4 / 6 + 1);
  EXPECT_TRUE(CheckLoadBalance(total, peers, *spans).ok());
  // A leader that hands everything to one peer, or moves half of a fast peer's span to a slow
  // one, is refused.
  std::vector<uint64_t> skewed(6, 0);
  skewed[0] = total;
  auto refused = CheckLoadBalance(total, peers, skewed);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.code(), StatusCode::kProtocolError);
  EXPECT_NE(refused.message().find("even split"), std::string::npos) << refused.ToString();
  auto slowed = *spans;
  slowed[0] += slowed[5] / 2;
  slowed[5] -= slowed[5] / 2;
  auto unbalanced = CheckLoadBalance(total, peers, slowed);
  ASSERT_FALSE(unbalanced.ok());
  EXPECT_NE(unbalanced.message().find("longer than a balanced split"), std::string::npos)
      << unbalanced.ToString();
  // Rounding differences between machines (a value here or there) pass.
  auto nudged = *spans;
  nudged[0] += 1;
  nudged[1] -= 1;
  EXPECT_TRUE(CheckLoadBalance(total, peers, nudged).ok());
  // A client may not be handed a span.
  peers[2].reduces = false;
  auto balanced = LoadBalance(total, peers);
  ASSERT_TRUE(balanced.ok());
  auto to_client = *balanced;
  to_client[2] += 1;
  to_client[0] -= 1;
  EXPECT_FALSE(CheckLoadBalance(total, peers, to_client).ok());
}

TEST(GroupKey, NextBitsScatterGroupMates) {
  EXPECT_EQ(GroupKey("run", "01"), "run.0b01");
  EXPECT_TRUE(CheckGroupBits("0101").ok());
  EXPECT_FALSE(CheckGroupBits("012").ok());
  EXPECT_EQ(NextGroupBits("", "gid", 3), "");
  // The four members of one group land in four different buckets, and every member computes
  // the same permutation.
  for (std::string gid : {"group-a-0123456", "group-b-0123456", "zzzzzzzzzzzzzzzz"}) {
    std::set<std::string> buckets;
    for (size_t i = 0; i < 4; ++i) buckets.insert(NextGroupBits("10", gid, i));
    EXPECT_EQ(buckets.size(), 4u);
    EXPECT_EQ(NextGroupBits("10", gid, 2), NextGroupBits("01", gid, 2));
  }
}

TEST(Reduce, AddScaled) {
  std::vector<float> a = {1, 2, 3}, b = {1, 1, 1};
  AddScaled(a, b, 2);
  EXPECT_EQ(a, (std::vector<float>{3, 4, 5}));
}

TEST(Reduce, CenteredClipBoundsAnOutlier) {
  const size_t n = 64;
  std::vector<std::vector<float>> inputs(4, std::vector<float>(n));
  for (size_t k = 0; k < 3; ++k) {
    for (size_t i = 0; i < n; ++i) inputs[k][i] = 0.01f * static_cast<float>(k) + 1.0f;
  }
  std::fill(inputs[3].begin(), inputs[3].end(), 1e6f);  // the attacker
  std::vector<std::span<const float>> views(inputs.begin(), inputs.end());
  std::vector<double> weights(4, 1.0);
  std::vector<float> out(n);
  CenteredClipOptions opt{.tau = 1.0, .iterations = 50};
  CenteredClip(views, weights, opt, out);
  // Honest mean is 1.01 everywhere and the honest deviations (L2 0.08) stay within tau. At the
  // fixed point 3 (mean_honest - v) + tau * u = 0 with |u| = 1, so |v - mean_honest| = tau / 3.
  double dist2 = 0;
  for (float v : out) dist2 += (v - 1.01) * (v - 1.01);
  EXPECT_LT(std::sqrt(dist2), opt.tau / 3 + 0.01) << out[0];
  // Without an attacker CenteredClip is the mean.
  std::vector<std::span<const float>> honest(views.begin(), views.begin() + 3);
  CenteredClip(honest, std::vector<double>(3, 1.0), opt, out);
  for (float v : out) EXPECT_NEAR(v, 1.01, 1e-6);
}

// An attacker that declares a huge weight gains nothing: weights above the median count as the
// median, so the bound of the test above (tau / 3 from the honest mean) holds for any weight.
TEST(Reduce, CenteredClipIsNotDefeatedByAHugeWeight) {
  const size_t n = 64;
  std::vector<std::vector<float>> inputs(4, std::vector<float>(n));
  for (size_t k = 0; k < 3; ++k) {
    for (size_t i = 0; i < n; ++i) inputs[k][i] = 0.01f * static_cast<float>(k) + 1.0f;
  }
  std::fill(inputs[3].begin(), inputs[3].end(), 1e6f);
  std::vector<std::span<const float>> views(inputs.begin(), inputs.end());
  std::vector<float> out(n);
  CenteredClipOptions opt{.tau = 1.0, .iterations = 50};
  for (double attacker_weight : {1.0, 1e3, 1e12, 1e300}) {
    CenteredClip(views, std::vector<double>{1.0, 1.0, 1.0, attacker_weight}, opt, out);
    double dist2 = 0;
    for (float v : out) dist2 += (v - 1.01) * (v - 1.01);
    EXPECT_LT(std::sqrt(dist2), opt.tau / 3 + 0.01) << "attacker weight " << attacker_weight;
  }
  // Honest senders with different weights still count in proportion up to the median.
  EXPECT_EQ(WeightsCappedAtMedian(std::vector<double>{1, 2, 3, 1e300}),
            (std::vector<double>{1, 2, 2, 2}));
  EXPECT_EQ(WeightsCappedAtMedian(std::vector<double>{5}), (std::vector<double>{5}));
}

// A reducer's output check: finite and within its inputs' largest magnitude (plus rounding).
TEST(Reduce, AnOutputOutsideItsInputsIsCaught) {
  const std::vector<float> in = {-3.0f, 2.0f, 0.5f};
  EXPECT_EQ(MaxAbs(in), 3.0f);
  std::vector<uint8_t> bytes(in.size() * sizeof(float));
  std::memcpy(bytes.data(), in.data(), bytes.size());
  EXPECT_EQ(MaxAbsBytes(bytes), 3.0f);
  EXPECT_EQ(MaxAbs(std::vector<float>{}), 0.0f);
  EXPECT_TRUE(OutputWithinInputs(std::vector<float>{-3.0f, 1.0f}, 3.0f));
  EXPECT_TRUE(OutputWithinInputs(std::vector<float>{3.00001f}, 3.0f));  // rounding
  EXPECT_FALSE(OutputWithinInputs(std::vector<float>{3.01f}, 3.0f));
  EXPECT_FALSE(OutputWithinInputs(std::vector<float>{-4.0f}, 3.0f));
  EXPECT_FALSE(OutputWithinInputs(std::vector<float>{NAN}, 3.0f));
  EXPECT_FALSE(OutputWithinInputs(std::vector<float>{INFINITY}, 3.0f));
  // A weighted mean of many senders stays within bounds after float rounding.
  std::vector<float> acc(1, 0.0f);
  const std::vector<float> x = {0.1f};
  for (int i = 0; i < 1000; ++i) AddScaled(acc, x, 0.37f);
  Scale(acc, 1.0f / 370.0f);
  EXPECT_TRUE(OutputWithinInputs(acc, 0.1f)) << acc[0];
}

// Projections of every input against `r`, as contributors publish them (one run, one part).
RunValues ProjectAll(const std::vector<std::vector<float>>& xs, const std::vector<float>& r,
                     std::vector<double> weights, double tau, uint64_t seed = 42) {
  std::vector<float> z(kDirections * r.size());
  CheckDirections(seed, 1000, z);
  RunValues run{std::move(weights), {}, 0};
  for (const auto& x : xs) run.projections.push_back(ProjectDeviation(z, x, r, tau));
  double r2 = 0;
  for (float v : r) r2 += static_cast<double>(v) * v;
  run.result_norm = std::sqrt(r2);
  return run;
}

std::vector<std::vector<float>> RandomInputs(size_t count, size_t n, float spread) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<std::vector<float>> xs(count, std::vector<float>(n));
  for (auto& x : xs) {
    for (size_t i = 0; i < n; ++i) x[i] = 0.5f + normal(rng);
  }
  return xs;
}

TEST(Verify, TheExactMeanPassesAndAShiftedOneIsCaught) {
  const size_t n = 5000;
  const auto xs = RandomInputs(5, n, 0.1f);
  const std::vector<double> w = {1, 2, 3, 4, 5};
  std::vector<double> mean(n, 0.0);
  for (size_t k = 0; k < xs.size(); ++k) {
    for (size_t i = 0; i < n; ++i) mean[i] += w[k] * xs[k][i] / 15.0;
  }
  const std::vector<float> r(mean.begin(), mean.end());
  // The exact mean passes on every draw. A reducer that returns one of its inputs, or shifts
  // the mean by half the inputs' spread, is caught on every draw: one random direction misses
  // such a result with a probability of about 2-3% (the tolerance over the residual's spread
  // on it), all kDirections of a draw with about 1e-6.
  std::vector<float> shifted = r;
  for (float& v : shifted) v += 0.05f;
  int exact_passed = 0, own_caught = 0, shifted_caught = 0;
  for (uint64_t seed = 0; seed < 100; ++seed) {
    std::vector<RunValues> runs = {ProjectAll(xs, r, w, 0, seed)};
    exact_passed += CheckFixedPoint(runs, false).ok;
    runs = {ProjectAll(xs, xs[0], w, 0, seed)};
    own_caught += !CheckFixedPoint(runs, false).ok;
    runs = {ProjectAll(xs, shifted, w, 0, seed)};
    shifted_caught += !CheckFixedPoint(runs, false).ok;
  }
  EXPECT_EQ(exact_passed, 100);
  EXPECT_EQ(own_caught, 100);
  EXPECT_EQ(shifted_caught, 100);
  std::vector<RunValues> runs;
  // Equal inputs (a second round): the residual is float rounding, inside the tolerance.
  const std::vector<std::vector<float>> same(4, xs[1]);
  runs = {ProjectAll(same, xs[1], {1, 1, 1, 1}, 0)};
  EXPECT_TRUE(CheckFixedPoint(runs, false).ok);
}

TEST(Verify, CenteredClipToItsToleranceIsTheFixedPointTheMembersCheck) {
  const size_t n = 4000;
  auto xs = RandomInputs(6, n, 0.05f);
  for (float& v : xs[5]) v += 2.0f;  // an outlier, clipped in every iteration
  const std::vector<double> w(6, 1.0);
  std::vector<std::span<const float>> views(xs.begin(), xs.end());
  std::vector<float> r(n);
  CenteredClipOptions o{.tau = 0.5, .iterations = 2};
  CenteredClip(views, w, o, r);
  std::vector<RunValues> runs = {ProjectAll(xs, r, w, 0.5)};
  EXPECT_FALSE(CheckFixedPoint(runs, true).ok) << "two iterations are far from the fixed point";
  o.tolerance = kReducerTolerance;
  EXPECT_TRUE(CenteredClip(views, w, o, r));
  runs = {ProjectAll(xs, r, w, 0.5)};
  EXPECT_TRUE(CheckFixedPoint(runs, true).ok);
  // The plain mean is not CenteredClip's result when an input is clipped.
  std::vector<float> mean(n, 0.0f);
  for (const auto& x : xs) {
    for (size_t i = 0; i < n; ++i) mean[i] += x[i] / 6.0f;
  }
  runs = {ProjectAll(xs, mean, w, 0.5)};
  EXPECT_FALSE(CheckFixedPoint(runs, true).ok);
}

TEST(Verify, AnAuditToleratesRoundingAndCatchesAChangedGradient) {
  std::vector<float> g(1000);
  for (size_t k = 0; k < g.size(); ++k) g[k] = std::sin(0.1 * static_cast<double>(k));
  std::vector<float> rounded = g, flipped = g, scaled = g, stale = g;
  for (size_t k = 0; k < g.size(); ++k) {
    rounded[k] = g[k] * (1 + 1e-5f * ((k % 3) - 1.0f));  // another summation order's error
    flipped[k] = -g[k];
    scaled[k] = 1.05f * g[k];
    stale[k] = std::sin(0.1 * static_cast<double>(k) + 0.05);  // older parameters
  }
  EXPECT_TRUE(CompareAudited(g, g).ok);
  EXPECT_TRUE(CompareAudited(rounded, g).ok);
  EXPECT_FALSE(CompareAudited(flipped, g).ok);
  EXPECT_NEAR(CompareAudited(flipped, g).relative_error, 2.0, 1e-9);
  EXPECT_FALSE(CompareAudited(scaled, g).ok);
  EXPECT_FALSE(CompareAudited(stale, g).ok);
  EXPECT_FALSE(CompareAudited(std::vector<float>(999), g).ok);  // another length
  std::vector<float> zeros(1000, 0.0f), tiny(1000, 1e-9f);
  EXPECT_TRUE(CompareAudited(zeros, zeros).ok);
  EXPECT_TRUE(CompareAudited(tiny, zeros).ok);  // below float rounding of any real gradient
  std::vector<float> nan = g;
  nan[3] = std::nanf("");
  EXPECT_FALSE(CompareAudited(nan, g).ok);
}

TEST(Wire, VerificationStatementsAreBoundedAndValidated) {
  VerifyStatement v;
  v.group_id = std::string(16, 'g');
  v.member = 1;
  v.phase = VerifyPhase::kChecks;
  v.seed = std::string(32, 's');
  v.weight = 2;
  v.signature = std::string(64, 'x');
  v.spans = {{1, {{0, 2, {0, 1}, {1.0, 2.0}, {0.5, -0.25, 1, 2, 3, 4, 5, 6}, {1.5, 0.75}, 3.0}}}};
  auto back = DecodeVerifyStatement(EncodeVerifyStatement(v), 4);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->spans[0].runs[0].projections,
            (std::vector<double>{0.5, -0.25, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(EncodeVerifyStatement(*back), EncodeVerifyStatement(v));
  auto refused = [&](VerifyStatement bad, size_t group = 4) {
    return !DecodeVerifyStatement(EncodeVerifyStatement(bad), group).ok();
  };
  EXPECT_TRUE(refused(v, 1));  // member 1 of a group of 1
  VerifyStatement bad = v;
  bad.spans[0].runs[0].contributors = {1, 0};
  EXPECT_TRUE(refused(bad));
  bad = v;
  bad.spans[0].runs[0].contributors = {0, 9};
  EXPECT_TRUE(refused(bad));
  bad = v;
  bad.spans[0].runs[0].projections.push_back(1.0);
  EXPECT_TRUE(refused(bad));
  bad = v;
  bad.spans[0].runs[0].projections.pop_back();  // not kDirections per entry
  EXPECT_TRUE(refused(bad));
  bad = v;
  bad.spans[0].runs[0].weights = {1.0};
  EXPECT_TRUE(refused(bad));
  bad = v;
  bad.spans[0].runs[0].projections[0] = std::nan("");
  EXPECT_TRUE(refused(bad));
  bad = v;
  bad.spans[0].runs[0].norms[1] = -1;
  EXPECT_TRUE(refused(bad));
  bad = v;
  bad.spans[0].runs.push_back(bad.spans[0].runs[0]);  // parts out of order
  EXPECT_TRUE(refused(bad));
  bad = v;
  bad.spans.push_back(bad.spans[0]);  // the same reducer twice
  EXPECT_TRUE(refused(bad));
  bad = v;
  bad.seed.clear();
  EXPECT_TRUE(refused(bad));
  bad = v;
  bad.commitment = std::string(32, 'c');  // a field of another phase
  EXPECT_TRUE(refused(bad));
  VerifyStatement commit;
  commit.group_id = v.group_id;
  commit.phase = VerifyPhase::kCommit;
  commit.commitment = std::string(32, 'c');
  commit.signature = std::string(64, 'x');
  EXPECT_TRUE(DecodeVerifyStatement(EncodeVerifyStatement(commit), 4).ok());
  commit.signature.resize(63);
  EXPECT_TRUE(refused(commit));
  commit.signature.resize(64);
  commit.commitment.resize(31);
  EXPECT_TRUE(refused(commit));
  commit.commitment.resize(32);
  commit.weight = 1;  // the checks' weight in a commit
  EXPECT_TRUE(refused(commit));
  commit.weight = 0;
  commit.audit_claim = std::string(kMaxAuditClaimBytes, 'a');
  EXPECT_TRUE(DecodeVerifyStatement(EncodeVerifyStatement(commit), 4).ok());
  commit.audit_claim.push_back('a');
  EXPECT_TRUE(refused(commit));
  bad = v;
  bad.audit_claim = "a claim in the checks";  // claims come with the commitment only
  EXPECT_TRUE(refused(bad));
  EXPECT_FALSE(DecodeVerifyStatement(std::string(kMaxVerifyStatementBytes + 1, '\0'), 4).ok());
  EXPECT_FALSE(DecodeVerifyStatement("\x18\x07", 4).ok());  // phase 7
}

// A reducer's checks of its own span (member 0 of 3, one run, one part), as its statement says.
VerifyStatement ReducerChecks(const std::vector<std::vector<float>>& xs,
                              const std::vector<float>& r) {
  const RunValues run = ProjectAll(xs, r, std::vector<double>(xs.size(), 1.0), 0);
  VerifyStatement v;
  v.group_id = std::string(16, 'g');
  v.member = 0;
  v.phase = VerifyPhase::kChecks;
  v.seed = std::string(32, 's');
  RunCheck c{0, 1, {}, run.weights, {}, {}, run.result_norm};
  for (uint32_t i = 0; i < xs.size(); ++i) {
    c.contributors.push_back(i);
    c.projections.insert(c.projections.end(), run.projections[i].values.begin(),
                         run.projections[i].values.end());
    c.norms.push_back(run.projections[i].norm);
  }
  v.spans = {{0, {c}}};
  return v;
}

TEST(BanEvidence, OnlyAReducersOwnFailingSignedChecksConvictIt) {
  const auto xs = RandomInputs(3, 2000, 0.1f);
  std::vector<float> mean(2000, 0.0f);
  for (const auto& x : xs) {
    for (size_t i = 0; i < mean.size(); ++i) mean[i] += x[i] / 3.0f;
  }
  const KeyPair liar = KeyPair::Generate(), other = KeyPair::Generate();
  auto evidence = [&](VerifyStatement v, const KeyPair& signer, const PeerId& peer,
                      std::string_view prefix = "run.grads") {
    SignStatement(signer, prefix, v);
    return CheckBanEvidence("run.grads", BanEvidence{peer, EncodeVerifyStatement(v)});
  };
  // Its own input as the result: its signed numbers convict it.
  auto convicted = evidence(ReducerChecks(xs, xs[0]), liar, liar.peer_id());
  ASSERT_TRUE(convicted.ok()) << convicted.status().ToString();
  EXPECT_NE(convicted->find("not the weighted mean"), std::string::npos) << *convicted;
  // Honest numbers do not; nor do failing numbers signed by someone else (a framer), or
  // signed for another run.
  EXPECT_FALSE(evidence(ReducerChecks(xs, mean), liar, liar.peer_id()).ok());
  EXPECT_FALSE(evidence(ReducerChecks(xs, xs[0]), other, liar.peer_id()).ok());
  EXPECT_FALSE(evidence(ReducerChecks(xs, xs[0]), liar, liar.peer_id(), "run2.grads").ok());
  // A signed statement changed afterwards (its numbers) no longer verifies.
  VerifyStatement v = ReducerChecks(xs, mean);
  SignStatement(liar, "run.grads", v);
  v.spans[0].runs[0].projections[0] += 100.0;
  EXPECT_FALSE(CheckBanEvidence("run.grads", {liar.peer_id(), EncodeVerifyStatement(v)}).ok());

  // Ban lists: bounded, and every entry names a valid peer.
  BanList list{.evidence = std::vector<BanEvidence>(kMaxBanEvidence, {liar.peer_id(), "x"}),
               .accused = std::vector<PeerId>(kMaxAccusations, other.peer_id())};
  auto decoded = DecodeBanList(EncodeBanList(list));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->evidence.size(), kMaxBanEvidence);
  EXPECT_EQ(decoded->accused, list.accused);
  BanList over = list;
  over.evidence.push_back(list.evidence[0]);
  EXPECT_FALSE(DecodeBanList(EncodeBanList(over)).ok());
  over = list;
  over.accused.push_back(liar.peer_id());
  auto too_many = DecodeBanList(EncodeBanList(over));
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("accuses at most 32"), std::string::npos);
  EXPECT_FALSE(DecodeBanList("\x0a\x04\x0a\x02zz").ok());  // a peer id of junk
  EXPECT_FALSE(DecodeBanList("\x12\x02zz").ok());          // an accused id of junk
}

TEST(Wire, RoundTripsAndRejectsHostileMessages) {
  GroupInfo g;
  g.group_id = std::string(16, 'g');
  g.part_size = 100;
  g.total = 10;
  MemberInfo a, b;
  a.peer = KeyPair::Generate().peer_id();
  a.addrs = {"/ip4/127.0.0.1/tcp/1"};
  a.bandwidth = 1;
  a.span = 10;
  b.peer = KeyPair::Generate().peer_id();
  b.mode = Mode::kClient;
  b.bandwidth = 1;
  g.members = {a, b};
  JoinResponse r;
  r.code = JoinResponse::Code::kBegin;
  r.group = g;
  auto back = DecodeJoinResponse(EncodeJoinResponse(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->group.members.size(), 2u);
  EXPECT_EQ(back->group.members[1].mode, Mode::kClient);

  // A client given a span, spans not summing to the total, duplicate members: refused.
  auto bad = r;
  bad.group.members[1].span = 1;
  EXPECT_FALSE(DecodeJoinResponse(EncodeJoinResponse(bad)).ok());
  bad = r;
  bad.group.total = 11;
  EXPECT_FALSE(DecodeJoinResponse(EncodeJoinResponse(bad)).ok());
  bad = r;
  bad.group.members[1] = bad.group.members[0];
  bad.group.members[1].span = 0;
  bad.group.total = 10;
  EXPECT_FALSE(DecodeJoinResponse(EncodeJoinResponse(bad)).ok());
  bad = r;
  bad.group.part_size = 0;
  EXPECT_FALSE(DecodeJoinResponse(EncodeJoinResponse(bad)).ok());

  EXPECT_FALSE(DecodeJoinResponse("\xff\xff\xff").ok());
  EXPECT_FALSE(DecodePartHeader(EncodePartHeader({0, {2, 1}}), 4).ok());  // not increasing
  EXPECT_FALSE(DecodePartHeader(EncodePartHeader({0, {5}}), 4).ok());     // out of range
  EXPECT_TRUE(DecodePartHeader(EncodePartHeader({3, {0, 2}}), 4).ok());
  EXPECT_FALSE(DecodeReduceHello(EncodeReduceHello({"gid", 0, -1.0})).ok());
  EXPECT_FALSE(DecodeReduceHello(EncodeReduceHello({"gid", 0, NAN})).ok());
  JoinRequest jr;
  jr.bandwidth = 0;
  EXPECT_FALSE(DecodeJoinRequest(EncodeJoinRequest(jr)).ok());
  EXPECT_FALSE(DecodeStateAdvert(EncodeStateAdvert({{}, 1.0})).ok());
  StateHeader h;
  h.tensor_sizes = {kMaxTotalValues, 1};
  EXPECT_FALSE(DecodeStateHeader(EncodeStateHeader(h)).ok());
  // A state digest is SHA-256 or absent; digest requests round-trip.
  StateHeader digest;
  digest.metadata = "m";
  digest.tensor_sizes = {3};
  digest.digest = std::string(kStateDigestBytes, 'd');
  auto decoded = DecodeStateHeader(EncodeStateHeader(digest));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->digest, digest.digest);
  digest.digest = std::string(31, 'd');
  EXPECT_FALSE(DecodeStateHeader(EncodeStateHeader(digest)).ok());
  auto request = DecodeStateRequest(EncodeStateRequest({"run.grads", 4.5, true}));
  ASSERT_TRUE(request.ok()) << request.status().ToString();
  EXPECT_TRUE(request->digest_only);
  EXPECT_FALSE(
      DecodeStateRequest(EncodeStateRequest({"run.grads", std::nullopt})).value().digest_only);
}

}  // namespace
}  // namespace colony::averaging
