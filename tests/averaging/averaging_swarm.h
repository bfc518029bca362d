// Averagers on real sockets in one process, for the averaging tests: a bootstrap DHT node and
// peers that each run their own node and averager over SyntheticValues.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "averaging/averager.h"
#include "dht/node.h"

#ifdef __GLIBC__
#include <malloc.h>  // mallopt
#endif

namespace colony::averaging::swarm_test {

using namespace std::chrono_literals;

// While one lives, every fresh heap allocation of this process comes filled with 0x42 bytes
// (floats of 48.6) instead of whatever the allocator had (often zeros), so that code reading
// memory it never wrote is wrong in every run. glibc only; elsewhere (and under ASan, which
// fills allocations with its own pattern) it does nothing.
class DirtyAllocations {
 public:
  DirtyAllocations() {
#ifdef __GLIBC__
    mallopt(M_PERTURB, 0x42 ^ 0xff);  // glibc fills with the complement of the byte given
#endif
  }
  ~DirtyAllocations() {
#ifdef __GLIBC__
    mallopt(M_PERTURB, 0);
#endif
  }
  DirtyAllocations(const DirtyAllocations&) = delete;
  DirtyAllocations& operator=(const DirtyAllocations&) = delete;
};

struct Peer {
  std::unique_ptr<dht::Node> node;
  std::vector<float> data;
  std::unique_ptr<Averager> averager;
};

class Swarm {
 public:
  explicit Swarm(size_t values) : values_(values) {
    dht::NodeOptions o;
    o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
    auto boot = dht::Node::Start(KeyPair::Generate(), o);
    EXPECT_TRUE(boot.ok()) << boot.status().ToString();
    bootstrap_ = std::move(*boot);
  }

  // A peer with SyntheticValues(seed) (or `fill` when given), averaged as one tensor or, with
  // `split`, as consecutive tensors of those sizes (views into Peer::data).
  Peer& Add(uint64_t seed, AveragerOptions options, std::optional<float> fill = std::nullopt,
            size_t values = 0, const std::vector<size_t>& split = {}) {
    auto p = std::make_unique<Peer>();
    dht::NodeOptions o;
    o.initial_peers = {bootstrap_->VisibleAddresses()[0].ToString()};
    if (options.mode == Mode::kClient) {
      o.dht.client_mode = true;
    } else {
      o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
    }
    auto node = dht::Node::Start(KeyPair::Generate(), o);
    EXPECT_TRUE(node.ok()) << node.status().ToString();
    p->node = std::move(*node);
    p->data.resize(values ? values : values_);
    SyntheticValues(seed, 0, p->data);
    if (fill) std::fill(p->data.begin(), p->data.end(), *fill);
    if (options.prefix.empty()) options.prefix = "test.avg";
    std::vector<std::span<float>> tensors;
    size_t at = 0;
    for (size_t size : split) {
      tensors.push_back(std::span<float>(p->data).subspan(at, size));
      at += size;
    }
    EXPECT_TRUE(split.empty() || at == p->data.size()) << "the split does not cover the values";
    if (split.empty()) tensors.push_back(p->data);
    auto avg = Averager::Create(*p->node, tensors, options);
    EXPECT_TRUE(avg.ok()) << avg.status().ToString();
    p->averager = std::move(*avg);
    peers_.push_back(std::move(p));
    return *peers_.back();
  }

  // Runs one step on every peer at once (with audit claims[i] when given).
  std::vector<Result<StepResult>> StepAll(std::vector<double> weights = {},
                                          std::chrono::milliseconds timeout = 30s,
                                          std::vector<std::string> claims = {}) {
    std::vector<size_t> all(peers_.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    return StepSome(all, std::move(weights), timeout, std::move(claims));
  }

  // One step on the peers `who` at once (weights and claims in the order of `who`).
  std::vector<Result<StepResult>> StepSome(const std::vector<size_t>& who,
                                           std::vector<double> weights = {},
                                           std::chrono::milliseconds timeout = 30s,
                                           std::vector<std::string> claims = {}) {
    std::vector<std::future<Result<StepResult>>> futures;
    for (size_t k = 0; k < who.size(); ++k) {
      const size_t i = who[k];
      const double w = weights.empty() ? 1.0 : weights[k];
      std::string claim = claims.empty() ? std::string() : claims[k];
      futures.push_back(std::async(std::launch::async, [this, i, w, timeout, claim]() {
        return peers_[i]->averager->StepSync({.weight = w,
                                              .audit_claim = claim,
                                              .gather = "peer" + std::to_string(i),
                                              .timeout = timeout});
      }));
    }
    std::vector<Result<StepResult>> out;
    for (auto& f : futures) out.push_back(f.get());
    return out;
  }

  std::vector<std::unique_ptr<Peer>>& peers() { return peers_; }

 private:
  size_t values_;
  std::unique_ptr<dht::Node> bootstrap_;
  std::vector<std::unique_ptr<Peer>> peers_;
};

inline AveragerOptions Options(size_t group_size) {
  AveragerOptions o;
  o.target_group_size = group_size;
  o.min_group_size = group_size;
  o.matchmaking_time = 5s;
  o.part_size_bytes = 16 * 1024;
  o.part_timeout = 3s;
  return o;
}

inline std::vector<float> Synthetic(uint64_t seed, size_t n) {
  std::vector<float> v(n);
  SyntheticValues(seed, 0, v);
  return v;
}

}  // namespace colony::averaging::swarm_test
