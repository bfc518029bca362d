// Internals shared by the block server's files. Not part of the public API.
//
//   server.cpp            start, stop, stats, RPC registration, serve.info
//   server_blocks.cpp     loading (and quantizing) the blocks, running them, measuring throughput
//   server_placement.cpp  announcing in the DHT, choosing blocks, rebalancing
//   server_forward.cpp    serve.forward and serve.backward, with prompts and LoRA adapters, and
//                         the passes of a server that trains its blocks
//   server_sessions.cpp   serve.inference sessions with the KV-cache budget, serve.push
//
// Requests are decoded and checked by serve/wire.h first; the checks here are the ones that
// depend on this server (its blocks, limits and model).
#pragma once

#include <ATen/ATen.h>

#include <asio/awaitable.hpp>
#include <asio/experimental/concurrent_channel.hpp>
#include <asio/steady_timer.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "model/device.h"
#include "model/llama.h"
#include "net/host.h"
#include "net/source_budget.h"
#include "runtime/task_pool.h"
#include "serve/server.h"
#include "serve/wire.h"

namespace colony::serve {

using Clock = std::chrono::steady_clock;

// One step of an inference session, from the client or pushed by the previous server.
struct Input {
  StepRequest step;
  std::vector<net::TensorFrame> tensors;
  bool from_push = false;
};
using InputPtr = std::shared_ptr<Input>;
using Channel = asio::experimental::concurrent_channel<void(asio::error_code, InputPtr)>;

struct Session {
  std::string id;
  int64_t start = 0, end = 0, max_length = 0, batch = 0;
  int64_t reserved = 0;
  // The most tensor bytes one step can use (a whole session's hidden states in float32 and its
  // hypo ids): a larger step is refused before it is queued, so that what a session's queue
  // holds is bounded by the session's own size, not by the transport's message limit.
  uint64_t max_step_bytes = 0;
  std::vector<model::KVCache> caches;
  int64_t length = 0;
  uint64_t last_step = 0;
  // The highest step id the client itself sent: a push may run at most the step after it (the
  // client's ids go up by 2), so that a push cannot claim a step id ahead of the client's and
  // get the client's own steps dropped as duplicates.
  uint64_t client_step = 0;
  // Set (on the compute thread) while a step changes the caches and prompts: a step that fails
  // with it set leaves them changed, so the session ends even when the step came by push.
  bool dirty = false;
  // Whether a push to `next` is in flight: at most one is, a later step's push is dropped then
  // (the client's own copy of the step follows anyway).
  std::shared_ptr<std::atomic<bool>> pushing = std::make_shared<std::atomic<bool>>(false);
  PushTarget next;        // set by the client (open or any step); empty: no push
  std::string client_ip;  // where the client's session stream comes from (push targets' rule)
  // What the per-address caps count the session under ("": exempt).
  std::string source;
  // The server whose pushes the session accepts (named by the client; guarded by the server's
  // mu_, since pushes arrive on other connections).
  std::optional<PeerId> upstream;
  // Tuning for every step (at open): deep prompts [blocks, batch or 1, P, H] in the server's
  // dtype (per-row ones follow hypo_ids) and LoRA adapters per block.
  at::Tensor prompts;
  std::vector<model::BlockAdapters> adapters;
  std::unique_ptr<Channel> channel;
  std::unique_ptr<asio::steady_timer> idle_timer;
  Clock::time_point idle_deadline;
  bool done = false;
};

// Deep prompts and LoRA adapters read from a request's tensors (as sent).
struct Tuning {
  at::Tensor prompts;            // [blocks, B or 1, P, H]
  std::vector<at::Tensor> lora;  // flat: block, target, (A, B)
};
bool AllFinite(const Tuning& t);
// The adapters of `blocks` blocks as model::BlockAdapters, from flat tensors (block, target,
// (A, B)).
std::vector<model::BlockAdapters> MakeAdapters(const std::vector<at::Tensor>& flat, int64_t blocks,
                                               const TuningSpec& spec);

Result<at::ScalarType> ParseDType(const std::string& name);
std::string DTypeLabel(at::ScalarType t);
// The dtypes a client may send hidden states, prompts and adapters in.
extern const std::vector<DType> kFloatDTypes;
// The first bytes of a session id, for logs.
std::string Hex(std::string_view bytes);

class BlockServer::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(dht::Node& node, ServerOptions options);

  // ---- server.cpp
  Status Init();
  void Shutdown();
  ServerStats Stats() const;
  const model::LlamaConfig& config() const { return config_; }
  const std::string& model_name() const { return options_.model_name; }
  void SetState(ServerState state);
  void RegisterHandlers();
  Status CheckServing() const;
  // Checked again on the compute thread: the blocks may have moved since the request arrived.
  bool Holds(int64_t start, int64_t end) const;
  Status MovedError() const;
  Status CheckRange(int64_t start, int64_t end) const;
  asio::awaitable<Result<net::Message>> Info();

  // ---- server_blocks.cpp (compute runs only on the pool's single thread)
  Status LoadBlocks(int64_t first, int64_t last);
  // Hidden states of positions offset.. through blocks [start, end) (absolute indices within
  // ours). Deep prompts [end-start, B or 1, P, H] are added to the positions < P before each
  // block.
  at::Tensor RunBlocks(int64_t start, int64_t end, at::Tensor h, int64_t offset,
                       std::vector<model::KVCache>* caches, const at::Tensor& prompts,
                       const std::vector<model::BlockAdapters>* adapters = nullptr);
  void MeasureThroughput();

  // ---- server_placement.cpp
  std::vector<ServerRecord> FetchRecords();
  // The throughput per block that placement counts (CountedCoverage): other servers' records
  // whose servers answered a ping (at most kMaxPlacementPings, 1 s), with this server's claim
  // `own_claim` (0: not measured yet) in the median.
  std::vector<double> PlacementCoverage(double own_claim);
  void Announce();
  void AnnounceLoop();
  // Pings (short deadline) the online servers whose span starts where ours ends, for the
  // next_pings of our records (what health monitors show of the route through us).
  void MeasureNextPings();
  // Moves to weaker blocks when the swarm's weakest block would gain clearly (Petals'
  // balance-quality rule), and only while no session holds a cache here.
  void MaybeRebalance();
  int64_t CacheTokensLeftLocked() const;  // mu_ held

  // ---- server_forward.cpp
  // Validates a hidden-state tensor [B, T, H] from a client.
  Result<at::Tensor> ReadHidden(const net::TensorFrame& frame, int64_t max_elements) const;
  // Reads a tuning's tensors, tensors[first..] (deep prompts when prompt_length > 0, then the
  // LoRA adapters of blocks [start, end)); they must be the last. Prompts have `batch` or 1 rows
  // and at most max_prompt positions.
  Result<Tuning> ReadTuning(const std::vector<net::TensorFrame>& tensors, size_t first,
                            int64_t start, int64_t end, const TuningSpec& spec, int64_t batch,
                            int64_t max_prompt) const;
  // `source`: the caller's net::SourceKey, for its share of the request budgets.
  asio::awaitable<Result<net::Message>> Forward(std::string source, net::Message m, bool backward);
  Result<std::vector<at::Tensor>> TrainingPass(int64_t start, int64_t end, const at::Tensor& x,
                                               const at::Tensor& grad_out);

  // ---- server_sessions.cpp
  asio::awaitable<Result<net::Message>> Push(const PeerId& from, net::Message m);
  // serve.fence: a training server's answer whether it took a microbatch (swarm).
  asio::awaitable<Result<net::Message>> Fence(net::Message m);
  // A push target a client at `client_ip` may name: a /p2p/ address this server may dial for it
  // (net/dial_targets.h: no loopback or private address for a client on the Internet).
  static Status CheckPushTarget(const PushTarget& target, const std::string& client_ip);
  // Whether a step message fits the session: its tensors within Session::max_step_bytes, at
  // most two of them, and metadata within kMaxStepMetaBytes (the frames keep the whole received
  // message alive while the step waits in the session's queue).
  static Status CheckStepSize(const Session& s, const net::Message& m);
  // Reserves `bytes` of the cache budget for a session from `source` (waiting up to
  // alloc_timeout for room, within the server's and the address's share).
  asio::awaitable<Status> ReserveCache(net::CallContext& ctx, const std::string& source,
                                       int64_t bytes);
  // Sends a step's output to the next server; clears `pushing` when done.
  static asio::awaitable<void> SendPush(std::shared_ptr<Impl> self, Multiaddr addr,
                                        net::Message message,
                                        std::shared_ptr<std::atomic<bool>> pushing);
  static asio::awaitable<void> ReadSteps(std::shared_ptr<net::Stream> stream,
                                         std::shared_ptr<Session> s);
  static asio::awaitable<void> Watchdog(std::shared_ptr<net::Stream> stream,
                                        std::shared_ptr<Session> s, std::chrono::milliseconds idle);
  asio::awaitable<Status> Inference(net::CallContext& ctx);
  asio::awaitable<Status> Step(net::Stream& stream, Session& s, Input& input);

  dht::Node& node_;
  ServerOptions options_;
  model::LlamaConfig config_;
  at::ScalarType dtype_ = at::kFloat;
  model::WeightQuantization quantization_ = model::WeightQuantization::kNone;
  c10::Device device_ = c10::kCPU;  // the blocks, caches and adapters; the network sees host copies
  int64_t max_length_ = 0;
  bool pinned_ = false;
  std::vector<model::LlamaBlock> blocks_;
  std::shared_ptr<BlockTraining> training_;  // set when the server trains its blocks
  runtime::TaskPool pool_;
  // Forward and backward requests waiting or running, and their decoded tensors' bytes.
  net::SourceBudget queued_requests_;
  net::SourceBudget held_request_bytes_;
  std::thread announcer_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  int64_t first_ = 0, last_ = 0;
  ServerState state_ = ServerState::kJoining;
  std::vector<std::pair<PeerId, double>> next_pings_;  // guarded by mu_
  double throughput_ = 0, inference_rps_ = 0;
  int64_t cache_used_ = 0;
  int64_t weight_bytes_ = 0;
  std::map<std::string, std::shared_ptr<Session>> sessions_;
  struct SourceUse {
    size_t sessions = 0;
    int64_t cache_bytes = 0;
  };
  std::map<std::string, SourceUse> sources_;  // by net::SourceKey; guarded by mu_
  uint64_t steps_ = 0, pushes_used_ = 0, duplicates_ = 0, forwards_ = 0, backwards_ = 0;
};

}  // namespace colony::serve
