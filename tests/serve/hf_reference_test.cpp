// Checkpoints written by Hugging Face transformers 5 (tests/data/hf, copied unchanged from the
// shared fixtures: Llama with the transformers-5 config layout and tied embeddings, Llama 3 rope
// scaling, a sharded bf16 Llama, Qwen2 with q/k/v biases, Mistral, Mixtral with 4 experts and
// top-2 routing) against what transformers itself computed from them (reference.json): logits,
// greedy and 4-beam generations, locally and through two block servers, and the training loss
// and global gradient norm. Built twice: hf_reference_test computes on the CPU, and
// hf_reference_gpu_test (ctest label gpu, COLONY_TEST_DEVICE=cuda) on the GPU, servers and client
// head included; without a usable GPU the latter's tests are skipped, saying why.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dht/node.h"
#include "model/checkpoint.h"
#include "model/device.h"
#include "serve/client.h"
#include "serve/generation.h"
#include "serve/server.h"
#include "test_support.h"

namespace colony::serve {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

const std::filesystem::path kFixtures = COLONY_HF_FIXTURES;
#ifndef COLONY_TEST_DEVICE
#define COLONY_TEST_DEVICE "cpu"
#endif
const std::string kDevice = COLONY_TEST_DEVICE;

const json& Reference() {
  static const json reference = [] {
    std::ifstream in(kFixtures / "reference.json");
    return json::parse(in);
  }();
  return reference;
}

const json& ReferenceOf(const std::string& name) { return Reference().at("models").at(name); }

std::vector<int64_t> Ints(const json& j) { return j.get<std::vector<int64_t>>(); }

// |got - want| <= rtol * |want|: what "equal to transformers" means for float32 results computed
// in a different order of operations.
void ExpectRelativelyNear(double got, double want, double rtol, const std::string& what) {
  EXPECT_LE(std::abs(got - want), rtol * std::abs(want))
      << what << ": Colony " << got << ", transformers " << want;
}

// How close Colony must come to transformers' numbers for a checkpoint.
struct Tolerance {
  double logits = 1e-4;      // relative to the largest logit of the position
  double gradient = 1e-4;    // relative, global gradient norm
  size_t argmax_misses = 0;  // positions whose argmax may differ
};

// transformers' reference for the bf16 checkpoint ran with its rotary frequencies rounded to
// bfloat16: make_fixtures.py converts the whole model to bf16 to save it and back to float32 to
// compute, and the frequencies are a buffer of the model. Colony computes them in float32, as a
// float32 load of the checkpoint should. With the frequencies rounded the same way (tried by hand
// when this test was written) Colony matched at the default tolerance; as it is, the logits
// differ by up to 4e-2 (one near-tie flips an argmax) and the gradient norm by 1e-3, while the
// loss, greedy and beam generations still agree exactly.
Tolerance ToleranceOf(const std::string& name) {
  if (name == "llama-sharded-bf16") return {.logits = 1e-2, .gradient = 2e-3, .argmax_misses = 1};
  return {};
}

class HfReference : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    if (kDevice != "cpu" && !model::CudaAvailable()) {
      GTEST_SKIP() << "needs a CUDA device (--device " << kDevice
                   << "): " << model::ParseDevice(kDevice).status().ToString();
    }
    device_ = *model::ParseDevice(kDevice);
  }
  std::filesystem::path Dir() const { return kFixtures / GetParam(); }
  const json& Ref() const { return ReferenceOf(GetParam()); }
  Tolerance Tol() const { return ToleranceOf(GetParam()); }
  c10::Device device_ = c10::kCPU;
};

TEST_P(HfReference, LogitsAndGenerationsEqualTransformers) {
  auto loaded = model::LoadLlama(Dir());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  model::LlamaModel m = *loaded;
  m->eval();
  m->to(device_);
  at::NoGradGuard no_grad;
  const std::vector<int64_t> prompt = Ints(Ref().at("prompt"));
  const at::Tensor logits =
      m->forward(at::tensor(prompt, at::kLong).unsqueeze(0).to(device_))[0].cpu();

  const auto argmax = logits.argmax(-1);
  const std::vector<int64_t> got_argmax(argmax.data_ptr<int64_t>(),
                                        argmax.data_ptr<int64_t>() + argmax.numel());
  const std::vector<int64_t> want_argmax = Ints(Ref().at("argmax_per_position"));
  ASSERT_EQ(got_argmax.size(), want_argmax.size());
  size_t misses = 0;
  for (size_t i = 0; i < got_argmax.size(); ++i) misses += got_argmax[i] != want_argmax[i];
  EXPECT_LE(misses, Tol().argmax_misses)
      << "argmax per position: Colony " << testing::PrintToString(got_argmax) << ", transformers "
      << testing::PrintToString(want_argmax);
  ExpectRelativelyNear(logits.norm().item<double>(), Ref().at("logits_fro_norm"), Tol().logits,
                       "Frobenius norm of the logits");
  const auto first16 = Ref().at("last_logits_first16").get<std::vector<double>>();
  const double scale = logits[-1].abs().max().item<double>();
  for (size_t i = 0; i < first16.size(); ++i) {
    EXPECT_NEAR(logits[-1][static_cast<int64_t>(i)].item<double>(), first16[i],
                Tol().logits * scale)
        << "last position, logit " << i;
  }

  std::vector<int64_t> greedy = prompt;
  const auto generated = model::Generate(m, prompt, {.max_new_tokens = 24});
  greedy.insert(greedy.end(), generated.begin(), generated.end());
  EXPECT_EQ(greedy, Ints(Ref().at("greedy_24")));

  LocalBackend local(m);
  auto beams = BeamSearch(local, prompt, 4, 12);
  ASSERT_TRUE(beams.ok()) << beams.status().ToString();
  std::vector<int64_t> best = prompt;
  best.insert(best.end(), beams->front().tokens.begin(), beams->front().tokens.end());
  EXPECT_EQ(best, Ints(Ref().at("beam4_12")));
}

TEST_P(HfReference, TrainingLossAndGradientNormEqualTransformers) {
  auto loaded = model::LoadLlama(Dir());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  model::LlamaModel m = *loaded;
  m->train();
  m->to(device_);
  const auto rows = Ref().at("train_batch").get<std::vector<std::vector<int64_t>>>();
  std::vector<at::Tensor> tensors;
  for (const auto& row : rows) tensors.push_back(at::tensor(row, at::kLong));
  const at::Tensor batch = at::stack(tensors).to(device_);
  const int64_t t = batch.size(1);
  const at::Tensor logits = m->forward(batch);
  const at::Tensor loss =
      model::LanguageModelLoss(logits.narrow(1, 0, t - 1), batch.narrow(1, 1, t - 1));
  loss.backward();
  ExpectRelativelyNear(loss.item<double>(), Ref().at("train_loss"), 1e-4, "training loss");
  double squares = 0;
  for (const at::Tensor& p : m->parameters()) {
    if (p.grad().defined()) squares += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  ExpectRelativelyNear(std::sqrt(squares), Ref().at("grad_global_norm"), Tol().gradient,
                       "global gradient norm");
}

// A checkpoint's blocks split over two servers (each with its own DHT node and host on
// loopback, on `device`), and a client-mode node with a SequenceManager that sees both.
struct TwoServers {
  std::unique_ptr<dht::Node> boot, client;
  std::vector<std::unique_ptr<dht::Node>> nodes;
  std::vector<std::unique_ptr<BlockServer>> servers;
  std::shared_ptr<SequenceManager> manager;

  void Start(const std::filesystem::path& dir, const std::string& name, const std::string& device) {
    auto config = model::LoadLlamaConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    const int64_t blocks = config->num_layers, split = blocks / 2;
    dht::NodeOptions bo;
    bo.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
    auto b = dht::Node::Start(KeyPair::Generate(), bo);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    boot = std::move(*b);
    const std::string bootstrap = boot->VisibleAddresses().at(0).ToString();
    for (auto [first, last] : {std::pair<int64_t, int64_t>{0, split}, {split, blocks}}) {
      dht::NodeOptions no;
      no.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
      no.initial_peers = {bootstrap};
      auto node = dht::Node::Start(KeyPair::Generate(), no);
      ASSERT_TRUE(node.ok()) << node.status().ToString();
      ServerOptions o;
      o.model_dir = dir;
      o.model_name = name;
      o.first_block = first;
      o.last_block = last;
      o.throughput_override = 100;
      o.device = device;
      auto server = BlockServer::Start(**node, o);
      ASSERT_TRUE(server.ok()) << server.status().ToString();
      nodes.push_back(std::move(*node));
      servers.push_back(std::move(*server));
    }
    dht::NodeOptions co_node;
    co_node.initial_peers = {bootstrap};
    co_node.dht.client_mode = true;
    auto c = dht::Node::Start(KeyPair::Generate(), co_node);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client = std::move(*c);
    ClientOptions co;
    co.model_name = name;
    co.num_blocks = blocks;
    co.step_timeout = 30s;
    co.request_timeout = 30s;
    manager = std::make_shared<SequenceManager>(*client, co);
    ASSERT_TRUE(colony::test::WaitUntil(
        [&] { return manager->Refresh().ok() && manager->Servers().size() >= 2; }, 30s))
        << "the client did not see both servers";
  }

  ~TwoServers() {
    servers.clear();
    for (auto& n : nodes) n->Shutdown();
    if (client) client->Shutdown();
    if (boot) boot->Shutdown();
  }
};

// The same generations with the blocks split over two servers and the embeddings and head at
// the client.
TEST_P(HfReference, GreedyAndBeamSearchThroughTwoServersEqualTransformers) {
  TwoServers swarm;
  ASSERT_NO_FATAL_FAILURE(swarm.Start(Dir(), GetParam(), kDevice));
  RemoteSequential remote(swarm.manager);
  auto head = LoadClientModel(Dir(), device_);
  ASSERT_TRUE(head.ok()) << head.status().ToString();

  const std::vector<int64_t> prompt = Ints(Ref().at("prompt"));
  {
    auto session = remote.OpenSession({.max_length = 64, .batch_size = 1});
    RemoteBackend backend(*head, *session, 64);
    auto greedy = GenerateWith(backend, prompt, {.max_new_tokens = 24});
    ASSERT_TRUE(greedy.ok()) << greedy.status().ToString();
    std::vector<int64_t> all = prompt;
    all.insert(all.end(), greedy->begin(), greedy->end());
    EXPECT_EQ(all, Ints(Ref().at("greedy_24")));
  }
  {
    auto session = remote.OpenSession({.max_length = 64, .batch_size = 4});
    RemoteBackend backend(*head, *session, 64);
    auto beams = BeamSearch(backend, prompt, 4, 12);
    ASSERT_TRUE(beams.ok()) << beams.status().ToString();
    std::vector<int64_t> best = prompt;
    best.insert(best.end(), beams->front().tokens.begin(), beams->front().tokens.end());
    EXPECT_EQ(best, Ints(Ref().at("beam4_12")));
  }
}

// Gradients through the two servers (their backward pass, as fine-tuning uses it) equal those
// of the same blocks run locally with autograd.
TEST_P(HfReference, GradientsThroughTwoServersEqualLocalAutograd) {
  TwoServers swarm;
  ASSERT_NO_FATAL_FAILURE(swarm.Start(Dir(), GetParam(), kDevice));
  RemoteSequential remote(swarm.manager);
  auto loaded = model::LoadLlama(Dir());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  model::LlamaModel m = *loaded;
  m->to(device_);
  const std::vector<int64_t> prompt = Ints(Ref().at("prompt"));
  at::Tensor x0;
  {
    at::NoGradGuard no_grad;
    x0 = m->Embed(at::tensor(prompt, at::kLong).unsqueeze(0).to(device_)).detach();
  }
  // A fixed weighting of the outputs, so that every position and feature gets a gradient.
  const at::Tensor weights = at::randn(x0.sizes(), at::make_generator<at::CPUGeneratorImpl>(7))
                                 .to(device_, x0.scalar_type());

  at::Tensor local_in = x0.clone().requires_grad_(true);
  at::Tensor h = local_in;
  for (int64_t i = 0; i < m->num_blocks(); ++i) h = m->block(i)->forward(h);
  (h * weights).sum().backward();

  // The client's hidden states stay in host memory: in one process, a backward pass on the GPU
  // cannot call GPU servers. LibTorch runs a GPU's backward functions on one thread per device;
  // the client's remote function would hold it while the server's backward waited for it
  // (docs/serving.md). Servers in other processes, as in a real swarm, have their own.
  at::Tensor remote_in = x0.cpu().requires_grad_(true);
  at::Tensor out = remote.forward(remote_in);
  EXPECT_TRUE(out.device().is_cpu());
  (out * weights.cpu()).sum().backward();
  ASSERT_TRUE(remote_in.grad().defined());
  EXPECT_TRUE(remote_in.grad().device().is_cpu());

  const at::Tensor want = local_in.grad().cpu(), got = remote_in.grad().cpu();
  const double scale = want.abs().max().item<double>();
  ASSERT_GT(scale, 0);
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-4 * scale)
      << "the servers' gradients differ from local autograd";
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, HfReference,
                         ::testing::Values("llama-v5-rope500k-tied", "llama3-rope-scaling",
                                           "llama-sharded-bf16", "qwen2-attention-bias", "mistral",
                                           "mixtral-4x-top2"),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace colony::serve
