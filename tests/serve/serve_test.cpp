// Serving in one process over real sockets: block servers (each with its own DHT node and host on
// loopback) and a client, checked against the same model run locally.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/optim/adam.h>
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "adversary/attack_measurements.h"
#include "adversary/hostile_peer.h"
#include "core/files.h"
#include "dht/node.h"
#include "dht/validation.h"
#include "model/checkpoint.h"
#include "naive_beam_search.h"
#include "net/host.h"
#include "runtime/task_pool.h"
#include "runtime/tensor_io.h"
#include "serve/client.h"
#include "serve/finetune.h"
#include "serve/generation.h"
#include "serve/serve.pb.h"
#include "serve/server.h"
#include "serve/tuning.h"
#include "small_model.h"
#include "test_support.h"

namespace colony::serve {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Untied embeddings: the client model then loads a separate LM head.
model::LlamaConfig SmallConfig() { return test::SmallLlamaConfig(/*tie_word_embeddings=*/false); }

class ServeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    dir_ = colony::test::TempPath("serve-test");
    config_ = SmallConfig();
    at::manual_seed(42);
    model::LlamaModel m(config_);
    ASSERT_TRUE(model::SaveLlama(dir_, m).ok());
    auto loaded = model::LoadLlama(dir_);
    ASSERT_TRUE(loaded.ok());
    local_ = *loaded;
    local_->eval();
    dht::NodeOptions o;
    o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
    auto boot = dht::Node::Start(KeyPair::Generate(), o);
    ASSERT_TRUE(boot.ok()) << boot.status().ToString();
    bootstrap_ = std::move(*boot);
  }

  void TearDown() override {
    session_.reset();
    servers_.clear();
    if (client_) client_->Shutdown();
    for (auto& n : nodes_) n->Shutdown();
    if (bootstrap_) bootstrap_->Shutdown();
    RemoveTree(dir_);
  }

  std::string BootstrapAddress() { return bootstrap_->VisibleAddresses().at(0).ToString(); }

  // Pinned on blocks [first, last), or unpinned (o.num_blocks) with first = last = -1.
  BlockServer& AddServer(int64_t first, int64_t last, double throughput = 100,
                         ServerOptions o = {}) {
    dht::NodeOptions no;
    no.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
    no.initial_peers = {BootstrapAddress()};
    auto node = dht::Node::Start(KeyPair::Generate(), no);
    EXPECT_TRUE(node.ok()) << node.status().ToString();
    o.model_dir = dir_;
    o.model_name = "tiny";
    o.first_block = first;
    o.last_block = last;
    o.throughput_override = throughput;
    o.torch_threads = 0;
    auto server = BlockServer::Start(**node, o);
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    nodes_.push_back(std::move(*node));
    servers_.push_back(std::move(*server));
    return *servers_.back();
  }

  // Starts the client (dialing from `dial_from`, default the kernel's choice) and waits until it
  // sees `expected` servers.
  void Connect(size_t expected, ClientOptions co = {}, const std::string& dial_from = {}) {
    dht::NodeOptions no;
    no.host.dial_from = dial_from;
    no.initial_peers = {BootstrapAddress()};
    no.dht.client_mode = true;
    auto node = dht::Node::Start(KeyPair::Generate(), no);
    ASSERT_TRUE(node.ok()) << node.status().ToString();
    client_ = std::move(*node);
    co.model_name = "tiny";
    co.num_blocks = config_.num_layers;
    co.step_timeout = 10s;
    co.request_timeout = 10s;
    co.retry_backoff = 50ms;
    manager_ = std::make_shared<SequenceManager>(*client_, co);
    bool refreshed = true;
    const bool seen = colony::test::WaitUntil(
        [&] {
          refreshed = refreshed && manager_->Refresh().ok();
          return !refreshed || manager_->Servers().size() >= expected;
        },
        15s);
    ASSERT_TRUE(refreshed);
    if (seen) return;
    FAIL() << "the client saw " << manager_->Servers().size() << " of " << expected
           << " servers within 15 s";
  }

  ClientModel Head() {
    auto head = LoadClientModel(dir_);
    EXPECT_TRUE(head.ok()) << head.status().ToString();
    return *head;
  }

  // Seeded LoRA adapters (rank 2, scale 2) on q_proj, v_proj and down_proj, with B drawn from
  // N(0, b_std) instead of zeros so that they change the output.
  LoraTuned RandomLora(std::shared_ptr<RemoteSequential> remote, double b_std) {
    at::manual_seed(5);
    LoraTuningOptions lo;
    lo.rank = 2;
    lo.targets = {"q_proj", "v_proj", "down_proj"};
    lo.scale = 2.0;
    LoraTuned lora(Head(), std::move(remote), lo);
    at::NoGradGuard no_grad;
    for (size_t i = 1; i < lora->adapters.size(); i += 2) lora->adapters[i].normal_(0, b_std);
    return lora;
  }

  at::Tensor LocalBlocks(at::Tensor h, int64_t first, int64_t last,
                         const at::Tensor& prompts = {}) {
    for (int64_t i = first; i < last; ++i) {
      if (prompts.defined()) {
        const int64_t p = prompts.size(2);
        h = at::cat({h.narrow(1, 0, p) + prompts[i - first], h.narrow(1, p, h.size(1) - p)}, 1);
      }
      h = local_->block(i)->forward(h);
    }
    return h;
  }

  Multiaddr ServerAddress(size_t i) { return nodes_.at(i)->VisibleAddresses().at(0); }

  // An honest client generating beside an attack, one token per step through blocks [0, 4):
  // Steps() returns its step latencies (each step must succeed), Check() compares everything it
  // generated with the local blocks.
  class HonestGeneration {
   public:
    HonestGeneration(ServeTest& t, int64_t max_tokens)
        : t_(t),
          remote_(t.manager_),
          session_(remote_.OpenSession({.max_length = max_tokens, .batch_size = 1})),
          x_(at::randn({1, max_tokens, t.config_.hidden_size})) {}

    std::vector<double> Steps(int64_t n) {
      std::vector<double> latencies;
      for (int64_t i = 0; i < n && position_ < x_.size(1); ++i, ++position_) {
        const auto t0 = Clock::now();
        auto y = session_->Step(x_.narrow(1, position_, 1));
        latencies.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        EXPECT_TRUE(y.ok()) << "an honest step failed beside the attack: " << y.status().ToString();
        if (y.ok()) outputs_.push_back(*y);
      }
      return latencies;
    }

    void Check() {
      at::NoGradGuard no_grad;
      ASSERT_EQ(static_cast<int64_t>(outputs_.size()), position_);
      EXPECT_TRUE(at::allclose(at::cat(outputs_, 1),
                               t_.LocalBlocks(x_.narrow(1, 0, position_), 0, 4), 0, 1e-3))
          << "the honest client's outputs changed under the attack";
    }

   private:
    ServeTest& t_;
    RemoteSequential remote_;
    std::unique_ptr<InferenceSession> session_;
    at::Tensor x_;
    std::vector<at::Tensor> outputs_;
    int64_t position_ = 0;
  };

  // Shuts down the server that holds the span starting at block `start` in the session's route
  // (mid-generation); returns its id.
  PeerId KillServerAt(const InferenceSession& session, int64_t start) {
    PeerId killed;
    for (const auto& span : session.stats().route) {
      if (span.start != start) continue;
      killed = span.server.peer;
      for (size_t i = 0; i < nodes_.size(); ++i) {
        if (nodes_[i]->peer_id() == killed) {
          servers_[i]->Shutdown();
          nodes_[i]->Shutdown();
        }
      }
    }
    return killed;
  }

  // Greedy decoding of a tuned model without sessions: every step runs the whole sequence
  // through `forward` (tokens [1, T] -> logits [1, T, V], the RemoteSequential forward path).
  // Returns the generated tokens; `logits`, when given, gets each step's logits.
  static std::vector<int64_t> ReferenceGreedy(
      const std::function<at::Tensor(const at::Tensor&)>& forward, std::vector<int64_t> tokens,
      int64_t new_tokens, std::vector<at::Tensor>* logits = nullptr) {
    at::NoGradGuard no_grad;
    std::vector<int64_t> out;
    for (int64_t i = 0; i < new_tokens; ++i) {
      at::Tensor l = forward(at::tensor(tokens, at::kLong).unsqueeze(0));
      if (logits) logits->push_back(l);
      out.push_back(l[0][-1].argmax().item<int64_t>());
      tokens.push_back(out.back());
    }
    return out;
  }

  // Greedy generation through an inference session tuned by `options` (and shallow prompts)
  // equals the reference token for token, and its logits equal the reference's (atol 1e-3)
  // position by position. Returns the tokens.
  std::vector<int64_t> ExpectSessionEqualsReference(
      RemoteSequential& remote, const std::function<at::Tensor(const at::Tensor&)>& forward,
      const SessionOptions& options, const at::Tensor& shallow, const std::vector<int64_t>& prompt,
      int64_t new_tokens) {
    std::vector<at::Tensor> ref_logits;
    const auto expected = ReferenceGreedy(forward, prompt, new_tokens, &ref_logits);
    {
      auto session = remote.OpenSession(options);
      RemoteBackend backend(Head(), *session, options.max_length, shallow);
      at::Tensor input = at::tensor(prompt, at::kLong).unsqueeze(0);
      for (int64_t i = 0; i < new_tokens; ++i) {
        auto logits = backend.Step(input, backend.position(), {}, StepLogits::kAll);
        EXPECT_TRUE(logits.ok()) << logits.status().ToString();
        if (!logits.ok()) return {};
        const at::Tensor& ref = ref_logits[static_cast<size_t>(i)];
        const at::Tensor want = ref.narrow(1, ref.size(1) - input.size(1), input.size(1));
        EXPECT_TRUE(at::allclose(*logits, want, 0, 1e-3))
            << "step " << i << ": max difference " << (*logits - want).abs().max().item<double>();
        input = at::full({1, 1}, expected[static_cast<size_t>(i)], at::kLong);
      }
      EXPECT_EQ(backend.position(), static_cast<int64_t>(prompt.size()) + new_tokens - 1);
    }
    auto session = remote.OpenSession(options);
    RemoteBackend backend(Head(), *session, options.max_length, shallow);
    auto got = GenerateWith(backend, prompt, {.max_new_tokens = new_tokens});
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    if (got.ok()) {
      EXPECT_EQ(*got, expected);
    }
    return expected;
  }

  std::filesystem::path dir_;
  model::LlamaConfig config_;
  model::LlamaModel local_{nullptr};
  std::unique_ptr<dht::Node> bootstrap_;
  std::vector<std::unique_ptr<dht::Node>> nodes_;
  std::vector<std::unique_ptr<BlockServer>> servers_;
  std::unique_ptr<dht::Node> client_;
  std::shared_ptr<SequenceManager> manager_;
  std::unique_ptr<InferenceSession> session_;
};

TEST_F(ServeTest, RemoteBlockEqualsLocal) {
  AddServer(0, 4);
  Connect(1);
  RemoteSequential remote(manager_);
  at::Tensor x = at::randn({2, 7, config_.hidden_size});
  auto out = remote.Forward(x);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::allclose(*out, LocalBlocks(x, 0, 4), 0, 1e-4));
  // A sub-range of the server's blocks.
  RemoteSequential middle(manager_, 1, 3);
  auto mid = middle.Forward(x);
  ASSERT_TRUE(mid.ok()) << mid.status().ToString();
  EXPECT_TRUE(at::allclose(*mid, LocalBlocks(x, 1, 3), 0, 1e-4));
}

TEST_F(ServeTest, ChainOfThreeServersForwardAndBackwardEqualLocal) {
  AddServer(0, 1);
  AddServer(1, 3);
  AddServer(3, 4);
  Connect(3);
  RemoteSequential remote(manager_);
  const int64_t p = 3;
  at::Tensor x = at::randn({2, 6, config_.hidden_size}).requires_grad_();
  at::Tensor prompts = (at::randn({4, 2, p, config_.hidden_size}) * 0.1).requires_grad_();
  at::Tensor target = at::randn({2, 6, config_.hidden_size});
  at::Tensor out = remote.forward(x, prompts);
  ASSERT_TRUE(out.requires_grad());
  ((out - target).pow(2).sum()).backward();

  at::Tensor x2 = x.detach().clone().requires_grad_();
  at::Tensor prompts2 = prompts.detach().clone().requires_grad_();
  at::Tensor ref = LocalBlocks(x2, 0, 4, prompts2);
  ((ref - target).pow(2).sum()).backward();
  EXPECT_TRUE(at::allclose(out, ref, 0, 1e-4));
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(at::allclose(x.grad(), x2.grad(), 1e-4, 1e-4))
      << (x.grad() - x2.grad()).abs().max().item<double>();
  EXPECT_TRUE(at::allclose(prompts.grad(), prompts2.grad(), 1e-4, 1e-4));
  EXPECT_GT(x.grad().abs().sum().item<double>(), 0);
  size_t forwards = 0, backwards = 0;
  for (auto& s : servers_) {
    forwards += s->Stats().forwards;
    backwards += s->Stats().backwards;
  }
  EXPECT_EQ(forwards, 3u);
  EXPECT_EQ(backwards, 3u);
}

TEST_F(ServeTest, InferenceStepsEqualLocalBlocks) {
  AddServer(0, 2);
  AddServer(2, 4);
  Connect(2);
  RemoteSequential remote(manager_);
  auto session = remote.OpenSession({.max_length = 32, .batch_size = 2});
  at::Tensor x = at::randn({2, 10, config_.hidden_size});
  at::Tensor ref;
  {
    at::NoGradGuard no_grad;
    ref = LocalBlocks(x, 0, 4);
  }
  // The prefix in one step, then one token per step: the same as the full causal forward.
  auto a = session->Step(x.narrow(1, 0, 6));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(at::allclose(*a, ref.narrow(1, 0, 6), 0, 1e-3));
  for (int64_t t = 6; t < 10; ++t) {
    auto s = session->Step(x.narrow(1, t, 1));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_TRUE(at::allclose(*s, ref.narrow(1, t, 1), 0, 1e-3)) << "position " << t;
  }
  EXPECT_EQ(session->position(), 10);
  EXPECT_EQ(session->stats().route.size(), 2u);
}

TEST_F(ServeTest, TheChainsLastServerReturnsOnlyTheLastPositionWhenAskedForIt) {
  AddServer(0, 2);
  AddServer(2, 4);
  Connect(2);
  RemoteSequential remote(manager_);
  const int64_t b = 2, h = config_.hidden_size;
  at::Tensor x = at::randn({b, 9, h});
  at::Tensor ref;
  {
    at::NoGradGuard no_grad;
    ref = LocalBlocks(x, 0, 4);
  }
  // kLast on the prompt and on every decoding step, then a kAll step in the same session.
  auto session = remote.OpenSession({.max_length = 32, .batch_size = b});
  auto a = session->Step(x.narrow(1, 0, 6), {}, -1, StepOutputs::kLast);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->sizes(), at::IntArrayRef({b, 1, h}));
  EXPECT_TRUE(at::allclose(*a, ref.narrow(1, 5, 1), 0, 1e-3));
  // What came back: all 6 positions from the first server (the client keeps them for a
  // replacement of the second), the last one only from the second; float32 values.
  const int64_t f = sizeof(float);
  EXPECT_EQ(session->stats().received_bytes, b * 6 * h * f + b * 1 * h * f);
  for (int64_t t = 6; t < 8; ++t) {
    auto s = session->Step(x.narrow(1, t, 1), {}, -1, StepOutputs::kLast);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_TRUE(at::allclose(*s, ref.narrow(1, t, 1), 0, 1e-3)) << "position " << t;
  }
  // Rolled back by one and asked for every position: both servers send both.
  auto all = session->Step(x.narrow(1, 6, 3), {}, 6);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_TRUE(at::allclose(*all, ref.narrow(1, 6, 3), 0, 1e-3));
  EXPECT_EQ(session->stats().received_bytes, b * (6 + 1 + 2 + 2 + 3 + 3) * h * f);
  // The second server took most steps' inputs from the first one's push.
  EXPECT_GT(servers_[1]->Stats().pushes_used, 0u);
}

TEST_F(ServeTest, GreedyAndSampledGenerationEqualLocal) {
  AddServer(0, 1);
  AddServer(1, 3);
  AddServer(3, 4);
  Connect(3);
  RemoteSequential remote(manager_);
  const std::vector<int64_t> prompt = {5, 17, 99, 3};
  for (double temperature : {0.0, 0.9}) {
    model::SamplingOptions so{.max_new_tokens = 20,
                              .temperature = temperature,
                              .top_k = 40,
                              .top_p = 0.95,
                              .repetition_penalty = 1.1,
                              .seed = 11};
    const auto expected = model::Generate(local_, prompt, so);
    auto session = remote.OpenSession({.max_length = 64, .batch_size = 1});
    RemoteBackend backend(Head(), *session, 64);
    std::vector<int64_t> streamed;
    auto got = GenerateWith(backend, prompt, so, -1, [&](int64_t t) { streamed.push_back(t); });
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, expected) << "temperature " << temperature;
    EXPECT_EQ(streamed, expected);
    // The local backend is the same algorithm on the local model.
    LocalBackend local_backend(local_);
    auto local = GenerateWith(local_backend, prompt, so);
    ASSERT_TRUE(local.ok());
    EXPECT_EQ(*local, expected);
  }
}

// n samples of one prompt as the rows of one session: each row is token for token what the whole
// model in this process generates with that row's options (its own seed, temperature, length), a
// row ended early by its caller stays ended, and the session stepped once per token for all rows.
TEST_F(ServeTest, SampledRowsOfOneSessionEachEqualLocalGeneration) {
  AddServer(0, 2);
  AddServer(2, 4);
  Connect(2);
  RemoteSequential remote(manager_);
  const std::vector<int64_t> prompt = {5, 17, 99, 3};
  std::vector<model::SamplingOptions> rows;
  for (uint64_t seed : {11, 12, 13}) {
    rows.push_back({.max_new_tokens = 20,
                    .temperature = 0.9,
                    .top_k = 40,
                    .top_p = 0.95,
                    .repetition_penalty = 1.1,
                    .seed = seed});
  }
  rows[2].max_new_tokens = 7;
  rows.push_back({.max_new_tokens = 20, .temperature = 0});  // greedy
  std::vector<std::vector<int64_t>> expected;
  for (const auto& so : rows) expected.push_back(model::Generate(local_, prompt, so));
  ASSERT_NE(expected[0], expected[1]) << "two seeds sampled the same tokens";
  // Row 1 is stopped by its caller after its 5th token.
  expected[1].resize(5);
  auto session = remote.OpenSession({.max_length = 64, .batch_size = 4});
  RemoteBackend backend(Head(), *session, 64);
  std::vector<std::vector<int64_t>> streamed(rows.size());
  auto got = GenerateRows(
      backend, prompt, rows, -1,
      [&](int64_t row, int64_t t) { streamed[static_cast<size_t>(row)].push_back(t); },
      [&](int64_t row) { return row == 1 && streamed[1].size() == 5; });
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, expected);
  EXPECT_EQ(streamed, expected);
  // The prompt, then one step per token of the longest row (its last token is not stepped).
  EXPECT_EQ(backend.position(), static_cast<int64_t>(prompt.size()) + 20 - 1);
  // One row is GenerateWith.
  auto one = remote.OpenSession({.max_length = 64, .batch_size = 1});
  RemoteBackend one_backend(Head(), *one, 64);
  auto single = GenerateWith(one_backend, prompt, rows[0]);
  ASSERT_TRUE(single.ok()) << single.status().ToString();
  EXPECT_EQ(*single, expected[0]);
  // Rows that do not fit the session's rows are refused by the servers, not run short.
  auto short_session = remote.OpenSession({.max_length = 64, .batch_size = 2});
  RemoteBackend short_backend(Head(), *short_session, 64);
  EXPECT_FALSE(GenerateRows(short_backend, prompt, rows).ok());
}

// A decoding step asks for the last position's logits only: both backends return [B, 1, V], the
// last row of what the same step gives with every position's, after a prompt and after a
// one-token step; a step without tokens is refused.
TEST_F(ServeTest, ADecodingStepGetsItsLastPositionsLogitsOnly) {
  AddServer(0, 2);
  AddServer(2, 4);
  Connect(2);
  RemoteSequential remote(manager_);
  auto session = remote.OpenSession({.max_length = 32, .batch_size = 2});
  RemoteBackend remote_backend(Head(), *session, 32);
  LocalBackend local_backend(local_);
  const at::Tensor prompt = at::tensor({3, 9, 27, 81, 7, 21}, at::kLong).view({2, 3});
  const at::Tensor next = at::tensor({5, 6}, at::kLong).view({2, 1});
  const int64_t v = config_.vocab_size;
  for (DecoderBackend* backend : std::vector<DecoderBackend*>{&remote_backend, &local_backend}) {
    for (const at::Tensor& tokens : {prompt, next}) {
      const int64_t position = tokens.size(1) == 3 ? 0 : 3;
      auto all = backend->Step(tokens, position, {}, StepLogits::kAll);
      ASSERT_TRUE(all.ok()) << all.status().ToString();
      ASSERT_EQ(all->sizes(), (std::vector<int64_t>{2, tokens.size(1), v}));
      auto last = backend->Step(tokens, position, {}, StepLogits::kLast);  // the same step again
      ASSERT_TRUE(last.ok()) << last.status().ToString();
      ASSERT_EQ(last->sizes(), (std::vector<int64_t>{2, 1, v}));
      EXPECT_TRUE(at::allclose(*last, all->narrow(1, tokens.size(1) - 1, 1), 1e-5, 1e-5));
    }
    auto empty = backend->Step(at::zeros({2, 0}, at::kLong), 4, {}, StepLogits::kLast);
    ASSERT_FALSE(empty.ok());
    EXPECT_NE(empty.status().message().find("[2, 0]"), std::string::npos)
        << empty.status().ToString();
  }
}

// `got` holds the beams of `expected`: the same tokens, log-probabilities within 1e-3.
void ExpectBeams(const Result<std::vector<Beam>>& got, const std::vector<Beam>& expected) {
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), expected.size());
  for (size_t i = 0; i < got->size(); ++i) {
    EXPECT_EQ((*got)[i].tokens, expected[i].tokens) << "beam " << i;
    EXPECT_NEAR((*got)[i].log_prob, expected[i].log_prob, 1e-3) << "beam " << i;
  }
}

TEST_F(ServeTest, BeamSearchThroughTwoServersEqualsAnIndependentSearch) {
  AddServer(0, 2);
  AddServer(2, 4);
  Connect(2);
  RemoteSequential remote(manager_);
  const std::vector<int64_t> prompt = {1, 2, 3, 4, 5};
  const auto expected = test::NaiveBeamSearch(local_, prompt, 4, 12);
  auto session = remote.OpenSession({.max_length = 32, .batch_size = 4});
  RemoteBackend backend(Head(), *session, 32);
  auto got = BeamSearch(backend, prompt, 4, 12);
  ExpectBeams(got, expected);
  // The same through the local backend (KV cache and row reordering on one process).
  LocalBackend local_backend(local_);
  auto local = BeamSearch(local_backend, prompt, 4, 12);
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  ASSERT_EQ(local->size(), expected.size());
  for (size_t i = 0; i < local->size(); ++i) {
    EXPECT_EQ((*local)[i].tokens, expected[i].tokens) << "local beam " << i;
  }
}

// A repetition penalty changes what beam search finds, as transformers applies it (to the beams'
// log-probabilities, over the prompt and each beam's own tokens, through the row reordering):
// the beams equal the independent search with the same penalty, and differ from those without.
TEST_F(ServeTest, BeamSearchWithARepetitionPenaltyEqualsAnIndependentSearch) {
  const std::vector<int64_t> prompt = {1, 2, 3, 4, 5};
  const double penalty = 3.0;
  const auto expected = test::NaiveBeamSearch(local_, prompt, 4, 10, penalty);
  EXPECT_NE(expected[0].tokens, test::NaiveBeamSearch(local_, prompt, 4, 10)[0].tokens)
      << "the penalty must matter for this test to mean anything";
  LocalBackend backend(local_);
  auto got = BeamSearch(backend, prompt, 4, 10, {}, 1.0, penalty);
  ExpectBeams(got, expected);
  LocalBackend again(local_);
  EXPECT_EQ(BeamSearch(again, prompt, 4, 10, {}, 1.0, 0.0).status().code(),
            StatusCode::kInvalidArgument);
}

// transformers' beam search ends a hypothesis at any id of its eos list (Llama 3 Instruct lists
// three). Two tokens of the unconstrained search's beams are made end tokens, the second of the
// list one that its best beam generates third: no beam may go on past either, and every beam
// that took one is finished with it (ignoring the second id, the best beam goes on past it).
TEST_F(ServeTest, ABeamEndsAtAnyOfItsEndTokens) {
  const std::vector<int64_t> prompt = {1, 2, 3, 4, 5};
  const auto free = test::NaiveBeamSearch(local_, prompt, 4, 12);
  const int64_t end = free[0].tokens[2];
  const int64_t other = free[1].tokens.back();
  LocalBackend backend(local_);
  auto got = BeamSearch(backend, prompt, 4, 12, {other, end});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_FALSE(got->empty());
  for (const Beam& b : *got) {
    for (size_t i = 0; i + 1 < b.tokens.size(); ++i) {
      EXPECT_TRUE(b.tokens[i] != end && b.tokens[i] != other)
          << "a beam went on past an end token at " << i;
    }
    const bool ends = !b.tokens.empty() && (b.tokens.back() == end || b.tokens.back() == other);
    EXPECT_EQ(b.finished, ends);
  }
}

TEST_F(ServeTest, RollbackRecomputesFromAnEarlierPosition) {
  AddServer(0, 4);
  Connect(1);
  RemoteSequential remote(manager_);
  auto session = remote.OpenSession({.max_length = 32, .batch_size = 1});
  at::Tensor a = at::randn({1, 8, config_.hidden_size});
  at::Tensor b = at::randn({1, 3, config_.hidden_size});
  ASSERT_TRUE(session->Step(a).ok());
  // Speculative decoding: drop the last 3 positions and continue with other tokens.
  auto r = session->Step(b, {}, 5);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(session->position(), 8);
  at::NoGradGuard no_grad;
  at::Tensor ref = LocalBlocks(at::cat({a.narrow(1, 0, 5), b}, 1), 0, 4);
  EXPECT_TRUE(at::allclose(*r, ref.narrow(1, 5, 3), 0, 1e-3));
  // Rolling forward past the end is refused.
  EXPECT_EQ(session->Step(b, {}, 9).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ServeTest, CacheAccountingIsExactPerSession) {
  auto& server = AddServer(0, 4);
  Connect(1);
  const int64_t per_token = CacheBytesPerToken(config_, at::kFloat);
  ASSERT_EQ(server.Stats().cache_bytes_used, 0);
  RemoteSequential remote(manager_);
  auto s1 = remote.OpenSession({.max_length = 20, .batch_size = 3});
  ASSERT_TRUE(s1->Step(at::randn({3, 2, config_.hidden_size})).ok());
  EXPECT_EQ(server.Stats().cache_bytes_used, 3 * 20 * 4 * per_token);
  RemoteSequential part(manager_, 1, 3);
  auto s2 = part.OpenSession({.max_length = 10, .batch_size = 1});
  ASSERT_TRUE(s2->Step(at::randn({1, 1, config_.hidden_size})).ok());
  EXPECT_EQ(server.Stats().cache_bytes_used, (3 * 20 * 4 + 10 * 2) * per_token);
  EXPECT_EQ(server.Stats().sessions, 2u);
  s1->Close();
  colony::test::WaitUntil([&] { return server.Stats().cache_bytes_used == 10 * 2 * per_token; },
                          5s);
  EXPECT_EQ(server.Stats().cache_bytes_used, 10 * 2 * per_token);
  s2->Close();
  colony::test::WaitUntil([&] { return server.Stats().cache_bytes_used == 0; }, 5s);
  EXPECT_EQ(server.Stats().cache_bytes_used, 0);
  EXPECT_EQ(server.Stats().sessions, 0u);
}

TEST_F(ServeTest, PushedStepsAreProcessedExactlyOnce) {
  auto& first = AddServer(0, 2);
  auto& second = AddServer(2, 4);
  Connect(2);
  RemoteSequential remote(manager_);
  auto session = remote.OpenSession({.max_length = 40, .batch_size = 1});
  at::Tensor x = at::randn({1, 20, config_.hidden_size});
  at::Tensor ref;
  {
    at::NoGradGuard no_grad;
    ref = LocalBlocks(x, 0, 4);
  }
  const int steps = 20;
  for (int t = 0; t < steps; ++t) {
    auto r = session->Step(x.narrow(1, t, 1));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(at::allclose(*r, ref.narrow(1, t, 1), 0, 1e-3));
  }
  // Exactly once: every step ran once on each server, whichever copy arrived first.
  EXPECT_EQ(first.Stats().steps, static_cast<uint64_t>(steps));
  EXPECT_EQ(second.Stats().steps, static_cast<uint64_t>(steps));
  EXPECT_GT(second.Stats().pushes_used, 0u);
  // The client sends every step too: for each step that ran from a push, the client's copy
  // arrives later and is dropped (the last one may still be in flight: wait for it).
  colony::test::WaitUntil([&] { return second.Stats().duplicates >= second.Stats().pushes_used; },
                          5s);
  EXPECT_GE(second.Stats().duplicates, second.Stats().pushes_used);
  EXPECT_EQ(second.Stats().steps, static_cast<uint64_t>(steps));
}

TEST_F(ServeTest, FailoverToAReplacementKeepsGenerationIdentical) {
  AddServer(0, 2, 100);
  AddServer(2, 4, 1000);  // preferred: faster
  AddServer(2, 4, 10);    // replacement
  Connect(3);
  RemoteSequential remote(manager_);
  const std::vector<int64_t> prompt = {9, 8, 7};
  model::SamplingOptions so{.max_new_tokens = 16};
  const auto expected = model::Generate(local_, prompt, so);
  auto session = remote.OpenSession({.max_length = 32, .batch_size = 1});
  RemoteBackend backend(Head(), *session, 32);
  int produced = 0;
  PeerId killed;
  auto got = GenerateWith(backend, prompt, so, -1, [&](int64_t) {
    // Take down the server holding blocks 2..4 in the session's route, mid-generation.
    if (++produced == 5) killed = KillServerAt(*session, 2);
  });
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, expected);
  EXPECT_EQ(session->stats().failovers, 1) << got.status().ToString();
  EXPECT_GT(session->stats().replayed_tokens, 0);
  for (const auto& span : session->stats().route) EXPECT_NE(span.server.peer, killed);
}

TEST_F(ServeTest, RoutingPrefersFastServersAndSkipsBannedOnes) {
  AddServer(0, 4, 10);
  AddServer(0, 2, 1000);
  AddServer(2, 4, 1000);
  Connect(3);
  auto route = manager_->MakeRoute(0, 4, RoutingMode::kMaxThroughput);
  ASSERT_TRUE(route.ok()) << route.status().ToString();
  ASSERT_EQ(route->size(), 2u);
  EXPECT_EQ((*route)[0].server.peer, nodes_[1]->peer_id());
  EXPECT_EQ((*route)[1].server.peer, nodes_[2]->peer_id());
  manager_->Ban(nodes_[2]->peer_id(), Unavailable("test"));
  route = manager_->MakeRoute(0, 4, RoutingMode::kMaxThroughput);
  ASSERT_TRUE(route.ok());
  // Blocks 2..4 now only on the slow server, which also holds 0..2.
  EXPECT_EQ(route->back().server.peer, nodes_[0]->peer_id());
  manager_->Ban(nodes_[0]->peer_id(), Unavailable("test"));
  auto none = manager_->MakeRoute(0, 4, RoutingMode::kMaxThroughput);
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("block 2"), std::string::npos) << none.status().ToString();
}

// A stranger's record of blocks [0, 4) of "tiny", online at `address` with a throughput (and
// inference rate) of `claim`: one DHT item per block, signed by `key` as its owner.
std::vector<dht::StoreItem> FakeRecordItems(const KeyPair& key, const std::string& address,
                                            double claim, int64_t start = 0, int64_t end = 4) {
  ServerRecord r;
  r.peer = key.peer_id();
  r.state = ServerState::kOnline;
  r.start = start;
  r.end = end;
  r.throughput = r.inference_rps = claim;
  r.addresses = {address};
  std::vector<dht::StoreItem> out;
  for (int64_t b = start; b < end; ++b) {
    out.push_back(
        colony::test::HostilePeer::SignedBy(key, {.key = BlockKey("tiny", b),
                                                  .subkey = dht::OwnerMarker(key.peer_id()),
                                                  .value = EncodeServerRecord(r),
                                                  .expiration = dht::Now() + 300}));
  }
  return out;
}

// Stores `items` (records of identities of their own) on each of `replicas` from a peer of its
// own (a node signs only its own records).
::testing::AssertionResult StoreAsStranger(const std::vector<Multiaddr>& replicas,
                                           const std::vector<dht::StoreItem>& items) {
  colony::test::HostilePeer liar;
  if (!liar.start_error().ok()) return ::testing::AssertionFailure() << "no peer to store from";
  for (const Multiaddr& replica : replicas) {
    for (size_t i = 0; i < items.size(); i += 16) {
      auto stored = liar.Store(
          replica, {items.begin() + static_cast<std::ptrdiff_t>(i),
                    items.begin() + static_cast<std::ptrdiff_t>(std::min(items.size(), i + 16))});
      if (!stored.ok()) return ::testing::AssertionFailure() << stored.status().ToString();
    }
  }
  return ::testing::AssertionSuccess();
}

// Binds `fd` to a free port of 127.0.0.1 and returns the port (0 on failure).
uint16_t BindLoopback(int fd) {
  sockaddr_in bound{};
  bound.sin_family = AF_INET;
  bound.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof bound;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&bound), sizeof bound) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
    return 0;
  }
  return ntohs(bound.sin_port);
}

// Records are what strangers say of themselves. 200 identities announce every block with a
// boastful throughput at an address that accepts TCP and never answers (a black hole), and one
// more names the honest server's address as its own: routing pings the unknown servers at once
// (sequentially, 200 two-second ping deadlines would take 400 s), routes around those that did
// not answer, and the impostor's record is refused.
TEST_F(ServeTest, FakeRecordsWithBlackHoledAddressesDoNotStallRouting) {
  AddServer(0, 4, 100);
  // A listener that never accepts: connections complete in the kernel and hear nothing.
  const int hole = ::socket(AF_INET, SOCK_STREAM, 0);
  const uint16_t port = BindLoopback(hole);
  ASSERT_NE(port, 0);
  ASSERT_EQ(::listen(hole, 4096), 0);
  constexpr int kFakes = 200;
  std::vector<dht::StoreItem> items;
  for (int i = 0; i < kFakes; ++i) {
    const KeyPair key = KeyPair::Generate();
    for (auto& item : FakeRecordItems(
             key, fmt::format("/ip4/127.0.0.1/tcp/{}/p2p/{}", port, key.peer_id().ToString()),
             1e9)) {
      items.push_back(std::move(item));
    }
  }
  const KeyPair impostor = KeyPair::Generate();
  for (auto& item : FakeRecordItems(impostor, ServerAddress(0).ToString(), 1e9))
    items.push_back(item);
  ASSERT_TRUE(StoreAsStranger({bootstrap_->VisibleAddresses().at(0), ServerAddress(0)}, items));

  Connect(1 + kFakes);
  for (const auto& r : manager_->Servers()) EXPECT_NE(r.peer, impostor.peer_id());
  for (RoutingMode mode : {RoutingMode::kMaxThroughput, RoutingMode::kMinLatency}) {
    const auto t0 = Clock::now();
    auto route = manager_->MakeRoute(0, 4, mode);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    ASSERT_TRUE(route.ok()) << route.status().ToString();
    ASSERT_EQ(route->size(), 1u);
    EXPECT_EQ(route->front().server.peer, nodes_[0]->peer_id());
    EXPECT_LT(seconds, 60) << "routing waited for the black-holed servers one by one";
  }
  // And a forward pass goes through.
  RemoteSequential remote(manager_);
  auto out = remote.Forward(at::randn({1, 3, config_.hidden_size}));
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  ::close(hole);
}

// A stranger's server that calls every request invalid (invalid_argument, the caller's fault if
// believed) would make every call routed to it fail at once, and never be avoided. The client
// takes such a refusal as the server's failure: it avoids the server (one refused call each) and
// goes on through the honest one, whose results equal the blocks run here.
TEST_F(ServeTest, AServerCallingEveryRequestInvalidIsAvoidedNotBelieved) {
  AddServer(0, 4, 10);
  std::atomic<int> forwards{0}, sessions{0};
  net::HostOptions ho;
  ho.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  colony::test::HostilePeer liar(ho);
  ASSERT_TRUE(liar.start_error().ok()) << liar.start_error().ToString();
  liar.host().RegisterUnary(
      "serve.forward",
      [&forwards](net::CallContext&, net::Message) -> asio::awaitable<Result<net::Message>> {
        ++forwards;
        co_return InvalidArgument("hidden states have size 1 in the last dimension");
      });
  liar.host().RegisterBidiStreaming(
      "serve.inference", [&sessions](net::CallContext& ctx) -> asio::awaitable<Status> {
        ++sessions;
        (void)co_await ctx.stream().Read();
        co_return InvalidArgument("max_length is outside [1, 1] (this server's limit)");
      });
  // Its record: every block, a throughput far above the honest server's (routing prefers it).
  const auto items =
      FakeRecordItems(liar.identity(), liar.host().ListenAddresses().at(0).ToString(), 1e6);
  for (const Multiaddr& replica : {bootstrap_->VisibleAddresses().at(0), ServerAddress(0)}) {
    auto stored = liar.Store(replica, items);
    ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  }
  Connect(2);

  RemoteSequential remote(manager_);
  const at::Tensor x = at::randn({1, 3, config_.hidden_size});
  at::Tensor expected;
  {
    at::NoGradGuard no_grad;
    expected = LocalBlocks(x, 0, 4);
  }
  auto out = remote.Forward(x);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(forwards.load(), 1) << "the liar was never chosen (the test tested nothing) or "
                                   "chosen again after it refused";
  EXPECT_TRUE(at::allclose(*out, expected, 0, 1e-4));
  EXPECT_TRUE(manager_->IsBanned(liar.id()));

  // An inference session likewise, once the liar is no longer avoided.
  EXPECT_TRUE(colony::test::WaitUntil([&] { return !manager_->IsBanned(liar.id()); }, 30s));
  auto session = remote.OpenSession({.max_length = 16, .batch_size = 1});
  auto step = session->Step(x);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  ASSERT_EQ(sessions.load(), 1) << "the liar was never chosen (the test tested nothing) or "
                                   "chosen again after it refused";
  EXPECT_TRUE(at::allclose(*step, expected, 0, 1e-4));
  ASSERT_EQ(session->stats().route.size(), 1u);
  EXPECT_EQ(session->stats().route.front().server.peer, nodes_[0]->peer_id());
}

TEST(ChooseBestStart, PicksTheWeakestWindow) {
  std::vector<ServerRecord> records(2);
  records[0].state = ServerState::kOnline;
  records[0].start = 0;
  records[0].end = 4;
  records[0].throughput = 10;
  records[1].state = ServerState::kOnline;
  records[1].start = 6;
  records[1].end = 8;
  records[1].throughput = 5;
  EXPECT_EQ(ChooseBestStart(records, 8, 2), 4);  // blocks 4, 5 are uncovered
  records[1].state = ServerState::kOffline;
  EXPECT_EQ(ChooseBestStart(records, 8, 3), 4);  // 4..6 uncovered (first such window)
  EXPECT_EQ(ChooseBestStart({}, 8, 8), 0);
}

// Placement's count of claims: at most 4x the (lower) median claim each, and per address only
// the largest claim on each block; records without an address key add up.
// Claims are capped against the lower median: the smaller middle value, so that half the
// claimants lying high do not raise the cap.
TEST(LowerMedian, IsTheMiddleValueOrTheSmallerOfTheTwo) {
  EXPECT_EQ(LowerMedian({}), 0);
  EXPECT_EQ(LowerMedian({5}), 5);
  EXPECT_EQ(LowerMedian({100, 1}), 1);
  EXPECT_EQ(LowerMedian({3, 1e300, 2, 1e300}), 3);
  EXPECT_EQ(LowerMedian({7, 1, 1e300, 2, 1e300}), 7);
}

TEST(CountedCoverage, ClaimsAreCappedAndOneAddressCountsOnce) {
  auto record = [](int64_t start, int64_t end, double claim) {
    ServerRecord r;
    r.state = ServerState::kOnline;
    r.start = start;
    r.end = end;
    r.throughput = claim;
    return r;
  };
  ServerRecord offline = record(0, 4, 1000);
  offline.state = ServerState::kOffline;
  const std::vector<ServerRecord> records = {record(0, 2, 100),   record(0, 2, 100),
                                             record(2, 4, 1e300), record(2, 3, 50),
                                             record(2, 3, 60),    offline};
  const auto coverage = CountedCoverage(records, {"", "", "", "10.0.0.1", "10.0.0.1", ""}, 4);
  // Claims 100, 100, 1e300, 50, 60: the lower median 100 caps at 400.
  EXPECT_EQ(coverage, (std::vector<double>{200, 200, 460, 400}));
  EXPECT_EQ(ChooseBestStart(coverage, 2), 0);
  // This server's own claim joins the median: 100, 100, 1e300, 50, 60, 10 -> 60, cap 240.
  EXPECT_EQ(CountedCoverage(records, {"", "", "", "10.0.0.1", "10.0.0.1", ""}, 4, 10),
            (std::vector<double>{200, 200, 300, 240}));
}

// Opens a raw inference stream (what a hostile client controls fully).
Result<std::shared_ptr<net::Stream>> RawSession(net::Host& host, const Multiaddr& addr,
                                                const pb::OpenSession& open,
                                                const std::vector<at::Tensor>& tensors = {}) {
  net::Message m(open.SerializeAsString());
  for (const auto& t : tensors) m.tensors.push_back(*runtime::ToFrame(t));
  auto fut = asio::co_spawn(
      host.io_context(),
      [&host, addr, m]() -> asio::awaitable<Result<std::shared_ptr<net::Stream>>> {
        auto s = co_await host.OpenStream(addr, "serve.inference", {.timeout = 60s});
        if (!s.ok()) co_return s.status();
        Status st = co_await (*s)->Write(m);
        if (!st.ok()) co_return st;
        auto reply = co_await (*s)->Read();
        if (!reply.ok()) co_return reply.status();
        if (!*reply) co_return Closed("ended");
        co_return *s;
      },
      asio::use_future);
  return fut.get();
}

// Writes one message on a session's stream and reads the answer: OK, or the error that ended the
// session.
Status StepOnce(net::Host& host, std::shared_ptr<net::Stream> stream, net::Message m) {
  auto fut = asio::co_spawn(
      host.io_context(),
      [stream, m]() -> asio::awaitable<Status> {
        Status st = co_await stream->Write(m);
        if (!st.ok()) co_return st;
        auto r = co_await stream->Read();
        co_return r.ok() ? Status() : r.status();
      },
      asio::use_future);
  return fut.get();
}

pb::OpenSession MakeOpen(int64_t max_length, int64_t batch) {
  static int counter = 0;
  pb::OpenSession o;
  std::string id(16, 'a');
  id[0] = static_cast<char>(++counter);
  id[1] = static_cast<char>(counter >> 8);
  o.set_session_id(id);
  o.set_start(0);
  o.set_end(4);
  o.set_max_length(static_cast<uint32_t>(max_length));
  o.set_batch_size(static_cast<uint32_t>(batch));
  return o;
}

TEST_F(ServeTest, HostileRequestsGetErrorsAndTheServerKeepsServing) {
  ServerOptions o;
  o.max_sessions = 6;
  o.alloc_timeout = 200ms;
  o.cache_bytes = int64_t{2} << 20;
  o.max_length = 64;
  auto& server = AddServer(0, 4, 100, o);
  Connect(1);
  net::Host& host = client_->host();
  const Multiaddr addr = ServerAddress(0);
  auto call = [&](const std::string& method, net::Message m) {
    return host.CallSync(addr, method, std::move(m), {.timeout = 10s});
  };
  // An honest session generates beside the attacks (it holds one of the 6 sessions).
  HonestGeneration honest(*this, 64);
  const auto before = honest.Steps(10);
  std::vector<double> during;
  auto honest_steps = [&](int64_t n) {
    const auto l = honest.Steps(n);
    during.insert(during.end(), l.begin(), l.end());
  };
  auto forward = [&](at::Tensor x, int64_t start = 0, int64_t end = 4) {
    pb::BlockRequest req;
    req.set_start(static_cast<uint32_t>(start));
    req.set_end(static_cast<uint32_t>(end));
    net::Message m(req.SerializeAsString());
    m.tensors.push_back(*runtime::ToFrame(x));
    return call("serve.forward", std::move(m));
  };
  // Wrong hidden size, NaN, blocks it does not hold, garbage metadata, missing tensors.
  EXPECT_EQ(forward(at::randn({1, 4, 65})).status().code(), StatusCode::kInvalidArgument);
  at::Tensor nan = at::randn({1, 4, 64});
  nan[0][1][3] = std::numeric_limits<float>::quiet_NaN();
  auto nan_result = forward(nan);
  EXPECT_EQ(nan_result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(nan_result.status().message().find("NaN"), std::string::npos);
  EXPECT_EQ(forward(at::randn({1, 4, 64}), 2, 6).status().code(), StatusCode::kUnavailable);
  // Malformed requests (an empty range) are protocol errors; requests this server cannot serve
  // are the caller's errors.
  EXPECT_EQ(forward(at::randn({1, 4, 64}), 3, 3).status().code(), StatusCode::kProtocolError);
  EXPECT_EQ(forward(at::randn({1, 4, 64}).to(at::kLong)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(call("serve.forward", net::Message("\xff\xff garbage")).ok());
  EXPECT_FALSE(call("serve.backward", net::Message()).ok());
  // A request larger than the element cap.
  EXPECT_FALSE(forward(at::zeros({64, 65, 64})).ok());
  honest_steps(10);

  // Sessions: a huge max_length, a huge batch, a cache budget too small, too many sessions.
  EXPECT_EQ(RawSession(host, addr, MakeOpen(1 << 30, 1)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(RawSession(host, addr, MakeOpen(8, 100000)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(RawSession(host, addr, MakeOpen(64, 64)).status().code(),
            StatusCode::kResourceExhausted);  // 64 x 64 tokens x 4 blocks x 256 B > 2 MiB
  // A push needs more than the session's id: it must come from the server the client named
  // before this one. Here nobody was named, and then the session's own client (this host,
  // which knows the id) is not the named upstream either.
  {
    const std::string upstream = KeyPair::Generate().peer_id().ToString();
    for (const std::string& named : {std::string(), upstream}) {
      pb::OpenSession open = MakeOpen(8, 1);
      open.set_upstream(named);
      auto session = RawSession(host, addr, open);
      ASSERT_TRUE(session.ok()) << session.status().ToString();
      pb::PushRequest push;
      push.set_session_id(open.session_id());
      push.mutable_step()->set_step_id(1000);
      net::Message pm(push.SerializeAsString());
      pm.tensors.push_back(*runtime::ToFrame(at::zeros({1, 1, config_.hidden_size})));
      auto pushed = call("serve.push", std::move(pm));
      EXPECT_EQ(pushed.status().code(), StatusCode::kPermissionDenied)
          << pushed.status().ToString();
      (*session)->Cancel();
    }
    pb::OpenSession bad = MakeOpen(8, 1);
    bad.set_upstream("not a peer id");
    EXPECT_EQ(RawSession(host, addr, bad).status().code(), StatusCode::kProtocolError);
  }
  honest_steps(10);
  // Push targets this server must not dial for a client (net/dial_targets.h): unspecified,
  // link-local, broadcast, a name to resolve (one without /p2p/ is refused as malformed).
  const std::string someone = KeyPair::Generate().peer_id().ToString();
  for (const std::string& target :
       {"/ip4/0.0.0.0/tcp/22/p2p/" + someone, "/ip4/169.254.169.254/tcp/80/p2p/" + someone,
        "/ip4/255.255.255.255/tcp/80/p2p/" + someone, "/dns/localhost/tcp/22/p2p/" + someone}) {
    pb::OpenSession open = MakeOpen(8, 1);
    open.mutable_next()->set_address(target);
    open.mutable_next()->set_session_id(std::string(16, 'b'));
    auto refused_target = RawSession(host, addr, open);
    EXPECT_EQ(refused_target.status().code(), StatusCode::kPermissionDenied) << target;
  }
  std::vector<std::shared_ptr<net::Stream>> held;
  int refused = 0;
  for (int i = 0; i < 40; ++i) {
    auto s = RawSession(host, addr, MakeOpen(8, 1));
    if (s.ok()) {
      held.push_back(*s);
    } else {
      EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted) << s.status().ToString();
      ++refused;
    }
  }
  EXPECT_EQ(held.size(), 5u);
  EXPECT_EQ(refused, 35);
  EXPECT_EQ(server.Stats().sessions, 6u);
  honest_steps(10);  // the honest session keeps its slot and its cache
  // Still serving forward requests while sessions are exhausted.
  auto ok = forward(at::randn({1, 4, 64}));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  // A bad step kills only its own session.
  {
    pb::Step step;
    step.set_step_id(2);
    step.set_position(5);  // nothing cached yet
    net::Message m(step.SerializeAsString());
    m.tensors.push_back(*runtime::ToFrame(at::randn({1, 1, 64})));
    auto stream = held.front();
    Status st = StepOnce(host, stream, m);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  }
  // A step larger than its session can use (8 tokens here) is refused before it is queued, so
  // that a session's queue holds at most a few of its own steps, not 64 MiB messages.
  {
    pb::Step step;
    step.set_step_id(1);
    net::Message m(step.SerializeAsString());
    m.tensors.push_back(*runtime::ToFrame(at::randn({1, 9, 64})));
    auto stream = held.at(1);
    Status st = StepOnce(host, stream, m);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find("larger than this session can use"), std::string::npos)
        << st.ToString();
  }
  honest_steps(10);
  honest.Check();
  // Each step is a few milliseconds here; the floor of the bound keeps scheduling noise out.
  EXPECT_LT(colony::test::RecordHonestSlowdown(before, during), 10);
  for (auto& s : held) s->Cancel();
  held.clear();
  colony::test::WaitUntil([&] { return server.Stats().sessions == 1; }, 5s);
  EXPECT_EQ(server.Stats().sessions, 1u) << "only the honest session is left";
  // And a new well-behaved session works afterwards.
  RemoteSequential remote(manager_);
  auto session = remote.OpenSession({.max_length = 16, .batch_size = 1});
  auto r = session->Step(at::randn({1, 3, 64}));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
}

// Writes one message on a session's stream.
Status WriteOnly(net::Host& host, std::shared_ptr<net::Stream> stream, net::Message m) {
  auto fut = asio::co_spawn(
      host.io_context(),
      [stream, m]() -> asio::awaitable<Status> { co_return co_await stream->Write(m); },
      asio::use_future);
  return fut.get();
}

// The next result a session's stream carries, waiting at most 10 s (then the stream is
// cancelled).
Result<pb::StepResult> NextResult(net::Host& host, std::shared_ptr<net::Stream> stream) {
  auto fut = asio::co_spawn(
      host.io_context(),
      [stream]() -> asio::awaitable<Result<pb::StepResult>> {
        auto m = co_await stream->Read();
        if (!m.ok()) co_return m.status();
        if (!*m) co_return Closed("the server ended the session");
        pb::StepResult r;
        if (!r.ParseFromString((*m)->meta)) co_return ProtocolError("not a StepResult");
        co_return r;
      },
      asio::use_future);
  if (fut.wait_for(10s) != std::future_status::ready) {
    stream->Cancel();
    fut.wait();
    return DeadlineExceeded("no result within 10 s");
  }
  return fut.get();
}

// `extra` bytes of a field no message here has (protobuf parses and skips it): field 1000,
// length-delimited.
std::string Padding(size_t extra) {
  if (extra == 0) return {};
  std::string out = "\xc2\x3e";  // the tag, varint 8002
  for (size_t n = extra; true; n >>= 7) {
    out += static_cast<char>(n < 0x80 ? n : (n & 0x7f) | 0x80);
    if (n < 0x80) break;
  }
  return out + std::string(extra, 'p');
}

pb::Step MakeStep(uint64_t step_id, int64_t position) {
  pb::Step step;
  step.set_step_id(step_id);
  step.set_position(position);
  return step;
}

// A step message with `extra` bytes of padding in its metadata.
net::Message StepWithPadding(uint64_t step_id, int64_t position, size_t extra, at::Tensor x) {
  net::Message m(MakeStep(step_id, position).SerializeAsString() + Padding(extra));
  m.tensors.push_back(*runtime::ToFrame(x));
  return m;
}

// The server a client named as upstream may push the client's next step, not one beyond it: a
// push claiming a later step id would get every step the client sends dropped as a duplicate
// (no result, the client's step times out and the honest server is blamed). A step or push with
// metadata beyond a few KiB is refused before it is queued (its frames would keep the whole
// message alive while it waits).
TEST_F(ServeTest, APushCannotRunAheadOfTheClientNorCarryAHugeMessage) {
  AddServer(0, 4, 100);
  Connect(1);
  net::Host& host = client_->host();
  const Multiaddr addr = ServerAddress(0);
  auto push = [&](const pb::OpenSession& open, uint64_t step_id, int64_t position,
                  size_t extra = 0) {
    pb::PushRequest req;
    req.set_session_id(open.session_id());
    *req.mutable_step() = MakeStep(step_id, position);
    net::Message pm(req.SerializeAsString() + Padding(extra));
    pm.tensors.push_back(*runtime::ToFrame(at::randn({1, 1, config_.hidden_size})));
    return host.CallSync(addr, "serve.push", std::move(pm), {.timeout = 10s});
  };
  const int64_t h = config_.hidden_size;
  // This host is the session's client and its named upstream (a server the client chose, and
  // which turned hostile or was replaced).
  pb::OpenSession open = MakeOpen(8, 1);
  open.set_upstream(host.peer_id().ToString());
  auto session = RawSession(host, addr, open);
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  auto far = push(open, UINT64_MAX - 1, 0);
  ASSERT_TRUE(far.ok()) << far.status().ToString();  // queued before the client's step
  ASSERT_TRUE(WriteOnly(host, *session, StepWithPadding(2, 0, 0, at::randn({1, 1, h}))).ok());
  auto first = NextResult(host, *session);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->step_id(), 2u) << "the push ran ahead of the client";
  EXPECT_EQ(first->length(), 1);
  // The client's next step may come by push: it runs, and the client's own copy is a duplicate.
  const auto duplicates = servers_[0]->Stats().duplicates;
  auto next = push(open, 4, 1);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  auto pushed = NextResult(host, *session);
  ASSERT_TRUE(pushed.ok()) << pushed.status().ToString();
  EXPECT_EQ(pushed->step_id(), 4u);
  EXPECT_EQ(pushed->length(), 2);
  ASSERT_TRUE(WriteOnly(host, *session, StepWithPadding(4, 1, 0, at::randn({1, 1, h}))).ok());
  colony::test::WaitUntil([&] { return servers_[0]->Stats().duplicates > duplicates; }, 5s);
  EXPECT_EQ(servers_[0]->Stats().duplicates, duplicates + 1);
  // Padded metadata: refused by push, and it ends a client's session.
  auto padded_push = push(open, 6, 2, 8000);
  EXPECT_EQ(padded_push.status().code(), StatusCode::kInvalidArgument)
      << padded_push.status().ToString();
  EXPECT_NE(padded_push.status().message().find("bytes of metadata"), std::string::npos)
      << padded_push.status().ToString();
  Status padded = StepOnce(host, *session, StepWithPadding(6, 2, 8000, at::randn({1, 1, h})));
  EXPECT_EQ(padded.code(), StatusCode::kInvalidArgument) << padded.ToString();
  EXPECT_NE(padded.message().find("bytes of metadata"), std::string::npos) << padded.ToString();
}

// One machine cannot take every inference session or the whole KV cache (issue 15, part 5). The
// server applies its per-address caps to loopback here, so that 127.0.0.2 plays the attacker's
// machine (with a new identity per connection: identities are free) and 127.0.0.3 an honest
// client's.
TEST_F(ServeTest, OneAddressCannotTakeEverySessionOrTheWholeCache) {
  ServerOptions o;
  o.max_sessions = 8;
  o.max_sessions_per_address = 3;
  o.cache_share_per_address = 0.5;
  o.limit_loopback_addresses = true;
  o.alloc_timeout = 200ms;
  o.cache_bytes = int64_t{1} << 20;
  o.max_length = 64;
  auto& server = AddServer(0, 4, 100, o);
  const Multiaddr addr = ServerAddress(0);
  // A session of `tokens` x `batch` over the 4 blocks takes tokens x batch KiB here.
  const int64_t per_token = CacheBytesPerToken(config_, at::kFloat);
  ASSERT_EQ(4 * per_token, 1024);
  std::vector<std::unique_ptr<net::Host>> attackers;
  auto attacker = [&]() -> net::Host& {
    net::HostOptions ho;
    ho.dial_from = "127.0.0.2";
    attackers.push_back(std::make_unique<net::Host>(KeyPair::Generate(), ho));
    EXPECT_TRUE(attackers.back()->Start().ok());
    return *attackers.back();
  };
  // The honest client (from 127.0.0.3) generates beside the attacks, one token per step: its
  // step latencies before and during them, and its outputs against the local blocks at the end.
  Connect(1, {}, "127.0.0.3");
  auto honest = std::make_unique<HonestGeneration>(*this, 64);  // a 64 KiB session
  auto honest_steps = [&](int64_t tokens) { return honest->Steps(tokens); };
  const auto before = honest_steps(10);

  std::vector<std::shared_ptr<net::Stream>> held;
  // Sessions: 6 identities from one address, 2 small sessions each; 3 are kept.
  int refused = 0;
  for (int i = 0; i < 6; ++i) {
    net::Host& host = attacker();
    for (int j = 0; j < 2; ++j) {
      auto s = RawSession(host, addr, MakeOpen(8, 1));
      if (s.ok()) {
        held.push_back(*s);
        continue;
      }
      ++refused;
      EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted) << s.status().ToString();
      EXPECT_NE(s.status().message().find("per client address"), std::string::npos)
          << s.status().ToString();
    }
  }
  EXPECT_EQ(held.size(), 3u);
  EXPECT_EQ(refused, 9);
  EXPECT_EQ(server.Stats().sessions, 4u);
  auto during = honest_steps(10);
  for (auto& s : held) s->Cancel();
  held.clear();
  ASSERT_TRUE(colony::test::WaitUntil([&] { return server.Stats().sessions == 1; }, 5s));

  // Cache: the address's share (512 KiB) in one session; then nothing more, neither a larger
  // session (refused at once) nor a small one (refused after alloc_timeout).
  net::Host& host = attacker();
  auto big = RawSession(host, addr, MakeOpen(64, 8));
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  held.push_back(*big);
  auto larger = RawSession(attacker(), addr, MakeOpen(64, 9));
  EXPECT_EQ(larger.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(larger.status().message().find("more than one client address may hold"),
            std::string::npos)
      << larger.status().ToString();
  auto more = RawSession(attacker(), addr, MakeOpen(8, 1));
  EXPECT_EQ(more.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(more.status().message().find("already hold"), std::string::npos)
      << more.status().ToString();
  EXPECT_EQ(server.Stats().cache_bytes_used, (64 * 8 + 64) * 1024);
  const auto also_during = honest_steps(20);
  during.insert(during.end(), also_during.begin(), also_during.end());

  // The honest client opens another session beside the attacker's (its address holds 64 KiB).
  RemoteSequential remote(manager_);
  auto second = remote.OpenSession({.max_length = 64, .batch_size = 4});
  const at::Tensor x4 = at::randn({4, 5, config_.hidden_size});
  auto y4 = second->Step(x4);
  ASSERT_TRUE(y4.ok()) << y4.status().ToString();
  EXPECT_EQ(server.Stats().cache_bytes_used, (64 * 8 + 64 + 64 * 4) * 1024);
  EXPECT_EQ(server.Stats().sessions, 3u);
  {
    at::NoGradGuard no_grad;
    EXPECT_TRUE(at::allclose(*y4, LocalBlocks(x4, 0, 4), 0, 1e-3));
  }
  honest->Check();
  // Each step is a few milliseconds here; the floor of the bound keeps scheduling noise out.
  EXPECT_LT(colony::test::RecordHonestSlowdown(before, during), 10);
  honest.reset();
  second.reset();
  for (auto& s : held) s->Cancel();
  ASSERT_TRUE(colony::test::WaitUntil([&] { return server.Stats().cache_bytes_used == 0; }, 5s));
  for (auto& a : attackers) a->Shutdown();
}

// A BlockTraining whose passes wait until the test opens it: the server's compute thread is then
// busy, and the forward requests that arrive meanwhile wait in its queue.
class GatedTraining : public BlockTraining {
 public:
  Status Run(const TrainingCall&, const std::function<Status()>& compute) override {
    std::unique_lock lock(mu_);
    ++entered_;
    cv_.wait(lock, [&] { return open_; });
    lock.unlock();
    return compute();
  }
  bool Fence(uint64_t, int64_t, int64_t, uint32_t) override { return false; }
  void Open() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  int entered() {
    std::lock_guard lock(mu_);
    return entered_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int entered_ = 0;
};

// One machine cannot fill a block server's forward/backward queue or hold its request memory.
// The server applies its per-address caps to loopback here: 127.0.0.2 plays the attacker's
// machine, 127.0.0.3 an honest client's. While the compute thread is held (a gated pass), the
// attacker may queue its share of the requests (4 of 16) and of their bytes (12 KiB of 48),
// beyond which it is refused at once; the honest client's requests still queue, and every queued
// request is computed right once the thread is free.
TEST_F(ServeTest, OneAddressHoldsOnlyItsShareOfTheForwardQueueAndItsBytes) {
  auto gate = std::make_shared<GatedTraining>();
  struct OpenAtEnd {
    GatedTraining& gate;
    ~OpenAtEnd() { gate.Open(); }
  } open_at_end{*gate};
  ServerOptions o;
  o.limit_loopback_addresses = true;
  o.max_queued_tasks = 16;
  o.max_request_bytes = 48 << 10;
  o.request_share_per_address = 0.25;
  o.make_training = [gate](std::vector<at::Tensor>) -> Result<std::shared_ptr<BlockTraining>> {
    return std::shared_ptr<BlockTraining>(gate);
  };
  auto& server = AddServer(0, 4, 100, o);
  const Multiaddr addr = ServerAddress(0);
  std::vector<std::unique_ptr<net::Host>> hosts;
  auto host_from = [&](const char* ip) -> net::Host& {
    net::HostOptions ho;
    ho.dial_from = ip;
    hosts.push_back(std::make_unique<net::Host>(KeyPair::Generate(), ho));
    EXPECT_TRUE(hosts.back()->Start().ok());
    return *hosts.back();
  };
  net::Host& attacker = host_from("127.0.0.2");
  net::Host& honest = host_from("127.0.0.3");
  auto forward = [&](net::Host& host, const at::Tensor& x) {
    return std::async(std::launch::async, [&host, addr, x] {
      pb::BlockRequest req;
      req.set_start(0);
      req.set_end(4);
      net::Message m(req.SerializeAsString());
      m.tensors.push_back(*runtime::ToFrame(x));
      return host.CallSync(addr, "serve.forward", std::move(m), {.timeout = 60s});
    });
  };
  // (A request's count is taken as it arrives, its bytes once it is read: both are waited for.)
  auto held = [&](uint64_t n, uint64_t bytes) {
    return colony::test::WaitUntil(
        [&] {
          const auto s = server.Stats();
          return s.requests_held == n && s.request_bytes_held == bytes;
        },
        10s);
  };
  auto refused_naming = [](auto future, const std::string& what) {
    ASSERT_EQ(future.wait_for(10s), std::future_status::ready) << what << ": not refused at once";
    auto r = future.get();
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().ToString();
  };
  const int64_t hidden = config_.hidden_size;
  auto big = [&] { return at::randn({1, 8192 / (4 * hidden), hidden}); };  // 8 KiB
  auto tiny = [&] { return at::randn({1, 1, hidden}); };

  std::vector<std::pair<at::Tensor, std::future<Result<net::Message>>>> queued;
  auto queue = [&](net::Host& host, at::Tensor x) {
    auto f = forward(host, x);
    queued.emplace_back(std::move(x), std::move(f));
  };
  queue(honest, tiny());  // takes the compute thread and holds it
  ASSERT_TRUE(colony::test::WaitUntil([&] { return gate->entered() == 1; }, 10s));
  queue(attacker, big());
  const uint64_t tiny_bytes = 4u * hidden;
  ASSERT_TRUE(held(2, 8192u + tiny_bytes));
  refused_naming(forward(attacker, big()),
                 "holds 8192 bytes of forward and backward requests on this server and one "
                 "client address may hold 12288");
  for (int i = 0; i < 3; ++i) queue(attacker, tiny());
  ASSERT_TRUE(held(5, 8192u + 4 * tiny_bytes));
  refused_naming(forward(attacker, tiny()),
                 "holds 4 forward and backward requests on this server and one client address "
                 "may hold 4");
  queue(honest, big());  // the honest address has its own share
  ASSERT_TRUE(held(6, 8192u * 2 + 4 * tiny_bytes)) << server.Stats().request_bytes_held;
  EXPECT_EQ(server.Stats().requests_refused, 2u);

  gate->Open();
  for (auto& [x, f] : queued) {
    auto r = f.get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto y = runtime::FromFrame(r->tensors.at(0), {});
    ASSERT_TRUE(y.ok()) << y.status().ToString();
    EXPECT_TRUE(at::allclose(*y, LocalBlocks(x, 0, 4), 1e-4, 1e-4));
  }
  EXPECT_TRUE(held(0, 0)) << server.Stats().request_bytes_held;
  EXPECT_TRUE(forward(attacker, big()).get().ok()) << "the address's share came back";
}

TEST_F(ServeTest, IdleSessionsAreClosedByTheServer) {
  ServerOptions o;
  o.session_idle_timeout = 300ms;
  auto& server = AddServer(0, 4, 100, o);
  Connect(1);
  auto s = RawSession(client_->host(), ServerAddress(0), MakeOpen(8, 1));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(server.Stats().sessions, 1u);
  colony::test::WaitUntil([&] { return server.Stats().sessions == 0; }, 5s);
  EXPECT_EQ(server.Stats().sessions, 0u);
  EXPECT_EQ(server.Stats().cache_bytes_used, 0);
}

TEST_F(ServeTest, PromptTuningThroughTheSwarmLowersTheLoss) {
  AddServer(0, 2);
  AddServer(2, 4);
  Connect(2);
  auto remote = std::make_shared<RemoteSequential>(manager_);
  // The demonstration task: two fixed sequences the random model knows nothing about.
  const at::Tensor tokens =
      at::tensor({3, 6, 9, 12, 15, 18, 21, 24, 7, 7, 7, 7, 7, 7, 7, 7}, at::kLong).reshape({2, 8});
  for (bool deep : {false, true}) {
    at::manual_seed(3);
    PromptTuningOptions po;
    po.prompt_length = 4;
    po.deep = deep;
    PromptTuned tuned(Head(), remote, po);
    torch::optim::Adam opt(tuned->TrainableParameters(), torch::optim::AdamOptions(0.1));
    std::vector<double> losses;
    for (int step = 0; step < 25; ++step) {
      opt.zero_grad();
      at::Tensor loss = tuned->Loss(tokens);
      loss.backward();
      opt.step();
      losses.push_back(loss.item<double>());
    }
    at::NoGradGuard no_grad;
    const double final_loss = tuned->Loss(tokens).item<double>();
    EXPECT_LT(final_loss, losses.front() - 0.3)
        << (deep ? "deep" : "shallow") << ": " << losses.front() << " -> " << final_loss;
    // The servers' weights are untouched: remote still equals local.
    at::Tensor x = at::randn({1, 3, config_.hidden_size});
    auto out = remote->Forward(x);
    ASSERT_TRUE(out.ok());
    EXPECT_TRUE(at::allclose(*out, LocalBlocks(x, 0, 4), 0, 1e-4));
  }
}

TEST_F(ServeTest, FineTuneLowersTheLossWithEveryMethodAndSavesWhatGenerationLoads) {
  AddServer(0, 2);
  AddServer(2, 4);
  Connect(2);
  auto remote = std::make_shared<RemoteSequential>(manager_);
  // The demonstration task of PromptTuningThroughTheSwarmLowersTheLoss, as token sequences.
  const std::vector<std::vector<int64_t>> data = {{3, 6, 9, 12, 15, 18, 21, 24},
                                                  {7, 7, 7, 7, 7, 7, 7, 7}};
  for (auto method :
       {FineTuneMethod::kPrompt, FineTuneMethod::kDeepPrompt, FineTuneMethod::kLora}) {
    SCOPED_TRACE(std::string(MethodName(method)));
    at::manual_seed(5);
    const auto file = dir_ / (std::string(MethodName(method)) + ".safetensors");
    std::vector<FineTuneStep> reports;
    FineTuneOptions o{.method = method,
                      .prompt_length = 4,
                      .lora_rank = 2,
                      .steps = 25,
                      .lr = 0.1,
                      .batch_size = 2,
                      .save = file,
                      .on_step = [&](const FineTuneStep& s) { reports.push_back(s); },
                      .report_every = 5};
    auto result = FineTune(Head(), remote, data, o);
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    EXPECT_EQ(result->steps, 25);
    EXPECT_LT(result->final_loss, result->initial_loss - 0.3)
        << result->initial_loss << " -> " << result->final_loss;
    // Reported at steps 1, 6, 11, 16, 21 and after the last.
    ASSERT_EQ(reports.size(), 6u);
    EXPECT_EQ(reports.back().step, 25);
    EXPECT_EQ(reports.back().steps, 25);
    // The file holds what this method trains, with the shapes the model needs.
    auto loaded = LoadTuned(file, config_);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    EXPECT_EQ(loaded->prompts.defined(), method != FineTuneMethod::kLora);
    EXPECT_EQ(loaded->deep_prompts.defined(), method == FineTuneMethod::kDeepPrompt);
    EXPECT_EQ(!loaded->adapters.empty(), method == FineTuneMethod::kLora);
  }
  // Options it cannot honour are errors, not defaults.
  EXPECT_EQ(FineTune(Head(), remote, {}, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(FineTune(Head(), remote, data, {.lr = 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(FineTune(Head(), remote, data, {.batch_size = 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(FineTune(Head(), remote, data, {.prompt_length = 0}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(FineTuneSequencesTest, SyntheticDataIsDeterministicAndWithinTheVocabulary) {
  auto a = FineTuneSequences(nullptr, 50, {});
  auto b = FineTuneSequences(nullptr, 50, {});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  ASSERT_FALSE(a->empty());
  for (const auto& s : *a) {
    EXPECT_GE(s.size(), 2u);
    for (int64_t t : s) EXPECT_TRUE(t >= 0 && t < 50) << t;
  }
  EXPECT_FALSE(FineTuneSequences(nullptr, 0, {}).ok());
  // A data file cannot be tokenized without a tokenizer: an error, not synthetic data.
  EXPECT_EQ(FineTuneSequences(nullptr, 50, "lines.txt").status().code(),
            StatusCode::kFailedPrecondition);
}

TEST_F(ServeTest, LoraThroughTheSwarmEqualsLocalAndLearns) {
  AddServer(0, 1);
  AddServer(1, 4);
  Connect(2);
  auto remote = std::make_shared<RemoteSequential>(manager_);
  LoraTuned lora = RandomLora(remote, 0.05);
  const LoraSpec& lo = lora->spec;
  // Forward and gradients equal the same adapters applied to the local blocks.
  at::Tensor x = at::randn({2, 5, config_.hidden_size}).requires_grad_();
  at::Tensor target = at::randn({2, 5, config_.hidden_size});
  at::Tensor out = remote->forward(x, {}, lora->spec, lora->adapters);
  (out - target).pow(2).sum().backward();
  std::vector<at::Tensor> remote_grads;
  for (auto& a : lora->adapters) remote_grads.push_back(a.grad().clone());

  std::vector<at::Tensor> copies;
  for (auto& a : lora->adapters) copies.push_back(a.detach().clone().requires_grad_());
  at::Tensor x2 = x.detach().clone().requires_grad_();
  at::Tensor h = x2;
  size_t k = 0;
  for (int64_t b = 0; b < 4; ++b) {
    model::BlockAdapters ad;
    for (const auto& name : lo.targets) {
      ad.Find(name)->a = copies[k++];
      ad.Find(name)->b = copies[k++];
      ad.Find(name)->scale = lo.scale;
    }
    h = local_->block(b)->forward(h, 0, nullptr, &ad);
  }
  (h - target).pow(2).sum().backward();
  EXPECT_TRUE(at::allclose(out, h, 0, 1e-4));
  EXPECT_TRUE(at::allclose(x.grad(), x2.grad(), 1e-4, 1e-4));
  for (size_t i = 0; i < copies.size(); ++i) {
    EXPECT_TRUE(at::allclose(remote_grads[i], copies[i].grad(), 1e-3, 1e-4)) << "adapter " << i;
  }
  // Training the adapters on the demonstration task lowers the loss.
  const at::Tensor tokens =
      at::tensor({3, 6, 9, 12, 15, 18, 21, 24, 7, 7, 7, 7, 7, 7, 7, 7}, at::kLong).reshape({2, 8});
  torch::optim::Adam opt(lora->TrainableParameters(), torch::optim::AdamOptions(0.05));
  double first = 0;
  for (int step = 0; step < 20; ++step) {
    opt.zero_grad();
    at::Tensor loss = lora->Loss(tokens);
    loss.backward();
    opt.step();
    if (step == 0) first = loss.item<double>();
  }
  at::NoGradGuard no_grad;
  const double last = lora->Loss(tokens).item<double>();
  EXPECT_LT(last, first - 0.3) << first << " -> " << last;
  // The servers' weights are untouched.
  at::Tensor y = at::randn({1, 3, config_.hidden_size});
  auto plain = remote->Forward(y);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(at::allclose(*plain, LocalBlocks(y, 0, 4), 0, 1e-4));
}

TEST_F(ServeTest, LoraRequestsAreValidated) {
  AddServer(0, 4);
  Connect(1);
  // An honest session generates beside the malformed requests.
  HonestGeneration honest(*this, 32);
  const auto before = honest.Steps(10);
  RemoteSequential remote(manager_);
  at::Tensor x = at::randn({1, 3, config_.hidden_size});
  LoraSpec spec{2, {"q_proj"}, 1.0};
  std::vector<at::Tensor> wrong(8, at::zeros({2, 3}));
  auto r = remote.Forward(x, {}, spec, wrong);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  auto during = honest.Steps(5);
  LoraSpec unknown{2, {"x_proj"}, 1.0};
  std::vector<at::Tensor> ok_shapes;
  for (int b = 0; b < 4; ++b) {
    ok_shapes.push_back(at::zeros({2, config_.hidden_size}));
    ok_shapes.push_back(at::zeros({config_.hidden_size, 2}));
  }
  r = remote.Forward(x, {}, unknown, ok_shapes);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  const auto also_during = honest.Steps(5);
  during.insert(during.end(), also_during.begin(), also_during.end());
  r = remote.Forward(x, {}, spec, ok_shapes);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  honest.Check();
  EXPECT_LT(colony::test::RecordHonestSlowdown(before, during), 10);
}

// A float32 server and a quantized one on the same blocks: their weight bytes, and the relative
// error of the blocks' update through the quantized one (preferred by routing) against the
// blocks run here.
class QuantizedServeTest : public ServeTest {
 protected:
  struct Measured {
    int64_t full_bytes = 0, quantized_bytes = 0;
    double rel = 0;
  };
  Measured Measure(const std::string& quantize) {
    auto& fp32 = AddServer(0, 4, 100);
    ServerOptions o;
    o.quantize = quantize;
    auto& quantized = AddServer(0, 4, 1000, o);
    Connect(2);
    Measured m{.full_bytes = static_cast<int64_t>(fp32.Stats().weight_bytes),
               .quantized_bytes = static_cast<int64_t>(quantized.Stats().weight_bytes)};
    RemoteSequential remote(manager_);
    at::Tensor x = at::randn({2, 6, config_.hidden_size});
    auto out = remote.Forward(x);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    if (!out.ok()) return m;
    EXPECT_EQ(quantized.Stats().forwards, 1u);
    at::NoGradGuard no_grad;
    at::Tensor ref = LocalBlocks(x, 0, 4);
    m.rel = ((*out - ref).norm() / (ref - x).norm()).item<double>();
    std::printf("%s: %lld -> %lld weight bytes; relative error of the blocks' update %.4f\n",
                quantize.c_str(), static_cast<long long>(m.full_bytes),
                static_cast<long long>(m.quantized_bytes), m.rel);
    return m;
  }
};

TEST_F(QuantizedServeTest, Int8UsesAQuarterOfTheMemoryAndStaysClose) {
  const Measured m = Measure("int8");
  // Projections at 1 byte per weight, norms and scales in fp32.
  EXPECT_LT(m.quantized_bytes, m.full_bytes / 3);
  EXPECT_LT(m.rel, 0.02);
  EXPECT_GT(m.rel, 0.0);
}

// NF4 (4-bit NormalFloat, Petals' default): 4.13 bits per weight with double-quantized scales.
TEST_F(QuantizedServeTest, Nf4UsesAnEighthOfTheMemoryAndStaysClose) {
  const Measured m = Measure("nf4");
  // 4 bits per weight and a byte per 64 of them (a float per 256 of those); norms stay in fp32.
  EXPECT_LT(m.quantized_bytes, m.full_bytes / 5);
  EXPECT_LT(m.rel, 0.2);  // 4-bit weights of a normal distribution: about 10% error each
  EXPECT_GT(m.rel, 0.0);
}

TEST_F(ServeTest, BFloat16ServerStaysCloseToFloat32) {
  ServerOptions o;
  o.dtype = "bfloat16";
  AddServer(0, 4, 100, o);
  Connect(1);
  RemoteSequential remote(manager_);
  at::Tensor x = at::randn({1, 5, config_.hidden_size});
  auto out = remote.Forward(x);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->scalar_type(), at::kFloat);
  at::NoGradGuard no_grad;
  at::Tensor ref = LocalBlocks(x, 0, 4);
  const double rel = ((*out - ref).norm() / ref.norm()).item<double>();
  EXPECT_LT(rel, 0.05);
  EXPECT_GT(rel, 0.0);  // it really ran in bfloat16
}

}  // namespace
}  // namespace colony::serve

namespace colony::serve {
namespace {

TEST_F(ServeTest, ShutdownAnnouncesOfflineAtOnce) {
  AddServer(0, 4);
  AddServer(0, 4);
  Connect(2);
  servers_[0]->Shutdown();
  // The record says "offline" right away (not after its TTL): clients stop routing there.
  ASSERT_TRUE(manager_->Refresh().ok());
  ASSERT_EQ(manager_->Servers().size(), 1u);
  EXPECT_EQ(manager_->Servers()[0].peer, nodes_[1]->peer_id());
}

// Placement counts only what it can check of strangers' records: records whose servers do not
// answer a ping count for nothing, a claim counts at most 4x the median claim, and the identities
// of one machine count as one server. An honest server serves blocks 0..2 at 300 tokens/s; 10
// identities on one machine (127.0.0.2, answering pings) claim blocks 2..4 at 100 each, and 5
// more, at a port where nothing listens, claim them at 1e300. A new server of 2 blocks takes
// blocks 2..4; believing every claim would put it on 0..2 beside the honest one.
TEST_F(ServeTest, PlacementCountsServersThatAnswerOncePerAddressWithClaimsCapped) {
  AddServer(0, 2, 300);
  std::vector<dht::StoreItem> items;
  std::vector<std::unique_ptr<net::Host>> sybils;
  for (int i = 0; i < 10; ++i) {
    net::HostOptions ho;
    ho.listen = {*Multiaddr::Parse("/ip4/127.0.0.2/tcp/0")};
    sybils.push_back(std::make_unique<net::Host>(KeyPair::Generate(), ho));
    ASSERT_TRUE(sybils.back()->Start().ok());
    const std::string addr = sybils.back()->ListenAddresses().at(0).ToString();
    for (auto& item : FakeRecordItems(sybils.back()->identity(), addr, 100, 2, 4)) {
      items.push_back(std::move(item));
    }
  }
  const int closed = ::socket(AF_INET, SOCK_STREAM, 0);  // bound, never listening: refused
  const uint16_t port = BindLoopback(closed);
  ASSERT_NE(port, 0);
  for (int i = 0; i < 5; ++i) {
    const KeyPair key = KeyPair::Generate();
    const std::string addr =
        fmt::format("/ip4/127.0.0.1/tcp/{}/p2p/{}", port, key.peer_id().ToString());
    for (auto& item : FakeRecordItems(key, addr, 1e300, 2, 4)) items.push_back(std::move(item));
  }
  ASSERT_TRUE(StoreAsStranger({bootstrap_->VisibleAddresses().at(0), ServerAddress(0)}, items));
  ServerOptions o;
  o.num_blocks = 2;
  o.limit_loopback_addresses = true;  // 127.0.0.2 is one machine
  o.rebalance = false;
  BlockServer& placed = AddServer(-1, -1, 100, o);  // unpinned
  ::close(closed);
  EXPECT_EQ(placed.Stats().first, 2);
  for (auto& h : sybils) h->Shutdown();
}

// A server that waits no time for pings would count no server in placement: refused by name.
TEST_F(ServeTest, APingTimeoutThatIsNotPositiveIsRefused) {
  ServerOptions o;
  o.model_dir = dir_;
  o.num_blocks = 2;
  o.ping_timeout = 0ms;
  auto refused = BlockServer::Start(*bootstrap_, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("ping_timeout must be positive, not 0 ms"),
            std::string::npos)
      << refused.status().ToString();
}

TEST_F(ServeTest, AnUnpinnedServerMovesToUncoveredBlocks) {
  ServerOptions o;
  o.announce_period = 50ms;  // rebalancing is checked every 6 announcements
  o.num_blocks = 2;
  BlockServer* mover = &AddServer(-1, -1, 100, o);  // unpinned
  EXPECT_EQ(mover->Stats().first, 0);               // an empty swarm: the first window
  // A pinned server takes the same blocks: blocks 2..4 are now uncovered, 0..2 doubly covered.
  AddServer(0, 2, 100);
  // (It loads the new blocks while offline, then announces itself online again.)
  colony::test::WaitUntil(
      [&] {
        const auto s = mover->Stats();
        return s.first == 2 && s.state == ServerState::kOnline;
      },
      10s);
  EXPECT_EQ(mover->Stats().first, 2);
  EXPECT_EQ(mover->Stats().last, 4);
  EXPECT_EQ(mover->Stats().state, ServerState::kOnline);
  // Now the swarm is balanced: it stays (checked over several rebalancing rounds).
  Connect(2);
  RemoteSequential remote(manager_);
  at::Tensor x = at::randn({1, 3, config_.hidden_size});
  auto out = remote.Forward(x);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::allclose(*out, LocalBlocks(x, 0, 4), 0, 1e-4));
}

}  // namespace
}  // namespace colony::serve

namespace colony::serve {
namespace {

TEST_F(ServeTest, DeepPromptTunedGenerationThroughASessionEqualsTheForwardPath) {
  AddServer(0, 2);
  AddServer(2, 4);
  Connect(2);
  auto remote = std::make_shared<RemoteSequential>(manager_);
  at::manual_seed(7);
  const PromptTuningOptions po{.prompt_length = 3, .deep = true};
  PromptTuned tuned(Head(), remote, po);
  {
    at::NoGradGuard no_grad;  // large random prompts, so that they matter
    tuned->prompts.normal_(0, 0.5);
    tuned->deep_prompts.normal_(0, 0.5);
  }
  const std::vector<int64_t> prompt = {5, 17, 99, 3};
  const int64_t n = 12, max_length = 3 + 4 + n;
  auto forward = [&](const at::Tensor& tokens) { return tuned->forward(tokens); };
  SessionOptions options{.max_length = max_length, .batch_size = 1};
  options.prompts = tuned->deep_prompts.unsqueeze(1);  // [blocks, 1, P, H]
  const auto tokens =
      ExpectSessionEqualsReference(*remote, forward, options, tuned->prompts, prompt, n);
  // The tuning matters: the untuned model generates something else.
  EXPECT_NE(tokens, model::Generate(local_, prompt, {.max_new_tokens = n}));
  // Per-row prompts [blocks, B, P, H] too: a batch of two different tunings equals each alone.
  at::Tensor deep2 = at::stack({tuned->deep_prompts, at::zeros_like(tuned->deep_prompts)}, 1);
  SessionOptions batched{.max_length = max_length, .batch_size = 2};
  batched.prompts = deep2;
  auto session = remote->OpenSession(batched);
  RemoteBackend backend(Head(), *session, max_length, tuned->prompts);
  at::Tensor input = at::tensor(prompt, at::kLong).unsqueeze(0).expand({2, -1}).contiguous();
  auto first = backend.Step(input, 0, {}, StepLogits::kAll);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  std::vector<at::Tensor> ref;
  ReferenceGreedy(forward, prompt, 1, &ref);
  EXPECT_TRUE(at::allclose((*first)[0], ref[0][0], 0, 1e-3));
  EXPECT_FALSE(at::allclose((*first)[1], ref[0][0], 0, 1e-2));
  // Swap the rows (beam search's reorder): row 1 continues with the tuned prompts.
  const at::Tensor swap = at::tensor({1, 0}, at::kLong);
  const at::Tensor next = at::full({2, 1}, tokens[0], at::kLong);
  auto second = backend.Step(next, backend.position(), swap, StepLogits::kAll);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ReferenceGreedy(forward, prompt, 2, &ref);
  EXPECT_TRUE(at::allclose((*second)[1][0], ref.back()[0][-1], 0, 1e-3));
  EXPECT_FALSE(at::allclose((*second)[0][0], ref.back()[0][-1], 0, 1e-2));
  // A rollback to the start prepends the shallow prompts again.
  auto again = backend.Step(input, 0, {}, StepLogits::kAll);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(at::allclose((*again)[1], ref[0][0], 0, 1e-3));
  // A decoding step's logits are the last token's, not a shallow prompt position's.
  auto last = backend.Step(input, 0, {}, StepLogits::kLast);
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  ASSERT_EQ(last->sizes(), (std::vector<int64_t>{2, 1, config_.vocab_size}));
  EXPECT_TRUE(at::allclose((*last)[1][0], ref[0][0][-1], 0, 1e-3));
}

TEST_F(ServeTest, PerRowDeepPromptsFollowBeamReorders) {
  AddServer(0, 2);
  AddServer(2, 4);
  Connect(2);
  RemoteSequential remote(manager_);
  const int64_t h = config_.hidden_size;
  const at::Tensor prompts = at::randn({4, 2, 2, h});  // two rows, two prompt positions
  SessionOptions options{.max_length = 8, .batch_size = 2};
  options.prompts = prompts;
  auto session = remote.OpenSession(options);
  const at::Tensor x1 = at::randn({2, 1, h}), x2 = at::randn({2, 1, h});
  ASSERT_TRUE(session->Step(x1).ok());
  // Swap the rows, then a step at position 1 (< P): each row keeps its own prompts.
  const at::Tensor swap = at::tensor({1, 0}, at::kLong);
  auto out = session->Step(x2, swap);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  auto ref =
      remote.Forward(at::cat({x1.index_select(0, swap), x2}, 1), prompts.index_select(1, swap));
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  EXPECT_TRUE(at::allclose(*out, ref->narrow(1, 1, 1), 0, 1e-4));
  // A rollback after the reorder recomputes with the reordered prompts too.
  out = session->Step(x2, {}, 1);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(at::allclose(*out, ref->narrow(1, 1, 1), 0, 1e-4));
}

TEST_F(ServeTest, LoraTunedGenerationThroughASessionEqualsTheForwardPath) {
  AddServer(0, 1);
  AddServer(1, 4);
  Connect(2);
  auto remote = std::make_shared<RemoteSequential>(manager_);
  LoraTuned lora = RandomLora(remote, 0.3);
  const std::vector<int64_t> prompt = {9, 8, 7, 200};
  const int64_t n = 12;
  auto forward = [&](const at::Tensor& tokens) { return lora->forward(tokens); };
  SessionOptions options{.max_length = 4 + n, .batch_size = 1};
  options.lora = lora->spec;
  options.adapters = lora->adapters;
  const auto tokens = ExpectSessionEqualsReference(*remote, forward, options, {}, prompt, n);
  // A server that ignored the adapters would produce the untuned model's tokens.
  EXPECT_NE(tokens, model::Generate(local_, prompt, {.max_new_tokens = n}));
}

TEST_F(ServeTest, FailoverKeepsTunedGenerationIdentical) {
  AddServer(0, 2, 100);
  AddServer(2, 4, 1000);  // preferred: fastest
  AddServer(2, 4, 100);   // the first replacement
  AddServer(2, 4, 10);    // the second
  Connect(4);
  auto remote = std::make_shared<RemoteSequential>(manager_);
  at::manual_seed(9);
  const PromptTuningOptions po{.prompt_length = 2, .deep = true};
  PromptTuned tuned(Head(), remote, po);
  const LoraTuningOptions lo{.rank = 2};
  LoraTuned lora(Head(), remote, lo);
  {
    at::NoGradGuard no_grad;
    tuned->prompts.normal_(0, 0.5);
    tuned->deep_prompts.normal_(0, 0.5);
    for (size_t i = 1; i < lora->adapters.size(); i += 2) lora->adapters[i].normal_(0, 0.3);
  }
  const std::vector<int64_t> prompt = {9, 8, 7};
  const int64_t n = 12, max_length = 2 + 3 + n;
  for (bool use_lora : {false, true}) {
    SessionOptions options{.max_length = max_length, .batch_size = 1};
    at::Tensor shallow;
    std::function<at::Tensor(const at::Tensor&)> forward;
    if (use_lora) {
      options.lora = lora->spec;
      options.adapters = lora->adapters;
      forward = [&](const at::Tensor& t) { return lora->forward(t); };
    } else {
      options.prompts = tuned->deep_prompts.unsqueeze(1);
      shallow = tuned->prompts;
      forward = [&](const at::Tensor& t) { return tuned->forward(t); };
    }
    const auto expected = ReferenceGreedy(forward, prompt, n);
    auto session = remote->OpenSession(options);
    RemoteBackend backend(Head(), *session, max_length, shallow);
    int produced = 0;
    PeerId killed;
    auto got = GenerateWith(backend, prompt, {.max_new_tokens = n}, -1, [&](int64_t) {
      if (++produced == 5) killed = KillServerAt(*session, 2);
    });
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, expected) << (use_lora ? "LoRA" : "deep prompts");
    EXPECT_EQ(session->stats().failovers, 1);
    EXPECT_GT(session->stats().replayed_tokens, 0);
    for (const auto& span : session->stats().route) EXPECT_NE(span.server.peer, killed);
  }
}

TEST_F(ServeTest, HostileTunedSessionsGetErrorsAndTheServerKeepsServing) {
  ServerOptions so;
  so.max_length = 64;
  auto& server = AddServer(0, 4, 100, so);
  Connect(1);
  net::Host& host = client_->host();
  const Multiaddr addr = ServerAddress(0);
  const int64_t h = config_.hidden_size;
  // An honest session generates beside the hostile ones and holds its own cache throughout.
  HonestGeneration honest(*this, 32);
  const auto before = honest.Steps(10);
  const int64_t honest_bytes = 32 * 4 * CacheBytesPerToken(config_, at::kFloat);
  auto open = [&](int64_t prompt_length, const std::vector<at::Tensor>& tensors, int64_t rank = 0) {
    pb::OpenSession o = MakeOpen(8, 1);
    o.set_prompt_length(static_cast<uint32_t>(prompt_length));
    if (rank > 0) {
      o.set_lora_rank(static_cast<uint32_t>(rank));
      o.add_lora_targets("q_proj");
    }
    return RawSession(host, addr, o, tensors);
  };
  at::Tensor nan = at::randn({4, 1, 2, h});
  nan[1][0][1][5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<at::Tensor> adapters;  // rank 2 on q_proj of 4 blocks
  for (int b = 0; b < 4; ++b) {
    adapters.push_back(at::randn({2, h}));
    adapters.push_back(at::randn({h, 2}));
  }
  std::vector<at::Tensor> wrong_adapters = adapters;
  wrong_adapters[3] = at::randn({h + 1, 2});
  const std::vector<std::pair<std::string, Result<std::shared_ptr<net::Stream>>>> bad = {
      {"no prompt tensor", open(2, {})},
      {"prompt length disagrees", open(3, {at::randn({4, 1, 2, h})})},
      {"wrong hidden size", open(2, {at::randn({4, 1, 2, h + 1})})},
      {"wrong block count", open(2, {at::randn({3, 1, 2, h})})},
      {"wrong batch", open(2, {at::randn({4, 2, 2, h})})},
      {"longer than the session", open(9, {at::randn({4, 1, 9, h})})},
      {"integer prompts", open(2, {at::ones({4, 1, 2, h}, at::kLong)})},
      {"NaN prompts", open(2, {nan})},
      {"adapters of the wrong size", open(0, wrong_adapters, 2)},
      {"too few adapters", open(0, {adapters[0], adapters[1]}, 2)},
  };
  for (const auto& [what, r] : bad) {
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument)
        << what << ": " << r.status().ToString();
  }
  // Not even a well-formed request: a protocol error.
  auto rank_without_targets = RawSession(host, addr, [] {
    pb::OpenSession o = MakeOpen(8, 1);
    o.set_lora_rank(2);
    return o;
  }());
  EXPECT_EQ(rank_without_targets.status().code(), StatusCode::kProtocolError)
      << rank_without_targets.status().ToString();
  auto during = honest.Steps(10);
  EXPECT_EQ(server.Stats().sessions, 1u) << "only the honest session";
  EXPECT_EQ(server.Stats().cache_bytes_used, honest_bytes);
  // A tuned session reserves its prompts' and adapters' memory with its cache.
  at::Tensor prompts = at::randn({4, 1, 2, h});
  std::vector<at::Tensor> tensors = {prompts};
  tensors.insert(tensors.end(), adapters.begin(), adapters.end());
  auto good = open(2, tensors, 2);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  const int64_t lora_bytes = 4 * 2 * (2 * h) * 4;
  EXPECT_EQ(server.Stats().cache_bytes_used, honest_bytes +
                                                 8 * 4 * CacheBytesPerToken(config_, at::kFloat) +
                                                 prompts.nbytes() + lora_bytes);
  (*good)->Cancel();
  // Through the client: NaN prompts and wrong adapters are the caller's errors.
  RemoteSequential remote(manager_);
  SessionOptions o{.max_length = 16, .batch_size = 1};
  o.prompts = nan;
  auto r = remote.OpenSession(o)->Step(at::randn({1, 3, h}));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  o.prompts = at::randn({4, 3, 2, h});  // batch 3 in a session of 1
  r = remote.OpenSession(o)->Step(at::randn({1, 3, h}));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  o.prompts = at::Tensor();
  o.lora = {2, {"q_proj"}, 1.0};
  o.adapters = wrong_adapters;
  r = remote.OpenSession(o)->Step(at::randn({1, 3, h}));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  EXPECT_FALSE(manager_->IsBanned(nodes_[0]->peer_id()));  // the caller's fault, not the server's
  // And the server still serves a well-formed tuned session.
  o.adapters = adapters;
  o.prompts = prompts;
  r = remote.OpenSession(o)->Step(at::randn({1, 3, h}));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  const auto also_during = honest.Steps(10);
  during.insert(during.end(), also_during.begin(), also_during.end());
  honest.Check();
  EXPECT_LT(colony::test::RecordHonestSlowdown(before, during), 10);
  colony::test::WaitUntil([&] { return server.Stats().sessions == 1; }, 5s);
  EXPECT_EQ(server.Stats().sessions, 1u);
  EXPECT_EQ(server.Stats().cache_bytes_used, honest_bytes);
}

TEST_F(ServeTest, TunedFilesRoundTrip) {
  AddServer(0, 4);
  Connect(1);
  auto remote = std::make_shared<RemoteSequential>(manager_);
  const auto file = dir_ / "tuned.safetensors";
  const PromptTuningOptions po{.prompt_length = 3, .deep = true};
  PromptTuned tuned(Head(), remote, po);
  ASSERT_TRUE(SaveTuned(file, *tuned).ok());
  auto p = LoadTuned(file, config_);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_TRUE(at::equal(p->prompts, tuned->prompts));
  EXPECT_TRUE(at::equal(p->deep_prompts, tuned->deep_prompts));
  EXPECT_EQ(p->lora.rank, 0);
  const LoraTuningOptions lo{.rank = 3, .targets = {"v_proj", "up_proj"}, .scale = 0.5};
  LoraTuned lora(Head(), remote, lo);
  ASSERT_TRUE(SaveTuned(file, *lora).ok());
  auto l = LoadTuned(file, config_);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_FALSE(l->prompts.defined());
  EXPECT_EQ(l->lora.rank, 3);
  EXPECT_EQ(l->lora.targets, lora->spec.targets);
  EXPECT_EQ(l->lora.scale, 0.5);
  ASSERT_EQ(l->adapters.size(), lora->adapters.size());
  for (size_t i = 0; i < l->adapters.size(); ++i)
    EXPECT_TRUE(at::equal(l->adapters[i], lora->adapters[i]));
  // Files without metadata (older versions) still load; other models' files do not.
  model::NamedTensors named;
  for (const auto& item : lora->named_parameters()) named.emplace_back(item.key(), item.value());
  ASSERT_TRUE(model::SaveModule(file, named).ok());
  auto old = LoadTuned(file, config_);
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(old->lora.targets, lora->spec.targets);
  EXPECT_EQ(old->lora.scale, 1.0);
  auto other = config_;
  other.num_layers = 5;
  EXPECT_EQ(LoadTuned(file, other).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace colony::serve
