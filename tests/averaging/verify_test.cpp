// Verification (AveragerOptions::verify, BTARD's check of the reducers) on real sockets in one
// process. The expected values are computed apart (exact weighted means in double, and the
// CenteredClip fixed-point condition evaluated here), not by the averager's own code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>

#include "averaging/averager.h"
#include "averaging/ban_evidence.h"
#include "averaging_swarm.h"
#include "dht/validation.h"
#include "test_support.h"

namespace colony::averaging {
namespace {

using swarm_test::Options;
using swarm_test::Swarm;
using swarm_test::Synthetic;
using namespace std::chrono_literals;

AveragerOptions VerifyOptions(size_t group) {
  AveragerOptions o = Options(group);
  o.verify = true;
  return o;
}

// Which member of a round a peer was.
uint32_t IndexOf(const StepResult& r, const PeerId& peer) {
  for (uint32_t m = 0; m < r.members.size(); ++m) {
    if (r.members[m].peer == peer) return m;
  }
  ADD_FAILURE() << "the peer is not a member";
  return 0;
}

// The element range that member `m` reduced: the parts listed for it are contiguous, so take
// them from the layout every member agrees on (spans in member order, sized by bandwidth:
// equal bandwidths give equal spans up to rounding). The test reads the range back from a
// peer that kept its own values for it.
std::vector<double> WeightedMean(const std::vector<std::vector<float>>& inputs,
                                 const std::vector<double>& weights) {
  std::vector<double> out(inputs[0].size(), 0.0);
  double total = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (size_t k = 0; k < out.size(); ++k) out[k] += weights[i] * inputs[i][k];
    total += weights[i];
  }
  for (double& v : out) v /= total;
  return out;
}

// Three honest peers (seeds 0-2) and a liar (seed 3) whose options `lie` changes, all with
// `options`; their inputs and the exact mean of all four, computed here.
struct LiarSwarm {
  LiarSwarm(size_t n, const AveragerOptions& options, void (*lie)(AveragerOptions&)) : swarm(n) {
    for (uint64_t i = 0; i < 3; ++i) swarm.Add(i, options);
    AveragerOptions liar = options;
    lie(liar);
    swarm.Add(3, liar);
    for (uint64_t i = 0; i < 4; ++i) inputs.push_back(Synthetic(i, n));
    all_four = WeightedMean(inputs, std::vector<double>(4, 1.0));
    liar_id = swarm.peers()[3]->averager->peer_id();
  }
  Swarm swarm;
  std::vector<std::vector<float>> inputs;
  std::vector<double> all_four;
  PeerId liar_id;
};

// Two peers that differ in what their group must do: neither step succeeds, and at least one
// says why (the requester's; the leader's own step just finds nobody).
void ExpectRefusedNaming(const std::vector<Result<StepResult>>& results, const std::string& why) {
  int mentions = 0;
  for (const auto& r : results) {
    ASSERT_FALSE(r.ok());
    mentions += r.status().message().find(why) != std::string::npos;
  }
  EXPECT_GE(mentions, 1) << results[0].status().ToString() << " | "
                         << results[1].status().ToString();
}

TEST(Verification, HonestRoundsBanNobodyAndKeepTheExactWeightedMean) {
  const size_t n = 50'003;
  Swarm swarm(n);
  for (uint64_t i = 0; i < 4; ++i) swarm.Add(i, VerifyOptions(4));
  const std::vector<double> weights = {1.0, 2.0, 3.0, 4.0};
  std::vector<std::vector<float>> inputs;
  for (uint64_t i = 0; i < 4; ++i) inputs.push_back(Synthetic(i, n));
  const std::vector<double> expect = WeightedMean(inputs, weights);
  // The second round averages values that are already equal: its residuals are rounding only.
  for (int round = 0; round < 2; ++round) {
    auto results = swarm.StepAll(weights);
    for (size_t i = 0; i < 4; ++i) {
      ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status().ToString();
      const Verification& v = results[i]->verification;
      EXPECT_TRUE(v.performed);
      EXPECT_TRUE(v.banned.empty()) << "round " << round << " peer " << i << ": " << v.reasons[0];
      EXPECT_TRUE(v.discarded.empty()) << "round " << round << " peer " << i;
      for (size_t k = 0; k < n; ++k) {
        ASSERT_NEAR(swarm.peers()[i]->data[k], expect[k], 2e-6) << "peer " << i << " at " << k;
      }
    }
  }
  for (auto& p : swarm.peers()) EXPECT_TRUE(p->averager->banned().empty());
}

TEST(Verification, APeerThatDoesNotVerifyIsRefusedWithAReason) {
  // A group verifies its rounds or does not: a peer of the other kind is refused at the join,
  // rather than having its span discarded in every round.
  Swarm swarm(1000);
  AveragerOptions plain = Options(2);
  plain.matchmaking_time = 2s;
  AveragerOptions verified = plain;
  verified.verify = true;
  swarm.Add(0, verified);
  swarm.Add(1, plain);
  ExpectRefusedNaming(swarm.StepAll({}, 4s), "verifies its rounds");
}

TEST(Verification, ItsTrafficDoesNotGrowWithTheTensors) {
  // The same group of 4 over 20 and 20 x 20 parts: each member sends the same statements
  // (scalars per member and per run of parts, not per value or per part).
  std::vector<uint64_t> sent;
  for (size_t n : {size_t{80'000}, size_t{1'600'000}}) {
    Swarm swarm(n);
    for (uint64_t i = 0; i < 4; ++i) swarm.Add(i, VerifyOptions(4));
    auto results = swarm.StepAll();
    ASSERT_TRUE(results[0].ok()) << results[0].status().ToString();
    EXPECT_TRUE(results[0]->verification.banned.empty());
    sent.push_back(results[0]->verification.bytes_sent);
  }
  EXPECT_GT(sent[0], 0u);
  // Equal but for the varint sizes of part indices (and which member the first peer was).
  EXPECT_NEAR(static_cast<double>(sent[1]), static_cast<double>(sent[0]), 0.05 * sent[0]);
  // 3 phases to 3 members, each signed (64 bytes): commit and reveal ~140 bytes each, the
  // checks of 4 spans with one run each (4 contributors on our own span, 1 on the others)
  // ~500 bytes.
  EXPECT_LT(sent[0], 3u * 1024) << sent[0];
  std::cout << "verification statements sent per member per round (group of 4): " << sent[0]
            << " bytes, for 80,000 and for 1,600,000 values\n";
}

TEST(Verification, CenteredClipWithAnOutlierIsItsFixedPointAndBansNobody) {
  const size_t n = 20'000;
  Swarm swarm(n);
  AveragerOptions o = VerifyOptions(4);
  o.centered_clip = CenteredClipOptions{.tau = 0.5, .iterations = 5};
  // Three peers near each other, one far away: every part clips the outlier, and a few
  // iterations from the median are far from the fixed point, so the reducers must iterate on.
  std::vector<std::vector<float>> inputs;
  for (uint64_t i = 0; i < 4; ++i) {
    auto& p = swarm.Add(i, o);
    if (i == 3) {
      for (float& x : p.data) x += 3.0f;
    } else {
      for (float& x : p.data) x = 0.1f * x;
    }
    inputs.push_back(p.data);
  }
  auto results = swarm.StepAll();
  const std::vector<double> weights(4, 1.0);
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status().ToString();
    EXPECT_TRUE(results[i]->verification.banned.empty()) << results[i]->verification.reasons[0];
    EXPECT_TRUE(results[i]->verification.discarded.empty());
    // Evaluated here: sum_i clip_tau(x_i - r) over each part is ~0 against the sum of the
    // clipped deviations' norms.
    const auto& r = swarm.peers()[i]->data;
    for (const auto& part : results[i]->parts) {
      ASSERT_EQ(part.contributors.size(), 4u);
      std::vector<double> residual(part.end - part.begin, 0.0);
      double norms = 0;
      for (const auto& x : inputs) {
        double norm2 = 0;
        for (uint64_t k = part.begin; k < part.end; ++k) {
          norm2 += (static_cast<double>(x[k]) - r[k]) * (static_cast<double>(x[k]) - r[k]);
        }
        const double clip = std::min(1.0, 0.5 / std::sqrt(norm2));
        for (uint64_t k = part.begin; k < part.end; ++k) {
          residual[k - part.begin] += clip * (static_cast<double>(x[k]) - r[k]);
        }
        norms += clip * std::sqrt(norm2);
      }
      double res2 = 0;
      for (double d : residual) res2 += d * d;
      EXPECT_LT(std::sqrt(res2), 2e-3 * norms) << "peer " << i << " part at " << part.begin;
    }
  }
}

TEST(Verification, AReducerReturningAWrongResultIsBannedByEveryHonestMember) {
  const size_t n = 40'000;
  AveragerOptions o = VerifyOptions(4);
  o.min_group_size = 3;
  // The liar returns its own values as every part's result.
  LiarSwarm liars(n, o, [](AveragerOptions& l) { l.testing.wrong_result = true; });
  auto& [swarm, inputs, all_four, liar_id] = liars;

  auto results = swarm.StepAll();
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status().ToString();
    const StepResult& r = *results[i];
    ASSERT_EQ(r.members.size(), 4u);
    const uint32_t liar_index = IndexOf(r, liar_id);
    EXPECT_EQ(r.verification.banned, std::vector<uint32_t>{liar_index});
    EXPECT_EQ(r.verification.discarded, std::vector<uint32_t>{liar_index});
    // The liar's span holds this peer's own values; every other part the exact mean of all
    // four (the liar sent its true values as a sender).
    for (const auto& part : r.parts) {
      const bool own = part.contributors == std::vector<uint32_t>{r.self_index};
      for (uint64_t k = part.begin; k < part.end; ++k) {
        if (own) {
          ASSERT_EQ(swarm.peers()[i]->data[k], inputs[i][k]) << "peer " << i << " at " << k;
        } else {
          ASSERT_NEAR(swarm.peers()[i]->data[k], all_four[k], 2e-6) << "peer " << i << " at " << k;
        }
      }
    }
    const auto banned = swarm.peers()[i]->averager->banned();
    ASSERT_EQ(banned.size(), 1u);
    EXPECT_EQ(banned[0].first, liar_id);
    EXPECT_NE(banned[0].second.find("not the weighted mean"), std::string::npos)
        << banned[0].second;
  }
  // The ban is the whole host's, not only averaging's: the liar's connections are refused with
  // the reason, and the honest peers no longer dial it.
  net::Host& liar_host = swarm.peers()[3]->node->host();
  for (size_t i = 0; i < 3; ++i) {
    net::Host& honest_host = swarm.peers()[i]->node->host();
    auto ping = liar_host.PingSync(honest_host.ListenAddresses()[0]);
    ASSERT_FALSE(ping.ok()) << "peer " << i;
    EXPECT_NE(ping.status().message().find("refuses you: it was banned from averaging 'test.avg'"),
              std::string::npos)
        << ping.status().ToString();
    auto dial = honest_host.PingSync(liar_host.ListenAddresses()[0]);
    ASSERT_FALSE(dial.ok()) << "peer " << i;
    EXPECT_EQ(dial.status().code(), StatusCode::kPermissionDenied) << dial.status().ToString();
  }

  // A newcomer that never met the liar learns the ban from the DHT: the evidence is the liar's
  // own signed checks. (The honest peers publish it in the background: wait until it is there,
  // since a newcomer reads the bans when it starts and at each step.)
  EXPECT_TRUE(colony::test::WaitUntil(
      [&] {
        auto bans = swarm.peers()[0]->node->GetSync("test.avg.bans", dht::Freshness::kLatest);
        return bans.ok() && bans->is_dict && !bans->subkeys.empty();
      },
      std::chrono::seconds(20)));
  auto& newcomer = swarm.Add(9, VerifyOptions(4));
  EXPECT_TRUE(colony::test::WaitUntil([&] { return !newcomer.averager->banned().empty(); },
                                      std::chrono::seconds(20)));
  const auto learned = newcomer.averager->banned();
  ASSERT_EQ(learned.size(), 1u);
  EXPECT_EQ(learned[0].first, liar_id);
  EXPECT_NE(learned[0].second.find("signed checks"), std::string::npos) << learned[0].second;
  swarm.peers().pop_back();

  // The next round: the honest three average among themselves; the liar's data is in no part.
  std::vector<std::vector<float>> before;
  for (size_t i = 0; i < 3; ++i) before.push_back(swarm.peers()[i]->data);
  const std::vector<double> honest = WeightedMean(before, std::vector<double>(3, 1.0));
  results = swarm.StepAll({}, 15s);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status().ToString();
    for (const StepResult& r = *results[i]; const auto& part : r.parts) {
      for (uint32_t c : part.contributors) EXPECT_NE(r.members[c].peer, liar_id);
    }
    for (size_t k = 0; k < n; ++k) {
      ASSERT_NEAR(swarm.peers()[i]->data[k], honest[k], 2e-6) << "peer " << i << " at " << k;
    }
  }
}

TEST(Verification, AReducerThatWithholdsItsChecksIsBannedInTheThirdRound) {
  LiarSwarm liars(20'000, VerifyOptions(4),
                  [](AveragerOptions& l) { l.testing.withhold_checks = true; });
  auto& [swarm, inputs, all_four, liar_id] = liars;
  for (int round = 0; round < 3; ++round) {
    auto results = swarm.StepAll();
    for (size_t i = 0; i < 3; ++i) {
      ASSERT_TRUE(results[i].ok()) << results[i].status().ToString();
      const StepResult& r = *results[i];
      const uint32_t liar_index = IndexOf(r, liar_id);
      // Its span is discarded every round (its results cannot be checked); banned in the third.
      EXPECT_EQ(r.verification.discarded, std::vector<uint32_t>{liar_index}) << "round " << round;
      EXPECT_EQ(r.verification.banned,
                round < 2 ? std::vector<uint32_t>{} : std::vector<uint32_t>{liar_index})
          << "round " << round;
    }
  }
}

TEST(Verification, AMemberLyingAboutItsProjectionsIsBannedAndNoHonestMemberIs) {
  const size_t n = 30'000;
  LiarSwarm liars(n, VerifyOptions(4),
                  [](AveragerOptions& l) { l.testing.wrong_projections = true; });
  auto& [swarm, inputs, all_four, liar_id] = liars;
  auto results = swarm.StepAll();
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status().ToString();
    const StepResult& r = *results[i];
    const uint32_t liar_index = IndexOf(r, liar_id);
    EXPECT_EQ(r.verification.banned, std::vector<uint32_t>{liar_index});
    for (const auto& part : r.parts) {
      const bool own = part.contributors == std::vector<uint32_t>{r.self_index};
      for (uint64_t k = part.begin; k < part.end; ++k) {
        const double want = own ? inputs[i][k] : all_four[k];
        ASSERT_NEAR(swarm.peers()[i]->data[k], want, 2e-6) << "peer " << i << " at " << k;
      }
    }
    const auto banned = swarm.peers()[i]->averager->banned();
    ASSERT_EQ(banned.size(), 1u);
    EXPECT_EQ(banned[0].first, liar_id);
  }
}

// The liar states its checks last, so that it holds everyone's when it judges: it convicts the
// honest members at once, and a ban closes its connections to them. Its own checks must still
// reach them first, or none of them could convict it (they would see no checks from it at all).
TEST(Verification, ALiarThatJudgesLastCannotKeepItsChecksFromTheHonestMembers) {
  LiarSwarm liars(20'000, VerifyOptions(4), [](AveragerOptions& l) {
    l.testing.wrong_projections = true;
    l.testing.checks_delay = 300ms;
  });
  auto& [swarm, inputs, all_four, liar_id] = liars;
  auto results = swarm.StepAll();
  ASSERT_TRUE(results[3].ok()) << results[3].status().ToString();
  EXPECT_EQ(results[3]->verification.banned.size(), 3u);  // the liar's verdict on the others
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status().ToString();
    const StepResult& r = *results[i];
    EXPECT_EQ(r.verification.banned, std::vector<uint32_t>{IndexOf(r, liar_id)}) << "peer " << i;
    for (const auto& reason : r.verification.reasons) {
      EXPECT_EQ(reason.find("sent no checks"), std::string::npos) << "peer " << i << ": " << reason;
    }
  }
}

// Audits: a claim "synthetic:<seed>" says the values are SyntheticValues(seed), recomputed
// here independently of the averager; "elsewhere" is a claim this peer cannot reproduce (made
// on other parameters, say).
AveragerOptions AuditOptions(size_t group) {
  AveragerOptions o = VerifyOptions(group);
  o.audit_targets = group;  // everyone, every round: the test does not depend on the draw
  o.recompute = [](const PeerId&, std::string_view claim, double weight,
                   std::span<float> out) -> Status {
    if (claim == "elsewhere") return FailedPrecondition("made on other parameters");
    if (!claim.starts_with("synthetic:") || weight != 1.0) {
      return InvalidArgument("not a claim of this test");
    }
    SyntheticValues(std::stoull(std::string(claim.substr(10))), 0, out);
    return Status::Ok();
  };
  return o;
}

TEST(Verification, AnAuditBansAMemberWhoseValuesAreNotWhatItsClaimedDataGives) {
  const size_t n = 20'000;
  Swarm swarm(n);
  for (uint64_t i = 0; i < 5; ++i) swarm.Add(i, AuditOptions(5));
  // Member 3 sends its values' negation (a sign-flipping attacker) and claims its true data;
  // member 4 is honest, with a claim the others cannot reproduce.
  for (float& v : swarm.peers()[3]->data) v = -v;
  const PeerId flipper = swarm.peers()[3]->averager->peer_id();
  const PeerId elsewhere = swarm.peers()[4]->averager->peer_id();
  auto results = swarm.StepAll(
      {}, 30s, {"synthetic:0", "synthetic:1", "synthetic:2", "synthetic:3", "elsewhere"});
  for (size_t i : {0, 1, 2, 4}) {
    ASSERT_TRUE(results[i].ok()) << results[i].status().ToString();
    const StepResult& r = *results[i];
    ASSERT_EQ(r.members.size(), 5u);
    EXPECT_EQ(r.verification.banned, std::vector<uint32_t>{IndexOf(r, flipper)}) << "peer " << i;
    // Every other honest member was audited (and passed), except the unreproducible one.
    std::vector<uint32_t> audited = r.verification.audited;
    std::sort(audited.begin(), audited.end());
    std::vector<uint32_t> want;
    for (uint32_t m = 0; m < 5; ++m) {
      if (m != r.self_index && r.members[m].peer != flipper && r.members[m].peer != elsewhere) {
        want.push_back(m);
      }
    }
    EXPECT_EQ(audited, want) << "peer " << i;
    bool noted = false;
    for (const auto& reason : r.verification.reasons) {
      noted = noted || reason.find("could not make: made on other parameters") != std::string::npos;
    }
    EXPECT_EQ(noted, r.members[r.self_index].peer != elsewhere) << "peer " << i;
    const auto banned = swarm.peers()[i]->averager->banned();
    ASSERT_EQ(banned.size(), 1u);
    EXPECT_EQ(banned[0].first, flipper);
    EXPECT_NE(banned[0].second.find("differ from what it sent"), std::string::npos)
        << banned[0].second;
  }
}

// An audit's verdict is published as an accusation (the accused's id: a third party could not
// recompute the gradient at that round's parameters). A peer that reads it audits the accused at
// its first round with it, whatever the seed picks: a cheater is banned by a newcomer at their
// first round together, and a framed honest peer passes its audit and is not banned.
TEST(Verification, APublishedAuditVerdictMakesEveryReaderAuditTheAccused) {
  const size_t n = 8'000;
  Swarm swarm(n);
  AveragerOptions o = AuditOptions(4);
  o.min_group_size = 3;
  for (uint64_t i = 0; i < 4; ++i) swarm.Add(i, o);
  auto negate = [](std::vector<float>& data) {
    for (float& v : data) v = -v;
  };
  negate(swarm.peers()[3]->data);  // a sign flipper that claims its true data
  const PeerId flipper = swarm.peers()[3]->averager->peer_id();
  auto results = swarm.StepSome({0, 1, 2, 3}, {}, 30s,
                                {"synthetic:0", "synthetic:1", "synthetic:2", "synthetic:3"});
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status().ToString();
    EXPECT_EQ(results[i]->verification.banned,
              std::vector<uint32_t>{IndexOf(*results[i], flipper)});
  }
  // The three publish the flipper as accused (no evidence: a ban of an audit).
  ASSERT_TRUE(colony::test::WaitUntil(
      [&] {
        auto record = swarm.peers()[0]->node->GetSync("test.avg.bans", dht::Freshness::kLatest);
        if (!record.ok() || !record->is_dict) return false;
        size_t accusers = 0;
        for (const auto& [subkey, entry] : record->subkeys) {
          auto list = DecodeBanList(entry.value);
          accusers +=
              list.ok() && list->evidence.empty() && list->accused == std::vector<PeerId>{flipper};
        }
        return accusers == 3;
      },
      20s));
  // The flipper, as a false accuser, frames an honest peer that has not trained yet.
  auto& framed = swarm.Add(7, o);
  const PeerId framed_id = framed.averager->peer_id();
  auto& false_accuser = *swarm.peers()[3]->node;
  ASSERT_TRUE(false_accuser
                  .StoreSync("test.avg.bans", EncodeBanList({.accused = {framed_id}}),
                             dht::Now() + 600, dht::OwnerMarker(false_accuser.peer_id()))
                  .ok());

  // Two newcomers, whose seed audits pick one member a round: each reads both accusations and
  // audits both accused at its first round with them, bans the flipper and clears the framed.
  AveragerOptions newcomer = o;
  newcomer.audit_targets = 1;
  swarm.Add(5, newcomer);
  swarm.Add(6, newcomer);
  for (size_t i : {5, 6}) {
    auto* avg = swarm.peers()[i]->averager.get();
    ASSERT_TRUE(colony::test::WaitUntil([&] { return avg->suspects().size() == 2; }, 20s))
        << "peer " << i << " read " << avg->suspects().size() << " accusations";
    EXPECT_TRUE(avg->banned().empty());  // an accusation bans nobody
  }
  SyntheticValues(3, 0, swarm.peers()[3]->data);  // in place: the averager holds a span of it
  negate(swarm.peers()[3]->data);
  results = swarm.StepSome({3, 4, 5, 6}, {}, 30s,
                           {"synthetic:3", "synthetic:7", "synthetic:5", "synthetic:6"});
  for (size_t k : {2, 3}) {
    SCOPED_TRACE(k);
    ASSERT_TRUE(results[k].ok()) << results[k].status().ToString();
    const StepResult& r = *results[k];
    ASSERT_EQ(r.members.size(), 4u);
    std::vector<uint32_t> accused{IndexOf(r, flipper), IndexOf(r, framed_id)};
    std::sort(accused.begin(), accused.end());
    std::vector<uint32_t> audited = r.verification.audited_on_accusation;
    std::sort(audited.begin(), audited.end());
    EXPECT_EQ(audited, accused);
    EXPECT_EQ(r.verification.banned, std::vector<uint32_t>{IndexOf(r, flipper)});
    const auto& v = r.verification.audited;
    EXPECT_NE(std::find(v.begin(), v.end(), IndexOf(r, framed_id)), v.end());
    const auto* avg = swarm.peers()[k + 3]->averager.get();
    const auto banned = avg->banned();
    ASSERT_EQ(banned.size(), 1u);
    EXPECT_EQ(banned[0].first, flipper);
    EXPECT_NE(banned[0].second.find("differ from what it sent"), std::string::npos);
    EXPECT_TRUE(avg->suspects().empty());
  }
}

TEST(Verification, AMemberPickedForAnAuditWithoutAClaimIsBanned) {
  const size_t n = 8'000;
  Swarm swarm(n);
  for (uint64_t i = 0; i < 4; ++i) swarm.Add(i, AuditOptions(4));
  const PeerId silent = swarm.peers()[3]->averager->peer_id();
  auto results =
      swarm.StepAll({}, 30s, {"synthetic:0", "synthetic:1", "synthetic:2", std::string()});
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status().ToString();
    EXPECT_EQ(results[i]->verification.banned, std::vector<uint32_t>{IndexOf(*results[i], silent)});
    const auto banned = swarm.peers()[i]->averager->banned();
    ASSERT_EQ(banned.size(), 1u);
    EXPECT_NE(banned[0].second.find("claimed no data"), std::string::npos) << banned[0].second;
  }
}

TEST(Verification, AnAuditingPeerAndOneThatDoesNotAuditAreRefusedWithAReason) {
  Swarm swarm(1000);
  AveragerOptions audits = AuditOptions(2);
  audits.matchmaking_time = 2s;
  AveragerOptions verifies = VerifyOptions(2);
  verifies.matchmaking_time = 2s;
  swarm.Add(0, audits);
  swarm.Add(1, verifies);
  ExpectRefusedNaming(swarm.StepAll({}, 4s, {"synthetic:0", ""}), "audits its group's values");
}

}  // namespace
}  // namespace colony::averaging
