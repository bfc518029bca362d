// Adaptive rebalancing of SWARM stages (rebalancing.h): the rule, and a stage peer that follows it.
#include "swarm/rebalancing.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string_view>
#include <tuple>

#include "core/bytes.h"
#include "core/files.h"
#include "core/log.h"
#include "serve/records.h"
#include "serve/server.h"

namespace colony::swarm {
namespace {

// Which of the peers that may move moves this round: a fixed function of (peer, round), so that
// every peer that reads the same records names the same one.
uint64_t MoverRank(const PeerId& peer, uint64_t round) {
  const Bytes id = peer.ToBytes();
  const uint64_t h = Fnv1a64(std::string_view(reinterpret_cast<const char*>(&round), sizeof round));
  return Fnv1a64(AsStringView(id), h);
}

// A move must make the weaker of the two stages it touches this much stronger than the weakest
// stage was: a move costs the mover its epoch's gradients and a download of the stage's state.
constexpr double kMinGain = 1.05;

double Blocks(const StageLayout& layout, size_t stage) {
  return static_cast<double>(layout.stages[stage].second - layout.stages[stage].first);
}

}  // namespace

std::vector<double> StageCapacities(const StageLayout& layout, const std::vector<PeerLoad>& peers) {
  std::vector<double> caps(layout.stages.size(), 0.0);
  for (const auto& p : peers) {
    if (p.stage < caps.size()) caps[p.stage] += p.throughput / Blocks(layout, p.stage);
  }
  return caps;
}

std::optional<PlannedMove> PlanMove(const StageLayout& layout, const std::vector<PeerLoad>& peers,
                                    double balance_quality, uint64_t round) {
  const std::vector<double> caps = StageCapacities(layout, peers);
  if (caps.size() < 2) return std::nullopt;
  const double weakest = *std::min_element(caps.begin(), caps.end());
  // What the peers could give at best: every block served at the same rate (an upper bound of
  // any assignment of these peers to the stages). Close enough to it, nobody moves.
  double total = 0;
  for (const auto& p : peers) total += p.stage < caps.size() ? p.throughput : 0.0;
  const double bound = total / static_cast<double>(layout.stages.back().second);
  if (!(weakest < balance_quality * bound)) return std::nullopt;
  // Each peer's best move (to a weakest stage if it has one, else to any weaker stage), when
  // the weaker of the two stages it touches ends clearly stronger than the target was.
  struct Candidate {
    const PeerLoad* peer;
    size_t to;
    bool to_weakest;
    double left, pair;
  };
  std::vector<Candidate> candidates;
  for (const auto& p : peers) {
    if (p.stage >= caps.size() || !(p.throughput > 0)) continue;
    const double left = caps[p.stage] - p.throughput / Blocks(layout, p.stage);
    std::optional<Candidate> best;
    for (size_t to = 0; to < caps.size(); ++to) {
      if (!(caps[to] < caps[p.stage])) continue;
      const double pair = std::min(left, caps[to] + p.throughput / Blocks(layout, to));
      if (!(pair > kMinGain * caps[to])) continue;
      const Candidate c{&p, to, caps[to] == weakest, left, pair};
      if (!best || std::tie(c.to_weakest, c.pair) > std::tie(best->to_weakest, best->pair)) {
        best = c;
      }
    }
    if (best) candidates.push_back(*best);
  }
  const bool any_to_weakest = std::any_of(candidates.begin(), candidates.end(),
                                          [](const Candidate& c) { return c.to_weakest; });
  std::optional<PlannedMove> chosen;
  uint64_t chosen_rank = 0;
  for (const auto& c : candidates) {
    if (any_to_weakest && !c.to_weakest) continue;
    const uint64_t rank = MoverRank(c.peer->peer, round);
    if (chosen && rank >= chosen_rank) continue;
    std::vector<double> after = caps;
    after[c.peer->stage] = c.left;
    after[c.to] += c.peer->throughput / Blocks(layout, c.to);
    chosen = PlannedMove{.peer = c.peer->peer,
                         .from = c.peer->stage,
                         .to = c.to,
                         .capacity_now = weakest,
                         .capacity_after = *std::min_element(after.begin(), after.end())};
    chosen_rank = rank;
  }
  return chosen;
}

size_t WeakestStage(const StageLayout& layout, const std::vector<PeerLoad>& peers) {
  const std::vector<double> caps = StageCapacities(layout, peers);
  return static_cast<size_t>(std::min_element(caps.begin(), caps.end()) - caps.begin());
}

StagePeer::StagePeer(dht::Node& node, StagePeerOptions options)
    : node_(node), options_(std::move(options)) {}

Result<std::unique_ptr<StagePeer>> StagePeer::Start(dht::Node& node, StagePeerOptions options) {
  if (options.layout.stages.empty()) return InvalidArgument("a stage peer needs the run's layout");
  const auto& r = options.rebalance;
  if (!(r.balance_quality > 0 && r.balance_quality <= 1) || !(r.max_claim_ratio >= 1) ||
      r.period.count() < 0 || r.ping_timeout.count() <= 0) {
    return InvalidArgument(fmt::format(
        "balance quality {} must be in (0, 1], the claim ratio {} at least 1, the period ({} ms) "
        "not negative and the ping timeout ({} ms) positive",
        r.balance_quality, r.max_claim_ratio, r.period.count(), r.ping_timeout.count()));
  }
  auto peer = std::unique_ptr<StagePeer>(new StagePeer(node, std::move(options)));
  const StageOptions& so = peer->options_.stage;
  size_t index = 0;
  if (so.first_block < 0 && so.last_block < 0) {
    index = WeakestStage(peer->options_.layout, peer->ReadPeers());
  } else if (auto found = peer->options_.layout.Find(so.first_block, so.last_block)) {
    index = *found;
  } else {
    return InvalidArgument(fmt::format("blocks {}:{} are not a stage of the run (its stages: {})",
                                       so.first_block, so.last_block,
                                       peer->options_.layout.ToString()));
  }
  COLONY_RETURN_IF_ERROR(peer->StartStage(index));
  if (peer->options_.rebalance.period.count() > 0) {
    peer->thread_ = std::thread([p = peer.get()] { p->Loop(); });
  }
  return peer;
}

StagePeer::~StagePeer() { Shutdown(); }

void StagePeer::Shutdown() {
  {
    std::lock_guard lock(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  if (stage_) stage_->Shutdown();
}

Status StagePeer::StartStage(size_t index, uint64_t* counter) {
  StageOptions so = options_.stage;
  so.first_block = options_.layout.stages[index].first;
  so.last_block = options_.layout.stages[index].second;
  COLONY_ASSIGN_OR_RETURN(auto stage, Stage::Start(node_, std::move(so)));
  std::lock_guard lock(mu_);
  stage_ = std::move(stage);
  index_ = index;
  if (counter != nullptr) ++*counter;
  return Status::Ok();
}

StagePeerStats StagePeer::stats() const {
  std::lock_guard lock(mu_);
  StagePeerStats s;
  s.first = options_.layout.stages[index_].first;
  s.last = options_.layout.stages[index_].second;
  s.moves = moves_;
  s.failed_moves = failed_moves_;
  s.rejoins = rejoins_;
  s.stageless = !stage_;
  if (stage_) {
    s.server = stage_->server_stats();
    s.training = stage_->training_stats();
  }
  return s;
}

std::vector<at::Tensor> StagePeer::parameters() const {
  std::lock_guard lock(mu_);
  return stage_ ? stage_->parameters() : std::vector<at::Tensor>{};
}

std::vector<PeerLoad> StagePeer::LastView() const {
  std::lock_guard lock(mu_);
  return view_;
}

// The layout's stage peers from their records (one key per stage: a stage peer announces every
// block it serves) that answer a ping, this peer from its own state. A joining peer (moving in,
// or loading) counts with the median of the others' throughputs, so that a round does not send a
// second peer after it; a claim counts at most max_claim_ratio times this peer's own throughput,
// or, before it has one, times the median claim.
std::vector<PeerLoad> StagePeer::ReadPeers() {
  const StageLayout& layout = options_.layout;
  const auto num_blocks = layout.stages.back().second;
  std::vector<std::string> keys;
  for (const auto& [first, last] : layout.stages) {
    keys.push_back(serve::BlockKey(options_.stage.run, first));
  }
  auto results = node_.GetManySync(keys, dht::Freshness::kLatest);
  double own = 0;
  std::optional<size_t> own_index;
  {
    std::lock_guard lock(mu_);
    if (stage_) {
      own = stage_->server_stats().throughput;
      own_index = index_;
    }
  }
  std::map<PeerId, std::pair<size_t, serve::ServerRecord>> records;  // the stage, the record
  const double now = dht::Now();
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok() || !results[i]->is_dict) continue;
    for (const auto& [subkey, entry] : results[i]->subkeys) {
      auto peer = dht::ParseOwnerMarker(subkey);
      if (!peer || *peer == node_.peer_id() || entry.expiration < now) continue;
      auto rec = serve::ParseServerRecord(*peer, entry.value, num_blocks);
      if (!rec.ok() || rec->state == serve::ServerState::kOffline) continue;
      auto index = layout.Find(rec->start, rec->end);
      if (!index || *index != i) continue;
      records[*peer] = {i, std::move(*rec)};
    }
  }
  // A record counts only when its peer answers a ping at the address it names: at most
  // kMaxPeerPings of them, drawn at random, pinged at once.
  std::vector<std::pair<size_t, serve::ServerRecord>> drawn;
  for (auto& [peer, r] : records) drawn.push_back(std::move(r));
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::shuffle(drawn.begin(), drawn.end(), rng);
  if (drawn.size() > kMaxPeerPings) drawn.resize(kMaxPeerPings);
  std::vector<serve::ServerRecord> pinged;
  for (const auto& d : drawn) pinged.push_back(d.second);
  const std::vector<bool> answered =
      serve::AnsweringRecords(node_.host(), pinged, options_.rebalance.ping_timeout);
  std::map<PeerId, PeerLoad> by_peer;
  std::set<PeerId> joining;
  std::vector<double> claims;
  for (size_t k = 0; k < drawn.size(); ++k) {
    if (!answered[k]) continue;
    const auto& [i, rec] = drawn[k];
    double t = std::isfinite(rec.throughput) ? std::max(0.0, rec.throughput) : 0.0;
    if (own > 0) t = std::min(t, own * options_.rebalance.max_claim_ratio);
    if (rec.state == serve::ServerState::kJoining) {
      joining.insert(rec.peer);
    } else if (t > 0) {
      claims.push_back(t);
    }
    by_peer[rec.peer] = PeerLoad{.peer = rec.peer, .stage = i, .throughput = t};
  }
  if (own <= 0 && !claims.empty()) {
    // Without a throughput of its own yet (joining), a claim counts at most max_claim_ratio
    // times the (lower) median claim.
    const double cap = serve::LowerMedian(std::move(claims)) * options_.rebalance.max_claim_ratio;
    for (auto& [peer, load] : by_peer) load.throughput = std::min(load.throughput, cap);
  }
  std::vector<PeerLoad> out;
  std::vector<double> known;
  if (own_index && own > 0) known.push_back(own);
  for (auto& [peer, load] : by_peer) {
    if (load.throughput > 0 && joining.count(peer) == 0) {
      known.push_back(load.throughput);
    }
  }
  std::sort(known.begin(), known.end());
  const double median = known.empty() ? 1.0 : known[known.size() / 2];
  for (auto& [peer, load] : by_peer) {
    if (joining.count(peer) > 0) load.throughput = median;
    out.push_back(load);
  }
  if (own_index) {
    out.push_back({.peer = node_.peer_id(), .stage = *own_index, .throughput = own});
  }
  return out;
}

void StagePeer::Loop() {
  const auto period = options_.rebalance.period;
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> moment(0.2, 0.9);
  for (;;) {
    // Once per round of the wall clock (every peer's rounds line up), at a random moment of it.
    const double p = std::chrono::duration<double>(period).count();
    const double wall = dht::Now();
    const auto round = static_cast<uint64_t>(wall / p) + 1;
    const double at = (static_cast<double>(round) + moment(rng)) * p;
    const auto wait = std::chrono::duration<double>(std::max(0.0, at - wall));
    {
      std::unique_lock lock(stop_mu_);
      if (stop_cv_.wait_for(lock, wait, [&] { return stopping_; })) return;
    }
    Check(round);
  }
}

void StagePeer::Check(uint64_t round) {
  std::vector<PeerLoad> peers = ReadPeers();
  bool stageless = false;
  {
    std::lock_guard lock(mu_);
    view_ = peers;
    stageless = !stage_;
  }
  if (stageless) {
    // A move and the move back failed: join the weakest stage, as a new peer does.
    const size_t index = WeakestStage(options_.layout, peers);
    const auto& [first, last] = options_.layout.stages[index];
    if (Status st = StartStage(index, &rejoins_); !st.ok()) {
      COLONY_LOG_WARN("swarm: stageless; could not join stage {}:{} ({}); trying again next round",
                      first, last, st.ToString());
      return;
    }
    COLONY_LOG_INFO("swarm: stageless after a failed move; joined stage {}:{}", first, last);
    return;
  }
  auto move = PlanMove(options_.layout, peers, options_.rebalance.balance_quality, round);
  // A stage must have looked short of peers in the previous round too: one lookup that timed out
  // reads as an empty stage, and a move on it would be undone by the next round's.
  std::optional<size_t> short_before;
  if (last_check_round_ + 1 == round) short_before = short_stage_;
  last_check_round_ = round;
  short_stage_ = move ? std::optional<size_t>(move->to) : std::nullopt;
  if (!move || move->to != short_before || move->peer != node_.peer_id()) return;
  StageMove event;
  event.from = options_.layout.stages[move->from];
  event.to = options_.layout.stages[move->to];
  event.capacity_now = move->capacity_now;
  event.capacity_after = move->capacity_after;
  COLONY_LOG_INFO(
      "swarm: moving from stage {}:{} to {}:{} (the pipeline's capacity {:.3g} -> {:.3g} tokens/s)",
      event.from.first, event.from.second, event.to.first, event.to.second, move->capacity_now,
      move->capacity_after);
  std::unique_ptr<Stage> old;
  {
    std::lock_guard lock(mu_);
    old = std::move(stage_);
  }
  // In-flight microbatches of the old stage fail and their trainers retry them on its other
  // peers; what this peer accumulated of the current epoch there is lost, as when a peer leaves.
  event.left = old->training_stats();
  old->Shutdown();
  old.reset();
  // A stage and the count that says how it came are seen together (stats() never shows a joined
  // stage without its move, or a stage gone back to without its failed move).
  event.status = StartStage(move->to, &moves_);
  if (!event.status.ok()) {
    COLONY_LOG_WARN("swarm: could not join stage {}:{} ({}); going back", event.to.first,
                    event.to.second, event.status.ToString());
    if (Status back = StartStage(move->from, &failed_moves_); !back.ok()) {
      COLONY_LOG_ERROR(
          "swarm: could not go back to stage {}:{} either: {}; stageless until a later round "
          "joins a stage",
          event.from.first, event.from.second, back.ToString());
      std::lock_guard lock(mu_);
      ++failed_moves_;
    }
  }
  if (options_.on_move) options_.on_move(event);
}

}  // namespace colony::swarm
