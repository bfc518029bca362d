// BlockServer: hosts a range of a Llama-family model's transformer blocks for the swarm (Petals'
// server). It loads only its blocks' tensors from a Hugging Face checkpoint, measures its
// throughput, announces itself per block in the DHT, and serves:
//   serve.info       what it hosts and how loaded it is
//   serve.forward    hidden states through blocks [start, end) (training, prompt tuning)
//   serve.backward   gradients w.r.t. the inputs (and deep prompts), recomputing the forward
//   serve.inference  a bidirectional stream: one session with a server-side KV cache per stream
//   serve.push       a previous server's output for a session step (saves a client round trip)
//
//   auto node = dht::Node::Start(KeyPair::Generate(), {...});
//   auto server = BlockServer::Start(**node, {.model_dir = "llama", .first_block = 0,
//                                             .last_block = 4});
//
// Limits (every byte from the network is untrusted): batch, length and element caps per request,
// a KV-cache memory budget reserved per session up front (waiting up to alloc_timeout for room),
// caps on sessions and cache per server and per client address, an idle timeout per session, and a
// bounded compute queue in which inference steps run before training requests.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "dht/node.h"
#include "model/checkpoint.h"
#include "runtime/task_pool.h"
#include "serve/records.h"

namespace colony::serve {

// A serve.forward or serve.backward that a training server runs (BlockTraining::Run).
struct TrainingCall {
  int64_t epoch = -1;   // the trainer's tag (-1: untagged)
  int64_t samples = 0;  // sequences
  bool backward = false;
  int64_t start = 0, end = 0;  // the blocks it runs through
  // A backward's microbatch id (0: none) and whether the trainer knows that a server of these
  // blocks took its gradient (a replay: its parameter gradients are dropped).
  uint64_t microbatch = 0;
  bool replay = false;
  uint32_t attempt = 0;  // which try of the microbatch's backward this is (from 1)
};

// What a server that trains its blocks (a SWARM stage, swarm/stage_training.h) does around each
// serve.forward and serve.backward, and answers to serve.fence.
class BlockTraining {
 public:
  virtual ~BlockTraining() = default;
  // Runs `compute` (on the server's compute thread, one call at a time): a forward, or a
  // backward that leaves the blocks' parameter gradients in their .grad, which Run then takes
  // (or drops: a replay, or a microbatch taken or fenced before). It may first bring the
  // parameters to the call's epoch (a step of the stage). An error refuses the request, and
  // gradients are then discarded.
  virtual Status Run(const TrainingCall& call, const std::function<Status()>& compute) = 0;
  // serve.fence (on a network thread: must not wait for a compute): whether the gradient of
  // `microbatch` over [start, end) was taken; if not, tries up to `attempt` never will be.
  virtual bool Fence(uint64_t microbatch, int64_t start, int64_t end, uint32_t attempt) = 0;
};

struct ServerOptions {
  std::filesystem::path model_dir;
  // DHT prefix shared by the model's servers and clients (default: the directory's name).
  std::string model_name;
  // Blocks [first_block, last_block) when pinned; otherwise num_blocks blocks where the swarm
  // is weakest.
  int64_t first_block = -1;
  int64_t last_block = -1;
  int64_t num_blocks = 0;
  std::string dtype = "float32";  // float32 or bfloat16 (weights and compute)
  // Where the blocks compute and keep their caches: cpu, cuda, cuda:N or auto (model/device.h).
  std::string device = "cpu";
  // "int8": projections stored as int8 codes with per-row scales (4x less memory than float32);
  // "nf4": as 4-bit NormalFloat with a scale per 64 weights (7x less); both dequantized per
  // product (model::Quantize). "none": as loaded.
  std::string quantize = "none";
  int64_t max_batch = 64;
  int64_t max_length = 0;  // tokens per session (0: the model's max_seq_len)
  int64_t cache_bytes = int64_t{512} << 20;
  std::chrono::milliseconds alloc_timeout{5'000};
  std::chrono::milliseconds session_idle_timeout{60'000};
  size_t max_sessions = 128;
  // Per client address (the IP a session's stream comes from; a client reached through a relay
  // counts under its peer id, the relay capping circuits per address): the sessions and the share
  // of cache_bytes that one address may hold, so that one machine cannot take every session or
  // the whole cache. Loopback clients are exempt unless limit_loopback_addresses (a swarm on one
  // machine shares 127.0.0.1).
  size_t max_sessions_per_address = 32;
  double cache_share_per_address = 0.25;
  bool limit_loopback_addresses = false;
  // Elements (batch x tokens x hidden) per forward/backward request.
  int64_t max_request_elements = int64_t{1} << 24;
  // Forward and backward tasks waiting for the compute thread (beyond: refused at once). The
  // sessions' steps have max_sessions slots of their own.
  size_t max_queued_tasks = 256;
  // Bytes of forward and backward requests (their decoded tensors) held while they wait and run
  // (beyond: refused at once, ResourceExhausted). Of this and of max_queued_tasks, one client
  // address (counted as for sessions) may hold request_share_per_address, or one request of any
  // size while it holds nothing else, so that one machine cannot fill the queue or the memory.
  uint64_t max_request_bytes = uint64_t{1} << 30;
  double request_share_per_address = 0.25;
  int torch_threads = 0;  // 0: LibTorch's default
  std::chrono::milliseconds announce_period{5'000};
  double record_ttl_seconds = 20;
  // Throughput to announce instead of measuring it (tests that need a fixed routing).
  double throughput_override = 0;
  // Rebalance (move to weaker blocks) when not pinned; checked every announce_period x 6.
  bool rebalance = true;
  double balance_quality = 0.75;
  // How long the server waits for the servers it pings (all at once, each dialled if it is not
  // connected yet): placement's (one that has not answered counts for nothing) and the next
  // servers' whose round-trip times it announces. A server across the world needs about four
  // round trips (TCP, the handshake, the ping): at 1 s, servers more than ~250 ms away would
  // never count. Placement and rebalancing checks run on the announcing thread: a check of
  // records that never answer delays the next announcement (and a shutdown) by up to this.
  std::chrono::milliseconds ping_timeout{5'000};
  // Trains the blocks (SWARM, swarm/stage.h): called once with the loaded blocks' parameters;
  // serve.backward then also computes their gradients, every forward and backward goes through
  // the returned BlockTraining, and inference sessions, deep prompts and adapters are refused
  // (the weights change). Needs pinned blocks, float32, no quantization and the CPU.
  std::function<Result<std::shared_ptr<BlockTraining>>(std::vector<at::Tensor> params)>
      make_training = {};
};

struct ServerStats {
  int64_t first = 0, last = 0;
  ServerState state = ServerState::kJoining;
  double throughput = 0;
  double inference_rps = 0;
  int64_t weight_bytes = 0;
  int64_t cache_bytes_total = 0;
  int64_t cache_bytes_used = 0;
  size_t sessions = 0;
  uint64_t steps = 0;
  uint64_t pushes_used = 0;  // steps whose input came by push
  uint64_t duplicates = 0;   // step messages dropped as already processed
  uint64_t forwards = 0, backwards = 0;
  // Forward and backward requests held now (waiting or running) and their bytes; those refused
  // for max_queued_tasks, max_request_bytes or an address's share of them.
  uint64_t requests_held = 0, request_bytes_held = 0, requests_refused = 0;
};

class BlockServer {
 public:
  // Loads the blocks, measures throughput, registers the RPCs on the node's host and announces
  // the blocks. The node must outlive the server.
  static Result<std::unique_ptr<BlockServer>> Start(dht::Node& node, ServerOptions options);
  ~BlockServer();  // Shutdown()
  BlockServer(const BlockServer&) = delete;
  BlockServer& operator=(const BlockServer&) = delete;

  // Announces OFFLINE, ends sessions, stops the compute pool. Idempotent.
  void Shutdown();

  ServerStats Stats() const;
  const model::LlamaConfig& config() const;
  const std::string& model_name() const;

  class Impl;

 private:
  explicit BlockServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

// Bytes of KV cache one token takes in one block at this dtype.
int64_t CacheBytesPerToken(const model::LlamaConfig& config, at::ScalarType dtype);

// The block range a new server of `num_blocks` blocks should take, given the throughput per
// block: the window whose weakest block has the least (ties: least total, then lowest index).
int64_t ChooseBestStart(const std::vector<double>& coverage, int64_t num_blocks);
// The same over records' claims as announced (not offline).
int64_t ChooseBestStart(const std::vector<ServerRecord>& records, int64_t total_blocks,
                        int64_t num_blocks);

// A claim counts at most this many times the median claim for placement (as for routing).
inline constexpr double kPlacementClaimCap = 4;
// The lower median of `values` (the middle one, or the smaller of the two middle ones; 0 when
// empty): what claims of throughput are capped against, so that half the claimants lying high
// do not raise the cap.
double LowerMedian(std::vector<double> values);
// Records a placement pings (at random among more).
inline constexpr size_t kMaxPlacementPings = 64;
// Which of `records` answer a ping at the address they name (dialled as the record's owner, so
// that another peer cannot answer for it), all pinged at once for `deadline`; a record without a
// usable address does not answer.
std::vector<bool> AnsweringRecords(net::Host& host, const std::vector<ServerRecord>& records,
                                   std::chrono::milliseconds deadline);
// What placement counts of records that answered a ping (offline ones left out), per block:
// each record's throughput at most kPlacementClaimCap x the median of the claims (with
// `own_claim`, this server's, when positive), and for the records of one address
// (`address_keys[i]`, e.g. net::SourceKey of the address that answered; "" counts alone) only
// the largest, so that identities from one machine count as one server.
std::vector<double> CountedCoverage(const std::vector<ServerRecord>& records,
                                    const std::vector<std::string>& address_keys,
                                    int64_t total_blocks, double own_claim = 0);

}  // namespace colony::serve
