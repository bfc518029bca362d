// The options of a DHT node for tests and benchmarks on loopback: listens on a free port of
// 127.0.0.1, joins `initial_peers`, answers within 2 s, and checks records with the rules every
// colony command uses (so that a test meets what a user's swarm would).
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "core/multiaddr.h"
#include "dht/node.h"
#include "tools/record_rules.h"

namespace colony::test {

inline dht::NodeOptions LoopbackNodeOptions(std::vector<std::string> initial_peers = {}) {
  dht::NodeOptions o;
  o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  o.initial_peers = std::move(initial_peers);
  o.dht.request_timeout = std::chrono::seconds(2);
  o.validators = {cli::SwarmRecordRules()};
  return o;
}

}  // namespace colony::test
