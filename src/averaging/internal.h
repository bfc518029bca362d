// Internals shared by the averager's files (matchmaking.cpp, allreduce.cpp, verify.cpp,
// state_sharing.cpp, averager.cpp). Not part of the public API.
#pragma once

#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "averaging/averager.h"
#include "averaging/ban_evidence.h"
#include "averaging/wire.h"
#include "core/log.h"
#include "net/host.h"

namespace colony::averaging {

using IoStrand = asio::strand<asio::io_context::executor_type>;
using PoolStrand = asio::strand<asio::thread_pool::executor_type>;

inline SteadyTime SteadyNow() { return std::chrono::steady_clock::now(); }

inline std::chrono::milliseconds MsUntil(SteadyTime t) {
  auto d = std::chrono::duration_cast<std::chrono::milliseconds>(t - SteadyNow());
  return std::max(d, std::chrono::milliseconds(1));
}

inline double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Coroutines on one strand wait until Notify() or a deadline. Waiters re-check their condition
// after every wake-up; since waiters and notifiers share the strand, no wake-up is lost between a
// check and the wait.
class Event {
 public:
  explicit Event(asio::any_io_executor ex) : ex_(std::move(ex)) {}
  asio::awaitable<void> WaitUntil(SteadyTime deadline) {
    auto timer = std::make_shared<asio::steady_timer>(ex_, deadline);
    waiters_.push_back(timer);
    co_await timer->async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    std::erase(waiters_, timer);
  }
  void Notify() {
    for (auto& t : waiters_) t->cancel();
  }

 private:
  asio::any_io_executor ex_;
  std::vector<std::shared_ptr<asio::steady_timer>> waiters_;
};

// Awaits `fn` spawned on `ex` *without* forwarding the awaiting coroutine's cancellation.
// asio's per-operation cancellation is not thread-safe: a signal emitted on one strand (say, a
// connection's, when a stream is reset) must not reach an operation pending on another strand
// (a timer on the averager's). Work on our strands learns of failures from stream errors and
// deadlines instead.
template <typename T, typename Executor, typename F>
asio::awaitable<T> OnStrand(const Executor& ex, F fn) {
  co_return co_await asio::co_spawn(
      ex, std::move(fn),
      asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable));
}

// True when the awaiting coroutine was asked to stop (e.g. its RPC was reset).
inline asio::awaitable<bool> CoroCancelled() {
  auto cs = co_await asio::this_coro::cancellation_state;
  co_return cs.cancelled() != asio::cancellation_type::none;
}

// Runs `fn` (a plain function) on `ex` and returns its result to the awaiting coroutine.
template <typename T, typename Executor, typename F>
asio::awaitable<T> RunOn(const Executor& ex, F fn) {
  auto job = [fn = std::move(fn)]() mutable -> asio::awaitable<T> { co_return fn(); };
  co_return co_await asio::co_spawn(ex, std::move(job), asio::use_awaitable);
}

// The process-wide pool for codecs and reductions (never the hosts' I/O threads). It lives until
// the process exits, so that work still queued when an averager is destroyed stays valid.
asio::thread_pool& ComputePool();
// Its executor, as a long-lived object (never a temporary inside a co_await expression).
const asio::thread_pool::executor_type& PoolExecutor();

// The first of a peer's announced addresses that parses and names that peer (/p2p/ is added
// when missing, so the connection still authenticates it); an error naming the problem if none.
// `host` is given all of them, to dial when the first leads elsewhere (Host::SetPeerAddresses).
Result<Multiaddr> DialAddress(net::Host& host, const std::vector<std::string>& addrs,
                              const PeerId& peer);

// Where each member's span starts in the flattened tensors.
std::vector<uint64_t> SpanBegins(const GroupInfo& group);

class AllReduceRun;

// StepResult::group: what a follow-up step needs of the group (averager.h).
struct FormedGroup {
  GroupInfo info;
};

// Phases of a follow-up step are 1 to this many bytes (StepOptions::phase).
inline constexpr size_t kMaxPhaseBytes = 32;

// A peer that advertises its state under "<prefix>.state" (state_sharing.cpp).
struct StateDonor {
  PeerId peer;
  Multiaddr addr;
  double priority = 0;
};

class Averager::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(dht::Node& node, std::vector<std::span<float>> tensors, AveragerOptions options);
  Status Init();
  void Shutdown();

  asio::awaitable<Result<StepResult>> Step(StepOptions options);
  void CancelStep();
  // Runs this peer's all-reduce in a formed group (on strand_).
  asio::awaitable<Result<StepResult>> RunInGroup(const GroupInfo& group, const StepOptions& o,
                                                 SteadyTime deadline);
  // The group of a follow-up step (StepOptions::in_group): `first`'s members, with an id
  // derived from its id, the phase and this averager's schema, and its spans scaled to this
  // averager's values.
  Result<GroupInfo> FollowUpGroup(const GroupInfo& first, const std::string& phase) const;

  // ---- matchmaking (matchmaking.cpp); all on strand_.
  struct Candidate {
    PeerId peer;
    std::vector<std::string> addrs;
    double expiration = 0;
  };
  struct PendingFollower {
    PeerId peer;
    JoinRequest request;
    std::optional<JoinResponse> outcome;
  };
  struct Looking {
    std::string group_key;
    double expiration = 0;  // wall clock (declared)
    SteadyTime deadline;    // the same moment on the steady clock
    std::string gathered;
    size_t start_size = 0;  // the leader starts at this many members
    std::vector<std::shared_ptr<PendingFollower>> followers;
    std::optional<Candidate> requesting;  // the leader we are asking to join
  };
  asio::awaitable<Result<GroupInfo>> Matchmake(SteadyTime step_deadline, std::string gathered,
                                               size_t expected_group_size,
                                               std::vector<std::string>& reasons);
  asio::awaitable<Result<net::Message>> HandleJoin(PeerId from, net::Message request);
  // What a declaration in the group key says about us.
  enum class Availability {
    kLooking,    // looking for a group: leaders may be asked to take us
    kWithdrawn,  // no longer looking (overrides our earlier declaration)
  };
  asio::awaitable<Status> Declare(const std::string& key, double expiration,
                                  Availability availability);
  asio::awaitable<std::vector<Candidate>> FetchCandidates(const std::string& key);
  asio::awaitable<Result<JoinResponse>> RequestJoin(const Candidate& leader, SteadyTime deadline,
                                                    const std::string& gathered);
  Result<GroupInfo> FormGroup();
  // The part size (in values) this peer would choose as a leader: options.part_size_bytes,
  // clamped to [1, kMaxPartSize].
  uint64_t OwnPartSize() const;
  void ResolveFollowers(const JoinResponse& response);
  JoinRequest OwnJoinRequest(const std::string& key, const std::string& gathered) const;
  std::vector<std::string> OwnAddrs() const;

  // ---- all-reduce (allreduce.cpp) and its verification (verify.cpp)
  asio::awaitable<Status> HandleReduce(net::CallContext& ctx);
  asio::awaitable<Result<net::Message>> HandleVerify(PeerId from, net::Message request);
  // ---- bans (bans.cpp): thread-safe.
  bool IsBanned(const PeerId& peer) const;
  // With `evidence` (the peer's signed checks that convict it, ban_evidence.h), the ban is
  // published under "<prefix>.bans" for newcomers; with `accuse` (an audit's verdict), the peer
  // is published as accused, for readers to audit.
  void Ban(const PeerId& peer, const std::string& reason, std::string evidence = {},
           bool accuse = false);
  // Reads "<prefix>.bans": bans every peer whose evidence holds and, with audits, notes the
  // accused as suspects (on strand_).
  asio::awaitable<void> LearnBans();
  // Suspects: peers a published audit verdict accused, which this peer audits at its first
  // round with them (verify.cpp) until one audit of theirs passes.
  bool IsSuspect(const PeerId& peer) const;
  void ClearSuspect(const PeerId& peer);
  asio::awaitable<void> PublishBans();  // on strand_
  // Reads the bans in the background, and stores ours again when they near their expiration.
  void StartLearningBans();
  // Counts the rounds in a row in which a reducer whose results we received sent no checks of
  // its span (silent) and returns that count; a round with its checks resets it.
  int NoteReducerSilence(const PeerId& peer, bool silent);

  // ---- state sharing (state_sharing.cpp)
  void ShareState(StateProvider provider, double priority);
  void SetStatePriority(double priority);
  asio::awaitable<Status> HandleStateRequest(net::CallContext& ctx, net::Message request);
  asio::awaitable<Result<SharedState>> LoadState(LoadStateOptions options);
  // Sends `request` on an avg.state stream and reads the donor's header (a digest_only request's
  // whole answer, or what precedes the values).
  asio::awaitable<Result<StateHeader>> RequestState(net::Stream& stream, StateRequest request);
  // A donor's digest of its state (a digest_only request), or why there is none.
  asio::awaitable<Result<StateHeader>> AskDigest(const PeerId& peer, const Multiaddr& addr,
                                                 std::optional<double> min_priority,
                                                 SteadyTime deadline);
  // LoadStateOptions::same_version's vote on a state downloaded from `from`: OK, or DataLoss
  // when more comparable donors contradict it than confirm it.
  asio::awaitable<Status> CrossCheck(const SharedState& state, const PeerId& from,
                                     const std::vector<StateDonor>& donors,
                                     const LoadStateOptions& options, SteadyTime deadline);
  asio::awaitable<void> AdvertiseLoop();

  // Flattened access to the tensors.
  void Gather(std::span<float> out) const;  // all tensors, concatenated
  void Scatter(uint64_t begin, std::span<const float> values);
  // Copies the flattened values [begin, begin + out.size()) out of the tensors.
  void ReadRange(uint64_t begin, std::span<float> out) const;
  // The flattened values [begin, end) as one view when a single tensor holds them all, else
  // an empty span (the caller copies them with ReadRange).
  std::span<float> View(uint64_t begin, uint64_t end) const;
  // The same from little-endian float32 bytes at any alignment.
  void ScatterBytes(uint64_t begin, ByteSpan bytes);
  // How received values are written into the tensors: past the caches (non-temporal stores)
  // once the tensors are larger than the caches, so that nothing is read before it is written.
  compression::Writes TensorWrites() const;
  // The tensor holding flattened index `index` (tensors_.size() when none does).
  size_t TensorAt(uint64_t index) const;
  // Calls fn(piece, done) on the consecutive pieces of the tensors that hold the flattened
  // values [begin, begin + count); `done` counts the values before the piece.
  template <typename Fn>
  void ForEachPiece(uint64_t begin, size_t count, Fn&& fn) const;

  std::string MethodName(std::string_view what) const {
    return "avg." + std::string(what) + "/" + options_.prefix;
  }

  dht::Node& node_;
  net::Host& host_;
  AveragerOptions options_;
  std::vector<std::span<float>> tensors_;
  std::vector<uint64_t> tensor_begins_;
  uint64_t total_ = 0;
  std::string schema_hash_;
  IoStrand strand_;

  // Guarded by strand_.
  std::string group_bits_;
  bool shut_down_ = false;
  std::optional<Looking> looking_;
  double declared_expiration_ = 0;  // of our last declaration (withdrawn just after it)
  // Of our last withdrawal: the next declaration must expire later, or the DHT keeps the
  // withdrawal (newest expiration wins) and refuses the declaration.
  double withdrawn_expiration_ = 0;
  Event looking_changed_;
  std::map<std::string, std::shared_ptr<AllReduceRun>> runs_;
  Event runs_changed_;
  std::shared_ptr<AllReduceRun> current_run_;
  // The last step's snapshot buffer, reused when no run holds it any more.
  std::shared_ptr<std::vector<float>> snapshot_;

  std::atomic<bool> step_running_{false};
  // AllReduceRun objects alive (their coroutines may still touch the host and the tensors):
  // Shutdown waits for them to end.
  std::atomic<int> live_runs_{0};
  std::atomic<bool> cancel_requested_{false};
  // Ban reads and publications in flight (bans.cpp): Shutdown waits for them too.
  std::atomic<int> ban_tasks_{0};

  // State sharing; guarded by state_mu_.
  std::mutex state_mu_;
  StateProvider provider_;
  double priority_ = 0;
  size_t transfers_in_flight_ = 0;
  // Transfers in flight per caller's source key (net::SourceKey); at most
  // max_concurrent_state_transfers entries.
  std::map<std::string, size_t> transfers_by_source_;
  bool advertising_ = false;
  // The advert loop's timer (strand only); cancelled to re-advertise at once.
  asio::steady_timer* advert_timer_ = nullptr;
  void ReadvertiseSoon();
  std::mt19937_64 rng_{std::random_device{}()};

  mutable std::mutex ban_mu_;
  std::map<PeerId, std::string> banned_;  // guarded by ban_mu_
  std::vector<BanEvidence> evidence_;     // guarded by ban_mu_; the newest kMaxBanEvidence
  std::vector<PeerId> accused_;           // guarded by ban_mu_; the newest kMaxAccusations
  // Accused peers read from the DHT -> whether an audit of ours has since passed (guarded by
  // ban_mu_; at most kMaxSuspects entries, bans.cpp).
  std::map<PeerId, bool> suspects_;
  std::map<PeerId, int> silent_rounds_;  // guarded by ban_mu_; at most kMaxSilentReducers
  bool learning_bans_ = false;           // strand_
  double bans_published_at_ = 0;         // strand_; dht::Now() of our last publication
};

}  // namespace colony::averaging
