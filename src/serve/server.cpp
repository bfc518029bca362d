#include "serve/server.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/concurrent_channel.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <cmath>
#include <future>
#include <limits>
#include <optional>

#include "core/log.h"
#include "dht/validation.h"
#include "runtime/tensor_io.h"
#include "serve/serve.pb.h"

namespace colony::serve {
namespace {

using Clock = std::chrono::steady_clock;
using asio::experimental::as_tuple;
constexpr auto use_awaitable = asio::use_awaitable;

struct Input {
  wire::Step step;
  std::vector<net::TensorFrame> tensors;
  bool from_push = false;
};
using InputPtr = std::shared_ptr<Input>;
using Channel = asio::experimental::concurrent_channel<void(asio::error_code, InputPtr)>;

struct Session {
  std::string id;
  int64_t start = 0, end = 0, max_length = 0, batch = 0;
  int64_t reserved = 0;
  std::vector<model::KVCache> caches;
  int64_t length = 0;
  uint64_t last_step = 0;
  wire::PushTarget next;  // set by the client (open or any step); empty address: no push
  // Tuning for every step (at open): deep prompts [blocks, batch or 1, P, H] in the server's
  // dtype (per-row ones follow hypo_ids) and LoRA adapters per block.
  at::Tensor prompts;
  std::vector<model::BlockAdapters> adapters;
  std::unique_ptr<Channel> channel;
  std::unique_ptr<asio::steady_timer> idle_timer;
  Clock::time_point idle_deadline;
  bool done = false;
};

Result<at::ScalarType> ParseDType(const std::string& name) {
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  return InvalidArgument(
      fmt::format("unsupported server dtype '{}'; use float32 or bfloat16", name));
}

std::string DTypeLabel(at::ScalarType t) { return t == at::kBFloat16 ? "bfloat16" : "float32"; }

const std::vector<DType> kFloatDTypes = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

// Deep prompts and LoRA adapters that a forward/backward request or an inference session
// carries (the metadata fields are named alike in BlockRequest and OpenSession).
struct TuningSpec {
  int64_t prompt_length = 0;
  int64_t rank = 0;
  std::vector<std::string> targets;
  double scale = 1.0;
};
template <typename Message>
TuningSpec TuningSpecOf(const Message& m) {
  return {m.prompt_length(), m.lora_rank(),
          std::vector<std::string>(m.lora_targets().begin(), m.lora_targets().end()),
          m.lora_scale() == 0 ? 1.0 : m.lora_scale()};
}
struct Tuning {
  at::Tensor prompts;            // [blocks, B or 1, P, H], as sent
  std::vector<at::Tensor> lora;  // flat: block, target, (A, B), as sent
};

bool AllFinite(const Tuning& t) {
  bool finite = !t.prompts.defined() || at::isfinite(t.prompts).all().item<bool>();
  for (const auto& a : t.lora) finite = finite && at::isfinite(a).all().item<bool>();
  return finite;
}

// The adapters of `blocks` blocks as model::BlockAdapters, from flat tensors (block, target,
// (A, B)).
std::vector<model::BlockAdapters> MakeAdapters(const std::vector<at::Tensor>& flat, int64_t blocks,
                                               const TuningSpec& spec) {
  std::vector<model::BlockAdapters> out;
  if (flat.empty()) return out;
  out.resize(static_cast<size_t>(blocks));
  size_t k = 0;
  for (auto& block : out) {
    for (const auto& name : spec.targets) {
      model::LoraAdapter* a = block.Find(name);
      a->a = flat[k++];
      a->b = flat[k++];
      a->scale = spec.scale;
    }
  }
  return out;
}

std::string Hex(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes.substr(0, 4)) out += fmt::format("{:02x}", c);
  return out;
}

}  // namespace

int64_t CacheBytesPerToken(const model::LlamaConfig& config, at::ScalarType dtype) {
  return 2 * config.num_kv_heads * config.head_dim() *
         static_cast<int64_t>(c10::elementSize(dtype));
}

int64_t ChooseBestStart(const std::vector<ServerRecord>& records, int64_t total_blocks,
                        int64_t num_blocks) {
  std::vector<double> coverage(static_cast<size_t>(total_blocks), 0.0);
  for (const auto& r : records) {
    if (r.state == ServerState::kOffline) continue;
    for (int64_t b = std::max<int64_t>(0, r.start); b < std::min(r.end, total_blocks); ++b) {
      coverage[static_cast<size_t>(b)] += r.throughput;
    }
  }
  int64_t best = 0;
  double best_min = std::numeric_limits<double>::infinity(), best_sum = best_min;
  for (int64_t s = 0; s + num_blocks <= total_blocks; ++s) {
    double mn = std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t b = s; b < s + num_blocks; ++b) {
      mn = std::min(mn, coverage[static_cast<size_t>(b)]);
      sum += coverage[static_cast<size_t>(b)];
    }
    if (mn < best_min || (mn == best_min && sum < best_sum)) {
      best = s;
      best_min = mn;
      best_sum = sum;
    }
  }
  return best;
}

class BlockServer::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(dht::Node& node, ServerOptions options)
      : node_(node),
        options_(std::move(options)),
        pool_({.threads = 1,
               .max_queued = options_.max_queued_tasks,
               .thread_init = [t = options_.torch_threads] {
                 if (t > 0) at::set_num_threads(t);
               }}) {}

  Status Init() {
    COLONY_ASSIGN_OR_RETURN(dtype_, ParseDType(options_.dtype));
    if (options_.quantize != "none" && options_.quantize != "int8") {
      return InvalidArgument(
          fmt::format("unknown quantization '{}'; use none or int8", options_.quantize));
    }
    COLONY_ASSIGN_OR_RETURN(config_, model::LoadLlamaConfig(options_.model_dir));
    if (options_.model_name.empty()) {
      options_.model_name = std::filesystem::absolute(options_.model_dir).filename().string();
      if (options_.model_name.empty()) {
        options_.model_name =
            std::filesystem::absolute(options_.model_dir).parent_path().filename().string();
      }
    }
    max_length_ = options_.max_length > 0 ? std::min(options_.max_length, config_.max_seq_len)
                                          : config_.max_seq_len;
    const int64_t n = config_.num_layers;
    if (options_.first_block >= 0 || options_.last_block >= 0) {
      first_ = options_.first_block;
      last_ = options_.last_block;
      pinned_ = true;
    } else {
      const int64_t count = options_.num_blocks > 0 ? std::min(options_.num_blocks, n) : n;
      first_ = ChooseBestStart(FetchRecords(), n, count);
      last_ = first_ + count;
    }
    if (first_ < 0 || last_ <= first_ || last_ > n) {
      return InvalidArgument(fmt::format(
          "blocks [{}, {}) are not a range of the model's {} blocks; use --blocks A:B with "
          "0 <= A < B <= {}",
          first_, last_, n, n));
    }
    SetState(ServerState::kJoining);
    Announce();
    COLONY_RETURN_IF_ERROR(LoadBlocks(first_, last_));
    MeasureThroughput();
    SetState(ServerState::kOnline);
    Announce();
    RegisterHandlers();
    announcer_ = std::thread([this] { AnnounceLoop(); });
    COLONY_LOG_INFO("serving blocks [{}, {}) of {} ({}, {:.0f} tokens/s per block) as {}", first_,
                    last_, options_.model_name, DTypeLabel(dtype_), throughput_,
                    node_.peer_id().ToString());
    return Status();
  }

  void Shutdown() {
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    cv_.notify_all();
    if (announcer_.joinable()) announcer_.join();
    SetState(ServerState::kOffline);
    Announce();
    std::vector<std::shared_ptr<Session>> sessions;
    {
      std::lock_guard lock(mu_);
      for (auto& [id, s] : sessions_) sessions.push_back(s);
    }
    for (auto& s : sessions) s->channel->close();
    pool_.Shutdown();
  }

  ServerStats Stats() const {
    std::lock_guard lock(mu_);
    ServerStats s;
    s.first = first_;
    s.last = last_;
    s.state = state_;
    s.throughput = throughput_;
    s.inference_rps = inference_rps_;
    s.weight_bytes = weight_bytes_;
    s.cache_bytes_total = options_.cache_bytes;
    s.cache_bytes_used = cache_used_;
    s.sessions = sessions_.size();
    s.steps = steps_;
    s.pushes_used = pushes_used_;
    s.duplicates = duplicates_;
    s.forwards = forwards_;
    s.backwards = backwards_;
    return s;
  }

  const model::LlamaConfig& config() const { return config_; }
  const std::string& model_name() const { return options_.model_name; }

 private:
  void SetState(ServerState state) {
    std::lock_guard lock(mu_);
    state_ = state;
  }

  // ---- blocks and compute (compute runs only on the pool's single thread) ----

  Status LoadBlocks(int64_t first, int64_t last) {
    COLONY_ASSIGN_OR_RETURN(model::LlamaBlockRange range,
                            model::LoadLlamaBlocks(options_.model_dir, first, last));
    int64_t bytes = 0;
    for (auto& b : range.blocks) {
      b->eval();
      for (auto& p : b->parameters()) p.set_requires_grad(false);
      b->to(dtype_);
      if (options_.quantize == "int8") b->QuantizeInt8();
      for (const auto& p : b->parameters()) bytes += static_cast<int64_t>(p.nbytes());
      for (const auto& p : b->buffers()) bytes += static_cast<int64_t>(p.nbytes());
    }
    blocks_ = std::move(range.blocks);
    std::lock_guard lock(mu_);
    weight_bytes_ = bytes;
    return Status();
  }

  // Hidden states of positions offset.. through blocks [start, end) (absolute indices within
  // ours). Deep prompts [end-start, B or 1, P, H] are added to the positions < P before each block.
  at::Tensor RunBlocks(int64_t start, int64_t end, at::Tensor h, int64_t offset,
                       std::vector<model::KVCache>* caches, const at::Tensor& prompts,
                       const std::vector<model::BlockAdapters>* adapters = nullptr) {
    for (int64_t i = start; i < end; ++i) {
      if (prompts.defined() && offset < prompts.size(2)) {
        const int64_t n = std::min(prompts.size(2) - offset, h.size(1));
        at::Tensor pr = prompts[i - start].narrow(1, offset, n).to(h.scalar_type());
        h = at::cat({h.narrow(1, 0, n) + pr, h.narrow(1, n, h.size(1) - n)}, 1);
      }
      h = blocks_[static_cast<size_t>(i - first_)]->forward(
          h, offset, caches ? &(*caches)[static_cast<size_t>(i - start)] : nullptr,
          adapters ? &(*adapters)[static_cast<size_t>(i - start)] : nullptr);
    }
    return h;
  }

  void MeasureThroughput() {
    const int64_t n = last_ - first_;
    if (options_.throughput_override > 0) {
      throughput_ = inference_rps_ = options_.throughput_override;
      return;
    }
    at::NoGradGuard no_grad;
    if (options_.torch_threads > 0) at::set_num_threads(options_.torch_threads);
    const int64_t tokens = 16;
    at::Tensor x = at::randn({1, tokens, config_.hidden_size}).to(dtype_);
    RunBlocks(first_, last_, x, 0, nullptr, {});
    auto t0 = Clock::now();
    const int reps = 3;
    for (int i = 0; i < reps; ++i) RunBlocks(first_, last_, x, 0, nullptr, {});
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    throughput_ = tokens * reps / std::max(secs, 1e-6) * static_cast<double>(n);
    std::vector<model::KVCache> caches(static_cast<size_t>(n));
    at::Tensor one = at::randn({1, 1, config_.hidden_size}).to(dtype_);
    RunBlocks(first_, last_, one, 0, &caches, {});
    const int steps = 8;
    t0 = Clock::now();
    for (int i = 1; i <= steps; ++i) RunBlocks(first_, last_, one, i, &caches, {});
    secs = std::chrono::duration<double>(Clock::now() - t0).count();
    inference_rps_ = steps / std::max(secs, 1e-6) * static_cast<double>(n);
  }

  // ---- DHT ----

  std::vector<ServerRecord> FetchRecords() {
    std::vector<std::string> keys;
    for (int64_t b = 0; b < config_.num_layers; ++b)
      keys.push_back(BlockKey(options_.model_name, b));
    auto results = node_.GetManySync(keys, /*latest=*/true);
    std::map<std::string, ServerRecord> by_peer;
    const double now = dht::Now();
    for (auto& r : results) {
      if (!r.ok() || !r->is_dict) continue;
      for (auto& [subkey, entry] : r->subkeys) {
        auto peer = dht::ParseOwnerMarker(subkey);
        if (!peer || *peer == node_.peer_id() || entry.expiration < now) continue;
        auto rec = ParseServerRecord(*peer, entry.value, config_.num_layers);
        if (rec.ok()) by_peer.emplace(peer->ToString(), std::move(*rec));
      }
    }
    std::vector<ServerRecord> out;
    for (auto& [k, v] : by_peer) out.push_back(std::move(v));
    return out;
  }

  void Announce() {
    ServerRecord r;
    {
      std::lock_guard lock(mu_);
      r.state = state_;
      r.start = first_;
      r.end = last_;
      r.throughput = throughput_;
      r.inference_rps = inference_rps_;
      r.cache_tokens_left = CacheTokensLeftLocked();
    }
    for (const auto& a : node_.VisibleAddresses()) r.addresses.push_back(a.ToString());
    r.version = COLONY_VERSION_STRING;
    r.dtype = DTypeLabel(dtype_);
    const std::string value = EncodeServerRecord(r);
    const double expiration = dht::Now() + options_.record_ttl_seconds;
    std::vector<dht::StoreItem> items;
    for (int64_t b = r.start; b < r.end; ++b) {
      items.push_back({.key = BlockKey(options_.model_name, b),
                       .subkey = dht::OwnerMarker(node_.peer_id()),
                       .value = value,
                       .expiration = expiration});
    }
    auto statuses = node_.StoreManySync(items);
    for (const auto& st : statuses) {
      if (!st.ok()) {
        COLONY_LOG_DEBUG("serve: announcing blocks failed: {}", st.ToString());
        break;
      }
    }
  }

  void AnnounceLoop() {
    int ticks = 0;
    std::unique_lock lock(mu_);
    while (!stopped_) {
      cv_.wait_for(lock, options_.announce_period, [&] { return stopped_; });
      if (stopped_) break;
      lock.unlock();
      Announce();
      if (!pinned_ && options_.rebalance && ++ticks % 6 == 0) MaybeRebalance();
      lock.lock();
    }
  }

  // Moves to weaker blocks when the swarm's weakest block would gain clearly (Petals'
  // balance-quality rule), and only while no session holds a cache here.
  void MaybeRebalance() {
    auto others = FetchRecords();
    const int64_t n = config_.num_layers, count = last_ - first_;
    std::vector<double> without(static_cast<size_t>(n), 0.0);
    for (const auto& r : others) {
      if (r.state == ServerState::kOffline) continue;
      for (int64_t b = r.start; b < r.end; ++b) without[static_cast<size_t>(b)] += r.throughput;
    }
    auto swarm_min = [&](int64_t start) {
      double mn = std::numeric_limits<double>::infinity();
      for (int64_t b = 0; b < n; ++b) {
        double c = without[static_cast<size_t>(b)] +
                   ((b >= start && b < start + count) ? throughput_ : 0.0);
        mn = std::min(mn, c);
      }
      return mn;
    };
    const int64_t best = ChooseBestStart(others, n, count);
    const double now_min = swarm_min(first_), new_min = swarm_min(best);
    if (best == first_ || new_min * options_.balance_quality <= now_min) return;
    {
      std::lock_guard lock(mu_);
      if (!sessions_.empty()) return;
    }
    COLONY_LOG_INFO(
        "serve: moving from blocks [{}, {}) to [{}, {}): the swarm's weakest block "
        "goes from {:.0f} to {:.0f} tokens/s",
        first_, last_, best, best + count, now_min, new_min);
    // Withdraw the old span, then swap blocks on the compute thread (no step runs meanwhile).
    SetState(ServerState::kOffline);
    Announce();
    std::promise<Status> done;
    auto future = done.get_future();
    const bool queued = pool_.Submit(runtime::kPriorityInference, [&](bool ok) {
      if (!ok) {
        done.set_value(Closed("shutting down"));
        return;
      }
      {
        // A session may have opened between the check above and going offline: keep it.
        std::lock_guard lock(mu_);
        if (!sessions_.empty()) {
          done.set_value(FailedPrecondition("an inference session opened meanwhile"));
          return;
        }
      }
      Status st = LoadBlocks(best, best + count);
      if (st.ok()) {
        std::lock_guard lock(mu_);
        first_ = best;
        last_ = best + count;
      }
      done.set_value(st);
    });
    Status st = queued ? future.get() : ResourceExhausted("compute queue full");
    if (!st.ok()) COLONY_LOG_WARN("serve: rebalancing failed, staying: {}", st.ToString());
    SetState(ServerState::kOnline);
    Announce();
  }

  int64_t CacheTokensLeftLocked() const {
    const int64_t per = CacheBytesPerToken(config_, dtype_) * std::max<int64_t>(1, last_ - first_);
    return (options_.cache_bytes - cache_used_) / per;
  }

  // ---- RPC ----

  void RegisterHandlers() {
    auto self = shared_from_this();
    auto& host = node_.host();
    host.RegisterUnary("serve.info",
                       [self](net::CallContext&, net::Message) { return self->Info(); });
    host.RegisterUnary("serve.forward", [self](net::CallContext&, net::Message m) {
      return self->Forward(std::move(m), /*backward=*/false);
    });
    host.RegisterUnary("serve.backward", [self](net::CallContext&, net::Message m) {
      return self->Forward(std::move(m), /*backward=*/true);
    });
    host.RegisterBidiStreaming("serve.inference",
                               [self](net::CallContext& ctx) { return self->Inference(ctx); });
    host.RegisterUnary("serve.push", [self](net::CallContext&, net::Message m) {
      return self->Push(std::move(m));
    });
  }

  Status CheckServing() const {
    std::lock_guard lock(mu_);
    if (stopped_) return Unavailable("the server is shutting down; use another server");
    if (state_ != ServerState::kOnline) {
      return Unavailable("the server is not online (loading or moving blocks); retry later");
    }
    return Status();
  }

  // Checked again on the compute thread: the blocks may have moved since the request arrived.
  bool Holds(int64_t start, int64_t end) const {
    std::lock_guard lock(mu_);
    return first_ <= start && end <= last_;
  }
  Status MovedError() const {
    return Unavailable("this server moved to other blocks (rebalancing); route the request again");
  }

  Status CheckRange(int64_t start, int64_t end) const {
    if (start >= end) {
      return InvalidArgument(fmt::format("blocks [{}, {}) is an empty range", start, end));
    }
    std::lock_guard lock(mu_);
    if (start < first_ || end > last_) {
      // Unavailable, not InvalidArgument: the client may have routed on a stale record.
      return Unavailable(
          fmt::format("blocks [{}, {}) requested; this server holds [{}, {}); route again", start,
                      end, first_, last_));
    }
    return Status();
  }

  asio::awaitable<Result<net::Message>> Info() {
    wire::InfoResponse info;
    {
      std::lock_guard lock(mu_);
      info.set_model(options_.model_name);
      info.set_start(static_cast<uint32_t>(first_));
      info.set_end(static_cast<uint32_t>(last_));
      info.set_state(std::string(StateName(state_)));
      info.set_throughput(throughput_);
      info.set_inference_steps_per_second(inference_rps_);
      info.set_cache_tokens_left(static_cast<uint64_t>(CacheTokensLeftLocked()));
      info.set_cache_bytes_left(static_cast<uint64_t>(options_.cache_bytes - cache_used_));
      info.set_active_sessions(static_cast<uint32_t>(sessions_.size()));
      info.set_weight_bytes(static_cast<uint64_t>(weight_bytes_));
    }
    info.set_version(COLONY_VERSION_STRING);
    info.set_dtype(DTypeLabel(dtype_));
    info.set_quantization(options_.quantize);
    info.set_max_batch(static_cast<uint32_t>(options_.max_batch));
    info.set_max_length(static_cast<uint32_t>(max_length_));
    info.set_hidden_size(static_cast<uint32_t>(config_.hidden_size));
    co_return net::Message(info.SerializeAsString());
  }

  // Validates a hidden-state tensor [B, T, H] from a client.
  Result<at::Tensor> ReadHidden(const net::TensorFrame& frame, int64_t max_elements) const {
    COLONY_ASSIGN_OR_RETURN(
        at::Tensor h,
        runtime::FromFrame(frame, {.max_elements = static_cast<uint64_t>(max_elements),
                                   .allowed_dtypes = kFloatDTypes,
                                   .rank = 3}));
    if (h.size(2) != config_.hidden_size) {
      return InvalidArgument(
          fmt::format("hidden states have size {} in the last dimension; this "
                      "model's hidden size is {}",
                      h.size(2), config_.hidden_size));
    }
    if (h.size(0) < 1 || h.size(0) > options_.max_batch) {
      return InvalidArgument(
          fmt::format("batch of {} outside [1, {}]", h.size(0), options_.max_batch));
    }
    if (h.size(1) < 1 || h.size(1) > max_length_) {
      return InvalidArgument(
          fmt::format("{} tokens per sequence outside [1, {}]", h.size(1), max_length_));
    }
    return h;
  }

  // The input and output sizes of a block projection, by name.
  std::optional<std::pair<int64_t, int64_t>> ProjectionShape(const std::string& name) const {
    const int64_t h = config_.hidden_size, kv = config_.num_kv_heads * config_.head_dim();
    const int64_t inter = config_.intermediate_size;
    if (name == "q_proj" || name == "o_proj") return std::make_pair(h, h);
    if (name == "k_proj" || name == "v_proj") return std::make_pair(h, kv);
    if (name == "gate_proj" || name == "up_proj") return std::make_pair(h, inter);
    if (name == "down_proj") return std::make_pair(inter, h);
    return std::nullopt;
  }

  // Checks a tuning's metadata and reads its tensors, tensors[first..] (deep prompts when
  // prompt_length > 0, then the LoRA adapters of blocks [start, end)); they must be the last.
  // Prompts have `batch` or 1 rows and at most max_prompt positions.
  Result<Tuning> ReadTuning(const std::vector<net::TensorFrame>& tensors, size_t first,
                            int64_t start, int64_t end, const TuningSpec& spec, int64_t batch,
                            int64_t max_prompt) const {
    const int64_t p = spec.prompt_length, rank = spec.rank;
    const auto& targets = spec.targets;
    if (rank > 256 || (rank > 0 && (targets.empty() || targets.size() > 7)) ||
        (rank == 0 && !targets.empty()) || !std::isfinite(spec.scale)) {
      return InvalidArgument("LoRA: rank must be in [1, 256] with 1 to 7 target projections");
    }
    for (size_t i = 0; i < targets.size(); ++i) {
      if (!ProjectionShape(targets[i])) {
        return InvalidArgument(
            fmt::format("LoRA: unknown projection '{}'", targets[i].substr(0, 32)));
      }
      if (std::count(targets.begin(), targets.end(), targets[i]) > 1) {
        return InvalidArgument(fmt::format("LoRA: projection '{}' listed twice", targets[i]));
      }
    }
    const size_t lora_count = rank > 0 ? 2 * static_cast<size_t>(end - start) * targets.size() : 0;
    const size_t want = first + (p > 0 ? 1 : 0) + lora_count;
    if (tensors.size() != want) {
      return InvalidArgument(fmt::format("expected {} tensors, got {}", want, tensors.size()));
    }
    const auto max_elements = static_cast<uint64_t>(options_.max_request_elements);
    Tuning out;
    size_t next = first;
    if (p > 0) {
      COLONY_ASSIGN_OR_RETURN(out.prompts,
                              runtime::FromFrame(tensors[next++], {.max_elements = max_elements,
                                                                   .allowed_dtypes = kFloatDTypes,
                                                                   .rank = 4}));
      const auto& pr = out.prompts;
      if (pr.size(0) != end - start || (pr.size(1) != batch && pr.size(1) != 1) ||
          pr.size(2) != p || pr.size(3) != config_.hidden_size || p > max_prompt) {
        return InvalidArgument(fmt::format(
            "deep prompts must have shape [{}, {} or 1, {}, {}] with {} <= {} tokens, got [{}]",
            end - start, batch, p, config_.hidden_size, p, max_prompt,
            fmt::join(pr.sizes(), ", ")));
      }
    }
    for (size_t i = 0; i < lora_count; ++i) {
      const std::string& target = targets[(i / 2) % targets.size()];
      const auto shape = ProjectionShape(target);
      COLONY_ASSIGN_OR_RETURN(at::Tensor t,
                              runtime::FromFrame(tensors[next++], {.max_elements = max_elements,
                                                                   .allowed_dtypes = kFloatDTypes,
                                                                   .rank = 2}));
      const bool is_a = i % 2 == 0;
      const int64_t rows = is_a ? rank : shape->second, cols = is_a ? shape->first : rank;
      if (t.size(0) != rows || t.size(1) != cols) {
        return InvalidArgument(fmt::format("LoRA {} for {} must have shape [{}, {}]",
                                           is_a ? "A" : "B", target, rows, cols));
      }
      out.lora.push_back(t);
    }
    return out;
  }

  asio::awaitable<Result<net::Message>> Forward(net::Message m, bool backward) {
    COLONY_CO_RETURN_IF_ERROR(CheckServing());
    wire::BlockRequest req;
    if (!req.ParseFromString(m.meta)) co_return InvalidArgument("malformed BlockRequest");
    const int64_t start = req.start(), end = req.end();
    COLONY_CO_RETURN_IF_ERROR(CheckRange(start, end));
    const TuningSpec spec = TuningSpecOf(req);
    const size_t base = backward ? 2 : 1;
    if (m.tensors.size() < base) {
      co_return InvalidArgument(
          fmt::format("expected at least {} tensors, got {}", base, m.tensors.size()));
    }
    auto x = ReadHidden(m.tensors[0], options_.max_request_elements);
    if (!x.ok()) co_return x.status();
    at::Tensor grad_out;
    if (backward) {
      auto g = ReadHidden(m.tensors[1], options_.max_request_elements);
      if (!g.ok()) co_return g.status();
      if (!g->sizes().equals(x->sizes())) {
        co_return InvalidArgument("grad_outputs and inputs have different shapes");
      }
      grad_out = *g;
    }
    auto tuning = ReadTuning(m.tensors, base, start, end, spec, x->size(0), x->size(1));
    if (!tuning.ok()) co_return tuning.status();
    const at::ScalarType client_dtype = x->scalar_type();
    auto self = shared_from_this();
    // Named first: g++ 12 mishandles temporaries (lambdas) inside co_await expressions.
    auto work = [self, start, end, x = *x, grad_out, backward, client_dtype,
                 tuning = std::move(*tuning), spec]() -> Result<std::vector<at::Tensor>> {
      const bool finite = at::isfinite(x).all().item<bool>() &&
                          (!grad_out.defined() || at::isfinite(grad_out).all().item<bool>()) &&
                          AllFinite(tuning);
      if (!finite) return InvalidArgument("inputs contain NaN or infinity");
      if (!self->Holds(start, end)) return self->MovedError();
      at::AutoGradMode grad_mode(backward);
      at::Tensor xin = x.to(self->dtype_).detach().requires_grad_(backward);
      at::Tensor pin;
      if (tuning.prompts.defined()) {
        pin = tuning.prompts.to(self->dtype_).detach().requires_grad_(backward);
      }
      std::vector<at::Tensor> lin;
      for (const auto& t : tuning.lora) {
        lin.push_back(t.to(self->dtype_).detach().requires_grad_(backward));
      }
      const std::vector<model::BlockAdapters> adapters = MakeAdapters(lin, end - start, spec);
      at::Tensor out =
          self->RunBlocks(start, end, xin, 0, nullptr, pin, adapters.empty() ? nullptr : &adapters);
      if (!backward) return std::vector<at::Tensor>{out.to(client_dtype)};
      std::vector<at::Tensor> inputs{xin};
      if (pin.defined()) inputs.push_back(pin);
      for (const auto& t : lin) inputs.push_back(t);
      auto grads = torch::autograd::grad({out}, inputs, {grad_out.to(out.scalar_type())},
                                         /*retain_graph=*/false, /*create_graph=*/false,
                                         /*allow_unused=*/true);
      std::vector<at::Tensor> res;
      for (size_t i = 0; i < grads.size(); ++i) {
        at::Tensor g = grads[i].defined() ? grads[i] : at::zeros_like(inputs[i]);
        res.push_back(g.to(client_dtype));
      }
      return res;
    };
    auto result = co_await runtime::RunOnPool<std::vector<at::Tensor>>(
        pool_, runtime::kPriorityTraining, std::move(work));
    if (!result.ok()) co_return result.status();
    {
      std::lock_guard lock(mu_);
      ++(backward ? backwards_ : forwards_);
    }
    net::Message reply;
    for (auto& t : *result) {
      auto f = runtime::ToFrame(t);
      if (!f.ok()) co_return f.status();
      reply.tensors.push_back(std::move(*f));
    }
    co_return reply;
  }

  asio::awaitable<Result<net::Message>> Push(net::Message m) {
    wire::PushRequest req;
    if (!req.ParseFromString(m.meta)) co_return InvalidArgument("malformed PushRequest");
    std::shared_ptr<Session> s;
    {
      std::lock_guard lock(mu_);
      auto it = sessions_.find(req.session_id());
      if (it != sessions_.end()) s = it->second;
    }
    if (!s)
      co_return NotFound("no such inference session on this server (it ended or never began)");
    auto input = std::make_shared<Input>();
    input->step = req.step();
    input->step.clear_next();  // the pusher does not choose our next hop: the client does
    input->tensors = std::move(m.tensors);
    input->from_push = true;
    // Never wait for room: when the session is busy the client's own copy of the step follows.
    (void)s->channel->try_send(asio::error_code{}, input);
    co_return net::Message();
  }

  asio::awaitable<Status> ReserveCache(net::CallContext& ctx, int64_t bytes) {
    if (bytes > options_.cache_bytes) {
      co_return ResourceExhausted(fmt::format(
          "the session needs {:.1f} MiB of KV cache, more than this server's whole budget of "
          "{:.1f} MiB; use a smaller batch or max_length",
          bytes / 1048576.0, options_.cache_bytes / 1048576.0));
    }
    const auto deadline = Clock::now() + options_.alloc_timeout;
    asio::steady_timer timer(co_await asio::this_coro::executor);
    while (true) {
      int64_t used = 0;
      {
        std::lock_guard lock(mu_);
        if (stopped_) co_return Unavailable("the server is shutting down");
        if (cache_used_ + bytes <= options_.cache_bytes) {
          cache_used_ += bytes;
          co_return Status();
        }
        used = cache_used_;
      }
      if (Clock::now() >= deadline || ctx.cancelled()) {
        co_return ResourceExhausted(fmt::format(
            "no room in the KV cache within {} ms: the session needs {:.1f} MiB, {:.1f} of "
            "{:.1f} MiB are in use; retry later or use another server",
            options_.alloc_timeout.count(), bytes / 1048576.0, used / 1048576.0,
            options_.cache_bytes / 1048576.0));
      }
      timer.expires_after(std::chrono::milliseconds(20));
      co_await timer.async_wait(as_tuple(use_awaitable));
    }
  }

  static asio::awaitable<void> SendPush(std::shared_ptr<Impl> self, Multiaddr addr,
                                        net::Message message) {
    const std::string method = "serve.push";
    const net::CallOptions call{.timeout = std::chrono::seconds(5)};
    auto r = co_await self->node_.host().Call(addr, method, std::move(message), call);
    if (!r.ok()) COLONY_LOG_DEBUG("serve: push failed: {}", r.status().ToString());
  }

  static asio::awaitable<void> ReadSteps(std::shared_ptr<net::Stream> stream,
                                         std::shared_ptr<Session> s) {
    while (true) {
      auto m = co_await stream->Read();
      InputPtr input;
      if (m.ok() && *m) {
        input = std::make_shared<Input>();
        if (!input->step.ParseFromString((*m)->meta)) {
          stream->Cancel(InvalidArgument("malformed Step message"));
          input.reset();
        } else {
          input->tensors = std::move((*m)->tensors);
        }
      }
      // A null input ends the session (clean end of stream or an error).
      auto [ec] =
          co_await s->channel->async_send(asio::error_code{}, input, as_tuple(use_awaitable));
      if (ec || !input) co_return;
    }
  }

  static asio::awaitable<void> Watchdog(std::shared_ptr<net::Stream> stream,
                                        std::shared_ptr<Session> s,
                                        std::chrono::milliseconds idle) {
    while (!s->done) {
      s->idle_timer->expires_at(s->idle_deadline);
      co_await s->idle_timer->async_wait(as_tuple(use_awaitable));
      if (s->done) break;
      if (Clock::now() >= s->idle_deadline) {
        stream->Cancel(DeadlineExceeded(
            fmt::format("inference session idle for {} ms; the server closed it", idle.count())));
        break;
      }
    }
  }

  asio::awaitable<Status> Inference(net::CallContext& ctx) {
    COLONY_CO_RETURN_IF_ERROR(CheckServing());
    auto& stream = ctx.stream();
    auto first = co_await stream.Read();
    if (!first.ok()) co_return first.status();
    if (!*first) co_return Status();
    wire::OpenSession open;
    if (!open.ParseFromString((*first)->meta)) {
      co_return InvalidArgument("serve.inference: the first message must be an OpenSession");
    }
    if (open.session_id().size() != 16) {
      co_return InvalidArgument("session ids are 16 random bytes");
    }
    COLONY_CO_RETURN_IF_ERROR(CheckRange(open.start(), open.end()));
    if (open.max_length() < 1 || open.max_length() > max_length_) {
      co_return InvalidArgument(
          fmt::format("max_length {} is outside [1, {}] (this server's limit)", open.max_length(),
                      max_length_));
    }
    if (open.batch_size() < 1 || open.batch_size() > options_.max_batch) {
      co_return InvalidArgument(
          fmt::format("batch size {} is outside [1, {}]", open.batch_size(), options_.max_batch));
    }
    const TuningSpec spec = TuningSpecOf(open);
    auto tuning = ReadTuning((*first)->tensors, 0, open.start(), open.end(), spec,
                             open.batch_size(), open.max_length());
    if (!tuning.ok()) co_return tuning.status();
    if (!AllFinite(*tuning)) {
      co_return InvalidArgument("deep prompts or LoRA adapters contain NaN or infinity");
    }
    auto s = std::make_shared<Session>();
    s->id = open.session_id();
    s->start = open.start();
    s->end = open.end();
    s->max_length = open.max_length();
    s->batch = open.batch_size();
    s->next = open.next();
    s->caches.resize(static_cast<size_t>(s->end - s->start));
    // Kept in the server's dtype and counted in the session's reservation with its cache.
    int64_t tuning_bytes = 0;
    if (tuning->prompts.defined()) {
      s->prompts = tuning->prompts.to(dtype_).contiguous();
      tuning_bytes += static_cast<int64_t>(s->prompts.nbytes());
    }
    std::vector<at::Tensor> lora;
    for (const auto& t : tuning->lora) {
      lora.push_back(t.to(dtype_).contiguous());
      tuning_bytes += static_cast<int64_t>(lora.back().nbytes());
    }
    s->adapters = MakeAdapters(lora, s->end - s->start, spec);
    const auto ex = co_await asio::this_coro::executor;
    s->channel = std::make_unique<Channel>(ex, 4);
    s->idle_timer = std::make_unique<asio::steady_timer>(ex);
    {
      std::lock_guard lock(mu_);
      if (sessions_.size() >= options_.max_sessions) {
        co_return ResourceExhausted(fmt::format(
            "this server already runs {} inference sessions (its limit); use another server",
            sessions_.size()));
      }
      if (!sessions_.emplace(s->id, s).second) {
        co_return AlreadyExists("an inference session with this id is already open");
      }
    }
    struct Cleanup {
      Impl* impl;
      std::shared_ptr<Session> s;
      ~Cleanup() {
        s->done = true;
        s->idle_timer->cancel();
        s->channel->close();
        std::lock_guard lock(impl->mu_);
        impl->sessions_.erase(s->id);
        impl->cache_used_ -= s->reserved;
      }
    } cleanup{this, s};
    const int64_t bytes =
        s->batch * s->max_length * (s->end - s->start) * CacheBytesPerToken(config_, dtype_) +
        tuning_bytes;
    COLONY_CO_RETURN_IF_ERROR(co_await ReserveCache(ctx, bytes));
    s->reserved = bytes;
    COLONY_LOG_DEBUG(
        "serve: session {} opened: blocks [{}, {}), batch {}, max_length {}, "
        "{} prompt tokens, LoRA rank {}",
        Hex(s->id), s->start, s->end, s->batch, s->max_length, spec.prompt_length, spec.rank);
    wire::SessionOpened opened;
    {
      std::lock_guard lock(mu_);
      opened.set_cache_tokens_left(static_cast<uint64_t>(CacheTokensLeftLocked()));
    }
    const net::Message opened_message(opened.SerializeAsString());
    COLONY_CO_RETURN_IF_ERROR(co_await stream.Write(opened_message));

    auto stream_ptr = stream.shared_from_this();
    s->idle_deadline = Clock::now() + options_.session_idle_timeout;
    asio::co_spawn(ex, ReadSteps(stream_ptr, s), asio::detached);
    asio::co_spawn(ex, Watchdog(stream_ptr, s, options_.session_idle_timeout), asio::detached);

    while (true) {
      auto [ec, input] = co_await s->channel->async_receive(as_tuple(use_awaitable));
      if (ec || !input) break;
      // The client may re-point the push target with any message, even a duplicate step.
      if (!input->from_push && input->step.has_next()) s->next = input->step.next();
      if (input->step.step_id() <= s->last_step) {
        std::lock_guard lock(mu_);
        ++duplicates_;
        continue;
      }
      Status st = co_await Step(stream, *s, *input);
      if (!st.ok()) {
        if (input->from_push) {
          COLONY_LOG_DEBUG("serve: ignoring a bad push for session {}: {}", Hex(s->id),
                           st.ToString());
          continue;
        }
        co_return st;
      }
      s->idle_deadline = Clock::now() + options_.session_idle_timeout;
    }
    if (stream.cancelled()) co_return Cancelled("the inference stream ended");
    co_return Status();
  }

  asio::awaitable<Status> Step(net::Stream& stream, Session& s, Input& input) {
    const wire::Step& step = input.step;
    const size_t want = step.has_hypo_ids() ? 2 : 1;
    if (input.tensors.size() != want) {
      co_return InvalidArgument(
          fmt::format("a step carries {} tensors, got {}", want, input.tensors.size()));
    }
    auto x = ReadHidden(input.tensors[0], s.batch * s.max_length * config_.hidden_size);
    if (!x.ok()) co_return x.status();
    if (x->size(0) != s.batch) {
      co_return InvalidArgument(
          fmt::format("the session was opened for a batch of {}, the step "
                      "has {}",
                      s.batch, x->size(0)));
    }
    const int64_t position = step.position(), tokens = x->size(1);
    if (position < 0 || position > s.length) {
      co_return InvalidArgument(fmt::format(
          "step position {} is outside [0, {}] (the tokens cached so far)", position, s.length));
    }
    if (position + tokens > s.max_length) {
      co_return InvalidArgument(fmt::format(
          "the session's max_length {} is exceeded: {} tokens at position {}; open a session "
          "with a larger max_length",
          s.max_length, tokens, position));
    }
    at::Tensor hypo;
    if (step.has_hypo_ids()) {
      auto h = runtime::FromFrame(input.tensors[1], {.max_elements = static_cast<uint64_t>(s.batch),
                                                     .allowed_dtypes = {DType::kInt64},
                                                     .rank = 1});
      if (!h.ok()) co_return h.status();
      if (h->size(0) != s.batch || (h->numel() > 0 && (h->min().item<int64_t>() < 0 ||
                                                       h->max().item<int64_t>() >= s.batch))) {
        co_return InvalidArgument(
            fmt::format("hypo_ids must be {} indices in [0, {})", s.batch, s.batch));
      }
      hypo = *h;
    }
    const at::ScalarType client_dtype = x->scalar_type();
    auto self = shared_from_this();
    Session* sp = &s;
    auto work = [self, sp, x = *x, hypo, position, client_dtype]() -> Result<at::Tensor> {
      if (!at::isfinite(x).all().item<bool>()) {
        return InvalidArgument("inputs contain NaN or infinity");
      }
      if (!self->Holds(sp->start, sp->end)) return self->MovedError();
      at::NoGradGuard no_grad;
      for (auto& c : sp->caches) {
        c.Truncate(position);
        if (hypo.defined()) c.Reorder(hypo);
      }
      // Per-row prompts belong to their rows: they move with them.
      if (hypo.defined() && sp->prompts.defined() && sp->prompts.size(1) > 1) {
        sp->prompts = sp->prompts.index_select(1, hypo);
      }
      at::Tensor h = self->RunBlocks(sp->start, sp->end, x.to(self->dtype_), position, &sp->caches,
                                     sp->prompts, sp->adapters.empty() ? nullptr : &sp->adapters);
      return h.to(client_dtype);
    };
    auto out = co_await runtime::RunOnPool<at::Tensor>(pool_, runtime::kPriorityInference,
                                                       std::move(work));
    if (!out.ok()) co_return out.status();
    s.length = position + tokens;
    s.last_step = step.step_id();
    {
      std::lock_guard lock(mu_);
      ++steps_;
      if (input.from_push) ++pushes_used_;
    }
    auto frame = runtime::ToFrame(*out);
    if (!frame.ok()) co_return frame.status();
    if (!s.next.address().empty()) {
      auto addr = Multiaddr::Parse(s.next.address());
      if (addr.ok()) {
        wire::PushRequest push;
        push.set_session_id(s.next.session_id());
        *push.mutable_step() = step;
        push.mutable_step()->clear_next();
        net::Message pm(push.SerializeAsString());
        pm.tensors.push_back(*frame);
        if (hypo.defined()) pm.tensors.push_back(input.tensors[1]);
        // (g++ 12: no temporaries in an expression that also co_awaits.)
        const auto ex = co_await asio::this_coro::executor;
        asio::co_spawn(ex, SendPush(self, *addr, std::move(pm)), asio::detached);
      }
    }
    wire::StepResult result;
    result.set_step_id(step.step_id());
    result.set_length(s.length);
    net::Message reply(result.SerializeAsString());
    reply.tensors.push_back(std::move(*frame));
    co_return co_await stream.Write(reply);
  }

  dht::Node& node_;
  ServerOptions options_;
  model::LlamaConfig config_;
  at::ScalarType dtype_ = at::kFloat;
  int64_t max_length_ = 0;
  bool pinned_ = false;
  std::vector<model::LlamaBlock> blocks_;
  runtime::TaskPool pool_;
  std::thread announcer_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  int64_t first_ = 0, last_ = 0;
  ServerState state_ = ServerState::kJoining;
  double throughput_ = 0, inference_rps_ = 0;
  int64_t cache_used_ = 0;
  int64_t weight_bytes_ = 0;
  std::map<std::string, std::shared_ptr<Session>> sessions_;
  uint64_t steps_ = 0, pushes_used_ = 0, duplicates_ = 0, forwards_ = 0, backwards_ = 0;
};

Result<std::unique_ptr<BlockServer>> BlockServer::Start(dht::Node& node, ServerOptions options) {
  auto impl = std::make_shared<Impl>(node, std::move(options));
  COLONY_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<BlockServer>(new BlockServer(std::move(impl)));
}

BlockServer::~BlockServer() { Shutdown(); }
void BlockServer::Shutdown() { impl_->Shutdown(); }
ServerStats BlockServer::Stats() const { return impl_->Stats(); }
const model::LlamaConfig& BlockServer::config() const { return impl_->config(); }
const std::string& BlockServer::model_name() const { return impl_->model_name(); }

}  // namespace colony::serve
