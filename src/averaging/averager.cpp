// The averager's public API, its step loop and RPC registration. Matchmaking, the all-reduce and
// state sharing live in their own files (see internal.h).
#include "averaging/averager.h"

#include <fmt/format.h>
#include <sodium.h>

#include <asio/post.hpp>
#include <cstring>
#include <future>
#include <optional>
#include <thread>

#include "averaging/allreduce.h"
#include "averaging/group_key.h"
#include "averaging/internal.h"
#include "core/stream_store.h"

namespace colony::averaging {

asio::thread_pool& ComputePool() {
  // Never destroyed: queued work may still reference it while the process exits.
  static auto* pool =
      new asio::thread_pool(std::max<unsigned>(1, std::thread::hardware_concurrency()));
  return *pool;
}

const asio::thread_pool::executor_type& PoolExecutor() {
  static const auto* executor = new asio::thread_pool::executor_type(ComputePool().get_executor());
  return *executor;
}

Result<Fault> ParseFault(std::string_view name) {
  static const std::pair<std::string_view, Fault> kNames[] = {
      {"none", Fault::kNone},
      {"kill-before-sending", Fault::kKillBeforeSending},
      {"kill-while-sending", Fault::kKillWhileSending},
      {"stop-while-sending", Fault::kStopWhileSending},
      {"kill-while-reducing", Fault::kKillWhileReducing},
      {"stop-while-reducing", Fault::kStopWhileReducing},
      {"cancel-while-sending", Fault::kCancelWhileSending},
  };
  for (const auto& [n, f] : kNames) {
    if (n == name) return f;
  }
  return InvalidArgument("unknown fault '" + std::string(name) + "'");
}

void SyntheticValues(uint64_t seed, uint64_t first_index, std::span<float> out) {
  for (size_t i = 0; i < out.size(); ++i) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + (first_index + i) * 0xD1B54A32D192ED03ull + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    out[i] =
        static_cast<float>(static_cast<double>(z >> 40) / static_cast<double>(1ull << 23) - 1.0);
  }
}

Averager::Impl::Impl(dht::Node& node, std::vector<std::span<float>> tensors,
                     AveragerOptions options)
    : node_(node),
      host_(node.host()),
      options_(std::move(options)),
      tensors_(std::move(tensors)),
      strand_(asio::make_strand(node.host().io_context())),
      group_bits_(options_.group_bits),
      looking_changed_(strand_),
      runs_changed_(strand_) {
  for (const auto& t : tensors_) {
    tensor_begins_.push_back(total_);
    total_ += t.size();
  }
  // The schema: tensor count and sizes (FNV-1a, 8 bytes). Peers compare it before averaging.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  };
  mix(tensors_.size());
  for (const auto& t : tensors_) mix(t.size());
  schema_hash_.resize(8);
  for (int i = 0; i < 8; ++i) schema_hash_[i] = static_cast<char>((h >> (8 * i)) & 0xff);
}

Status Averager::Impl::Init() {
  if (options_.prefix.empty() || options_.prefix.size() > 512) {
    return InvalidArgument("the averaging prefix must be 1 to 512 characters");
  }
  COLONY_RETURN_IF_ERROR(CheckGroupBits(group_bits_));
  if (options_.min_group_size < 1 || options_.target_group_size < options_.min_group_size ||
      options_.target_group_size > kMaxGroupSize) {
    return InvalidArgument(
        fmt::format("group sizes must satisfy 1 <= min ({}) <= target ({}) <= {}",
                    options_.min_group_size, options_.target_group_size, kMaxGroupSize));
  }
  if (!(options_.bandwidth > 0)) return InvalidArgument("bandwidth must be positive");
  if (!(options_.max_weight > 0) || !std::isfinite(options_.max_weight)) {
    return InvalidArgument("max_weight must be positive and finite");
  }
  if (options_.part_size_bytes < sizeof(float)) {
    return InvalidArgument("part_size_bytes must hold at least one value");
  }
  if (total_ > kMaxTotalValues) return InvalidArgument("too many values to average");
  if (options_.mode != Mode::kClient && node_.VisibleAddresses().empty()) {
    return InvalidArgument(
        "this peer cannot accept connections (a DHT client without a relay reservation); use "
        "averaging mode 'client', or reserve a slot at a relay");
  }
  {
    Bytes probe;
    COLONY_RETURN_IF_ERROR(compression::Encode(options_.codec, std::span<const float>(), probe,
                                               options_.codec_options));
  }
  if (options_.verify && options_.codec != compression::Codec::kNone) {
    return InvalidArgument(
        "verification needs codec none: a lossy codec moves each result away from the fixed "
        "point that its contributors check it against");
  }
  if (options_.audit_targets > 0 && (!options_.verify || !options_.recompute)) {
    return InvalidArgument(
        "audits need verification (they run in its rounds) and a function that recomputes a "
        "member's values from its claim");
  }
  if (options_.verify && options_.mode == Mode::kClient) {
    return InvalidArgument(
        "verification needs a peer that accepts connections (mode node or aux): members send "
        "each other their checks");
  }
  std::weak_ptr<Impl> weak = weak_from_this();
  host_.RegisterUnary(
      MethodName("join"),
      [weak](net::CallContext& ctx, net::Message m) -> asio::awaitable<Result<net::Message>> {
        auto self = weak.lock();
        if (!self) co_return Unavailable("the averager was shut down");
        auto fn = [self, from = ctx.peer(),
                   m = std::move(m)]() -> asio::awaitable<Result<net::Message>> {
          co_return co_await self->HandleJoin(from, m);
        };
        co_return co_await OnStrand<Result<net::Message>>(self->strand_, std::move(fn));
      });
  host_.RegisterBidiStreaming(MethodName("reduce"),
                              [weak](net::CallContext& ctx) -> asio::awaitable<Status> {
                                auto self = weak.lock();
                                if (!self) co_return Unavailable("the averager was shut down");
                                co_return co_await self->HandleReduce(ctx);
                              });
  host_.RegisterUnary(
      MethodName("verify"),
      [weak](net::CallContext& ctx, net::Message m) -> asio::awaitable<Result<net::Message>> {
        auto self = weak.lock();
        if (!self) co_return Unavailable("the averager was shut down");
        co_return co_await self->HandleVerify(ctx.peer(), std::move(m));
      });
  host_.RegisterServerStreaming(
      MethodName("state"),
      [weak](net::CallContext& ctx, net::Message m) -> asio::awaitable<Status> {
        auto self = weak.lock();
        if (!self) co_return Unavailable("the averager was shut down");
        co_return co_await self->HandleStateRequest(ctx, std::move(m));
      });
  if (options_.verify) StartLearningBans();
  return {};
}

asio::awaitable<Status> Averager::Impl::HandleReduce(net::CallContext& ctx) {
  std::shared_ptr<net::Stream> stream = ctx.stream().shared_from_this();
  auto first = co_await stream->Read();
  if (!first.ok()) co_return first.status();
  if (!first->has_value()) co_return ProtocolError("the reduce stream carried no hello");
  auto hello = DecodeReduceHello((*first)->meta);
  if (!hello.ok()) co_return hello.status();
  // The sender may have learned about the group a moment before us: wait for our run.
  auto find = [self = shared_from_this(),
               id = hello->group_id]() -> asio::awaitable<std::shared_ptr<AllReduceRun>> {
    const SteadyTime until = SteadyNow() + self->options_.part_timeout;
    for (;;) {
      auto it = self->runs_.find(id);
      if (it != self->runs_.end()) co_return it->second;
      if (self->shut_down_ || SteadyNow() >= until) co_return nullptr;
      co_await self->runs_changed_.WaitUntil(until);
    }
  };
  auto run = co_await OnStrand<std::shared_ptr<AllReduceRun>>(strand_, std::move(find));
  if (!run) co_return NotFound("no all-reduce of that group is running here");
  auto serve = [run, stream, hello = std::move(*hello)]() -> asio::awaitable<Status> {
    co_return co_await run->ServeSender(stream, hello);
  };
  co_return co_await OnStrand<Status>(run->strand(), std::move(serve));
}

void Averager::Impl::Gather(std::span<float> out) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    std::copy(tensors_[i].begin(), tensors_[i].end(),
              out.begin() + static_cast<ptrdiff_t>(tensor_begins_[i]));
  }
}

size_t Averager::Impl::TensorAt(uint64_t index) const {
  auto it = std::upper_bound(tensor_begins_.begin(), tensor_begins_.end(), index);
  if (it == tensor_begins_.begin()) return tensors_.size();
  return static_cast<size_t>(it - tensor_begins_.begin()) - 1;
}

template <typename Fn>
void Averager::Impl::ForEachPiece(uint64_t begin, size_t count, Fn&& fn) const {
  uint64_t at = begin;
  size_t done = 0;
  for (size_t t = TensorAt(begin); done < count && t < tensors_.size(); ++t) {
    const uint64_t offset = at - tensor_begins_[t];
    const size_t n = std::min<size_t>(count - done, tensors_[t].size() - offset);
    fn(tensors_[t].subspan(offset, n), done);
    done += n;
    at += n;
  }
}

void Averager::Impl::ReadRange(uint64_t begin, std::span<float> out) const {
  ForEachPiece(begin, out.size(), [&](std::span<float> piece, size_t done) {
    std::copy(piece.begin(), piece.end(), out.begin() + static_cast<ptrdiff_t>(done));
  });
}

std::span<float> Averager::Impl::View(uint64_t begin, uint64_t end) const {
  const size_t t = TensorAt(begin);
  if (t >= tensors_.size() || end < begin || end - tensor_begins_[t] > tensors_[t].size())
    return {};
  return tensors_[t].subspan(begin - tensor_begins_[t], end - begin);
}

void Averager::Impl::Scatter(uint64_t begin, std::span<const float> values) {
  ScatterBytes(begin, ByteSpan(reinterpret_cast<const uint8_t*>(values.data()),
                               values.size() * sizeof(float)));
}

void Averager::Impl::ScatterBytes(uint64_t begin, ByteSpan bytes) {
  const bool past_caches = TensorWrites() == compression::Writes::kPastCaches;
  ForEachPiece(begin, bytes.size() / sizeof(float), [&](std::span<float> piece, size_t done) {
    const uint8_t* from = bytes.data() + done * sizeof(float);
    if (past_caches) {
      StreamStore(piece.data(), from, piece.size_bytes());
    } else {
      std::memcpy(piece.data(), from, piece.size_bytes());
    }
  });
  if (past_caches) StreamFence();
}

compression::Writes Averager::Impl::TensorWrites() const {
  return total_ * sizeof(float) >= kStreamMinBytes ? compression::Writes::kPastCaches
                                                   : compression::Writes::kCached;
}

asio::awaitable<Result<StepResult>> Averager::Impl::Step(StepOptions o) {
  if (shut_down_) co_return Closed("the averager was shut down");
  if (o.gather.size() > kMaxGatheredBytes) {
    co_return InvalidArgument("gathered metadata is limited to 64 KiB");
  }
  if (o.audit_claim.size() > kMaxAuditClaimBytes) {
    co_return InvalidArgument("an audit claim is limited to 4 KiB");
  }
  if (!std::isfinite(o.weight) || o.weight < 0 || o.weight > options_.max_weight) {
    co_return InvalidArgument(fmt::format(
        "the step's weight {:g} must be finite, not negative and at most max_weight {:g} "
        "(other members exclude a sender declaring more)",
        o.weight, options_.max_weight));
  }
  if (o.group_bits && !o.in_group) {
    if (Status st = CheckGroupBits(*o.group_bits); !st.ok()) co_return st;
  }
  if (o.in_group) {
    if (options_.verify) {
      co_return InvalidArgument(
          "a follow-up step (in_group) cannot be verified: verification runs in the step that "
          "forms its group");
    }
    if (o.phase.empty() || o.phase.size() > kMaxPhaseBytes) {
      co_return InvalidArgument("a follow-up step's phase must be 1 to 32 bytes");
    }
  }
  if (step_running_.exchange(true)) co_return FailedPrecondition("a step is already running");
  if (options_.verify) StartLearningBans();
  if (o.group_bits && !o.in_group) group_bits_ = *o.group_bits;
  cancel_requested_ = false;
  const SteadyTime start = SteadyNow();
  const SteadyTime deadline = start + o.timeout;
  std::vector<std::string> reasons;
  Result<StepResult> outcome = DeadlineExceeded("no time to average");
  int attempts = 0;
  if (o.in_group) {
    auto group = FollowUpGroup(o.in_group->info, o.phase);
    if (group.ok()) {
      outcome = co_await RunInGroup(*group, o, deadline);
    } else {
      outcome = group.status();
    }
    if (outcome.ok()) {
      outcome->matchmaking_seconds = 0;
      outcome->attempts = 1;
      outcome->next_group_bits = group_bits_;
    }
    step_running_ = false;
    co_return outcome;
  }
  while (SteadyNow() < deadline) {
    ++attempts;
    const std::string key = GroupKey(options_.prefix, group_bits_);
    auto group = co_await Matchmake(deadline, o.gather, o.expected_group_size, reasons);
    if (options_.mode != Mode::kClient && !shut_down_) {
      // Withdraw the declaration so nobody asks us again (fire and forget). The withdrawal
      // must win over the declaration (newest expiration wins) but lose to our next one, which
      // Matchmake therefore declares to expire after it. (Before, the next one only counted on
      // being declared over a millisecond later: a round between two peers can end sooner,
      // and then every declaration was refused and every withdrawal pushed the next further
      // out, round after round.)
      auto self = shared_from_this();
      const double expiration = declared_expiration_ + 1e-3;
      withdrawn_expiration_ = expiration;
      auto withdraw = [self, key, expiration]() -> asio::awaitable<void> {
        (void)co_await self->Declare(key, expiration, Impl::Availability::kWithdrawn);
      };
      asio::co_spawn(strand_, std::move(withdraw), asio::detached);
    }
    if (!group.ok()) {
      outcome = group.status();
      if (!o.allow_retries || group.status().code() != StatusCode::kNotFound) break;
      continue;
    }
    COLONY_LOG_DEBUG("averaging: group {} formed with {} peers",
                     HexEncode(AsBytes(group->group_id)).substr(0, 8), group->members.size());
    uint32_t self_index = 0;
    for (uint32_t i = 0; i < group->members.size(); ++i) {
      if (group->members[i].peer == host_.peer_id()) self_index = i;
    }
    outcome = co_await RunInGroup(*group, o, deadline);
    if (outcome.ok()) {
      outcome->matchmaking_seconds = Seconds(SteadyNow() - start) - outcome->allreduce_seconds;
      outcome->attempts = attempts;
      if (options_.moshpit) group_bits_ = NextGroupBits(group_bits_, group->group_id, self_index);
      outcome->next_group_bits = group_bits_;
    }
    break;
  }
  step_running_ = false;
  co_return outcome;
}

asio::awaitable<Result<StepResult>> Averager::Impl::RunInGroup(const GroupInfo& group,
                                                               const StepOptions& o,
                                                               SteadyTime deadline) {
  std::optional<uint32_t> self_index;
  for (uint32_t i = 0; i < group.members.size(); ++i) {
    if (group.members[i].peer == host_.peer_id()) self_index = i;
  }
  if (!self_index) {
    co_return InvalidArgument("this peer is not a member of the group it was asked to average in");
  }
  if (group.members[*self_index].mode != options_.mode) {
    co_return InvalidArgument(
        fmt::format("this averager's mode ({}) is not this peer's mode in the group ({})",
                    ModeName(options_.mode), ModeName(group.members[*self_index].mode)));
  }
  const double weight = options_.mode == Mode::kAux ? 0.0 : o.weight;
  auto run = std::make_shared<AllReduceRun>(shared_from_this(), group, *self_index, weight,
                                            deadline, o.audit_claim);
  runs_[group.group_id] = run;
  current_run_ = run;
  runs_changed_.Notify();
  if (cancel_requested_ || shut_down_) run->Cancel(Cancelled("the averaging step was cancelled"));
  auto go = [run]() -> asio::awaitable<Result<StepResult>> { co_return co_await run->Run(); };
  Result<StepResult> outcome = co_await OnStrand<Result<StepResult>>(run->strand(), std::move(go));
  runs_.erase(group.group_id);
  current_run_.reset();
  if (outcome.ok()) outcome->group = std::make_shared<const FormedGroup>(FormedGroup{group});
  co_return outcome;
}

Result<GroupInfo> Averager::Impl::FollowUpGroup(const GroupInfo& first,
                                                const std::string& phase) const {
  if (first.total == 0 && total_ > 0) {
    return FailedPrecondition("the group to follow averaged no values: it has no spans to scale");
  }
  GroupInfo g = first;
  // Members with other tensor sizes get another id, and so cannot join each other's runs.
  std::string material;
  for (const std::string* piece : {&first.group_id, &phase, &schema_hash_}) {
    const uint64_t n = piece->size();
    material.append(reinterpret_cast<const char*>(&n), sizeof(n));
    material += *piece;
  }
  std::string digest(crypto_hash_sha256_BYTES, '\0');
  crypto_hash_sha256(reinterpret_cast<unsigned char*>(digest.data()),
                     reinterpret_cast<const unsigned char*>(material.data()), material.size());
  g.group_id = digest.substr(0, 16);
  // Integer arithmetic only: every member computes the same spans, whatever its floating point.
  __extension__ using Wide = unsigned __int128;
  uint64_t before = 0, boundary = 0;
  for (MemberInfo& m : g.members) {
    before += m.span;
    const auto next =
        first.total == 0 ? 0 : static_cast<uint64_t>(Wide{before} * total_ / first.total);
    m.span = next - boundary;
    boundary = next;
  }
  g.total = total_;
  COLONY_RETURN_IF_ERROR(CheckGroup(g));
  return g;
}

void Averager::Impl::CancelStep() {
  cancel_requested_ = true;
  auto self = shared_from_this();
  asio::post(strand_, [self]() {
    self->looking_changed_.Notify();
    if (self->current_run_)
      self->current_run_->Cancel(Cancelled("the averaging step was cancelled"));
  });
}

void Averager::Impl::Shutdown() {
  auto done = std::make_shared<std::promise<void>>();
  auto self = shared_from_this();
  asio::post(strand_, [self, done]() {
    self->shut_down_ = true;
    self->looking_changed_.Notify();
    self->runs_changed_.Notify();
    if (self->current_run_) self->current_run_->Cancel(Closed("the averager was shut down"));
    done->set_value();
  });
  done->get_future().wait_for(std::chrono::seconds(5));
  {
    std::lock_guard lock(state_mu_);
    provider_ = nullptr;
  }
  // Let a running step observe the shutdown (it ends within a part timeout).
  const SteadyTime until = SteadyNow() + options_.part_timeout + std::chrono::seconds(2);
  // Then let every run's coroutines end (their streams are cancelled), so that none touches the
  // host or the tensors after we return; and the state downloads being served, whose snapshot
  // and digest run on the compute pool and then return to the host's threads (the host may be
  // destroyed right after us).
  auto serving = [this] {
    std::lock_guard lock(state_mu_);
    return transfers_in_flight_ > 0;
  };
  while ((step_running_ || live_runs_ > 0 || ban_tasks_ > 0 || serving()) && SteadyNow() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (live_runs_ > 0) {
    COLONY_LOG_WARN("averaging: {} all-reduce run(s) still active at shutdown", live_runs_.load());
  }
}

// ---- public API

Averager::Averager(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Averager::~Averager() { Shutdown(); }

Result<std::unique_ptr<Averager>> Averager::Create(dht::Node& node,
                                                   std::vector<std::span<float>> tensors,
                                                   AveragerOptions options) {
  auto impl = std::make_shared<Impl>(node, std::move(tensors), std::move(options));
  COLONY_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Averager>(new Averager(std::move(impl)));
}

void Averager::Shutdown() {
  if (impl_ && !shut_down_) {
    shut_down_ = true;
    impl_->Shutdown();
  }
}

asio::awaitable<Result<StepResult>> Averager::Step(StepOptions options) {
  auto impl = impl_;
  auto fn = [impl, options]() -> asio::awaitable<Result<StepResult>> {
    co_return co_await impl->Step(options);
  };
  co_return co_await OnStrand<Result<StepResult>>(impl->strand_, std::move(fn));
}

Result<StepResult> Averager::StepSync(StepOptions options) {
  return asio::co_spawn(impl_->strand_, Step(std::move(options)), asio::use_future).get();
}

void Averager::CancelStep() { impl_->CancelStep(); }

void Averager::ShareState(StateProvider provider, double priority) {
  impl_->ShareState(std::move(provider), priority);
}

void Averager::SetStatePriority(double priority) { impl_->SetStatePriority(priority); }

asio::awaitable<Result<SharedState>> Averager::LoadStateFromPeers(LoadStateOptions options) {
  auto impl = impl_;
  auto fn = [impl, options]() -> asio::awaitable<Result<SharedState>> {
    co_return co_await impl->LoadState(options);
  };
  co_return co_await OnStrand<Result<SharedState>>(impl->strand_, std::move(fn));
}

Result<SharedState> Averager::LoadStateFromPeersSync(LoadStateOptions options) {
  return asio::co_spawn(impl_->strand_, LoadStateFromPeers(options), asio::use_future).get();
}

const std::string& Averager::group_bits() const { return impl_->group_bits_; }
const PeerId& Averager::peer_id() const { return impl_->host_.peer_id(); }
uint64_t Averager::total_values() const { return impl_->total_; }
std::vector<std::pair<PeerId, std::string>> Averager::banned() const {
  std::lock_guard lock(impl_->ban_mu_);
  return {impl_->banned_.begin(), impl_->banned_.end()};
}

std::vector<PeerId> Averager::suspects() const {
  std::lock_guard lock(impl_->ban_mu_);
  std::vector<PeerId> out;
  for (const auto& [peer, cleared] : impl_->suspects_) {
    if (!cleared && !impl_->banned_.contains(peer)) out.push_back(peer);
  }
  return out;
}

}  // namespace colony::averaging
