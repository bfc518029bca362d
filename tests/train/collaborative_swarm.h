// Peers of one collaborative run in one process, on real sockets: each with its own DHT node and
// averager, a parameter vector w on a chosen device (the CPU or a GPU) and a plain optimizer, so
// that tests set gradients by hand and know the result of every global step exactly.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
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

}  // namespace colony::train::test
