// InferenceSession: generation over a chain of servers covering a range of blocks, each holding
// the session's KV cache for its blocks (Petals' InferenceSession). Every step's input is kept
// per server; when a server dies mid-session the client opens sessions on replacements, replays
// that history to rebuild their caches, and continues the step, so the output does not change.
//
//   RemoteSequential remote(manager);
//   auto session = remote.OpenSession({.max_length = 128, .batch_size = 1});
//   Result<at::Tensor> h = session->Step(hidden_of_new_tokens);
#pragma once

#include <ATen/Tensor.h>

#include <memory>
#include <optional>
#include <vector>

#include "core/status.h"
#include "serve/remote_forward.h"
#include "serve/routing.h"

namespace colony::net {
class Stream;
}

namespace colony::serve {

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
  int64_t received_bytes = 0;   // hidden states the servers returned (replays included)
  std::vector<RouteSpan> route;
};

// Which positions' hidden states a step returns.
enum class StepOutputs {
  kAll,   // [B, T, H]
  kLast,  // [B, 1, H]: the chain's last server sends only this (what sampling needs)
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
  // returns the last block's output [B, T, H] (kLast: [B, 1, H], the last position's, which
  // is all the last server sends back). position -1 continues where the last step ended; a
  // smaller position rolls the session back (speculative decoding). hypo_ids [B] (int64)
  // reorders the cached rows first (beam search).
  Result<at::Tensor> Step(const at::Tensor& hidden, const at::Tensor& hypo_ids = {},
                          int64_t position = -1, StepOutputs outputs = StepOutputs::kAll);
  int64_t position() const { return position_; }
  const SessionStats& stats() const { return stats_; }
  // Ends the server sessions (frees their caches). Idempotent.
  void Close();

  struct Link;

 private:
  Status CheckTuning() const;
  Status OpenChain(int64_t start, int64_t end, std::vector<Link>& out);
  // `next` and `prev`: the links after and before it in the chain (null: none); with push,
  // `link`'s server pushes to `next`'s session and accepts pushes from `prev`'s server.
  Status OpenLink(Link& link, const Link* next, const Link* prev);
  Status Recover(size_t k, const Status& why);
  // last_at: the block at which the chain ends when only the last position is wanted (the
  // server whose blocks end there replies with it alone).
  Status SendStep(Link& link, uint64_t step_id, int64_t position, const at::Tensor& x,
                  const at::Tensor& hypo_ids, const Link* next, const Link* prev,
                  std::optional<uint32_t> last_at = std::nullopt);
  // The result of `shape`; with last_only [B, 1, H] (a server that sent every position, from
  // before replies were trimmed, has its reply cut to the last).
  Result<at::Tensor> ReadResult(Link& link, uint64_t step_id, at::IntArrayRef shape,
                                bool last_only = false);

  std::shared_ptr<SequenceManager> manager_;
  int64_t start_, end_;
  SessionOptions options_;
  std::vector<Link> chain_;
  int64_t position_ = 0;
  uint64_t step_id_ = 0;
  SessionStats stats_;
  bool closed_ = false;
};

}  // namespace colony::serve
