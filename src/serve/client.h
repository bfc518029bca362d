// The client side of running a model together: finding servers for blocks in the DHT, routing
// through them, and running forward/backward passes and inference sessions over chains of
// servers while they come and go.
//
//   auto node = dht::Node::Start(KeyPair::Generate(), {.initial_peers = {...}});  // client mode
//   auto manager = std::make_shared<SequenceManager>(**node, ClientOptions{
//       .model_name = "llama", .num_blocks = 32});
//   RemoteSequential remote(manager);
//   at::Tensor out = remote.forward(hidden);              // differentiable (autograd)
//   auto session = remote.OpenSession({.max_length = 128, .batch_size = 1});
//   Result<at::Tensor> h = session->Step(hidden_of_new_tokens);
//
// Failure handling: a server that fails a request is banned for a while (exponential backoff)
// and the affected blocks are routed to other servers. An inference session keeps every input
// it sent to each server; when a server dies mid-session, the client opens sessions on
// replacements, replays that history to rebuild their KV caches, and continues the step, so the
// generated output does not change.
#pragma once

#include <ATen/Tensor.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "dht/node.h"
#include "serve/records.h"

namespace colony::net {
class Stream;
}

namespace colony::serve {

struct ClientOptions {
  std::string model_name;
  int64_t num_blocks = 0;                             // blocks in the whole model
  std::chrono::milliseconds request_timeout{60'000};  // one forward or backward call
  std::chrono::milliseconds step_timeout{30'000};     // one inference step on one server
  std::chrono::milliseconds session_lifetime{3'600'000};
  // Records older than this are re-read from the DHT before routing.
  std::chrono::milliseconds refresh_period{10'000};
  // Attempts per request before giving up (each failure bans a server or waits for one).
  int max_attempts = 8;
  std::chrono::milliseconds retry_backoff{300};
  std::chrono::milliseconds ban_base{2'000};
  std::chrono::milliseconds ban_max{120'000};
  // Ask each server to push its step output straight to the next server (saves half a round
  // trip per hop); the client still sends every step itself, so a lost push costs nothing.
  bool use_push = true;
};

enum class RoutingMode {
  kMinLatency,     // inference: least (RTT + compute) along the chain
  kMaxThroughput,  // training: least compute time, by announced throughput
};

struct RouteSpan {
  ServerRecord server;
  int64_t start = 0, end = 0;
};

// Knows the swarm's servers for one model (from the DHT), their RTTs and bans. Thread-safe;
// shared by the remote sequences and sessions of a client.
class SequenceManager {
 public:
  SequenceManager(dht::Node& node, ClientOptions options);

  // Re-reads every block's records from the DHT.
  Status Refresh();
  // Servers for blocks [start, end), refreshing first when the records are stale. Unavailable
  // (naming the uncovered blocks) when no unbanned online server covers them.
  Result<std::vector<RouteSpan>> MakeRoute(int64_t start, int64_t end, RoutingMode mode);
  // Bans the server for a while (doubling with consecutive failures).
  void Ban(const PeerId& peer, const Status& why);
  void ReportSuccess(const PeerId& peer);
  bool IsBanned(const PeerId& peer) const;
  // Known online servers (from the last refresh).
  std::vector<ServerRecord> Servers() const;

  net::Host& host() { return node_.host(); }
  dht::Node& node() { return node_; }
  const ClientOptions& options() const { return options_; }

 private:
  double RttSeconds(const ServerRecord& server);

  dht::Node& node_;
  ClientOptions options_;
  mutable std::mutex mu_;
  std::vector<ServerRecord> servers_;
  std::chrono::steady_clock::time_point refreshed_{};
  bool ever_refreshed_ = false;
  struct BanState {
    std::chrono::steady_clock::time_point until{};
    int failures = 0;
  };
  std::map<PeerId, BanState> bans_;
  std::map<PeerId, double> rtt_;
};

// LoRA adapters trained by a client on frozen remote blocks: for each block and each target
// projection (in `targets` order), A [rank, in] and B [out, rank], flattened in that order.
struct LoraSpec {
  int64_t rank = 0;                  // 0: no adapters
  std::vector<std::string> targets;  // "q_proj", "v_proj", ...
  double scale = 1.0;
};

struct SessionOptions {
  int64_t max_length = 128;
  int64_t batch_size = 1;
  // A tuned model (e.g. PromptTuned's deep prompts or LoraTuned's adapters), applied by the
  // servers on every step. Deep prompts [end-start, batch_size or 1, P, H] are added before each
  // block to the hidden states of positions < P (per-row prompts follow hypo_ids); adapters are
  // flat as in LoraSpec, for blocks [start, end). Each server gets its blocks' slice.
  at::Tensor prompts{};
  LoraSpec lora{};
  std::vector<at::Tensor> adapters{};
};

struct SessionStats {
  int64_t failovers = 0;        // servers replaced mid-session
  int64_t replayed_tokens = 0;  // tokens re-sent to replacements
  std::vector<RouteSpan> route;
};

// An inference session over a chain of servers covering blocks [start, end) (Petals'
// InferenceSession). Not thread-safe: one user thread drives it.
class InferenceSession {
 public:
  InferenceSession(std::shared_ptr<SequenceManager> manager, int64_t start, int64_t end,
                   SessionOptions options);
  ~InferenceSession();  // Close()
  InferenceSession(const InferenceSession&) = delete;
  InferenceSession& operator=(const InferenceSession&) = delete;

  // Runs hidden states [B, T, H] for positions position..position+T-1 through the chain and
  // returns the last block's output [B, T, H]. position -1 continues where the last step ended;
  // a smaller position rolls the session back (speculative decoding). hypo_ids [B] (int64)
  // reorders the cached rows first (beam search).
  Result<at::Tensor> Step(const at::Tensor& hidden, const at::Tensor& hypo_ids = {},
                          int64_t position = -1);
  int64_t position() const { return position_; }
  const SessionStats& stats() const { return stats_; }
  // Ends the server sessions (frees their caches). Idempotent.
  void Close();

  struct Link;

 private:
  Status CheckTuning() const;
  Status OpenChain(int64_t start, int64_t end, std::vector<Link>& out);
  Status OpenLink(Link& link, const Link* next);
  Status Recover(size_t k, const Status& why);
  Status SendStep(Link& link, uint64_t step_id, int64_t position, const at::Tensor& x,
                  const at::Tensor& hypo_ids, const Link* next);
  Result<at::Tensor> ReadResult(Link& link, uint64_t step_id, at::IntArrayRef shape);

  std::shared_ptr<SequenceManager> manager_;
  int64_t start_, end_;
  SessionOptions options_;
  std::vector<Link> chain_;
  int64_t position_ = 0;
  uint64_t step_id_ = 0;
  SessionStats stats_;
  bool closed_ = false;
};

// Blocks [start, end) of a model served by the swarm, as one differentiable module.
class RemoteSequential {
 public:
  explicit RemoteSequential(std::shared_ptr<SequenceManager> manager, int64_t start = 0,
                            int64_t end = -1);

  // hidden [B, T, H] through the blocks. Deep prompts [end-start, B, P, H] (optional) are added
  // to the first P positions before each block. Differentiable w.r.t. hidden and prompts: the
  // backward pass asks the servers for gradients. Throws std::runtime_error when the swarm
  // cannot serve the request after every retry (as LibTorch modules throw).
  // LoRA adapters (flat, see LoraSpec) are applied by the servers and differentiable too.
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& prompts = {},
                     const LoraSpec& lora = {}, const std::vector<at::Tensor>& adapters = {});
  // The same without autograd, reporting failures as a Status.
  Result<at::Tensor> Forward(const at::Tensor& hidden, const at::Tensor& prompts = {},
                             const LoraSpec& lora = {},
                             const std::vector<at::Tensor>& adapters = {});

  std::unique_ptr<InferenceSession> OpenSession(SessionOptions options);

  int64_t start() const { return start_; }
  int64_t end() const { return end_; }
  SequenceManager& manager() { return *manager_; }

 private:
  std::shared_ptr<SequenceManager> manager_;
  int64_t start_, end_;
};

// The input a span of blocks received during a forward pass (kept for the backward pass).
struct SpanInput {
  int64_t start = 0, end = 0;
  at::Tensor input;
};

// Remote forward/backward of blocks [start, end) with retries and re-routing (used by
// RemoteSequential's autograd function). `inputs`, when given, receives each span's input.
Result<at::Tensor> RemoteForward(SequenceManager& manager, int64_t start, int64_t end,
                                 const at::Tensor& hidden, const at::Tensor& prompts,
                                 std::vector<SpanInput>* inputs, const LoraSpec& lora = {},
                                 const std::vector<at::Tensor>& adapters = {});
struct RemoteGradients {
  at::Tensor hidden;
  at::Tensor prompts;                // when prompts were given
  std::vector<at::Tensor> adapters;  // when adapters were given (flat, as given)
};
// Gradients w.r.t. hidden (and prompts and adapters, when given) of blocks [start, end).
Result<RemoteGradients> RemoteBackward(SequenceManager& manager, int64_t start, int64_t end,
                                       const at::Tensor& hidden, const at::Tensor& grad_output,
                                       const at::Tensor& prompts, const LoraSpec& lora = {},
                                       const std::vector<at::Tensor>& adapters = {});

}  // namespace colony::serve
