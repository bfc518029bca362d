// PowerSGD (train/powersgd.h) against references computed apart: LibTorch's QR for the
// orthonormalization, the exact weighted mean (computed here in double precision) for gradients
// whose matrices have rank at most PowerSGD's, the defining properties of an orthogonal
// projection for full-rank ones, and the mean itself for the running average of what error
// feedback applies over many rounds. Peers are real averagers on loopback sockets.
#include "train/powersgd.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <future>
#include <random>
#include <tuple>

#include "train/low_rank.h"

namespace colony::train {
namespace {

using namespace std::chrono_literals;

at::Tensor AsTensor(std::vector<float>& v, int64_t rows, int64_t cols) {
  return at::from_blob(v.data(), {rows, cols}, at::kFloat);
}

std::vector<float> Normal(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(LowRank, OrthonormalColumnsSpanWhatQrSpans) {
  const int64_t rows = 37, cols = 5;
  auto p = Normal(1, rows * cols);
  const at::Tensor original = AsTensor(p, rows, cols).to(at::kDouble).clone();
  OrthonormalizeColumns(p, rows, cols);
  const at::Tensor q = AsTensor(p, rows, cols).to(at::kDouble);
  const at::Tensor gram = q.t().mm(q);
  EXPECT_LT((gram - at::eye(cols, at::kDouble)).abs().max().item<double>(), 1e-6);
  // The same subspace as LibTorch's QR: equal projectors.
  const at::Tensor qr = std::get<0>(at::linalg_qr(original));
  EXPECT_LT((q.mm(q.t()) - qr.mm(qr.t())).abs().max().item<double>(), 1e-6);
  // A column in the span of the ones before it becomes zeros, not NaN.
  std::vector<float> m = {1, 2, 2, 4, 3, 6};  // 3 x 2: the second column is twice the first
  OrthonormalizeColumns(m, 3, 2);
  EXPECT_EQ(m[1], 0.0f);
  EXPECT_EQ(m[3], 0.0f);
  EXPECT_EQ(m[5], 0.0f);
  EXPECT_NEAR(m[0] * m[0] + m[2] * m[2] + m[4] * m[4], 1.0, 1e-6);
}

TEST(LowRank, ProductIsPTimesQTransposed) {
  const int64_t rows = 9, cols = 7, rank = 3;
  auto p = Normal(2, rows * rank), q = Normal(3, cols * rank);
  std::vector<float> out(rows * cols);
  LowRankProduct(p, q, rows, cols, rank, out);
  const at::Tensor expect = AsTensor(p, rows, rank).mm(AsTensor(q, cols, rank).t());
  EXPECT_LT((AsTensor(out, rows, cols) - expect).abs().max().item<float>(), 1e-5);
}

TEST(PowerSgd, OnlyMatricesThatGainAreCompressed) {
  // 64 x 32 gains at rank 4; a vector, a 4 x 4 matrix and a 3 x 2 x 2 tensor do not; a conv
  // kernel 16 x 3 x 3 x 3 is a 16 x 27 matrix, which gains at rank 4 (4 x 43 <= 0.5 x 432).
  const auto layout = PlanLowRank({{64, 32}, {32}, {4, 4}, {3, 2, 2}, {16, 3, 3, 3}}, 4);
  ASSERT_EQ(layout.matrices.size(), 2u);
  EXPECT_EQ(layout.matrices[0].offset, 0u);
  EXPECT_EQ(layout.matrices[0].rows, 64);
  EXPECT_EQ(layout.matrices[0].cols, 32);
  EXPECT_EQ(layout.matrices[1].offset, 2048u + 32 + 16 + 12);
  EXPECT_EQ(layout.matrices[1].rows, 16);
  EXPECT_EQ(layout.matrices[1].cols, 27);
  EXPECT_EQ(layout.matrices[1].p_offset, 64u * 4);
  EXPECT_EQ(layout.matrices[1].q_offset, 32u * 4);
  // The three tensors between them form one plain range.
  ASSERT_EQ(layout.plain.size(), 1u);
  EXPECT_EQ(layout.plain[0], (std::pair<size_t, size_t>{2048, 2048 + 60}));
  EXPECT_EQ(layout.plain_offset, (64u + 16u) * 4);
  EXPECT_EQ(layout.p_values, (64u + 16u) * 4 + 60);
  EXPECT_EQ(layout.q_values, (32u + 27u) * 4);
  EXPECT_EQ(layout.total, 2048u + 60 + 432);
}

// Peers with their own DHT node and PowerSgd, on loopback.
class Group {
 public:
  Group(size_t n, const LowRankLayout& layout, int rank) {
    dht::NodeOptions o;
    o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
    auto boot = dht::Node::Start(KeyPair::Generate(), o);
    EXPECT_TRUE(boot.ok()) << boot.status().ToString();
    boot_ = std::move(*boot);
    for (size_t i = 0; i < n; ++i) {
      o.initial_peers = {boot_->VisibleAddresses()[0].ToString()};
      auto node = dht::Node::Start(KeyPair::Generate(), o);
      EXPECT_TRUE(node.ok()) << node.status().ToString();
      averaging::AveragerOptions a;
      a.prefix = "test.powersgd";
      a.target_group_size = n;
      a.min_group_size = n;
      a.matchmaking_time = 5s;
      a.part_size_bytes = 4096;
      a.part_timeout = 3s;
      auto p = PowerSgd::Create(**node, layout, rank, a);
      EXPECT_TRUE(p.ok()) << p.status().ToString();
      nodes_.push_back(std::move(*node));
      peers_.push_back(std::move(*p));
    }
  }
  ~Group() {
    for (auto& p : peers_) p->Shutdown();
  }

  // One round: every peer averages its gradient (in place) with its weight.
  void Round(std::vector<std::vector<float>>& grads, const std::vector<double>& weights) {
    std::vector<std::future<Result<averaging::StepResult>>> futures;
    for (size_t i = 0; i < peers_.size(); ++i) {
      futures.push_back(std::async(std::launch::async, [&, i] {
        averaging::StepOptions so;
        so.weight = weights[i];
        so.timeout = 30s;
        so.expected_group_size = peers_.size();
        return peers_[i]->Average(grads[i], so);
      }));
    }
    for (size_t i = 0; i < futures.size(); ++i) {
      auto r = futures[i].get();
      ASSERT_TRUE(r.ok()) << "peer " << i << ": " << r.status().ToString();
      for (const auto& part : r->parts) {
        EXPECT_EQ(part.contributors.size(), peers_.size()) << "peer " << i;
      }
    }
  }

 private:
  std::unique_ptr<dht::Node> boot_;
  std::vector<std::unique_ptr<dht::Node>> nodes_;
  std::vector<std::unique_ptr<PowerSgd>> peers_;
};

std::vector<double> WeightedMean(const std::vector<std::vector<float>>& grads,
                                 const std::vector<double>& weights) {
  std::vector<double> mean(grads[0].size(), 0.0);
  double total = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    for (size_t k = 0; k < mean.size(); ++k) mean[k] += weights[i] * grads[i][k];
    total += weights[i];
  }
  for (double& x : mean) x /= total;
  return mean;
}

// A rows x cols matrix of rank 2: A (rows x 2, drawn from a_seed) x B (2 x cols, from b_seed).
std::vector<float> RankTwo(int64_t rows, int64_t cols, uint64_t a_seed, uint64_t b_seed) {
  auto a = Normal(a_seed, static_cast<size_t>(rows * 2));
  auto b = Normal(b_seed, static_cast<size_t>(2 * cols));
  const at::Tensor prod = AsTensor(a, rows, 2).mm(AsTensor(b, 2, cols)).contiguous();
  return {prod.data_ptr<float>(), prod.data_ptr<float>() + rows * cols};
}

// Every peer's values equal `expect` within 1e-4 of its largest magnitude.
void ExpectMean(const std::vector<std::vector<float>>& grads, const std::vector<double>& expect) {
  double scale = 0;
  for (double x : expect) scale = std::max(scale, std::abs(x));
  for (size_t i = 0; i < grads.size(); ++i) {
    for (size_t k = 0; k < expect.size(); ++k) {
      ASSERT_NEAR(grads[i][k], expect[k], 1e-4 * scale) << "peer " << i << " value " << k;
    }
  }
}

// Matrices of rank at most PowerSGD's lose nothing: P's columns span the mean's, so every peer
// ends with the exact weighted mean, bit for bit the same on each.
TEST(PowerSgd, GradientsOfLowRankAverageToTheExactMean) {
  const int rank = 3;
  const std::vector<std::vector<int64_t>> shapes = {{40, 24}, {24}, {30, 50}};
  const LowRankLayout layout = PlanLowRank(shapes, rank);
  ASSERT_EQ(layout.matrices.size(), 2u);
  const std::vector<double> weights = {1.0, 3.0, 0.5};
  std::vector<std::vector<float>> grads(weights.size());
  // Each matrix is A_m B_{m,i}: the column space A_m (rank 2) is every peer's.
  for (size_t i = 0; i < grads.size(); ++i) {
    grads[i] = Normal(100 + i, layout.total);
    for (size_t m = 0; m < layout.matrices.size(); ++m) {
      const auto& mat = layout.matrices[m];
      const auto prod = RankTwo(mat.rows, mat.cols, 7 + m, 1000 * (i + 1) + m);
      std::copy(prod.begin(), prod.end(), grads[i].begin() + static_cast<ptrdiff_t>(mat.offset));
    }
  }
  const auto expect = WeightedMean(grads, weights);
  Group group(weights.size(), layout, rank);
  group.Round(grads, weights);
  ExpectMean(grads, expect);
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_TRUE(grads[i] == grads[0]) << "peer " << i << " applies another gradient";
  }
}

// A round whose gradients are all zeros gives a zero mean Q: taken as the next round's start, it
// would make every later P zero. The next round must still give the exact mean of gradients of
// rank at most PowerSGD's.
TEST(PowerSgd, ARoundOfZeroGradientsDoesNotStallLaterRounds) {
  const int rank = 3;
  const int64_t rows = 40, cols = 24;
  const LowRankLayout layout = PlanLowRank({{rows, cols}}, rank);
  ASSERT_EQ(layout.matrices.size(), 1u);
  const std::vector<double> weights = {1.0, 2.0};
  Group group(weights.size(), layout, rank);
  std::vector<std::vector<float>> zeros(2, std::vector<float>(layout.total, 0.0f));
  group.Round(zeros, weights);
  for (const auto& z : zeros)
    EXPECT_TRUE(std::all_of(z.begin(), z.end(), [](float x) { return x == 0; }));
  std::vector<std::vector<float>> grads;
  for (size_t i = 0; i < weights.size(); ++i) grads.push_back(RankTwo(rows, cols, 11, 20 + i));
  const auto expect = WeightedMean(grads, weights);
  group.Round(grads, weights);
  ExpectMean(grads, expect);
}

// A full-rank mean is projected: each round's result R has rank <= r and the mean's remainder
// is orthogonal to it (R^T (M - R) = 0). Error feedback carries the remainder to later rounds,
// so the running average of what is applied over rounds of the same gradients approaches the
// mean, which one round's projection does not.
TEST(PowerSgd, AFullRankMeanIsProjectedAndErrorFeedbackCatchesUpOverRounds) {
  const int rank = 2;
  const int64_t rows = 32, cols = 24;
  const LowRankLayout layout = PlanLowRank({{rows, cols}}, rank);
  ASSERT_EQ(layout.matrices.size(), 1u);
  const std::vector<double> weights = {2.0, 1.0};
  std::vector<std::vector<float>> inputs = {Normal(5, rows * cols), Normal(6, rows * cols)};
  const auto mean = WeightedMean(inputs, weights);
  std::vector<float> mean_f(mean.begin(), mean.end());
  const at::Tensor m = AsTensor(mean_f, rows, cols).to(at::kDouble);
  const double norm = m.norm().item<double>();
  Group group(weights.size(), layout, rank);
  at::Tensor applied = at::zeros({rows, cols}, at::kDouble);
  double first_error = 0, error_at_50 = 0;
  const int rounds = 200;
  for (int k = 0; k < rounds; ++k) {
    auto grads = inputs;
    group.Round(grads, weights);
    ASSERT_TRUE(grads[0] == grads[1]) << "round " << k << ": the peers apply other gradients";
    const at::Tensor r = AsTensor(grads[0], rows, cols).to(at::kDouble);
    if (k == 0) {
      const at::Tensor s = at::linalg_svdvals(r);
      EXPECT_LT(s[rank].item<double>(), 1e-5 * s[0].item<double>()) << "rank above " << rank;
      EXPECT_LT(r.t().mm(m - r).abs().max().item<double>(), 1e-4 * norm * norm)
          << "the remainder is not orthogonal to the result";
      first_error = (r - m).norm().item<double>() / norm;
    }
    applied += r;
    if (k + 1 == 50) error_at_50 = (applied / 50 - m).norm().item<double>() / norm;
  }
  const double running_error = (applied / rounds - m).norm().item<double>() / norm;
  EXPECT_GT(first_error, 0.5) << "a rank-" << rank << " projection of a random 32 x 24 matrix";
  std::printf(
      "[powersgd] relative error: one round %.3f, running average of 50 rounds %.3f, of "
      "%d rounds %.3f\n",
      first_error, error_at_50, rounds, running_error);
  // The running average's error is the mean error feedback over the rounds: bounded, so it
  // falls as 1 / rounds (without error feedback it would stay at the projection's).
  EXPECT_LT(running_error, 0.1) << "after " << rounds << " rounds (one round: " << first_error
                                << ", 50 rounds: " << error_at_50 << ")";
  EXPECT_LT(running_error, 0.5 * error_at_50);
}

}  // namespace
}  // namespace colony::train
