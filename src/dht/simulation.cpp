#include "dht/simulation.h"

#include <fmt/format.h>

#include <charconv>

namespace colony::dht {

class Simulation::Env final : public Environment {
 public:
  Env(Simulation& sim, size_t index, double offset)
      : sim_(sim), index_(index), clock_(sim.clock_, offset) {}
  const Clock& clock() const override { return clock_; }

  void Ping(const Contact& to, PingRequest request, Duration timeout,
            Callback<PingResponse> done) override {
    Deliver<PingResponse>(
        to, timeout, std::move(done),
        [&sim = sim_, request = std::move(request)](size_t target, const PeerId& from) {
          return sim.node(target).HandlePing(from, request);
        });
  }
  void Store(const Contact& to, StoreRequest request, Duration timeout,
             Callback<StoreResponse> done) override {
    Deliver<StoreResponse>(
        to, timeout, std::move(done),
        [&sim = sim_, request = std::move(request)](size_t target, const PeerId& from) {
          return sim.node(target).HandleStore(from, request);
        });
  }
  void Find(const Contact& to, FindRequest request, Duration timeout,
            Callback<FindResponse> done) override {
    Deliver<FindResponse>(
        to, timeout, std::move(done),
        [&sim = sim_, request = std::move(request)](size_t target, const PeerId& from) {
          const FindScript& script = sim.nodes_[target]->find_script;
          return script ? script(from, request) : sim.node(target).HandleFind(from, request);
        });
  }
  // Each node is its own machine, unless added on a shared one (AddNodeAs).
  std::optional<std::string> AddressGroupOf(const PeerId& peer) const override {
    auto it = sim_.index_of_.find(peer);
    if (it == sim_.index_of_.end()) return std::nullopt;
    const std::string& address = sim_.nodes_[it->second]->address;
    const size_t at = address.find('@');
    return at == std::string::npos ? address : address.substr(at + 1);
  }
  void Schedule(Duration delay, std::function<void()> fn) override {
    const size_t index = index_;
    Simulation& sim = sim_;
    sim_.Schedule(delay, [&sim, index, fn = std::move(fn)] {
      if (sim.alive(index)) fn();
    });
  }

 private:
  // Request after one latency, reply after another; a dead or unknown target (or a node that
  // died meanwhile) yields DeadlineExceeded at the timeout.
  template <typename Resp, typename Handler>
  void Deliver(const Contact& to, Duration timeout, Callback<Resp> done, Handler handler) {
    Simulation& sim = sim_;
    const size_t from = index_;
    const long target = sim.Resolve(to);
    auto timed_out = [&sim, from, done, to, timeout]() {
      if (!sim.alive(from)) return;
      done(DeadlineExceeded(fmt::format(
          "{} did not answer within {} ms", to.addrs.empty() ? to.peer.Short() : to.addrs[0],
          std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count())));
    };
    const Duration there = sim.Latency();
    const Duration back = sim.Latency();
    if (target < 0 || there + back > timeout) {
      sim.Schedule(timeout, std::move(timed_out));
      return;
    }
    sim.Schedule(there, [&sim, from, target, done, handler = std::move(handler), back, timed_out,
                         timeout, there]() mutable {
      if (!sim.alive(static_cast<size_t>(target))) {
        sim.Schedule(timeout - there, std::move(timed_out));
        return;
      }
      ++sim.messages_;
      Result<Resp> reply = handler(static_cast<size_t>(target), sim.identity(from).peer_id());
      if constexpr (std::is_same_v<Resp, PingResponse>) {
        if (reply.ok()) reply->peer = sim.identity(static_cast<size_t>(target)).peer_id();
      }
      sim.Schedule(back, [&sim, from, done, reply = std::move(reply)]() mutable {
        if (sim.alive(from)) done(std::move(reply));
      });
    });
  }

  // The simulation's clock, with this node's wall-clock offset.
  class OffsetClock final : public Clock {
   public:
    OffsetClock(const Clock& base, double offset) : base_(base), offset_(offset) {}
    SteadyTime Now() const override { return base_.Now(); }
    double WallSeconds() const override { return base_.WallSeconds() + offset_; }

   private:
    const Clock& base_;
    double offset_;
  };

  Simulation& sim_;
  size_t index_;
  OffsetClock clock_;
};

Simulation::Simulation(SimulationOptions options) : options_(options), rng_(options.seed) {}

Simulation::~Simulation() {
  for (auto& n : nodes_) {
    if (n->core) n->core->Shutdown();
  }
}

size_t Simulation::AddNode(DhtOptions options, double clock_offset_seconds) {
  std::array<uint8_t, 32> seed{};
  uint64_t s = options_.seed * 0x9E3779B97F4A7C15ull + nodes_.size();
  std::memcpy(seed.data(), &s, sizeof(s));
  seed[31] = 0x5a;
  return AddNodeAs(KeyPair::FromSeed({seed.data(), seed.size()}), {}, options,
                   clock_offset_seconds);
}

size_t Simulation::AddNodeAs(KeyPair identity, const std::string& machine, DhtOptions options,
                             double clock_offset_seconds) {
  const size_t index = nodes_.size();
  auto node = std::make_unique<Node>();
  node->identity = std::make_unique<KeyPair>(std::move(identity));
  node->env = std::make_unique<Env>(*this, index, clock_offset_seconds);
  node->address =
      machine.empty() ? fmt::format("sim/{}", index) : fmt::format("sim/{}@{}", index, machine);
  std::vector<std::string> addrs;
  if (!options.client_mode) addrs.push_back(node->address);
  node->core = DhtCore::Create(*node->identity, std::move(addrs), options, *node->env);
  index_of_.emplace(node->identity->peer_id(), index);
  nodes_.push_back(std::move(node));
  return index;
}

void Simulation::ScriptFinds(size_t i, FindScript script) {
  nodes_[i]->find_script = std::move(script);
}

std::string Simulation::address(size_t i) const { return nodes_[i]->address; }

void Simulation::Kill(size_t i) {
  nodes_[i]->alive = false;
  nodes_[i]->core->Shutdown();
}

long Simulation::Resolve(const Contact& to) const {
  for (const std::string& a : to.addrs) {
    if (a.rfind("sim/", 0) != 0) continue;
    size_t index = 0;
    auto [p, ec] = std::from_chars(a.data() + 4, a.data() + a.size(), index);
    if (ec != std::errc() || index >= nodes_.size() || a != nodes_[index]->address) continue;
    if (!nodes_[index]->alive) return -1;
    if (to.peer.valid() && !(nodes_[index]->identity->peer_id() == to.peer)) return -1;
    return static_cast<long>(index);
  }
  return -1;
}

Duration Simulation::Latency() {
  const auto lo = options_.min_latency.count();
  const auto hi = std::max(options_.max_latency.count(), lo);
  std::uniform_int_distribution<int64_t> d(lo, hi);
  return Duration(d(rng_));
}

void Simulation::Schedule(Duration delay, std::function<void()> fn) {
  const int64_t now = clock_.Now().time_since_epoch().count();
  events_.push({now + std::max<int64_t>(delay.count(), 0), seq_++, std::move(fn)});
}

bool Simulation::RunUntil(const std::function<bool()>& done, Duration limit) {
  const int64_t end = clock_.Now().time_since_epoch().count() + limit.count();
  while (!done()) {
    if (events_.empty() || events_.top().at_ns > end) return false;
    Event e = std::move(const_cast<Event&>(events_.top()));
    events_.pop();
    const int64_t now = clock_.Now().time_since_epoch().count();
    if (e.at_ns > now) clock_.Advance(Duration(e.at_ns - now));
    e.fn();
  }
  return true;
}

void Simulation::RunFor(Duration d) {
  const int64_t end = clock_.Now().time_since_epoch().count() + d.count();
  while (!events_.empty() && events_.top().at_ns <= end) {
    Event e = std::move(const_cast<Event&>(events_.top()));
    events_.pop();
    const int64_t now = clock_.Now().time_since_epoch().count();
    if (e.at_ns > now) clock_.Advance(Duration(e.at_ns - now));
    e.fn();
  }
  const int64_t now = clock_.Now().time_since_epoch().count();
  if (end > now) clock_.Advance(Duration(end - now));
}

Result<size_t> Simulation::Bootstrap(size_t i, std::vector<std::string> initial_peers) {
  std::optional<Result<size_t>> out;
  node(i).Bootstrap(std::move(initial_peers), [&](Result<size_t> r) { out = std::move(r); });
  RunUntil([&] { return out.has_value(); });
  if (!out) return Internal("simulation ran out of events during bootstrap");
  return std::move(*out);
}

std::vector<Status> Simulation::Store(size_t i, std::vector<StoreItem> items) {
  std::optional<std::vector<Status>> out;
  node(i).Store(std::move(items), [&](std::vector<Status> r) { out = std::move(r); });
  RunUntil([&] { return out.has_value(); });
  return out ? std::move(*out) : std::vector<Status>{Internal("simulation ran out of events")};
}

Status Simulation::Store(size_t i, StoreItem item) {
  std::vector<StoreItem> items;
  items.push_back(std::move(item));
  return Store(i, std::move(items)).at(0);
}

std::vector<Result<Record>> Simulation::Get(size_t i, std::vector<std::string> keys,
                                            Freshness freshness) {
  std::optional<std::vector<Result<Record>>> out;
  const size_t n = keys.size();
  node(i).Get(std::move(keys), freshness,
              [&](std::vector<Result<Record>> r) { out = std::move(r); });
  RunUntil([&] { return out.has_value(); });
  return out ? std::move(*out)
             : std::vector<Result<Record>>(n, Internal("simulation ran out of events"));
}

Result<Record> Simulation::Get(size_t i, std::string key, Freshness freshness) {
  std::vector<std::string> keys{std::move(key)};
  return Get(i, std::move(keys), freshness).at(0);
}

}  // namespace colony::dht
