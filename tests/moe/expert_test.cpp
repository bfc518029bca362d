// Expert servers and remote experts over DHT nodes on loopback: forward and backward through a
// remote expert equal the expert's function computed here with the same weights (outputs, input
// gradients, and the server's SGD step), hostile requests get errors while the server keeps
// serving, and a backward reaching a restarted server works.
#include "moe/expert.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

#include "loopback_node.h"
#include "moe/discovery.h"
#include "moe/expert_server.h"
#include "moe/remote_expert.h"
#include "runtime/tensor_io.h"
#include "test_support.h"

namespace colony::moe {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kHidden = 16;

// hivemind's ffn expert written out here: Linear, GELU, Linear.
at::Tensor Ffn(const at::Tensor& x, const std::vector<at::Tensor>& p) {
  return at::matmul(at::gelu(at::matmul(x, p[0].t()) + p[1]), p[2].t()) + p[3];
}

class ExpertServers : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = dht::Node::Start(KeyPair::Generate(), test::LoopbackNodeOptions({}));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_node_ = std::move(*server);
    auto client = dht::Node::Start(
        KeyPair::Generate(),
        test::LoopbackNodeOptions({server_node_->VisibleAddresses().at(0).ToString()}));
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_node_ = std::move(*client);
    options_.uids = {"ffn.0.1", "ffn.2.3"};
    options_.expert = {.hidden = kHidden, .optimizer = "sgd", .lr = 0.1, .seed = 5};
    options_.max_batch = 64;
    auto s = ExpertServer::Start(*server_node_, options_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
  }
  void TearDown() override {
    server_.reset();
    client_node_->Shutdown();
    server_node_->Shutdown();
  }
  RemoteExpert Find(const std::string& uid) {
    auto found = GetExperts(*client_node_, {uid});
    EXPECT_TRUE(found.at(0).has_value()) << uid;
    return RemoteExpert(client_node_->host(), found.at(0).value_or(RemoteExpertInfo{.uid = uid}));
  }
  Result<net::Message> Raw(const std::string& method, const std::string& uid,
                           const std::vector<at::Tensor>& tensors) {
    net::Message m(uid);
    for (const auto& t : tensors) m.tensors.push_back(*runtime::ToFrame(t));
    return client_node_->host().CallSync(server_node_->VisibleAddresses().at(0), method,
                                         std::move(m), {.timeout = 10s});
  }

  ExpertServerOptions options_;
  std::unique_ptr<dht::Node> server_node_, client_node_;
  std::unique_ptr<ExpertServer> server_;
};

TEST_F(ExpertServers, ForwardAndBackwardEqualTheExpertComputedHere) {
  auto weights = server_->Parameters("ffn.0.1");
  ASSERT_TRUE(weights.ok());
  std::vector<at::Tensor> ref;
  for (const auto& w : *weights) ref.push_back(w.clone().requires_grad_(true));
  // The weights are the seeded ones a local expert starts from.
  auto local = Expert::Create({.hidden = kHidden, .seed = ExpertSeed(5, "ffn.0.1")});
  ASSERT_TRUE(local.ok());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_TRUE(at::equal((*local)->parameters()[i], ref[i]));

  RemoteExpert expert = Find("ffn.0.1");
  const at::Tensor data = at::randn({8, kHidden});
  const at::Tensor probe = at::randn({8, kHidden});
  at::Tensor x = data.clone().requires_grad_(true);
  at::Tensor y = CallRemoteExpert(expert, x, {});
  at::Tensor x_ref = data.clone().requires_grad_(true);
  at::Tensor y_ref = Ffn(x_ref, ref);
  EXPECT_TRUE(at::allclose(y, y_ref, 1e-5, 1e-6)) << (y - y_ref).abs().max().item<float>();
  (y * probe).sum().backward();
  (y_ref * probe).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(at::allclose(x.grad(), x_ref.grad(), 1e-5, 1e-6));
  // The backward trained the expert on the server: one SGD step with lr 0.1.
  auto after = server_->Parameters("ffn.0.1");
  ASSERT_TRUE(after.ok());
  for (size_t i = 0; i < ref.size(); ++i) {
    const at::Tensor stepped = ref[i].detach() - 0.1 * ref[i].grad();
    EXPECT_TRUE(at::allclose((*after)[i], stepped, 1e-5, 1e-6)) << "parameter " << i;
  }
  // The other expert was not touched.
  auto other = server_->Parameters("ffn.2.3");
  auto other_local = Expert::Create({.hidden = kHidden, .seed = ExpertSeed(5, "ffn.2.3")});
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_TRUE(at::equal((*other)[i], (*other_local)->parameters()[i]));
  }
  EXPECT_EQ(server_->stats().forwards, 1u);
  EXPECT_EQ(server_->stats().backwards, 1u);
}

// Requests that arrive together are computed in batches and cut back apart: each of 24
// concurrent forwards of 1 to 5 rows gets exactly its own rows' outputs. Their 70 rows fit the
// 2 x max_batch (128) rows an expert lets wait, however they arrive.
TEST_F(ExpertServers, ConcurrentRequestsAreBatchedAndEachGetsItsOwnRows) {
  auto weights = server_->Parameters("ffn.0.1");
  ASSERT_TRUE(weights.ok());
  RemoteExpert expert = Find("ffn.0.1");
  constexpr int kRequests = 24;
  std::vector<at::Tensor> xs, ys(kRequests);
  for (int i = 0; i < kRequests; ++i) xs.push_back(at::randn({i % 5 + 1, kHidden}));
  std::vector<std::thread> clients;
  std::vector<Status> errors(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] {
      auto y = expert.Forward(xs[i], test::HangGuard(30s));
      if (y.ok()) {
        ys[i] = *y;
      } else {
        errors[i] = y.status();
      }
    });
  }
  for (auto& c : clients) c.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(errors[i].ok()) << i << ": " << errors[i].ToString();
    EXPECT_TRUE(at::allclose(ys[i], Ffn(xs[i], *weights), 1e-5, 1e-6)) << "request " << i;
  }
  const auto stats = server_->stats();
  EXPECT_EQ(stats.forwards, static_cast<uint64_t>(kRequests));
  EXPECT_GE(stats.forward_batches, 1u);
  EXPECT_LE(stats.forward_batches, static_cast<uint64_t>(kRequests));
  std::printf("[experts] %d concurrent requests in %llu batches\n", kRequests,
              static_cast<unsigned long long>(stats.forward_batches));
}

TEST_F(ExpertServers, HostileRequestsGetErrorsAndTheServerKeepsServing) {
  const at::Tensor good = at::randn({4, kHidden});
  at::Tensor nan = good.clone();
  nan[1][2] = std::nanf("");
  struct Case {
    std::string method, uid;
    std::vector<at::Tensor> tensors;
    std::string why;
  };
  const std::vector<Case> cases = {
      {"moe.forward", "ffn.9.9", {good}, "not hosted here"},
      {"moe.forward", "../etc", {good}, "not hosted here"},
      {"moe.forward", "ffn.0.1", {at::randn({4, kHidden + 1})}, "this expert takes"},
      {"moe.forward", "ffn.0.1", {at::randn({65, kHidden})}, "elements"},
      {"moe.forward", "ffn.0.1", {at::randn({2, 2, kHidden})}, "rank"},
      {"moe.forward", "ffn.0.1", {at::ones({4, kHidden}, at::kInt)}, "dtype"},
      {"moe.forward", "ffn.0.1", {nan}, "NaN"},
      {"moe.forward", "ffn.0.1", {}, "takes 1 tensor"},
      {"moe.backward", "ffn.0.1", {good}, "takes 2 tensor"},
      {"moe.backward", "ffn.0.1", {good, at::randn({3, kHidden})}, "shape differs"},
      {"moe.backward", "ffn.0.1", {good, nan}, "NaN"},
  };
  for (const auto& c : cases) {
    auto r = Raw(c.method, c.uid, c.tensors);
    ASSERT_FALSE(r.ok()) << c.method << " " << c.why;
    EXPECT_NE(r.status().message().find(c.why), std::string::npos) << r.status().ToString();
  }
  EXPECT_EQ(server_->stats().refused, cases.size());
  // A hostile backward did not move the weights, and the server still answers.
  auto local = Expert::Create({.hidden = kHidden, .seed = ExpertSeed(5, "ffn.0.1")});
  auto weights = server_->Parameters("ffn.0.1");
  for (size_t i = 0; i < weights->size(); ++i) {
    EXPECT_TRUE(at::equal((*weights)[i], (*local)->parameters()[i]));
  }
  auto ok = Raw("moe.forward", "ffn.0.1", {good});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->tensors.size(), 1u);
}

TEST_F(ExpertServers, ABackwardReachesARestartedServer) {
  RemoteExpert expert = Find("ffn.2.3");
  at::Tensor x = at::randn({3, kHidden}).requires_grad_(true);
  at::Tensor y = CallRemoteExpert(expert, x, {});
  // The server restarts between the forward and the backward; the backward recomputes the
  // forward from the input it carries, so it needs no state from before.
  server_->Shutdown();
  server_.reset();
  auto again = ExpertServer::Start(*server_node_, options_);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  server_ = std::move(*again);
  y.sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(server_->stats().backwards, 1u);
  // A shut-down server says so.
  server_->Shutdown();
  auto refused = Raw("moe.forward", "ffn.2.3", {at::randn({1, kHidden})});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("shutting down"), std::string::npos);
}

}  // namespace
}  // namespace colony::moe
