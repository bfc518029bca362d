// An expert server (Learning@home): hosts experts, answers "moe.forward" and "moe.backward" for
// them (a backward trains the expert: its optimizer steps on the server), and declares them in
// the DHT every declare_interval so that clients' beam searches find them. Tensors travel in
// chunks of rows (expert_chunks.h), so a request of max_batch rows of any width gets through.
//
//   auto server = moe::ExpertServer::Start(node, {.uids = {"ffn.0.3", "ffn.1.7"},
//                                                 .expert = {.hidden = 64}});
//
// Requests are untrusted: the expert id must be hosted here, inputs float32 [batch, hidden] with
// 1 <= batch <= max_batch, finite, and a backward's gradient of the input's shape; anything else
// gets an error that says what is wrong, and the server keeps serving. The requests one client
// address holds at once are capped (request_share_per_address). Compute runs on a task
// pool; requests for an expert that come in while it computes join its next batch (up to
// max_batch rows: one forward for many requests, one optimizer step for many backward requests,
// as hivemind batches), and beyond 2 x max_batch rows waiting per expert and direction requests
// are refused at once (ResourceExhausted); one client address may have request_share_per_address
// of those rows waiting (or one request, of up to max_batch rows, when it has none waiting), so
// that a client keeping the queue full does not get every other client's calls refused.
#pragma once

#include <ATen/Tensor.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "dht/node.h"
#include "moe/expert.h"

namespace colony::moe {

struct ExpertServerOptions {
  std::vector<std::string> uids;
  // Every expert's sizes and optimizer; expert i starts from ExpertSeed(expert.seed, uid).
  ExpertOptions expert;
  int64_t max_batch = 4096;  // rows of a request, and of a batch of requests
  // Bytes of requests held at once, over all calls: those being received in chunks
  // (expert_chunks.h), waiting in a batch or computing. A call beyond it is refused
  // (ResourceExhausted).
  uint64_t max_request_bytes = 1ull << 30;
  // The part of max_request_bytes the calls from one client address may hold at once, or one
  // call of max_batch rows if that is more (net::SourceKey: loopback is exempt unless the host's
  // limit_loopback_addresses; a peer reached through a relay counts under its own identity, the
  // relay capping the circuits one address opens), so that one machine cannot take the whole
  // budget from the others. In (0, 1]; a call beyond it is refused (ResourceExhausted). The same
  // part of each expert's queue of waiting rows (2 x max_batch per direction) is the address's.
  double request_share_per_address = 0.25;
  size_t threads = 1;
  size_t max_queued = 256;  // the pool's tasks (at least two per expert)
  // hivemind: declared every 30 s, for 60 s.
  std::chrono::milliseconds declare_interval{30'000};
  double declaration_ttl_seconds = 60;
  // Where each expert's checkpoint lives (<dir>/<uid>.pt: weights, optimizer state, steps): read
  // at start when present, written every checkpoint_interval and at Shutdown. Empty: none.
  std::string checkpoint_dir = {};
  // Weights some experts start from (by id, as Expert::SetWeights takes them: a checkpoint's
  // experts), instead of their seeded ones; a checkpoint in checkpoint_dir still comes first.
  std::map<std::string, std::vector<at::Tensor>> initial_weights = {};
  std::chrono::milliseconds checkpoint_interval{60'000};
};

// The seed expert `uid` starts from on a server whose base seed is `base` (FNV-1a of the id).
uint64_t ExpertSeed(uint64_t base, const std::string& uid);

class ExpertServer {
 public:
  // Registers the handlers on the node's host and declares the experts once before returning
  // (an error when that first declaration fails), then every declare_interval.
  static Result<std::unique_ptr<ExpertServer>> Start(dht::Node& node, ExpertServerOptions options);
  ~ExpertServer();  // Shutdown()
  // Stops declaring, answers every later request with Unavailable and writes the checkpoints.
  // Idempotent.
  void Shutdown();
  // Writes every expert's checkpoint now (an error naming the experts that failed).
  Status SaveCheckpoints();
  // The experts whose checkpoint was read at start.
  size_t restored() const;

  struct Stats {
    uint64_t forwards = 0;
    uint64_t backwards = 0;
    uint64_t refused = 0;           // malformed or unknown requests, and those beyond the queues
    uint64_t forward_batches = 0;   // computations: forwards answered in batches of several
    uint64_t backward_batches = 0;  // optimizer steps
  };
  Stats stats() const;
  // A copy of an expert's current weights (NotFound for an id not hosted here).
  Result<std::vector<at::Tensor>> Parameters(const std::string& uid) const;

  struct Impl;

 private:
  explicit ExpertServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace colony::moe
