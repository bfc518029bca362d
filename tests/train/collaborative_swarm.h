// Peers of one collaborative run in one process, on real sockets: each with its own DHT node and
// averager, a parameter vector w on a chosen device (the CPU or a GPU) and a plain optimizer, so
// that tests set gradients by hand and know the result of every global step exactly.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/multiaddr.h"
#include "dht/node.h"
#include "train/collaborative.h"

namespace colony::train::test {

inline constexpr int64_t kSize = 64;

struct Peer {
  std::unique_ptr<dht::Node> node;
  at::Tensor w;
  std::shared_ptr<torch::optim::Optimizer> opt;
  std::unique_ptr<CollaborativeOptimizer> co;
  // w in host memory, for comparisons.
  at::Tensor Host() const { return w.detach().cpu(); }
};

class Swarm {
 public:
  Swarm() {
    dht::NodeOptions o;
    o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
    auto boot = dht::Node::Start(KeyPair::Generate(), o);
    EXPECT_TRUE(boot.ok()) << boot.status().ToString();
    bootstrap_ = std::move(*boot);
  }

  // A peer whose w (zeros) lives on `device`; SGD with lr 1, or Adam with lr 0.1.
  Peer& Add(CollaborativeOptions options, bool adam = false, int64_t size = kSize,
            c10::Device device = c10::kCPU) {
    using namespace std::chrono_literals;
    auto p = std::make_unique<Peer>();
    dht::NodeOptions o;
    o.initial_peers = {bootstrap_->VisibleAddresses()[0].ToString()};
    o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
    auto node = dht::Node::Start(KeyPair::Generate(), o);
    EXPECT_TRUE(node.ok()) << node.status().ToString();
    p->node = std::move(*node);
    p->w = at::zeros({size}, at::TensorOptions(at::kFloat).device(device)).set_requires_grad(true);
    if (adam) {
      p->opt = std::make_shared<torch::optim::Adam>(std::vector<at::Tensor>{p->w},
                                                    torch::optim::AdamOptions(0.1));
    } else {
      p->opt = std::make_shared<torch::optim::SGD>(std::vector<at::Tensor>{p->w},
                                                   torch::optim::SGDOptions(1.0));
    }
    options.run_id = "test.run";
    options.progress_min_refresh = 50ms;
    options.progress_max_refresh = 500ms;
    options.matchmaking_time = 5s;
    options.averaging_timeout = 30s;
    auto co = CollaborativeOptimizer::Create(*p->node, {p->w}, p->opt, options);
    EXPECT_TRUE(co.ok()) << co.status().ToString();
    p->co = std::move(*co);
    peers_.push_back(std::move(p));
    return *peers_.back();
  }

  std::vector<std::unique_ptr<Peer>>& peers() { return peers_; }
  // Where others join the swarm's DHT.
  std::string bootstrap_address() const { return bootstrap_->VisibleAddresses()[0].ToString(); }

 private:
  std::unique_ptr<dht::Node> bootstrap_;
  std::vector<std::unique_ptr<Peer>> peers_;
};

// Peer i's constant gradient (in host memory).
inline at::Tensor Gradient(int i) {
  return at::arange(kSize, at::kFloat).add(1).mul(0.01f * static_cast<float>(i + 1));
}

// Trains until `epochs` global steps happened (or a bound on batches), one batch per `compute`
// (an emulated forward/backward pass): each batch's gradient is `grad`, on w's device. Returns
// the reports of the steps.
inline std::vector<StepReport> Train(
    Peer& p, const at::Tensor& grad, int64_t batch, int epochs,
    std::chrono::milliseconds compute = std::chrono::milliseconds(20)) {
  std::vector<StepReport> steps;
  const at::Tensor g = grad.to(p.w.device());
  for (int b = 0; b < 5000 && static_cast<int>(steps.size()) < epochs; ++b) {
    std::this_thread::sleep_for(compute);
    p.w.mutable_grad() = g.clone();
    auto r = p.co->Step(batch);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) break;
    if (r->stepped) steps.push_back(*r);
  }
  return steps;
}

// Every peer of `swarm` trains one epoch on its own thread, peer i on Gradient(i) with batches of
// i + 1 samples; the reports of their steps (empty for a peer that did not step exactly once).
inline std::vector<StepReport> TrainOneEpochEach(Swarm& swarm) {
  std::vector<std::future<std::vector<StepReport>>> runs;
  for (size_t i = 0; i < swarm.peers().size(); ++i) {
    runs.push_back(std::async(std::launch::async, [&swarm, i] {
      return Train(*swarm.peers()[i], Gradient(static_cast<int>(i)),
                   /*batch=*/static_cast<int64_t>(i) + 1, /*epochs=*/1);
    }));
  }
  std::vector<StepReport> reports;
  for (auto& r : runs) {
    auto steps = r.get();
    EXPECT_EQ(steps.size(), 1u);
    if (steps.size() != 1) return {};
    reports.push_back(steps[0]);
  }
  return reports;
}

// Where one SGD step (lr 1) from zeros with the averaged gradient of TrainOneEpochEach puts every
// peer, computed apart: -sum(s_i g_i) / sum(s_i), s_i being the samples peer i contributed; and
// the sum of the s_i.
inline std::pair<at::Tensor, int64_t> SampleWeightedStep(Swarm& swarm) {
  at::Tensor num = at::zeros({kSize});
  int64_t total = 0;
  for (size_t i = 0; i < swarm.peers().size(); ++i) {
    const int64_t s = swarm.peers()[i]->co->counters().local_samples;
    num += Gradient(static_cast<int>(i)) * static_cast<float>(s);
    total += s;
  }
  return {-num / static_cast<float>(total), total};
}

// Delayed averaging: two peers with parameters on `device` train three epochs; each round runs
// in the background during the next batch and is applied a batch later, and both peers still
// apply the same steps: three SGD steps (lr 1) of about the equal-weight mean of g0 and g1 (both
// peers use batch 4, so their sample counts differ by at most a few batches: bound by the two
// gradients).
inline void DelayedAveragingAppliesTheSameSteps(c10::Device device) {
  Swarm swarm;
  for (int i = 0; i < 2; ++i) {
    swarm.Add({.target_batch_size = 200, .delay_grad_averaging = true}, false, kSize, device);
  }
  std::vector<std::future<std::vector<StepReport>>> runs;
  for (int i = 0; i < 2; ++i) {
    runs.push_back(std::async(std::launch::async, [&swarm, i] {
      auto steps = Train(*swarm.peers()[static_cast<size_t>(i)], Gradient(i), 4, 3);
      swarm.peers()[static_cast<size_t>(i)]->co->FinishPendingStep();
      return steps;
    }));
  }
  for (auto& r : runs) ASSERT_EQ(r.get().size(), 3u);
  const at::Tensor w0 = swarm.peers()[0]->Host(), w1 = swarm.peers()[1]->Host();
  EXPECT_TRUE(at::allclose(w0, w1, 1e-5, 1e-6));
  EXPECT_TRUE((w0 <= -3 * Gradient(0) + 1e-4).all().item<bool>());
  EXPECT_TRUE((w0 >= -3 * Gradient(1) - 1e-4).all().item<bool>());
  EXPECT_EQ(swarm.peers()[0]->co->counters().failed_rounds, 0);
}

}  // namespace colony::train::test
