// The remote mixture-of-experts layer over expert servers on loopback, against a reference
// mixture computed here from the same gating and expert weights (exhaustive top-k, softmax over
// the experts that answered): outputs, input gradients and gating gradients; a failed server's
// experts weighted 0 (allow_zero_outputs); a hanging expert that costs timeout_after_k_min, not
// the forward timeout; an expert answering NaN and a server's expert with NaN weights excluded;
// detect_anomalies (non-finite inputs and gradients). The switch variant
// against its own reference (top-1, product of per-dimension softmaxes, residual, utilization
// and load-balancing loss).
#include "moe/mixture.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <set>

#include "loopback_node.h"
#include "moe/discovery.h"
#include "moe/expert_server.h"
#include "moe/remote_expert.h"
#include "moe/switch_mixture.h"
#include "runtime/tensor_io.h"

namespace colony::moe {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kHidden = 8;
// Tests that compare with a reference where every live expert answers wait for all of them
// (the default cut of 1 s after the first answers could drop a slow one on a loaded machine).
constexpr std::chrono::milliseconds kWaitForAll = 60s;

at::Tensor Ffn(const at::Tensor& x, const std::vector<at::Tensor>& p) {
  return at::matmul(at::gelu(at::matmul(x, p[0].t()) + p[1]), p[2].t()) + p[3];
}

class Mixture : public ::testing::Test {
 protected:
  void SetUp() override {
    auto boot = dht::Node::Start(KeyPair::Generate(), test::LoopbackNodeOptions({}));
    ASSERT_TRUE(boot.ok()) << boot.status().ToString();
    nodes_.push_back(std::move(*boot));
    for (int i = 0; i < 3; ++i) {
      auto n = dht::Node::Start(
          KeyPair::Generate(),
          test::LoopbackNodeOptions({nodes_[0]->VisibleAddresses().at(0).ToString()}));
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      nodes_.push_back(std::move(*n));
    }
  }
  void TearDown() override {
    for (auto& s : servers_) s.reset();
    for (auto& n : nodes_) n->Shutdown();
  }
  // Starts an expert server on node i for `uids`.
  void Serve(size_t i, std::vector<std::string> uids) {
    ExpertServerOptions o;
    o.uids = uids;
    o.expert = {.hidden = kHidden, .optimizer = "sgd", .lr = 0.05, .seed = 11};
    auto s = ExpertServer::Start(*nodes_.at(i), o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    for (const auto& u : uids) {
      auto p = (*s)->Parameters(u);
      weights_[u] = *p;
    }
    servers_.push_back(std::move(*s));
  }
  // A mixture over a 2 x 2 grid choosing 2 experts per input, waiting for every answer.
  static Result<std::unique_ptr<RemoteMixtureOfExperts>> TwoByTwo(dht::Node& node) {
    return RemoteMixtureOfExperts::Create(node, {.grid_name = "ffn",
                                                 .grid_size = {2, 2},
                                                 .hidden = kHidden,
                                                 .k_best = 2,
                                                 .timeout_after_k_min = kWaitForAll});
  }
  // The reference: every expert in `live` scored from the gating's output, the top k of them,
  // softmax over those in `answering`, their outputs summed (zero when none answers).
  at::Tensor Reference(const at::Tensor& x, const std::vector<at::Tensor>& gate,
                       const std::vector<int64_t>& grid, const std::vector<std::string>& live,
                       const std::set<std::string>& answering, size_t k) {
    const at::Tensor logits = at::matmul(x, gate[0].t()) + gate[1];
    std::vector<at::Tensor> rows;
    for (int64_t i = 0; i < x.size(0); ++i) {
      std::vector<std::pair<double, std::string>> ranked;
      std::map<std::string, at::Tensor> score;
      for (const auto& uid : live) {
        auto u = ParseExpertUid(uid);
        at::Tensor s = at::zeros({}, at::kFloat);
        int64_t offset = 0;
        for (size_t d = 0; d < grid.size(); ++d) {
          s = s + logits[i][offset + u->coords[d]];
          offset += grid[d];
        }
        score[uid] = s;
        ranked.emplace_back(s.item<double>(), uid);
      }
      std::sort(ranked.rbegin(), ranked.rend());
      std::vector<at::Tensor> scores, outputs;
      for (size_t j = 0; j < k && j < ranked.size(); ++j) {
        const std::string& uid = ranked[j].second;
        if (!answering.contains(uid)) continue;
        scores.push_back(score[uid]);
        outputs.push_back(Ffn(x[i], weights_.at(uid)));
      }
      if (scores.empty()) {
        rows.push_back(at::zeros({kHidden}) * x[i].sum() * 0);
        continue;
      }
      const at::Tensor w = at::softmax(at::stack(scores), 0);
      rows.push_back((w.unsqueeze(1) * at::stack(outputs)).sum(0));
    }
    return at::stack(rows);
  }

  std::vector<std::unique_ptr<dht::Node>> nodes_;
  std::vector<std::unique_ptr<ExpertServer>> servers_;
  std::map<std::string, std::vector<at::Tensor>> weights_;
};

std::vector<at::Tensor> Copies(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(t.detach().clone().requires_grad_(true));
  return out;
}

TEST_F(Mixture, OutputsAndGradientsEqualAReferenceMixtureWithTheSameWeights) {
  const std::vector<std::string> a = {"ffn.0.0", "ffn.0.1", "ffn.1.2", "ffn.2.3"};
  const std::vector<std::string> b = {"ffn.1.0", "ffn.3.3", "ffn.2.1", "ffn.3.0"};
  ASSERT_NO_FATAL_FAILURE(Serve(1, a));
  ASSERT_NO_FATAL_FAILURE(Serve(2, b));
  auto moe = RemoteMixtureOfExperts::Create(*nodes_[3], {.grid_name = "ffn",
                                                         .grid_size = {4, 4},
                                                         .hidden = kHidden,
                                                         .k_best = 3,
                                                         .timeout_after_k_min = kWaitForAll,
                                                         .seed = 3});
  ASSERT_TRUE(moe.ok()) << moe.status().ToString();
  const auto gate = Copies((*moe)->gating_parameters());
  const at::Tensor data = at::randn({6, kHidden});
  const at::Tensor probe = at::randn({6, kHidden});
  at::Tensor x = data.clone().requires_grad_(true);
  auto y = (*moe)->Forward(x);
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  at::Tensor x_ref = data.clone().requires_grad_(true);
  std::vector<std::string> live = a;
  live.insert(live.end(), b.begin(), b.end());
  const at::Tensor y_ref = Reference(x_ref, gate, {4, 4}, live, {live.begin(), live.end()}, 3);
  EXPECT_TRUE(at::allclose(*y, y_ref, 1e-4, 1e-5)) << (*y - y_ref).abs().max().item<float>();
  (*y * probe).sum().backward();
  (y_ref * probe).sum().backward();
  EXPECT_TRUE(at::allclose(x.grad(), x_ref.grad(), 1e-4, 1e-5));
  const auto params = (*moe)->gating_parameters();
  EXPECT_TRUE(at::allclose(params[0].grad(), gate[0].grad(), 1e-4, 1e-5));
  EXPECT_TRUE(at::allclose(params[1].grad(), gate[1].grad(), 1e-4, 1e-5));
  EXPECT_EQ((*moe)->stats().failed_calls, 0u);
  // The backward trained the experts that served inputs.
  uint64_t backwards = 0;
  for (const auto& s : servers_) backwards += s->stats().backwards;
  EXPECT_GT(backwards, 0u);
}

// Sets a 4 x 4 mixture's gating to rank 'ffn.1.0' first and 'ffn.1.2' second for every input,
// and returns copies of it for a reference.
std::vector<at::Tensor> RankOneZeroThenOneTwo(RemoteMixtureOfExperts& moe) {
  {
    at::NoGradGuard no_grad;
    auto gate = moe.gating_parameters();
    gate[0].zero_();
    gate[1].copy_(at::tensor({-10.f, 10.f, -10.f, -10.f, 5.f, 0.f, 1.f, 0.f}));
  }
  return Copies(moe.gating_parameters());
}

TEST_F(Mixture, AFailedServersExpertsGetWeightZeroAndNoGradient) {
  const std::vector<std::string> a = {"ffn.0.0", "ffn.0.1", "ffn.1.2", "ffn.2.3"};
  const std::vector<std::string> b = {"ffn.1.0", "ffn.3.3", "ffn.2.1", "ffn.3.0"};
  ASSERT_NO_FATAL_FAILURE(Serve(1, a));
  ASSERT_NO_FATAL_FAILURE(Serve(2, b));
  servers_[1]->Shutdown();  // its records stay in the DHT until they expire; calls fail
  auto moe = RemoteMixtureOfExperts::Create(*nodes_[3], {.grid_name = "ffn",
                                                         .grid_size = {4, 4},
                                                         .hidden = kHidden,
                                                         .k_best = 4,
                                                         .timeout_after_k_min = kWaitForAll,
                                                         .allow_zero_outputs = true,
                                                         .seed = 4});
  ASSERT_TRUE(moe.ok());
  const auto gate = Copies((*moe)->gating_parameters());
  const at::Tensor data = at::randn({16, kHidden});
  at::Tensor x = data.clone().requires_grad_(true);
  auto y = (*moe)->Forward(x);
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  at::Tensor x_ref = data.clone().requires_grad_(true);
  std::vector<std::string> live = a;
  live.insert(live.end(), b.begin(), b.end());
  const at::Tensor y_ref = Reference(x_ref, gate, {4, 4}, live, {a.begin(), a.end()}, 4);
  EXPECT_TRUE(at::allclose(*y, y_ref, 1e-4, 1e-5));
  y->sum().backward();
  y_ref.sum().backward();
  EXPECT_TRUE(at::allclose(x.grad(), x_ref.grad(), 1e-4, 1e-5));
  EXPECT_GT((*moe)->stats().failed_calls, 0u);
  EXPECT_EQ(servers_[1]->stats().backwards, 0u);
}

TEST_F(Mixture, ADeadServerCostsOneStepEvenWhenAPartialCopyHidTheLiveExperts) {
  // Server A declares before the client's node joins, server B after: the client's node is one
  // of the replicas of every key and stores B's entries under the prefixes the two share, but
  // not A's, so its own copy of 'ffn.1.' names B's 'ffn.1.0' only.
  const std::vector<std::string> a = {"ffn.0.0", "ffn.0.1", "ffn.1.2", "ffn.2.3"};
  const std::vector<std::string> b = {"ffn.1.0", "ffn.3.3", "ffn.2.1", "ffn.3.0"};
  ASSERT_NO_FATAL_FAILURE(Serve(1, a));
  auto client =
      dht::Node::Start(KeyPair::Generate(),
                       test::LoopbackNodeOptions({nodes_[0]->VisibleAddresses().at(0).ToString()}));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  nodes_.push_back(std::move(*client));
  ASSERT_NO_FATAL_FAILURE(Serve(2, b));
  servers_[1]->Shutdown();  // B dies; its records stay in the DHT until they expire
  auto moe = RemoteMixtureOfExperts::Create(*nodes_.back(), {.grid_name = "ffn",
                                                             .grid_size = {4, 4},
                                                             .hidden = kHidden,
                                                             .k_best = 1,
                                                             .k_min = 1,
                                                             .timeout_after_k_min = kWaitForAll});
  ASSERT_TRUE(moe.ok());
  // B's dead 'ffn.1.0' first, A's 'ffn.1.2' second.
  const auto gate = RankOneZeroThenOneTwo(**moe);
  const at::Tensor x = at::randn({4, kHidden});
  auto first = (*moe)->Forward(x);
  ASSERT_FALSE(first.ok()) << "the scenario needs the client to find only the dead expert";
  EXPECT_EQ(first.status().code(), StatusCode::kUnavailable) << first.status().ToString();
  const uint64_t failed = (*moe)->stats().failed_calls;
  EXPECT_GT(failed, 0u);
  // The next steps leave B out and read the keys that named it from the nearest replicas: they
  // find A's 'ffn.1.2', and so do the steps after, from the node's own copy with A's entry added.
  const at::Tensor y_ref = Reference(x, gate, {4, 4}, a, {a.begin(), a.end()}, 1);
  for (int step = 0; step < 2; ++step) {
    auto y = (*moe)->Forward(x);
    ASSERT_TRUE(y.ok()) << "step " << step << ": " << y.status().ToString();
    EXPECT_TRUE(at::allclose(*y, y_ref, 1e-4, 1e-5)) << "step " << step;
  }
  EXPECT_EQ((*moe)->stats().failed_calls, failed);
}

TEST_F(Mixture, AHangingExpertCostsTimeoutAfterKMinAndANaNExpertIsExcluded) {
  ASSERT_NO_FATAL_FAILURE(Serve(1, {"ffn.0.0", "ffn.1.1"}));
  // Node 2 declares the other two experts: one never answers in time, one answers NaN.
  dht::Node& liar = *nodes_[2];
  liar.host().RegisterUnary(
      "moe.forward",
      [](net::CallContext&, net::Message m) -> asio::awaitable<Result<net::Message>> {
        at::Tensor x = *runtime::FromFrame(m.tensors.at(0));
        if (m.meta == "ffn.0.1") {
          asio::steady_timer timer(co_await asio::this_coro::executor, 10s);
          co_await timer.async_wait(asio::use_awaitable);
        }
        net::Message reply;
        reply.tensors.push_back(*runtime::ToFrame(at::full_like(x, std::nanf(""))));
        co_return reply;
      });
  ASSERT_TRUE(DeclareExperts(liar, {"ffn.0.1", "ffn.1.0"}, dht::Now() + 60).ok());
  auto moe = RemoteMixtureOfExperts::Create(*nodes_[3], {.grid_name = "ffn",
                                                         .grid_size = {2, 2},
                                                         .hidden = kHidden,
                                                         .k_best = 4,
                                                         .k_min = 1,
                                                         .forward_timeout = 60s,
                                                         .timeout_after_k_min = 2s,
                                                         .seed = 5});
  ASSERT_TRUE(moe.ok());
  const auto gate = Copies((*moe)->gating_parameters());
  const at::Tensor data = at::randn({4, kHidden});
  const auto start = std::chrono::steady_clock::now();
  auto y = (*moe)->Forward(data);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  // Not the 60 s forward timeout, nor the hanging expert's 10 s: 2 s after the others answered.
  EXPECT_LT(took, 8s);
  EXPECT_GE(took, 2s);
  EXPECT_TRUE(at::isfinite(*y).all().item<bool>());
  const at::Tensor y_ref = Reference(
      data, gate, {2, 2}, {"ffn.0.0", "ffn.1.1", "ffn.0.1", "ffn.1.0"}, {"ffn.0.0", "ffn.1.1"}, 4);
  EXPECT_TRUE(at::allclose(*y, y_ref, 1e-4, 1e-5));
  EXPECT_EQ((*moe)->stats().failed_calls, 2u);
}

// An expert server whose expert has NaN weights (a real server, not a fake handler): its
// answers are NaN, so the layer weights it 0 and the output equals the mixture of the others.
TEST_F(Mixture, AnExpertWithNaNWeightsIsExcludedAndTheOutputStaysFinite) {
  ASSERT_NO_FATAL_FAILURE(Serve(1, {"ffn.0.0", "ffn.1.1"}));
  ExpertServerOptions o;
  o.uids = {"ffn.0.1"};
  o.expert = {.hidden = kHidden, .optimizer = "sgd", .lr = 0.05, .seed = 12};
  o.initial_weights["ffn.0.1"] = {at::full({4 * kHidden, kHidden}, std::nanf("")),
                                  at::zeros({4 * kHidden}), at::zeros({kHidden, 4 * kHidden}),
                                  at::zeros({kHidden})};
  auto poisoned = ExpertServer::Start(*nodes_[2], o);
  ASSERT_TRUE(poisoned.ok()) << poisoned.status().ToString();
  servers_.push_back(std::move(*poisoned));
  auto moe = RemoteMixtureOfExperts::Create(*nodes_[3], {.grid_name = "ffn",
                                                         .grid_size = {2, 2},
                                                         .hidden = kHidden,
                                                         .k_best = 3,
                                                         .timeout_after_k_min = kWaitForAll,
                                                         .seed = 8});
  ASSERT_TRUE(moe.ok());
  const auto gate = Copies((*moe)->gating_parameters());
  const at::Tensor data = at::randn({6, kHidden});
  auto y = (*moe)->Forward(data);
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  EXPECT_TRUE(at::isfinite(*y).all().item<bool>());
  const at::Tensor y_ref =
      Reference(data, gate, {2, 2}, {"ffn.0.0", "ffn.1.1", "ffn.0.1"}, {"ffn.0.0", "ffn.1.1"}, 3);
  EXPECT_TRUE(at::allclose(*y, y_ref, 1e-4, 1e-5)) << (*y - y_ref).abs().max().item<float>();
  EXPECT_EQ((*moe)->stats().failed_calls, 1u);
}

TEST_F(Mixture, TheBackwardTrainsTheExpertsAlsoWhenTheInputNeedsNoGradient) {
  ASSERT_NO_FATAL_FAILURE(Serve(1, {"ffn.0.0", "ffn.1.1"}));
  auto moe = TwoByTwo(*nodes_[3]);
  ASSERT_TRUE(moe.ok());
  const at::Tensor x = at::randn({4, kHidden});  // a first layer's input: no gradient wanted
  auto y = (*moe)->Forward(x);
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  y->pow(2).sum().backward();
  EXPECT_EQ(servers_[0]->stats().backwards, 2u);
  auto after = servers_[0]->Parameters("ffn.0.0");
  EXPECT_FALSE(at::equal((*after)[0], weights_.at("ffn.0.0")[0]));
}

// Every call of a step fails while the client's peer cannot reach the server (played by the
// server's shutdown and restart), so every server it knows is avoided; the step after the outage
// must try them again, not fail until the avoidance ends a minute later.
TEST_F(Mixture, AfterAnOutageThatFailedEveryCallTheAvoidedServersAreTriedAgain) {
  const std::vector<std::string> uids = {"ffn.0.0", "ffn.1.1"};
  ASSERT_NO_FATAL_FAILURE(Serve(1, uids));
  auto moe = TwoByTwo(*nodes_[3]);
  ASSERT_TRUE(moe.ok());
  const auto gate = Copies((*moe)->gating_parameters());
  const at::Tensor x = at::randn({4, kHidden});
  ASSERT_TRUE((*moe)->Forward(x).ok());
  servers_[0]->Shutdown();
  auto during = (*moe)->Forward(x);
  ASSERT_FALSE(during.ok());
  EXPECT_EQ((*moe)->stats().failed_calls, 2u);
  servers_[0].reset();
  servers_.clear();
  ASSERT_NO_FATAL_FAILURE(Serve(1, uids));
  auto after = (*moe)->Forward(x);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_TRUE(at::allclose(*after, Reference(x, gate, {2, 2}, uids, {uids.begin(), uids.end()}, 2),
                           1e-4, 1e-5));
}

// The other side of that: a server that stays dead is called again once per retry interval
// (doubling while no call answers), not on every step its avoidance leaves an input empty.
// A peer declares an expert the gating ranks first for every input and answers every call to it
// with resource_exhausted (a busy server is alive, so a single refusal does not count against it):
// after ServerHealth::kRefusalsBeforeFailing refusals in a row it counts as failed and is avoided,
// and the steps after use the honest server's expert. Before, it was chosen, and refused, at every
// step.
TEST_F(Mixture, AServerThatOnlyEverSaysItIsBusyIsAvoidedAfterAFewRefusals) {
  const std::vector<std::string> a = {"ffn.0.0", "ffn.0.1", "ffn.1.2", "ffn.2.3"};
  ASSERT_NO_FATAL_FAILURE(Serve(1, a));
  dht::Node& liar = *nodes_[2];
  auto asked = std::make_shared<std::atomic<int>>(0);
  for (const char* method : {"moe.forward", "moe.backward"}) {
    liar.host().RegisterUnary(
        method, [asked](net::CallContext&, net::Message) -> asio::awaitable<Result<net::Message>> {
          ++*asked;
          co_return ResourceExhausted("busy, try again later");
        });
  }
  ASSERT_TRUE(DeclareExperts(liar, {"ffn.1.0"}, dht::Now() + 600).ok());
  MixtureOptions o{.grid_name = "ffn",
                   .grid_size = {4, 4},
                   .hidden = kHidden,
                   .k_best = 1,
                   .k_min = 1,
                   .timeout_after_k_min = kWaitForAll};
  o.search.avoid_failed_for = 600s;  // longer than the test
  auto moe = RemoteMixtureOfExperts::Create(*nodes_[3], o);
  ASSERT_TRUE(moe.ok());
  // The liar's 'ffn.1.0' first, the honest 'ffn.1.2' second.
  const auto gate = RankOneZeroThenOneTwo(**moe);
  const at::Tensor x = at::randn({4, kHidden});
  const int refusals = static_cast<int>(ServerHealth::kRefusalsBeforeFailing);
  for (int step = 0; step < refusals; ++step) {
    auto y = (*moe)->Forward(x);
    ASSERT_FALSE(y.ok()) << "step " << step << ": the liar's expert was not chosen";
    EXPECT_EQ(asked->load(), step + 1);
  }
  const at::Tensor y_ref = Reference(x, gate, {4, 4}, a, {a.begin(), a.end()}, 1);
  for (int step = 0; step < 3; ++step) {
    auto y = (*moe)->Forward(x);
    ASSERT_TRUE(y.ok()) << "step " << step << " after the refusals: " << y.status().ToString();
    EXPECT_TRUE(at::allclose(*y, y_ref, 1e-4, 1e-5)) << "step " << step;
  }
  EXPECT_EQ(asked->load(), refusals) << "the liar was asked again";
}

TEST_F(Mixture, ADeadSoleServerIsCalledOncePerRetryIntervalNotEveryStep) {
  const std::vector<std::string> uids = {"ffn.0.0", "ffn.1.1"};
  ASSERT_NO_FATAL_FAILURE(Serve(1, uids));
  MixtureOptions o{.grid_name = "ffn",
                   .grid_size = {2, 2},
                   .hidden = kHidden,
                   .k_best = 2,
                   .timeout_after_k_min = kWaitForAll};
  o.search.avoid_failed_for = 600s;  // both longer than the test
  o.search.retry_avoided_after = 600s;
  auto moe = RemoteMixtureOfExperts::Create(*nodes_[3], o);
  ASSERT_TRUE(moe.ok());
  const at::Tensor x = at::randn({4, kHidden});
  ASSERT_TRUE((*moe)->Forward(x).ok());
  servers_[0]->Shutdown();
  EXPECT_FALSE((*moe)->Forward(x).ok());  // both experts' calls fail: their server is avoided
  EXPECT_EQ((*moe)->stats().failed_calls, 2u);
  EXPECT_FALSE((*moe)->Forward(x).ok());  // the first retry calls them again
  EXPECT_EQ((*moe)->stats().failed_calls, 4u);
  for (int step = 0; step < 3; ++step) {
    auto y = (*moe)->Forward(x);
    ASSERT_FALSE(y.ok());
    EXPECT_EQ(y.status().code(), StatusCode::kNotFound) << y.status().ToString();
  }
  EXPECT_EQ((*moe)->stats().failed_calls, 4u);
  EXPECT_EQ((*moe)->stats().expert_calls, 6u);
}

TEST_F(Mixture, DetectAnomaliesRefusesNonFiniteInputsAndBadShapes) {
  ASSERT_NO_FATAL_FAILURE(Serve(1, {"ffn.0.0"}));
  auto moe = RemoteMixtureOfExperts::Create(*nodes_[3], {.grid_name = "ffn",
                                                         .grid_size = {2, 2},
                                                         .hidden = kHidden,
                                                         .k_best = 2,
                                                         .detect_anomalies = true});
  ASSERT_TRUE(moe.ok());
  at::Tensor x = at::randn({2, kHidden});
  x[0][0] = std::nanf("");
  auto r = (*moe)->Forward(x);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("NaN"), std::string::npos) << r.status().ToString();
  // A non-finite output gradient stops the backward before any expert is called.
  auto y = (*moe)->Forward(at::randn({2, kHidden}).requires_grad_(true));
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  try {
    y->backward(at::full_like(*y, std::nanf("")));
    ADD_FAILURE() << "a NaN gradient went through";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("a gradient holds NaN"), std::string::npos) << e.what();
  }
  EXPECT_EQ(servers_[0]->stats().backwards, 0u);
  auto shape = (*moe)->Forward(at::randn({2, kHidden + 1}));
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("float32 [1..65536, 8]"), std::string::npos)
      << shape.status().ToString();
  EXPECT_FALSE(
      RemoteMixtureOfExperts::Create(
          *nodes_[3],
          {.grid_name = "ffn", .grid_size = {2}, .hidden = kHidden, .k_best = 1, .k_min = 2})
          .ok());
  // Without any live expert in its grid, the layer says so.
  auto empty = RemoteMixtureOfExperts::Create(
      *nodes_[3], {.grid_name = "nobody", .grid_size = {3}, .hidden = kHidden, .k_best = 1});
  ASSERT_TRUE(empty.ok());
  auto none = (*empty)->Forward(at::randn({1, kHidden}));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no live expert"), std::string::npos);
}

// The switch layer written out: the best live expert by summed scores, its probability the
// product of each dimension's softmax at its coordinates, added to the input; the utilization
// after one batch from uniform, and the balancing loss from it.
struct SwitchReference {
  at::Tensor y, balance, utilization;
  int64_t passed = 0;  // rows whose best expert does not answer (they pass through)
};
SwitchReference SwitchRef(const at::Tensor& x, const std::vector<at::Tensor>& gate,
                          const std::vector<int64_t>& grid, const std::vector<std::string>& live,
                          const std::set<std::string>& answering,
                          const std::map<std::string, std::vector<at::Tensor>>& weights) {
  const at::Tensor logits = at::matmul(x, gate[0].t()) + gate[1];
  std::vector<at::Tensor> probs;
  int64_t offset = 0;
  for (int64_t size : grid) {
    probs.push_back(at::softmax(logits.narrow(1, offset, size), 1));
    offset += size;
  }
  std::vector<at::Tensor> counts;
  for (int64_t size : grid) counts.push_back(at::zeros({size}));
  std::vector<at::Tensor> rows;
  double answered = 0;
  int64_t passed = 0;
  for (int64_t i = 0; i < x.size(0); ++i) {
    std::string best;
    double best_score = -1e30;
    for (const auto& uid : live) {
      auto u = ParseExpertUid(uid);
      double s = 0;
      int64_t off = 0;
      for (size_t d = 0; d < grid.size(); ++d) {
        s += logits[i][off + u->coords[d]].item<double>();
        off += grid[d];
      }
      if (s > best_score) best_score = s, best = uid;
    }
    if (!answering.contains(best)) {
      rows.push_back(x[i]);
      ++passed;
      continue;
    }
    auto u = ParseExpertUid(best);
    at::Tensor p = at::ones({});
    for (size_t d = 0; d < grid.size(); ++d) {
      p = p * probs[d][i][u->coords[d]];
      counts[d][u->coords[d]] += 1;
    }
    answered += 1;
    rows.push_back(x[i] + p * Ffn(x[i], weights.at(best)));
  }
  SwitchReference r;
  r.y = at::stack(rows);
  r.passed = passed;
  std::vector<at::Tensor> use;
  r.balance = at::zeros({});
  for (size_t d = 0; d < grid.size(); ++d) {
    const auto size = static_cast<double>(grid[d]);
    at::Tensor batch_use = answered > 0 ? counts[d] / answered : counts[d];
    at::Tensor u = 0.9 * at::full({grid[d]}, 1 / size) + 0.1 * batch_use;
    use.push_back(u);
    r.balance = r.balance + (probs[d].mean(0) * u).mean() * size * size;
  }
  r.utilization = at::cat(use);
  return r;
}

TEST_F(Mixture, SwitchOutputsGradientsAndBalancingLossEqualAReference) {
  const std::vector<std::string> a = {"ffn.0.0", "ffn.0.1", "ffn.1.2", "ffn.2.3"};
  const std::vector<std::string> b = {"ffn.1.0", "ffn.3.3", "ffn.2.1", "ffn.3.0"};
  ASSERT_NO_FATAL_FAILURE(Serve(1, a));
  ASSERT_NO_FATAL_FAILURE(Serve(2, b));
  SwitchOptions o;
  o.grid_name = "ffn", o.grid_size = {4, 4}, o.hidden = kHidden, o.seed = 6;
  o.timeout_after_k_min = kWaitForAll;
  o.jitter_eps = 0.3, o.grid_dropout = 0.5;  // neither applies out of training
  auto layer = RemoteSwitchMixtureOfExperts::Create(*nodes_[3], o);
  ASSERT_TRUE(layer.ok()) << layer.status().ToString();
  (*layer)->set_training(false);
  const auto gate = Copies((*layer)->gating_parameters());
  const at::Tensor data = at::randn({12, kHidden});
  const at::Tensor probe = at::randn({12, kHidden});
  at::Tensor x = data.clone().requires_grad_(true);
  auto out = (*layer)->Forward(x);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  at::Tensor x_ref = data.clone().requires_grad_(true);
  std::vector<std::string> live = a;
  live.insert(live.end(), b.begin(), b.end());
  const auto ref = SwitchRef(x_ref, gate, {4, 4}, live, {live.begin(), live.end()}, weights_);
  EXPECT_TRUE(at::allclose(out->y, ref.y, 1e-4, 1e-5)) << (out->y - ref.y).abs().max();
  EXPECT_NEAR(out->balancing_loss.item<double>(), ref.balance.item<double>(), 1e-5);
  EXPECT_TRUE(at::allclose((*layer)->grid_utilization(), ref.utilization, 1e-5, 1e-6));
  ((out->y * probe).sum() + out->balancing_loss).backward();
  ((ref.y * probe).sum() + ref.balance).backward();
  EXPECT_TRUE(at::allclose(x.grad(), x_ref.grad(), 1e-4, 1e-5));
  const auto params = (*layer)->gating_parameters();
  EXPECT_TRUE(at::allclose(params[0].grad(), gate[0].grad(), 1e-4, 1e-5));
  EXPECT_TRUE(at::allclose(params[1].grad(), gate[1].grad(), 1e-4, 1e-5));
  EXPECT_EQ((*layer)->stats().failed_calls, 0u);
  // In training, grid dropout rules coordinates out of the search (-inf scores): the layer still
  // routes (its noise is seeded, so these draws are the same in every run).
  (*layer)->set_training(true);
  for (int i = 0; i < 3; ++i) {
    auto train = (*layer)->Forward(data);
    ASSERT_TRUE(train.ok()) << train.status().ToString();
    EXPECT_TRUE(at::isfinite(train->y).all().item<bool>());
  }
}

TEST_F(Mixture, SwitchPassesAnInputThroughWhenItsExpertFailsAndJittersItsGating) {
  const std::vector<std::string> a = {"ffn.0.0", "ffn.1.1"};
  const std::vector<std::string> b = {"ffn.0.1", "ffn.1.0"};
  ASSERT_NO_FATAL_FAILURE(Serve(1, a));
  ASSERT_NO_FATAL_FAILURE(Serve(2, b));
  servers_[1]->Shutdown();  // b's calls fail; the switch needs no answer (k_min 0)
  SwitchOptions o;
  o.grid_name = "ffn", o.grid_size = {2, 2}, o.hidden = kHidden, o.seed = 7;
  o.timeout_after_k_min = kWaitForAll, o.jitter_eps = 0.5;
  auto layer = RemoteSwitchMixtureOfExperts::Create(*nodes_[3], o);
  ASSERT_TRUE(layer.ok()) << layer.status().ToString();
  (*layer)->set_training(false);
  const auto gate = Copies((*layer)->gating_parameters());
  std::vector<std::string> live = a;
  live.insert(live.end(), b.begin(), b.end());
  // An input that the reference routes partly to b's experts (those rows pass through) and partly
  // to a's, from a seeded generator: the global one's state depends on what ran before in this
  // process, and an input routed to a alone would call no failing expert.
  at::Tensor x;
  SwitchReference ref;
  for (uint64_t seed = 1; seed <= 100 && !x.defined(); ++seed) {
    const at::Tensor candidate =
        at::randn({16, kHidden}, at::make_generator<at::CPUGeneratorImpl>(seed));
    ref = SwitchRef(candidate, gate, {2, 2}, live, {a.begin(), a.end()}, weights_);
    if (ref.passed > 0 && ref.passed < candidate.size(0)) x = candidate;
  }
  ASSERT_TRUE(x.defined()) << "no input of 100 routes rows to both servers";
  auto eval = (*layer)->Forward(x);
  ASSERT_TRUE(eval.ok()) << eval.status().ToString();
  EXPECT_TRUE(at::allclose(eval->y, ref.y, 1e-4, 1e-5));
  EXPECT_GT((*layer)->stats().failed_calls, 0u);
  // While training, the gating sees a jittered input: the same x gets other probabilities.
  (*layer)->set_training(true);
  auto train = (*layer)->Forward(x);
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  EXPECT_TRUE(at::isfinite(train->y).all().item<bool>());
  EXPECT_FALSE(at::allclose(train->y, eval->y, 1e-4, 1e-5));
  // Options outside their ranges are refused by name.
  SwitchOptions bad = o;
  bad.grid_dropout = 0;
  auto refused = RemoteSwitchMixtureOfExperts::Create(*nodes_[3], bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("grid_dropout"), std::string::npos);
}

}  // namespace
}  // namespace colony::moe
