// An expert's own training (its learning-rate schedule by steps and its Adam state, which a
// checkpoint restores, and gradient clipping), and expert servers and remote experts over DHT
// nodes on loopback: forward and backward through a remote expert equal the expert's function
// computed here with the same weights (outputs, input gradients, and the server's SGD step),
// declarations renewed while a server serves and gone after it stops, a call larger than one
// message travels in chunks, hostile requests and chunked calls get errors while the server keeps
// serving and holds a bounded number of request bytes, remote errors reach the caller with the
// server's reason, and a backward reaching a restarted server works.
#include "moe/expert.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/serialize/output-archive.h>

#include <asio/co_spawn.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <cmath>
#include <thread>

#include "adversary/hostile_peer.h"
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

// One backward step of the expert written out here: the parameters' gradients for input x and
// output gradient g.
std::vector<at::Tensor> FfnGrads(const std::vector<at::Tensor>& p, const at::Tensor& x,
                                 const at::Tensor& g) {
  std::vector<at::Tensor> leaves;
  for (const auto& t : p) leaves.push_back(t.detach().clone().requires_grad_(true));
  (Ffn(x, leaves) * g).sum().backward();
  std::vector<at::Tensor> grads;
  for (const auto& t : leaves) grads.push_back(t.grad());
  return grads;
}

std::vector<at::Tensor> Detached(const std::vector<at::Tensor>& p) {
  std::vector<at::Tensor> out;
  for (const auto& t : p) out.push_back(t.detach().clone());
  return out;
}

// An expert's own optimizer follows its learning-rate schedule by its steps (here linear: warmup
// over 2 steps, 0 at step 6; transformers' formula written out below) and clips its gradients'
// global norm; each step equals plain SGD at that rate on the clipped gradients computed here.
TEST(ExpertTraining, TheRateFollowsTheScheduleByStepsAndGradientsAreClipped) {
  constexpr double kLr = 0.1, kClip = 0.05;
  const auto rate = [](int64_t s) {
    return s < 2 ? kLr * static_cast<double>(s) / 2
                 : kLr * std::max(0.0, static_cast<double>(6 - s) / 4);
  };
  for (const double clip : {0.0, kClip}) {
    SCOPED_TRACE(clip);
    auto e = Expert::Create({.hidden = kHidden,
                             .optimizer = "sgd",
                             .lr = kLr,
                             .schedule = {.kind = train::LrSchedule::Kind::kLinear,
                                          .warmup_epochs = 2,
                                          .total_epochs = 6},
                             .clip_grad_norm = clip,
                             .seed = 3});
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    std::vector<at::Tensor> ref = Detached((*e)->parameters());
    bool clipped = false;
    for (int64_t s = 0; s < 8; ++s) {
      const at::Tensor x = at::randn({5, kHidden}), g = at::randn({5, kHidden});
      std::vector<at::Tensor> grads = FfnGrads(ref, x, g);
      double squares = 0;
      for (const auto& gr : grads) squares += gr.pow(2).sum().item<double>();
      const double norm = std::sqrt(squares);
      const double scale = clip > 0 && norm > clip ? clip / (norm + 1e-6) : 1.0;
      clipped = clipped || scale < 1;
      (*e)->Backward(x, g);
      for (size_t i = 0; i < ref.size(); ++i) ref[i] -= rate(s) * scale * grads[i];
      for (size_t i = 0; i < ref.size(); ++i) {
        EXPECT_TRUE(at::allclose((*e)->parameters()[i], ref[i], 1e-5, 1e-7))
            << "step " << s << ", parameter " << i;
      }
    }
    EXPECT_EQ(clipped, clip > 0);
  }
}

// A checkpoint carries the schedule's position (the step count): an expert restored from it
// takes its next step at the rate of that step, scaled from the learning rate it was started
// with now.
TEST(ExpertTraining, ARestoredExpertGoesOnWithItsScheduleWhereItWas) {
  test::TempDir dir("expert-schedule");
  const train::LrSchedule schedule{
      .kind = train::LrSchedule::Kind::kLinear, .warmup_epochs = 1, .total_epochs = 5};
  auto first = Expert::Create(
      {.hidden = kHidden, .optimizer = "sgd", .lr = 0.1, .schedule = schedule, .seed = 4});
  ASSERT_TRUE(first.ok());
  for (int s = 0; s < 3; ++s) (*first)->Backward(at::randn({2, kHidden}), at::randn({2, kHidden}));
  const std::string path = (dir.path() / "e.pt").string();
  ASSERT_TRUE((*first)->Save(path).ok());
  auto second = Expert::Create(
      {.hidden = kHidden, .optimizer = "sgd", .lr = 0.4, .schedule = schedule, .seed = 9});
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE((*second)->Load(path).ok());
  EXPECT_EQ((*second)->steps(), 3u);
  std::vector<at::Tensor> ref = Detached((*second)->parameters());
  const at::Tensor x = at::randn({2, kHidden}), g = at::randn({2, kHidden});
  const std::vector<at::Tensor> grads = FfnGrads(ref, x, g);
  (*second)->Backward(x, g);
  // Step 3 of warmup 1 and end 5: 0.4 x (5 - 3) / (5 - 1).
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_TRUE(at::allclose((*second)->parameters()[i], ref[i] - 0.2 * grads[i], 1e-5, 1e-7))
        << "parameter " << i;
  }
}

// Finite inputs can still overflow an expert's gradients; a step would then make its weights
// NaN for everyone. It is skipped instead, and counted.
TEST(ExpertTraining, AStepWhoseGradientsOverflowIsSkipped) {
  auto e = Expert::Create({.hidden = 4, .optimizer = "sgd", .lr = 0.1, .seed = 2});
  ASSERT_TRUE(e.ok());
  std::vector<at::Tensor> big = Detached((*e)->parameters());
  big[0].fill_(1e19f);  // hidden activations of 4e19, times an output gradient of 1e20
  ASSERT_TRUE((*e)->SetWeights(big).ok());
  (*e)->Backward(at::ones({1, 4}), at::full({1, 4}, 1e20f));
  EXPECT_EQ((*e)->steps(), 0u);
  EXPECT_EQ((*e)->skipped_steps(), 1u);
  for (size_t i = 0; i < big.size(); ++i) EXPECT_TRUE(at::equal((*e)->parameters()[i], big[i]));
}

// A finite gradient too large to square in float32 (one hostile backward request) would make
// Adam's second moment infinite for good: every later update would be 0. The step is skipped,
// and the expert goes on training.
TEST(ExpertTraining, AGradientTooLargeToSquareIsSkippedAndTrainingGoesOn) {
  auto e = Expert::Create({.hidden = 4, .optimizer = "adam", .lr = 0.1, .seed = 3});
  ASSERT_TRUE(e.ok());
  const std::vector<at::Tensor> before = Detached((*e)->parameters());
  (*e)->Backward(at::ones({2, 4}), at::full({2, 4}, 1e22f));
  EXPECT_EQ((*e)->steps(), 0u);
  EXPECT_EQ((*e)->skipped_steps(), 1u);
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(at::equal((*e)->parameters()[i], before[i]));
  }
  (*e)->Backward(at::ones({2, 4}), at::full({2, 4}, 0.5f));
  EXPECT_EQ((*e)->steps(), 1u);
  for (size_t i = 0; i < before.size(); ++i) {
    // Adam's first step moves every weight with a gradient by about lr.
    EXPECT_GT(((*e)->parameters()[i] - before[i]).abs().max().item<float>(), 0.05f) << i;
    EXPECT_TRUE(at::isfinite((*e)->parameters()[i]).all().item<bool>()) << i;
  }
}

// A server batches the backward requests that wait together into one step. When one client's
// request is too large to step with, that step is skipped; the other requests then step alone, so
// the expert ends as one that took only them (without it, the batch's step was lost: 0 steps).
TEST(ExpertTraining, ABatchedRequestTooLargeToStepWithDoesNotCancelTheOthersSteps) {
  const ExpertOptions o = {.hidden = 4, .optimizer = "adam", .lr = 0.1, .seed = 3};
  auto e = Expert::Create(o);
  auto reference = Expert::Create(o);
  ASSERT_TRUE(e.ok() && reference.ok());
  const std::pair<at::Tensor, at::Tensor> honest = {at::randn({3, 4}), at::randn({3, 4})};
  const std::pair<at::Tensor, at::Tensor> other = {at::randn({2, 4}), at::randn({2, 4})};
  const std::pair<at::Tensor, at::Tensor> hostile = {at::ones({1, 4}), at::full({1, 4}, 1e30f)};
  const std::vector<at::Tensor> gx = BackwardBatch(**e, {honest, hostile, other});
  ASSERT_EQ(gx.size(), 3u);
  EXPECT_EQ((*e)->steps(), 2u);
  EXPECT_EQ((*e)->skipped_steps(), 2u);  // the batch's, then the hostile request's alone
  const at::Tensor want_honest = (*reference)->Backward(honest.first, honest.second);
  const at::Tensor want_other = (*reference)->Backward(other.first, other.second);
  EXPECT_TRUE(at::allclose(gx[0], want_honest, 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(gx[2], want_other, 1e-6, 1e-7));
  EXPECT_EQ(gx[1].sizes(), hostile.first.sizes());
  for (size_t i = 0; i < (*e)->parameters().size(); ++i) {
    EXPECT_TRUE(at::allclose((*e)->parameters()[i], (*reference)->parameters()[i], 1e-6, 1e-7))
        << i;
  }
  // A batch that can step is one step, each request getting its rows of the batch's gradient.
  const std::vector<at::Tensor> together = BackwardBatch(**e, {honest, other});
  const at::Tensor whole = (*reference)
                               ->Backward(at::cat({honest.first, other.first}, 0),
                                          at::cat({honest.second, other.second}, 0));
  ASSERT_EQ(together.size(), 2u);
  EXPECT_EQ((*e)->steps(), 3u);
  EXPECT_TRUE(at::allclose(together[0], whole.narrow(0, 0, 3), 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(together[1], whole.narrow(0, 3, 2), 1e-6, 1e-7));
}

TEST(ExpertTraining, BadSchedulesClippingNormsAndStepCountsAreRefused) {
  const auto refused = [](ExpertOptions o, const std::string& says) {
    o.hidden = kHidden;
    auto e = Expert::Create(o);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find(says), std::string::npos) << e.status().ToString();
  };
  refused({.schedule = {.warmup_epochs = -1}}, "warmup steps must be >= 0");
  refused({.schedule = {.kind = train::LrSchedule::Kind::kCosine,
                        .warmup_epochs = 4,
                        .total_epochs = 4}},
          "decays the rate to 0 at total steps (4), which must be above warmup steps (4)");
  refused({.clip_grad_norm = -1}, "clipping norm -1");
  refused({.clip_grad_norm = std::nan("")}, "clipping norm nan");
  // A checkpoint whose step count is negative is not read (the check comes before the
  // optimizer's state, which this one leaves out).
  test::TempDir dir("expert-steps");
  auto e = Expert::Create({.hidden = kHidden, .seed = 1});
  ASSERT_TRUE(e.ok());
  torch::serialize::OutputArchive archive;
  for (size_t i = 0; i < (*e)->parameters().size(); ++i) {
    archive.write("param" + std::to_string(i), (*e)->parameters()[i].detach());
  }
  archive.write("steps", at::tensor(int64_t{-3}));
  const std::string path = (dir.path() / "e.pt").string();
  archive.save_to(path);
  Status st = (*e)->Load(path);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("its step count is not a count"), std::string::npos) << st.ToString();
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
    // Two backward calls of max_batch rows (8 KiB each) at once, not three.
    options_.max_request_bytes = 16 << 10;
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

  // A call written message by message (expert_chunks.h), from the client's host or `from`;
  // `close` false leaves it open (the stream is returned in *open) and reads nothing.
  Result<net::Message> RawStream(const std::string& method, const std::vector<net::Message>& msgs,
                                 bool close = true, std::shared_ptr<net::Stream>* open = nullptr,
                                 net::Host* from = nullptr) {
    net::Host& host = from != nullptr ? *from : client_node_->host();
    auto run = [&]() -> asio::awaitable<Result<net::Message>> {
      auto stream = co_await host.OpenStream(server_node_->VisibleAddresses().at(0), method,
                                             {.timeout = 30s});
      if (!stream.ok()) co_return stream.status();
      for (const auto& m : msgs) {
        Status st = co_await (*stream)->Write(m);
        if (!st.ok()) co_return st;
      }
      if (!close) {
        *open = *stream;
        co_return net::Message();
      }
      Status st = co_await (*stream)->CloseWrite();
      if (!st.ok()) co_return st;
      co_return co_await (*stream)->ReadFinal();
    };
    return asio::co_spawn(host.io_context(), run(), asio::use_future).get();
  }
  static net::Message Chunk(const std::string& uid, const std::vector<at::Tensor>& tensors) {
    net::Message m(uid);
    for (const auto& t : tensors) m.tensors.push_back(*runtime::ToFrame(t));
    return m;
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

// A server's refusal reaches the caller of a remote expert with the server's reason, through the
// plain calls and through autograd (an exception), and a call to an id nobody hosts says so.
TEST_F(ExpertServers, RemoteErrorsReachTheCallerWithTheServersReason) {
  RemoteExpert expert = Find("ffn.0.1");
  auto wide = expert.Forward(at::randn({2, kHidden + 1}), 10s);
  ASSERT_FALSE(wide.ok());
  EXPECT_NE(wide.status().message().find("this expert takes"), std::string::npos)
      << wide.status().ToString();
  at::Tensor nan = at::randn({2, kHidden});
  nan[0][0] = std::nanf("");
  auto backward = expert.Backward(at::randn({2, kHidden}), nan, 10s);
  ASSERT_FALSE(backward.ok());
  EXPECT_NE(backward.status().message().find("NaN"), std::string::npos)
      << backward.status().ToString();
  try {
    (void)CallRemoteExpert(expert, at::randn({3, kHidden + 2}), {});
    ADD_FAILURE() << "a refused call through autograd returned";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("this expert takes"), std::string::npos) << e.what();
  }
  auto found = GetExperts(*client_node_, {"ffn.0.1"});
  ASSERT_TRUE(found.at(0).has_value());
  RemoteExpertInfo elsewhere = *found[0];
  elsewhere.uid = "ffn.7.7";  // this server, an id it does not host
  RemoteExpert nobody(client_node_->host(), elsewhere);
  auto missing = nobody.Forward(at::randn({1, kHidden}), 10s);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("not hosted here"), std::string::npos)
      << missing.status().ToString();
}

// An expert's checkpoint restores its optimizer's state too: Adam's moments and step count make
// the next step of a restored expert equal the next step of the expert that saved it (a fresh
// Adam would take a step of another size).
TEST(ExpertTraining, ARestoredAdamExpertStepsAsTheOneThatSavedIt) {
  test::TempDir dir("expert-adam");
  const ExpertOptions o{.hidden = kHidden, .optimizer = "adam", .lr = 0.01, .seed = 6};
  auto saved = Expert::Create(o);
  ASSERT_TRUE(saved.ok());
  for (int s = 0; s < 3; ++s) (*saved)->Backward(at::randn({4, kHidden}), at::randn({4, kHidden}));
  const std::string path = (dir.path() / "e.pt").string();
  ASSERT_TRUE((*saved)->Save(path).ok());
  auto restored = Expert::Create(o);
  auto fresh = Expert::Create(o);
  ASSERT_TRUE(restored.ok() && fresh.ok());
  ASSERT_TRUE((*restored)->Load(path).ok());
  ASSERT_TRUE((*fresh)->SetWeights(Detached((*saved)->parameters())).ok());
  const at::Tensor x = at::randn({4, kHidden}), g = at::randn({4, kHidden});
  for (auto* e : {saved->get(), restored->get(), fresh->get()}) e->Backward(x, g);
  bool fresh_differs = false;
  for (size_t i = 0; i < (*saved)->parameters().size(); ++i) {
    EXPECT_TRUE(at::equal((*restored)->parameters()[i], (*saved)->parameters()[i])) << i;
    fresh_differs =
        fresh_differs || !at::allclose((*fresh)->parameters()[i], (*saved)->parameters()[i]);
  }
  EXPECT_TRUE(fresh_differs);
}

// A server re-declares its experts before their records expire (here every 0.2 s for 2 s, as
// hivemind's 30 s for 60 s), so they stay findable for as long as it serves; once it stops they
// disappear with their last record's expiration.
TEST(ExpertDeclarations, AreRenewedWhileTheServerServesAndExpireAfterItStops) {
  auto server_node = dht::Node::Start(KeyPair::Generate(), test::LoopbackNodeOptions({}));
  ASSERT_TRUE(server_node.ok()) << server_node.status().ToString();
  auto client_node = dht::Node::Start(
      KeyPair::Generate(),
      test::LoopbackNodeOptions({(*server_node)->VisibleAddresses().at(0).ToString()}));
  ASSERT_TRUE(client_node.ok()) << client_node.status().ToString();
  ExpertServerOptions o;
  o.uids = {"ffn.3.4"};
  o.expert = {.hidden = kHidden, .seed = 2};
  o.declare_interval = 200ms;
  o.declaration_ttl_seconds = 2;
  auto server = ExpertServer::Start(**server_node, o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const auto found = [&] { return GetExperts(**client_node, {"ffn.3.4"}).at(0).has_value(); };
  EXPECT_TRUE(found());
  // Past the first declaration's expiration: found only because it was declared again.
  std::this_thread::sleep_for(4500ms);
  EXPECT_TRUE(found());
  (*server)->Shutdown();
  EXPECT_TRUE(test::WaitUntil([&] { return !found(); }, 20s));
  (*client_node)->Shutdown();
  (*server_node)->Shutdown();
}

// A call bigger than the transport lets one message be (64 MiB): 4200 rows of 4096 floats, 69 MB
// per tensor, 138 MB for the backward. It travels in chunks both ways, and the outputs and the
// input gradient equal the expert's function computed here.
TEST_F(ExpertServers, ACallLargerThanAMessageTravelsInChunks) {
  constexpr int64_t kWide = 4096, kRows = 4200;
  server_.reset();
  auto big = ExpertServer::Start(
      *server_node_, {.uids = {"big.0"},
                      .expert = {.hidden = kWide, .ffn_hidden = 4, .optimizer = "sgd", .lr = 0},
                      .max_batch = kRows});
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  server_ = std::move(*big);
  auto weights = server_->Parameters("big.0");
  ASSERT_TRUE(weights.ok());
  std::vector<at::Tensor> ref;
  for (const auto& w : *weights) ref.push_back(w.clone().requires_grad_(true));
  const at::Tensor data = at::randn({kRows, kWide});
  ASSERT_GT(static_cast<uint64_t>(data.numel()) * 4, uint64_t{64} << 20);
  RemoteExpert expert = Find("big.0");
  at::Tensor x = data.clone().requires_grad_(true);
  at::Tensor y = CallRemoteExpert(
      expert, x,
      {.forward_timeout = test::HangGuard(300s), .backward_timeout = test::HangGuard(300s)});
  at::Tensor x_ref = data.clone().requires_grad_(true);
  at::Tensor y_ref = Ffn(x_ref, ref);
  EXPECT_TRUE(at::allclose(y, y_ref, 1e-4, 1e-5)) << (y - y_ref).abs().max().item<float>();
  y.sum().backward();
  y_ref.sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(at::allclose(x.grad(), x_ref.grad(), 1e-4, 1e-5));
  EXPECT_EQ(server_->stats().forwards, 1u);
  EXPECT_EQ(server_->stats().backwards, 1u);
}

// Chunked calls played by an attacker: rows beyond max_batch summed over chunks, a later chunk
// naming an expert, a call with no request, and calls left open holding their chunks (the
// server holds at most max_request_bytes of them; a call beyond is refused, and the bytes come
// back when the attacker's calls end).
TEST_F(ExpertServers, HostileChunkedCallsAreRefusedAndHeldBytesAreBounded) {
  const at::Tensor rows40 = at::randn({40, kHidden});
  struct Case {
    std::vector<net::Message> msgs;
    std::string why;
  };
  const std::vector<Case> cases = {
      {{Chunk("ffn.0.1", {rows40}), Chunk("", {rows40})}, "at most 64 rows"},
      {{Chunk("ffn.0.1", {rows40}), Chunk("ffn.2.3", {rows40})}, "only the first message"},
      {{}, "without a request"},
  };
  for (const auto& c : cases) {
    auto r = RawStream("moe.forward", c.msgs);
    ASSERT_FALSE(r.ok()) << c.why;
    EXPECT_NE(r.status().message().find(c.why), std::string::npos) << r.status().ToString();
  }
  const at::Tensor full = at::randn({64, kHidden});
  std::vector<std::shared_ptr<net::Stream>> held(2);
  for (auto& h : held) {
    auto r = RawStream("moe.backward", {Chunk("ffn.0.1", {full, full})}, false, &h);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  // The server reads both calls' chunks (16 KiB, its limit) before it refuses a third.
  Result<net::Message> third = Unavailable("not sent");
  for (int i = 0; i < 200; ++i) {
    third = Raw("moe.forward", "ffn.2.3", {at::randn({1, kHidden})});
    if (!third.ok()) break;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted) << third.status().ToString();
  EXPECT_NE(third.status().message().find("bytes of requests"), std::string::npos);
  for (auto& h : held) h->Cancel();
  Result<net::Message> after = Unavailable("not sent");
  for (int i = 0; i < 200; ++i) {
    after = Raw("moe.forward", "ffn.2.3", {at::randn({1, kHidden})});
    if (after.ok()) break;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  // No hostile call reached an expert: the weights are the seeded ones.
  auto local = Expert::Create({.hidden = kHidden, .seed = ExpertSeed(5, "ffn.0.1")});
  auto weights = server_->Parameters("ffn.0.1");
  for (size_t i = 0; i < weights->size(); ++i) {
    EXPECT_TRUE(at::equal((*weights)[i], (*local)->parameters()[i]));
  }
}

// One machine cannot hold the whole request budget: the server applies its per-address caps to
// loopback here, so that 127.0.0.2 plays the attacker's machine. Its calls left open hold its
// share (a quarter of 32 KiB: one backward call of 64 rows); the next ones are refused, and an
// honest client's backward of the same size is served beside them.
TEST_F(ExpertServers, OneAddressHoldsOnlyItsShareOfTheRequestBudget) {
  server_.reset();
  server_node_->Shutdown();
  auto o = test::LoopbackNodeOptions({});
  o.host.limit_loopback_addresses = true;
  auto node = dht::Node::Start(KeyPair::Generate(), o);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  server_node_ = std::move(*node);
  options_.max_request_bytes = 32 << 10;
  for (double bad : {0.0, -0.5, 1.5, std::nan("")}) {
    options_.request_share_per_address = bad;
    auto refused = ExpertServer::Start(*server_node_, options_);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("request_share_per_address"), std::string::npos);
  }
  options_.request_share_per_address = 0.25;
  auto started = ExpertServer::Start(*server_node_, options_);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  server_ = std::move(*started);

  test::HostilePeer attacker(test::DialingFrom("127.0.0.2"));
  ASSERT_TRUE(attacker.start_error().ok()) << attacker.start_error().ToString();
  const at::Tensor full = at::randn({64, kHidden});  // 8 KiB with its gradient
  std::vector<std::shared_ptr<net::Stream>> held(4);
  for (auto& h : held) {
    auto r =
        RawStream("moe.backward", {Chunk("ffn.0.1", {full, full})}, false, &h, &attacker.host());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  // The server reads the four calls' chunks: one is held, three are refused.
  EXPECT_TRUE(test::WaitUntil([&] { return server_->stats().refused == 3; }, 10s))
      << server_->stats().refused;
  auto one_more = RawStream("moe.forward", {Chunk("ffn.2.3", {at::randn({1, kHidden})})}, true,
                            nullptr, &attacker.host());
  ASSERT_FALSE(one_more.ok());
  EXPECT_EQ(one_more.status().code(), StatusCode::kResourceExhausted)
      << one_more.status().ToString();
  EXPECT_NE(one_more.status().message().find("one client address may hold 8192"), std::string::npos)
      << one_more.status().ToString();

  auto honest = RawStream("moe.backward", {Chunk("ffn.2.3", {full, full})});
  ASSERT_TRUE(honest.ok()) << honest.status().ToString();
  EXPECT_EQ(server_->stats().backwards, 1u);
  // The attacker's bytes come back with its calls: it may call again.
  for (auto& h : held) h->Cancel();
  Result<net::Message> after = Unavailable("not sent");
  for (int i = 0; i < 200 && !after.ok(); ++i) {
    if (i > 0) std::this_thread::sleep_for(10ms);
    after = RawStream("moe.forward", {Chunk("ffn.2.3", {full})}, true, nullptr, &attacker.host());
  }
  EXPECT_TRUE(after.ok()) << after.status().ToString();
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
  // The input gradient is the expert's, from the seeded weights both servers started from.
  auto seeded = Expert::Create({.hidden = kHidden, .seed = ExpertSeed(5, "ffn.2.3")});
  ASSERT_TRUE(seeded.ok());
  at::Tensor x_ref = x.detach().clone().requires_grad_(true);
  Ffn(x_ref, Detached((*seeded)->parameters())).sum().backward();
  EXPECT_TRUE(at::allclose(x.grad(), x_ref.grad(), 1e-5, 1e-6));
  // A shut-down server says so.
  server_->Shutdown();
  auto refused = Raw("moe.forward", "ffn.2.3", {at::randn({1, kHidden})});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("shutting down"), std::string::npos);
}

// A second server declares the expert too and never answers (hostile, or hung). It is tried
// first: the call still ends by its deadline, answered by the live server within it; the backward
// goes where the forward was computed, and the next calls do not wait on the mute server again.
TEST_F(ExpertServers, AMuteCoDeclarerCostsOneCallShareAndIsTriedLastAfterwards) {
  auto mute = dht::Node::Start(KeyPair::Generate(), test::LoopbackNodeOptions({}));
  ASSERT_TRUE(mute.ok()) << mute.status().ToString();
  auto asked = std::make_shared<std::atomic<int>>(0);
  for (const char* method : {"moe.forward", "moe.backward"}) {
    (*mute)->host().RegisterUnary(
        method, [asked](net::CallContext&, net::Message) -> asio::awaitable<Result<net::Message>> {
          ++*asked;
          asio::steady_timer timer(co_await asio::this_coro::executor, 20s);
          co_await timer.async_wait(asio::use_awaitable);
          co_return net::Message();
        });
  }
  auto declared = GetExperts(*client_node_, {"ffn.0.1"});
  ASSERT_TRUE(declared.at(0).has_value());
  const RemoteExpertInfo& found = *declared[0];
  ASSERT_EQ(found.servers.size(), 1u);
  RemoteExpertInfo info{
      .uid = "ffn.0.1",
      .servers = {(*mute)->host().peer_id(), found.servers[0]},
      .addrs = {{(*mute)->VisibleAddresses().at(0).ToString()}, found.addrs.at(0)}};
  RemoteExpert expert(client_node_->host(), info);
  const RemoteCallOptions timeouts{.forward_timeout = 6s, .backward_timeout = 6s};

  const at::Tensor data = at::randn({4, kHidden});
  at::Tensor x = data.clone().requires_grad_(true);
  const auto start = std::chrono::steady_clock::now();
  at::Tensor y = CallRemoteExpert(expert, x, timeouts);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(asked->load(), 1);
  // The mute server held the call for its half of the deadline, not the whole of it (tried in
  // turn with a timeout each, the call took 6 s and more).
  EXPECT_LT(took, 6s);
  auto weights = server_->Parameters("ffn.0.1");
  ASSERT_TRUE(weights.ok());
  const at::Tensor y_ref = Ffn(data, Detached(*weights));
  EXPECT_TRUE(at::allclose(y, y_ref, 1e-5, 1e-6));
  y.sum().backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_EQ(server_->stats().backwards, 1u);
  at::Tensor again = CallRemoteExpert(expert, data, timeouts);
  EXPECT_TRUE(
      at::allclose(again, Ffn(data, Detached(*server_->Parameters("ffn.0.1"))), 1e-5, 1e-6));
  EXPECT_EQ(asked->load(), 1) << "the mute server was asked again";
  (*mute)->Shutdown();
}

}  // namespace
}  // namespace colony::moe
