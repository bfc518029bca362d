// Training on a GPU through the collaborative optimizer (train/device_mirror.h): the optimizer
// steps host copies of the parameters (offloaded) or the GPU's parameters themselves, and the
// model on the GPU must end where a plain LibTorch loop on the CPU, the independent reference,
// ends. Also: tensors on the GPU cross the network
// (runtime/tensor_io.h). ctest label gpu; without a usable GPU the GPU tests are skipped, saying
// why, and the CPU case runs everywhere.
#include "train/device_mirror.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>

#include <vector>

#include "core/multiaddr.h"
#include "dht/node.h"
#include "model/device.h"
#include "model/llama.h"
#include "runtime/tensor_io.h"
#include "serve/small_model.h"
#include "train/collaborative.h"

namespace colony::train {
namespace {

constexpr int kBatches = 8, kAccumulate = 2;
constexpr int64_t kBatch = 4, kSeq = 16;

model::LlamaConfig TinyConfig() {
  model::LlamaConfig c = serve::test::SmallLlamaConfig(/*tie_word_embeddings=*/false);
  c.num_layers = 2;
  return c;
}

at::Tensor Tokens(int i) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(100 + static_cast<uint64_t>(i));
  return at::randint(TinyConfig().vocab_size, {kBatch, kSeq + 1}, g, at::kLong);
}

void Backward(model::LlamaModel& m, const at::Tensor& tokens) {
  const at::Tensor t = tokens.to(model::DeviceOf(*m));
  model::LanguageModelLoss(m->forward(t.narrow(1, 0, kSeq)), t.narrow(1, 1, kSeq)).backward();
}

at::Tensor Flat(model::LlamaModel& m) {
  std::vector<at::Tensor> flat;
  for (const auto& p : m->parameters()) flat.push_back(p.detach().cpu().flatten());
  return at::cat(flat);
}

at::Tensor InitialParameters() {
  at::manual_seed(0);
  model::LlamaModel m(TinyConfig());
  return Flat(m);
}

// The reference: the same batches, gradients averaged over kAccumulate batches, Adam on the CPU.
at::Tensor PlainCpuLoop() {
  at::manual_seed(0);
  model::LlamaModel m(TinyConfig());
  torch::optim::Adam opt(m->parameters(), 1e-3);
  for (int i = 0; i < kBatches; ++i) {
    Backward(m, Tokens(i));
    if ((i + 1) % kAccumulate == 0) {
      for (auto& p : m->parameters()) p.mutable_grad().div_(kAccumulate);
      opt.step();
      opt.zero_grad();
    }
  }
  return Flat(m);
}

void SkipWithoutGpu() {
  if (!model::CudaAvailable()) {
    GTEST_SKIP() << "needs a CUDA device: " << model::ParseDevice("cuda").status().ToString();
  }
}

TEST(DeviceMirror, OnTheCpuTheMasterIsTheParametersThemselves) {
  at::Tensor w = at::zeros({4}).set_requires_grad(true);
  DeviceMirror mirror({w}, /*offload=*/true);
  EXPECT_FALSE(mirror.offloaded());
  ASSERT_EQ(mirror.master().size(), 1u);
  EXPECT_TRUE(mirror.master()[0].is_same(w));
  w.mutable_grad() = at::ones({4});
  mirror.PullGradients();  // no copies: the optimizer reads w.grad itself
  EXPECT_TRUE(w.grad().equal(at::ones({4})));
}

// A lone peer trains on the GPU, with the optimizer on host copies (`offload`) or on the GPU.
void LonePeerOnTheGpuTrainsWhatAPlainCpuLoopTrains(bool offload) {
  const at::Tensor want = PlainCpuLoop();

  at::manual_seed(0);
  model::LlamaModel m(TinyConfig());
  m->to(*model::ParseDevice("cuda"));
  DeviceMirror mirror(m->parameters(), offload);
  ASSERT_EQ(mirror.offloaded(), offload);
  for (const auto& p : mirror.master()) {
    EXPECT_EQ(p.device().is_cpu(), offload);
    if (offload) {
      EXPECT_TRUE(p.is_pinned());
    }
  }
  auto adam = std::make_shared<torch::optim::Adam>(mirror.master(), 1e-3);
  dht::NodeOptions no;
  no.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  auto node = dht::Node::Start(KeyPair::Generate(), no);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  auto co = CollaborativeOptimizer::Create(
      **node, mirror.master(), adam,
      {.run_id = "test.gpu", .target_batch_size = kBatch * kAccumulate});
  ASSERT_TRUE(co.ok()) << co.status().ToString();
  int steps = 0;
  for (int i = 0; i < kBatches; ++i) {
    Backward(m, Tokens(i));
    mirror.PullGradients();
    if (offload) {
      for (const auto& p : m->parameters()) {
        ASSERT_EQ(p.grad().abs().max().item<float>(), 0.0f) << "the device gradients were zeroed";
      }
    }
    auto r = (*co)->Step(kBatch);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (r->stepped) {
      ++steps;
      mirror.PushParameters();
    }
  }
  EXPECT_EQ(steps, kBatches / kAccumulate);
  const at::Tensor got = Flat(m);
  std::vector<at::Tensor> master;
  for (const auto& p : mirror.master()) master.push_back(p.detach().cpu().flatten());
  EXPECT_TRUE(got.equal(at::cat(master))) << "the GPU model is not the stepped host copy";
  EXPECT_GT((want - InitialParameters()).abs().max().item<double>(), 1e-3)
      << "the reference did not train";
  // Float32 on different devices: the GPU's kernels sum in another order than the CPU's.
  const double diff = (got - want).abs().max().item<double>();
  EXPECT_LT(diff, 1e-4) << "the GPU run drifted from the CPU reference";
  (*node)->Shutdown();
}

TEST(DeviceMirror, ALonePeerOnTheGpuWithAnOffloadedOptimizerTrainsWhatAPlainCpuLoopTrains) {
  SkipWithoutGpu();
  if (testing::Test::IsSkipped()) return;
  LonePeerOnTheGpuTrainsWhatAPlainCpuLoopTrains(/*offload=*/true);
}

TEST(DeviceMirror, ALonePeerWhoseOptimizerStepsOnTheGpuTrainsWhatAPlainCpuLoopTrains) {
  SkipWithoutGpu();
  if (testing::Test::IsSkipped()) return;
  LonePeerOnTheGpuTrainsWhatAPlainCpuLoopTrains(/*offload=*/false);
}

TEST(DeviceMirror, GpuTensorsCrossTheNetworkAsTheirValues) {
  SkipWithoutGpu();
  if (testing::Test::IsSkipped()) return;
  const at::Tensor cpu = at::randn({3, 5});
  const at::Tensor gpu = cpu.to(*model::ParseDevice("cuda"));
  auto frame = runtime::ToFrame(gpu);
  ASSERT_TRUE(frame.ok()) << frame.status().ToString();
  auto back = runtime::FromFrame(*frame);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->device().is_cpu());
  EXPECT_TRUE(back->equal(cpu));
}

}  // namespace
}  // namespace colony::train
