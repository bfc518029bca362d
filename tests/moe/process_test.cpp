// `colony experts serve` processes on loopback: two servers take disjoint free ids of one grid, a
// mixture-of-experts layer in this process trains through them on a regression task and its loss
// goes down, also after one server is SIGKILLed (its experts get weight 0); a server restarted
// from its checkpoint answers as before it stopped.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>
#include <set>

#include "moe/discovery.h"
#include "moe/mixture.h"
#include "moe/remote_expert.h"
#include "test_support.h"
#include "tools/record_rules.h"

namespace colony::moe {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr int64_t kHidden = 8;

std::unique_ptr<dht::Node> Client(const std::string& boot) {
  dht::NodeOptions o;
  o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  o.initial_peers = {boot};
  o.validators = {cli::SwarmRecordRules()};
  auto n = dht::Node::Start(KeyPair::Generate(), o);
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  return n.ok() ? std::move(*n) : nullptr;
}

std::vector<std::string> ServeArgs(const std::string& boot, std::vector<std::string> extra) {
  std::vector<std::string> args = {"experts",         "serve",
                                   "--initial-peers", boot,
                                   "--listen",        "/ip4/127.0.0.1/tcp/0",
                                   "--hidden-dim",    std::to_string(kHidden),
                                   "--threads",       "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

double Mean(const std::vector<double>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

TEST(ExpertProcesses, AMixtureTrainsThroughTwoServersAndGoesOnWhenOneIsKilled) {
  test::TempDir dir("moe-train");
  test::ProcessGroup swarm(dir.path());
  auto boot = swarm.Start("dht", {"dht", "--listen", "/ip4/127.0.0.1/tcp/0"}, "warn");
  ASSERT_TRUE(boot.ok()) << boot.status().ToString();
  std::set<std::string> ids;
  for (const char* label : {"a", "b"}) {
    auto ready = swarm.Start(
        label,
        ServeArgs(*boot, {"--pattern", "ffn.[0:4].[0:4]", "--num-experts", "4", "--optimizer",
                          "adam", "--lr", "0.05", "--seed", label[0] == 'a' ? "1" : "2"}),
        "warn");
    ASSERT_TRUE(ready.ok()) << ready.status().ToString();
    const json j = json::parse(*ready);
    ASSERT_EQ(j["experts"].size(), 4u) << *ready;
    for (const auto& e : j["experts"]) {
      EXPECT_TRUE(ids.insert(e.get<std::string>()).second) << "two servers took " << e;
    }
  }
  auto node = Client(*boot);
  ASSERT_NE(node, nullptr);
  auto moe = RemoteMixtureOfExperts::Create(*node, {.grid_name = "ffn",
                                                    .grid_size = {4, 4},
                                                    .hidden = kHidden,
                                                    .k_best = 8,
                                                    .k_min = 1,
                                                    .forward_timeout = 20s,
                                                    .backward_timeout = 20s,
                                                    .seed = 9});
  ASSERT_TRUE(moe.ok()) << moe.status().ToString();
  at::manual_seed(0);
  const at::Tensor target_map = at::randn({kHidden, kHidden}) / std::sqrt(double(kHidden));
  std::vector<at::Tensor> gate = (*moe)->gating_parameters();
  std::vector<double> losses;
  constexpr int kSteps = 80, kKillAt = 40;
  for (int step = 0; step < kSteps; ++step) {
    if (step == kKillAt) swarm.Kill("b");
    const at::Tensor x = at::randn({32, kHidden});
    auto y = (*moe)->Forward(x);
    ASSERT_TRUE(y.ok()) << "step " << step << ": " << y.status().ToString();
    const at::Tensor loss = (*y - at::matmul(x, target_map)).pow(2).mean();
    for (auto& p : gate) {
      if (p.grad().defined()) p.grad().zero_();
    }
    loss.backward();
    {
      at::NoGradGuard no_grad;
      for (auto& p : gate) p.sub_(0.05 * p.grad());
    }
    losses.push_back(loss.item<double>());
  }
  std::printf(
      "[moe] loss: first 10 steps %.4f, before the kill %.4f, after it %.4f, last 10 %.4f\n",
      Mean(losses, 0, 10), Mean(losses, kKillAt - 10, kKillAt), Mean(losses, kKillAt, kKillAt + 10),
      Mean(losses, kSteps - 10, kSteps));
  EXPECT_LT(Mean(losses, kKillAt - 10, kKillAt), 0.8 * Mean(losses, 0, 10));
  EXPECT_LT(Mean(losses, kSteps - 10, kSteps), Mean(losses, kKillAt, kKillAt + 10));
  EXPECT_GT((*moe)->stats().failed_calls, 0u);
  moe->reset();
  node->Shutdown();
}

TEST(ExpertProcesses, ARestartedServerAnswersAsBeforeFromItsCheckpoint) {
  test::TempDir dir("moe-checkpoint");
  test::ProcessGroup swarm(dir.path());
  auto boot = swarm.Start("dht", {"dht", "--listen", "/ip4/127.0.0.1/tcp/0"}, "warn");
  ASSERT_TRUE(boot.ok()) << boot.status().ToString();
  const std::string ckpt = (dir.path() / "ckpt").string();
  const auto args = ServeArgs(*boot, {"--expert-ids", "ffn.1.2", "--optimizer", "adam", "--lr",
                                      "0.05", "--checkpoint-dir", ckpt});
  auto first = swarm.Start("first", args, "warn");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(json::parse(*first)["restored"], 0);
  auto node = Client(*boot);
  ASSERT_NE(node, nullptr);
  const at::Tensor x = at::randn({4, kHidden});
  auto find = [&] {
    auto found = GetExperts(*node, {"ffn.1.2"});
    EXPECT_TRUE(found[0].has_value());
    return found[0].value_or(RemoteExpertInfo{.uid = "ffn.1.2"});
  };
  RemoteExpert before(node->host(), find());
  // Two training steps move the weights and Adam's moments away from their seeded start.
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(before.Backward(x, at::ones_like(x), 10s).ok());
  auto y1 = before.Forward(x, 10s);
  ASSERT_TRUE(y1.ok()) << y1.status().ToString();
  swarm["first"].Signal(SIGTERM);
  auto code = swarm["first"].Wait(30s);
  ASSERT_TRUE(code.ok() && *code == 0) << swarm.Tail("first");
  auto second = swarm.Start("second", args, "warn");
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(json::parse(*second)["restored"], 1);
  // The restarted server (a new peer id) answers exactly as before.
  RemoteExpert after(node->host(), find());
  auto y2 = after.Forward(x, 10s);
  ASSERT_TRUE(y2.ok()) << y2.status().ToString();
  EXPECT_TRUE(at::equal(*y1, *y2));
  node->Shutdown();
}

}  // namespace
}  // namespace colony::moe
