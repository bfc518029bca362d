// A DHT on loopback for in-process swarm tests: a bootstrap node and the nodes that join it.
//
//   test::LoopbackDht dht;
//   ASSERT_TRUE(dht.Start().ok());
//   dht::Node& node = dht.Add();
//   ...
//   dht.Shutdown();  // after what runs on the nodes is gone
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "dht/node.h"
#include "loopback_node.h"

namespace colony::test {

class LoopbackDht {
 public:
  Status Start() {
    auto boot = dht::Node::Start(KeyPair::Generate(), LoopbackNodeOptions());
    if (!boot.ok()) return boot.status();
    boot_ = std::move(*boot);
    return Status::Ok();
  }
  // A node joined to the bootstrap node (a test failure, and a crash, if it cannot start).
  dht::Node& Add() {
    auto node = dht::Node::Start(KeyPair::Generate(),
                                 LoopbackNodeOptions({boot_->VisibleAddresses().at(0).ToString()}));
    EXPECT_TRUE(node.ok()) << node.status().ToString();
    nodes_.push_back(std::move(*node));
    return *nodes_.back();
  }
  // The nodes added, in order.
  std::vector<std::unique_ptr<dht::Node>>& nodes() { return nodes_; }
  void Shutdown() {
    for (auto& n : nodes_) n->Shutdown();
    if (boot_) boot_->Shutdown();
  }

 private:
  std::unique_ptr<dht::Node> boot_;
  std::vector<std::unique_ptr<dht::Node>> nodes_;
};

}  // namespace colony::test
