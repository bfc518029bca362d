// An in-memory, deterministic simulation of a DHT swarm: thousands of protocol cores in one
// process, a virtual clock, and a network with seeded per-message latencies. Dead nodes swallow
// requests, so their callers see timeouts exactly as on a real network. Used by the tests and
// by anyone tuning the protocol's parameters. Each node is its own machine (address group)
// unless added on a shared one; a node's find replies can be scripted (a hostile peer).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/identity.h"
#include "dht/protocol.h"

namespace colony::dht {

struct SimulationOptions {
  uint64_t seed = 1;
  Duration min_latency = std::chrono::milliseconds(5);  // one way
  Duration max_latency = std::chrono::milliseconds(40);
};

class Simulation {
 public:
  explicit Simulation(SimulationOptions options = {});
  ~Simulation();
  Simulation(const Simulation&) = delete;
  Simulation& operator=(const Simulation&) = delete;

  // Adds a node (not bootstrapped yet); returns its index. Its address is address(index).
  // `clock_offset_seconds` shifts the node's wall clock (a machine whose clock is off).
  size_t AddNode(DhtOptions options = {}, double clock_offset_seconds = 0);
  // A node with this identity, on `machine` (its address is "sim/<index>@<machine>"; nodes on
  // one machine share an address group, as identities on one host do): a test's Sybils.
  size_t AddNodeAs(KeyPair identity, const std::string& machine, DhtOptions options = {},
                   double clock_offset_seconds = 0);
  // Node i answers finds with `script` instead of its protocol core (a hostile peer).
  using FindScript = std::function<Result<FindResponse>(const PeerId& from, const FindRequest&)>;
  void ScriptFinds(size_t i, FindScript script);
  size_t size() const { return nodes_.size(); }
  DhtCore& node(size_t i) { return *nodes_[i]->core; }
  const KeyPair& identity(size_t i) const { return *nodes_[i]->identity; }
  std::string address(size_t i) const;
  // The node stops answering for good (as if SIGKILLed).
  void Kill(size_t i);
  bool alive(size_t i) const { return nodes_[i]->alive; }

  // Virtual time.
  ManualClock& clock() { return clock_; }
  // Runs events in time order until `done()` holds (true), or none are left or `limit` of
  // virtual time has passed (false).
  bool RunUntil(const std::function<bool()>& done, Duration limit = std::chrono::hours(1));
  // Runs every event due within `d` of virtual time from now.
  void RunFor(Duration d);
  uint64_t messages_delivered() const { return messages_; }

  // Blocking conveniences: start the operation on node i and run the simulation until it ends.
  Result<size_t> Bootstrap(size_t i, std::vector<std::string> initial_peers);
  std::vector<Status> Store(size_t i, std::vector<StoreItem> items);
  Status Store(size_t i, StoreItem item);
  std::vector<Result<Record>> Get(size_t i, std::vector<std::string> keys,
                                  Freshness freshness = Freshness::kAnyCopy);
  Result<Record> Get(size_t i, std::string key, Freshness freshness = Freshness::kAnyCopy);

  // Schedules `fn` at virtual time now + delay (used by the nodes' environments).
  void Schedule(Duration delay, std::function<void()> fn);
  Duration Latency();
  // Index of the live node at `address`, or -1.
  long Resolve(const Contact& to) const;

 private:
  class Env;
  struct Node {
    std::unique_ptr<KeyPair> identity;
    std::string address;
    FindScript find_script;
    std::unique_ptr<Env> env;
    std::shared_ptr<DhtCore> core;
    bool alive = true;
  };
  struct Event {
    int64_t at_ns;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Event& o) const {
      return at_ns != o.at_ns ? at_ns > o.at_ns : seq > o.seq;
    }
  };

  SimulationOptions options_;
  ManualClock clock_;
  std::mt19937_64 rng_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::map<PeerId, size_t> index_of_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  uint64_t seq_ = 0;
  uint64_t messages_ = 0;
};

}  // namespace colony::dht
