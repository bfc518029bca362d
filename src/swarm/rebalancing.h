// Adaptive rebalancing of SWARM stages (Ryabinin et al., "SWARM Parallelism", section 3.2; Petals'
// balance-quality rule): a stage peer that moves to another stage of the run's layout (layout.h)
// when the pipeline is clearly weaker than its peers could make it.
//
// Every microbatch passes through every stage, so the stages' loads (demand over capacity) differ
// only by their capacities: a stage's capacity is the sum of its peers' announced per-block
// throughputs over its number of blocks, and the pipeline's is that of its weakest stage. Once
// per round (every `period`, at a random moment of it) each peer reads the stage peers' records.
// When the pipeline's capacity is below balance_quality of what the peers could give (every block
// served at the same rate: the sum of throughputs over the model's blocks; Petals uses 0.75 and
// checks every 60 s), one peer of a stronger stage moves to a weakest stage: of the moves after
// which the weaker of the two stages the move touches is stronger than the weakest stage was (by
// 5%), the best for that peer. Every move raises the stages' capacities in sorted order, so moves
// end; with two stages empty, the first is filled, then the other. Only one peer moves per round:
// of those that may, the one whose hash of (peer id, round) is least, so that the peers of a stage
// do not all leave together, and a peer that never moves holds the others back for a round, not
// for ever. A peer moves only when the stage it moves to was short in its previous round's check
// as well: a DHT lookup that timed out reads as an empty stage, and one such read must not move a
// peer.
// Queue lengths are not used: with few trainers nothing queues, while capacities already say which
// stage every microbatch waits for.
//
// A peer whose move and move back both failed (its stage did not start: a checkpoint that does
// not load, memory) is stageless: each later round it joins the weakest stage, as a new peer
// does, until one starts.
//
// Records are untrusted: only records whose span is exactly a stage of the layout and whose peer
// answers a ping at the address it names count (at most kMaxPeerPings, drawn at random), and an
// announced throughput counts at most max_claim_ratio times this peer's own, or the median
// claim's while it has none (joining): a stranger claiming a huge throughput would otherwise
// empty the stage it claims to serve.
//
//   auto peer = swarm::StagePeer::Start(node, {.stage = {...}, .layout = layout,
//                                               .rebalance = {.period = 60s}});
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/identity.h"
#include "core/status.h"
#include "dht/node.h"
#include "swarm/layout.h"
#include "swarm/stage.h"

namespace colony::swarm {

struct PeerLoad {
  PeerId peer;
  size_t stage = 0;       // index in the layout
  double throughput = 0;  // per block (tokens/s through one block), as counted
};

// Each stage's capacity: the sum of its peers' throughputs over its number of blocks.
std::vector<double> StageCapacities(const StageLayout& layout, const std::vector<PeerLoad>& peers);

struct PlannedMove {
  PeerId peer;
  size_t from = 0, to = 0;
  double capacity_now = 0, capacity_after = 0;  // the pipeline's (its weakest stage's)
};

// The move of this round (see above), or nullopt (balanced enough, or no move helps).
std::optional<PlannedMove> PlanMove(const StageLayout& layout, const std::vector<PeerLoad>& peers,
                                    double balance_quality, uint64_t round);

// The stage a new peer joins: the weakest now (ties: the first).
size_t WeakestStage(const StageLayout& layout, const std::vector<PeerLoad>& peers);

// Stage peers' records a check pings (at random among more).
inline constexpr size_t kMaxPeerPings = 64;

struct RebalanceOptions {
  // Rounds of the check (0: never move). A peer checks once per round, at a random moment of it.
  std::chrono::milliseconds period{60'000};
  double balance_quality = 0.75;
  // An announced throughput counts at most this many times this peer's own.
  double max_claim_ratio = 8;
  // How long a check waits for the peers it pings (all at once); one that has not answered by
  // then counts for nothing. A peer across the world needs about four round trips (TCP, the
  // handshake, the ping): at 1 s, peers more than ~250 ms away would never count.
  std::chrono::milliseconds ping_timeout{5'000};
};

// What a move did, for the caller's log: the stage left (with what it did there) and the new one.
struct StageMove {
  std::pair<int64_t, int64_t> from, to;
  StageTrainingStats left;  // the stage left, at the move
  double capacity_now = 0, capacity_after = 0;
  Status status;  // not ok: the new stage did not start, and the peer went back (or stopped)
};

struct StagePeerOptions {
  // The stage to start with: first_block = last_block = -1 picks the weakest stage of the
  // layout (by the stage peers' records).
  StageOptions stage = {};
  StageLayout layout = {};
  RebalanceOptions rebalance = {};
  std::function<void(const StageMove&)> on_move = {};  // called on the rebalancing thread
};

struct StagePeerStats {
  int64_t first = 0, last = 0;  // the stage (the last one while stageless)
  bool stageless = false;       // a move and the move back failed; a later round joins a stage
  uint64_t moves = 0;
  uint64_t failed_moves = 0;  // moves whose new stage did not start (the peer went back)
  uint64_t rejoins = 0;       // stages joined while stageless
  serve::ServerStats server;
  StageTrainingStats training;  // of the current stage
};

// A stage peer that rebalances: hosts one stage of the layout at a time (a swarm::Stage) and
// moves as described above, downloading the new stage's state from its peers.
class StagePeer {
 public:
  static Result<std::unique_ptr<StagePeer>> Start(dht::Node& node, StagePeerOptions options);
  ~StagePeer();     // Shutdown()
  void Shutdown();  // stops rebalancing and leaves the stage; idempotent
  StagePeerStats stats() const;
  // The current stage's parameters (the live tensors; read them only while no request runs).
  std::vector<at::Tensor> parameters() const;
  // The peers of the layout's stages, as the last check read them (this peer included).
  std::vector<PeerLoad> LastView() const;

 private:
  StagePeer(dht::Node& node, StagePeerOptions options);
  // Starts stage `index` and, in the same step stats() sees, counts it in `counter` (if given).
  Status StartStage(size_t index, uint64_t* counter = nullptr);
  std::vector<PeerLoad> ReadPeers();
  void Loop();
  void Check(uint64_t round);

  dht::Node& node_;
  StagePeerOptions options_;
  mutable std::mutex mu_;  // stage_, index_, moves_, failed_moves_, rejoins_, view_
  std::unique_ptr<Stage> stage_;
  size_t index_ = 0;
  uint64_t moves_ = 0;
  uint64_t failed_moves_ = 0;
  uint64_t rejoins_ = 0;
  std::vector<PeerLoad> view_;
  // The rebalancing thread's: the stage the last check found short of peers, and its round.
  uint64_t last_check_round_ = 0;
  std::optional<size_t> short_stage_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace colony::swarm
