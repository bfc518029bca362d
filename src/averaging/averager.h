// Averager: decentralized averaging of a list of float32 tensors with peers found in the DHT.
//
// Each Step() finds a group of peers that average the same tensors under the same key prefix
// (matchmaking, docs/averaging.md), then runs a butterfly all-reduce inside the group: the
// flattened tensors are cut into one span per reducing peer, sized by bandwidth; every sender
// streams each span (compressed, in parts) to its owner, who reduces it (weighted mean, or
// CenteredClip) and streams the result back. Peers that fail, stall or send garbage are excluded
// from the parts not yet reduced; the rest finish by the deadline. The tensors are averaged in
// place; the returned StepResult says which peers' data went into each part of the result.
//
//   auto node = dht::Node::Start(KeyPair::Generate(), {...});
//   std::vector<float> grads(1 << 20);
//   auto avg = averaging::Averager::Create(**node, {grads}, {.prefix = "run1.grads"});
//   Result<StepResult> r = (*avg)->StepSync({.weight = samples, .timeout = 30s});
//
// Threading: the averager runs on a strand of the node's host; codecs and reductions run on a
// process-wide compute pool (one thread per core), never on I/O threads.
// Step() and LoadStateFromPeers() may be awaited from any executor; the *Sync conveniences block
// and must not be called from the host's I/O threads. One Step() runs at a time. The caller must
// not touch the tensors while a step runs.
//
// Memory: a step sends from the tensors and moves part-sized buffers; with verification it also
// keeps one snapshot of the tensors (reused from step to step). Processes that average every round
// should let glibc keep freed heap
// (`colony` calls mallopt(M_MMAP_THRESHOLD / M_TRIM_THRESHOLD) at start); otherwise page faults
// cost a third of the all-reduce time (docs/benchmarks.md).
#pragma once

#include <asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "averaging/mode.h"
#include "averaging/reduce.h"
#include "compression/codec.h"
#include "core/identity.h"
#include "core/status.h"
#include "dht/node.h"

namespace colony::averaging {

// Test-only fault injection: the averager harms itself at a precise moment, so that tests can
// check that the *other* peers finish. kKill* raise SIGKILL, kStop* raise SIGSTOP (the process
// freezes with its sockets open), kCancel cancels the step from inside.
enum class Fault : uint8_t {
  kNone = 0,
  kKillBeforeSending,   // after the group is formed, before any data is sent
  kKillWhileSending,    // after sending half of its parts to every reducer
  kStopWhileSending,    // the same moment, frozen instead of killed
  kKillWhileReducing,   // after returning half of its span's averaged parts
  kStopWhileReducing,   // the same moment, frozen
  kCancelWhileSending,  // cancels its own step after sending half of its parts
};
Result<Fault> ParseFault(std::string_view name);

struct AveragerOptions {
  // DHT key prefix shared by the peers that average together ("run1.grads").
  std::string prefix;
  Mode mode = Mode::kNode;
  // Matchmaking: a leader starts as soon as it has target_group_size peers, or at its
  // deadline (matchmaking_time after it declared itself) with at least min_group_size.
  size_t target_group_size = 16;
  size_t min_group_size = 2;
  std::chrono::milliseconds matchmaking_time{5'000};
  // Moshpit: the initial group key bits ("" or e.g. "0110"); after each round they are redrawn
  // from a seed shared by the group so that group mates scatter (set moshpit = false to keep).
  std::string group_bits;
  bool moshpit = true;
  // All-reduce.
  compression::Codec codec = compression::Codec::kNone;
  compression::CodecOptions codec_options;
  size_t part_size_bytes = 512 * 1024;  // of raw float32 data per part
  // Upload bandwidth in bytes/s announced for load balancing (spans are sized by it).
  double bandwidth = 100e6;
  // Paces this peer's all-reduce sends and state uploads to this rate (bytes/s of encoded
  // data); 0: unlimited.
  double max_send_rate = 0;
  // A sender that delivers no part for this long is excluded from the parts not yet reduced; a
  // reducer that returns no part for twice this long leaves its span at the local values.
  std::chrono::milliseconds part_timeout{5'000};
  // The largest weight a member may declare (its own steps included): a sender whose hello
  // declares more is excluded. Weights near the float range would turn every part's weighted
  // sum into Inf and the round into nothing; keep this near an honest weight's bound where one
  // is known (e.g. a few target batches of samples).
  double max_weight = 1e9;
  // Robust aggregation per part instead of the weighted mean.
  std::optional<CenteredClipOptions> centered_clip;
  // BTARD's verification (docs/averaging.md, "Verification"): after each all-reduce the group
  // draws a shared random direction (commit, then reveal) and every member checks that each
  // reducer's result is the fixed point of its reduction (the weighted mean, or CenteredClip)
  // from the projections its contributors publish. A reducer caught, or a member caught lying
  // about its projections, is banned by this averager for its lifetime (its data, spans,
  // statements and join requests are refused), and spans that cannot be trusted are replaced
  // by this peer's own values. Needs codec kNone (a lossy codec moves the fixed point) and a
  // peer that accepts connections (mode node or aux); costs reducers memory for every input
  // of their span until the round is verified, and up to 4 part_timeouts when members do not
  // answer.
  bool verify = false;
  // Spans that verification cannot trust become zeros rather than this peer's own values:
  // for gradients (a step that skips them), so that every honest member that discards the same
  // spans steps alike and their parameters stay equal (which audits compare).
  bool discard_to_zeros = false;
  // BTARD's audits (with verify): every round the group's shared seed (the one its checks use)
  // picks audit_targets of its members, and every member that reduced a span of their values
  // recomputes them from what each target claimed it computed them from
  // (StepOptions::audit_claim, in its signed commitment, sent before the seed was known) and
  // compares them with what it received (relative L2 error at most kAuditTolerance). A target
  // whose claim does not give what it sent, whose claim is invalid, or that claimed nothing is
  // banned. `recompute` fills `out` (every value) from the claim of `member` and the weight it
  // declared; it returns FailedPrecondition when this peer cannot reproduce the claim (e.g. it
  // was made on other parameters: no verdict) and any other error for an invalid claim (a
  // ban). It runs on the averager's compute pool, one call at a time per round.
  // A member banned after an audit is published under "<prefix>.bans" as accused (its word
  // only: no ban follows from it); every auditing peer that reads it audits the accused at its
  // first round with it, besides the seed's picks, until one such audit passes.
  size_t audit_targets = 0;
  std::function<Status(const PeerId& member, std::string_view claim, double weight,
                       std::span<float> out)>
      recompute = {};
  // State sharing: donors advertise themselves under "<prefix>.state" every
  // state_advert_period; at most max_concurrent_state_transfers downloads (or digests) are
  // served at once, at most max_state_transfers_per_address of them to callers from one address
  // (loopback exempt unless the host's limit_loopback_addresses), and others are told to try
  // another donor. A caller that stops reading loses its slot when the transport gives up its
  // stalled write (net::ConnectionOptions::send_stall_timeout).
  std::chrono::milliseconds state_advert_period{10'000};
  size_t max_concurrent_state_transfers = 2;
  size_t max_state_transfers_per_address = 1;
  size_t state_chunk_bytes = 1 << 20;

  // Test hooks: how a test makes this peer misbehave.
  struct Testing {
    Fault fault = Fault::kNone;  // harms itself at this moment (see Fault)
    // Verification attacks: as a reducer, return this peer's own values as every part's
    // result; as a contributor, publish projections that are not those of its values.
    bool wrong_result = false;
    bool wrong_projections = false;
    bool withhold_checks = false;  // sends no checks (phase 3) to anyone
    // As a reducer, lists every member as a contributor of each result, those that sent it
    // nothing included (a contributor list its members must not believe).
    bool claim_everyone = false;
    // As a sender, corrupts each encoded part it sends: its last byte becomes 0x80, a code the
    // blockwise encoders never write (codec none: sent as it is).
    bool corrupt_encoded_parts = false;
    // Computes its checks (phase 3) this much later: the last of its group to state them, it
    // holds everyone else's checks when it judges.
    std::chrono::milliseconds checks_delay{0};
    // When set, the two lies above only while it returns true (e.g. from a training epoch on);
    // called on the averager's threads.
    std::function<bool()> lying = {};
    bool WrongResult() const { return wrong_result && (!lying || lying()); }
    bool WrongProjections() const { return wrong_projections && (!lying || lying()); }
    // As the leader, lists these addresses for itself in the groups it forms instead of its
    // own (a leader lying about itself: its members cannot dial it).
    std::vector<std::string> addrs_in_led_groups = {};
  } testing = {};
};

// A group that a step averaged in (StepResult::group), for follow-up steps of other averagers of
// the same peers (StepOptions::in_group). Opaque.
struct FormedGroup;

struct StepOptions {
  double weight = 1.0;  // this peer's weight in the mean (e.g. its sample count); ignored for kAux
  // With audits: what this step's values are recomputed from (AveragerOptions::recompute; at
  // most 4 KiB). Empty: a member that cannot be audited, banned when picked.
  std::string audit_claim = {};
  std::string gather;  // metadata delivered to every group member (at most 64 KiB)
  // The step (matchmaking, all-reduce and retries) ends by this deadline.
  std::chrono::milliseconds timeout{60'000};
  // Try matchmaking again (until the deadline) when no group formed in one attempt.
  bool allow_retries = true;
  // When > 0, a leader starts as soon as it has this many peers (at most target_group_size),
  // e.g. the number of peers that a progress tracker saw at this epoch, so that a known swarm
  // does not wait for matchmaking_time each round.
  size_t expected_group_size = 0;
  // When set, this step (and later ones) use these group key bits instead of the current ones,
  // e.g. bits derived from a training epoch so that only peers at the same epoch meet.
  std::optional<std::string> group_bits = std::nullopt;
  // A follow-up step: averages in the group of an earlier step (its StepResult::group, from
  // any averager of this peer) instead of forming one, e.g. PowerSGD's second phase, whose
  // values depend on the first phase's result and must be averaged by the same peers. Every
  // member of that group takes such a step, with the same `phase` (1 to 32 bytes), on an
  // averager of the same prefix and tensor sizes; a member with other sizes cannot join the
  // run (its group id differs) and is excluded, as is one that does not come within a part
  // timeout. The spans are the earlier group's, scaled to this averager's values, and the
  // leader's part size is kept. `gather`, `expected_group_size` and `group_bits` are ignored,
  // and the group key bits do not move (Moshpit moves them after the step that formed the
  // group). Not with verification (AveragerOptions::verify).
  std::shared_ptr<const FormedGroup> in_group = nullptr;
  std::string phase = {};
};

struct GroupMember {
  PeerId peer;
  Mode mode = Mode::kNode;
  std::string gathered;
};

// Which peers' data made it into one contiguous part of the flattened result.
struct PartReport {
  uint64_t begin = 0, end = 0;         // element range in the flattened tensors
  std::vector<uint32_t> contributors;  // indices into StepResult::members
};

// What verification (AveragerOptions::verify) concluded about one round.
struct Verification {
  bool performed = false;
  // Reducers whose spans this peer replaced with its own values: caught, banned, silent, or
  // checked against another random direction than this peer's.
  std::vector<uint32_t> discarded;
  std::vector<uint32_t> banned;      // members banned after this round (indices into members)
  std::vector<std::string> reasons;  // one line per discarded span or ban
  std::vector<uint32_t> audited;     // members this peer audited and found honest
  // Members audited because a published audit verdict accused them (whatever the seed picked;
  // AveragerOptions::audit_targets), whatever the audit found.
  std::vector<uint32_t> audited_on_accusation;
  // Bytes of statements this peer sent (to every member): scalars and hashes per member and
  // per run of parts, independent of the size of the tensors.
  uint64_t bytes_sent = 0;
};

struct StepResult {
  std::string group_id;  // random, 16 bytes
  std::vector<GroupMember> members;
  uint32_t self_index = 0;
  std::vector<PartReport> parts;  // ascending, covering all elements
  std::string next_group_bits;    // the key bits of the next round (Moshpit)
  double matchmaking_seconds = 0;
  double allreduce_seconds = 0;
  int attempts = 0;
  Verification verification;
  std::shared_ptr<const FormedGroup> group;  // for follow-up steps (StepOptions::in_group)
};

// A snapshot of state offered to newcomers (e.g. model parameters and optimizer statistics).
struct SharedState {
  std::string metadata;  // e.g. epoch and optimizer hyper-parameters, at most 1 MiB
  std::vector<std::vector<float>> tensors;
};
// Returns the state to send to a newcomer; called on the compute pool, once per download.
using StateProvider = std::function<Result<SharedState>()>;

struct LoadStateOptions {
  // The download (every donor tried) ends by this deadline. A donor must send its state's header
  // within half the time left, so one that accepts the call and stays silent costs that half.
  std::chrono::milliseconds timeout{60'000};
  // Only donors whose current priority is at least this serve the state (a donor checks its own
  // priority when asked, so a stale advert does not matter); e.g. the epoch the loader needs.
  std::optional<double> min_priority = std::nullopt;
  // Called with a donor's metadata and announced tensor sizes (in values) before any tensor data
  // is downloaded: an error refuses that donor (the next one is tried). The loader knows what
  // state it expects (its model's shapes), so a donor cannot make it download and hold a state
  // of any size the wire allows. Without it, a state may hold up to
  // `max_values` values.
  std::function<Status(const std::string& metadata, std::span<const uint64_t> tensor_sizes)>
      check_header = nullptr;
  uint64_t max_values = uint64_t{1} << 32;  // 16 GiB of float32
  // Cross-checking a download with other donors, for states that honest donors hold bit for bit
  // alike (e.g. the same epoch of a run whose peers all apply the same averaged gradients).
  // When set, the loader asks up to `confirmations` other donors for the SHA-256 digest of their
  // state; those whose metadata `same_version` says should equal the downloaded state's vote:
  // a state that more of them contradict than confirm is refused, and the next donor is tried.
  // A finite but wrong state from one donor is caught whenever honest donors of the same version
  // outnumber it among those asked; with one honest donor against one liar, both states are
  // refused and the load fails naming the disagreement (rather than trusting whichever came
  // first). Each ask has 1 / (confirmations still wanted + 1) of the time left, so a donor that
  // never answers costs a share of `timeout`, not all of it.
  std::function<bool(const std::string& downloaded_metadata, const std::string& other_metadata)>
      same_version = nullptr;
  size_t confirmations = 2;
};

class Averager {
 public:
  // `tensors` must stay valid (and not be resized) for the averager's lifetime. The node must
  // outlive the averager.
  static Result<std::unique_ptr<Averager>> Create(dht::Node& node,
                                                  std::vector<std::span<float>> tensors,
                                                  AveragerOptions options);
  ~Averager();  // Shutdown()
  Averager(const Averager&) = delete;
  Averager& operator=(const Averager&) = delete;

  // Stops serving; a running step fails with Closed. Idempotent.
  void Shutdown();

  // Averages the tensors in place with a group. On error the tensors are unchanged, except
  // when the error came after the all-reduce began, in which case they are partly averaged
  // (StepResult would have said which parts); errors name what failed and what to do.
  asio::awaitable<Result<StepResult>> Step(StepOptions options);
  Result<StepResult> StepSync(StepOptions options);
  // Cancels a running step (it ends with Cancelled); thread-safe.
  void CancelStep();

  // State sharing: serve the provider's snapshots to newcomers with this priority (higher is
  // preferred, e.g. the epoch); nullptr stops serving.
  void ShareState(StateProvider provider, double priority);
  void SetStatePriority(double priority);
  // Downloads state from the donor with the highest advertised priority (ties: a random one,
  // so newcomers spread over donors), falling back to the next donor when one refuses (busy,
  // below options.min_priority) or fails mid-transfer.
  asio::awaitable<Result<SharedState>> LoadStateFromPeers(LoadStateOptions options);
  Result<SharedState> LoadStateFromPeersSync(LoadStateOptions options);

  const std::string& group_bits() const;
  const PeerId& peer_id() const;
  // Peers that verification banned (AveragerOptions::verify), with the reason; thread-safe.
  std::vector<std::pair<PeerId, std::string>> banned() const;
  // With audits: peers a published audit verdict accused, not yet audited here with success
  // (each is audited at this peer's first round with it); thread-safe.
  std::vector<PeerId> suspects() const;
  uint64_t total_values() const;

  class Impl;

 private:
  explicit Averager(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
  bool shut_down_ = false;
};

// Deterministic pseudo-random values in [-1, 1) for tests, benchmarks and `colony average`:
// value i of stream `seed` is the same in every process.
void SyntheticValues(uint64_t seed, uint64_t first_index, std::span<float> out);

}  // namespace colony::averaging
