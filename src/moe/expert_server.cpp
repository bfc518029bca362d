#include "moe/expert_server.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>

#include "core/log.h"
#include "core/periodic.h"
#include "model/finite.h"
#include "moe/discovery.h"
#include "moe/expert_chunks.h"
#include "moe/expert_uid.h"
#include "net/source_address.h"
#include "net/source_budget.h"
#include "runtime/batcher.h"
#include "runtime/task_pool.h"
#include "runtime/tensor_io.h"

namespace colony::moe {

uint64_t ExpertSeed(uint64_t base, const std::string& uid) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : uid) h = (h ^ c) * 1099511628211ull;
  return base ^ h;
}

using ForwardBatcher = runtime::Batcher<at::Tensor, at::Tensor>;
using BackwardBatcher = runtime::Batcher<std::pair<at::Tensor, at::Tensor>, at::Tensor>;

// The rows of `whole` cut back into the requests' outputs, `rows[i]` each.
std::vector<Result<at::Tensor>> Split(Result<at::Tensor> whole, const std::vector<int64_t>& rows) {
  std::vector<Result<at::Tensor>> out;
  if (!whole.ok()) {
    out.assign(rows.size(), whole.status());
    return out;
  }
  int64_t start = 0;
  for (int64_t n : rows) {
    out.emplace_back(whole->narrow(0, start, n).contiguous());
    start += n;
  }
  return out;
}

struct HostedExpert {
  std::mutex mu;
  std::unique_ptr<Expert> expert;
  // Requests that come in while the expert computes join its next batch: one forward for many
  // requests, one optimizer step for many backward requests (hivemind's batching).
  std::shared_ptr<ForwardBatcher> forward;
  std::shared_ptr<BackwardBatcher> backward;

  // Up to 2 x max_batch rows wait per direction; one client address may have
  // `share_per_address` of them waiting, or one request of any size when it has none waiting:
  // at most max_batch rows, so a client that keeps the queue full leaves room for others' calls.
  void MakeBatchers(runtime::TaskPool& pool, int64_t max_batch, double share_per_address) {
    const size_t pending = 2 * static_cast<size_t>(max_batch);
    const runtime::BatcherOptions bo = {
        .priority = runtime::kPriorityTraining,
        .max_rows = static_cast<size_t>(max_batch),
        .max_pending_rows = pending,
        .max_pending_rows_per_source = std::max<size_t>(
            1, static_cast<size_t>(share_per_address * static_cast<double>(pending)))};
    forward = std::make_shared<ForwardBatcher>(
        pool, bo, [](const at::Tensor& x) { return static_cast<size_t>(x.size(0)); },
        [this](std::vector<at::Tensor>& xs) {
          std::vector<int64_t> rows;
          for (const auto& x : xs) rows.push_back(x.size(0));
          const at::Tensor x = xs.size() == 1 ? xs[0] : at::cat(xs, 0);
          std::lock_guard lock(mu);
          return Split(expert->Forward(x), rows);
        });
    backward = std::make_shared<BackwardBatcher>(
        pool, bo,
        [](const std::pair<at::Tensor, at::Tensor>& in) {
          return static_cast<size_t>(in.first.size(0));
        },
        [this](std::vector<std::pair<at::Tensor, at::Tensor>>& ins) {
          std::lock_guard lock(mu);
          std::vector<Result<at::Tensor>> out;
          for (auto& gx : BackwardBatch(*expert, ins)) out.emplace_back(std::move(gx));
          return out;
        });
  }
};

struct ExpertServer::Impl {
  dht::Node& node;
  ExpertServerOptions options;
  std::map<std::string, std::unique_ptr<HostedExpert>> experts;
  runtime::TaskPool pool;
  mutable std::mutex mu;
  bool stopped = false;
  Stats stats;
  size_t restored = 0;
  std::unique_ptr<Periodic> declarer;
  std::unique_ptr<Periodic> checkpointer;
  // The requests' bytes held while calls are read and run. What one source may hold:
  // request_share_per_address of the limit, or one call of max_batch rows (input and gradient)
  // if that is more.
  net::SourceBudget held_requests;

  Impl(dht::Node& n, ExpertServerOptions o)
      : node(n),
        options(std::move(o)),
        // Each expert's two batchers queue at most one task each.
        pool({.threads = options.threads,
              .max_queued = std::max(options.max_queued, 2 * options.uids.size())}),
        held_requests({.limit = options.max_request_bytes,
                       .per_source = SourceShare(options),
                       .unit = "bytes of requests",
                       .holder = "this expert server"}) {}

  static uint64_t SourceShare(const ExpertServerOptions& o) {
    const uint64_t largest_call = static_cast<uint64_t>(o.max_batch) *
                                  static_cast<uint64_t>(std::max<int64_t>(o.expert.hidden, 0)) *
                                  sizeof(float) * 2;
    // share < 1 keeps the product below 2^64.
    const uint64_t part = o.request_share_per_address >= 1
                              ? o.max_request_bytes
                              : static_cast<uint64_t>(o.request_share_per_address *
                                                      static_cast<double>(o.max_request_bytes));
    return std::max(part, largest_call);
  }

  Status Refuse(Status why) {
    std::lock_guard lock(mu);
    ++stats.refused;
    return why;
  }

  // The hosted expert a call names.
  Result<HostedExpert*> Find(const std::string& uid) {
    {
      std::lock_guard lock(mu);
      if (stopped) return Unavailable("the expert server is shutting down; use another server");
    }
    if (uid.size() > kMaxUidBytes) return Refuse(InvalidArgument("expert id too long"));
    auto it = experts.find(uid);
    if (it == experts.end()) {
      return Refuse(NotFound(fmt::format("expert '{}' is not hosted here",
                                         ParseExpertUid(uid).ok() ? uid : "(malformed id)")));
    }
    return it->second.get();
  }

  // One message of a call's request (expert_chunks.h), checked: x (and grad_y for a backward),
  // float32 [1..rows_left, hidden], finite, with the same rows.
  Result<std::vector<at::Tensor>> ReadChunk(const net::Message& m, bool backward,
                                            int64_t rows_left) {
    const size_t want = backward ? 2 : 1;
    if (m.tensors.size() != want) {
      return Refuse(
          InvalidArgument(fmt::format("moe.{} takes {} tensor(s), got {}",
                                      backward ? "backward" : "forward", want, m.tensors.size())));
    }
    const int64_t hidden = options.expert.hidden;
    std::vector<at::Tensor> tensors;
    for (const auto& frame : m.tensors) {
      auto t = runtime::FromFrame(frame, {.max_elements = static_cast<uint64_t>(rows_left * hidden),
                                          .allowed_dtypes = {DType::kFloat32},
                                          .rank = 2});
      if (!t.ok()) {
        return Refuse(t.status().WithContext(fmt::format(
            "a request of at most {} rows of {} (max_batch)", options.max_batch, hidden)));
      }
      if (t->size(1) != hidden || t->size(0) < 1 || t->size(0) > rows_left) {
        return Refuse(InvalidArgument(
            fmt::format("expert input of shape [{}, {}]; this expert takes [1..{}, {}] in all",
                        t->size(0), t->size(1), options.max_batch, hidden)));
      }
      if (!model::AllFinite(*t)) {
        return Refuse(InvalidArgument("expert input holds NaN or infinite values"));
      }
      tensors.push_back(std::move(*t));
    }
    if (backward && !tensors[0].sizes().equals(tensors[1].sizes())) {
      return Refuse(InvalidArgument("the gradient's shape differs from the input's"));
    }
    return tensors;
  }

  // A call: reads the request's messages (holding their bytes against held_requests), runs the
  // expert through its batcher, writes the output in chunks.
  asio::awaitable<Status> Serve(net::CallContext& ctx, bool backward) {
    HostedExpert* hosted = nullptr;
    std::vector<std::vector<at::Tensor>> parts(backward ? 2 : 1);
    int64_t rows = 0;
    const std::string source = net::SourceKey(ctx, node.host().limits_loopback());
    net::SourceBudget::Lease held = held_requests.Open(source);  // given back when the call ends
    for (;;) {
      auto next = co_await ctx.stream().Read();
      if (!next.ok()) co_return next.status();
      if (!next->has_value()) break;
      const net::Message& m = **next;
      if (hosted == nullptr) {
        auto found = Find(m.meta);
        if (!found.ok()) co_return found.status();
        hosted = *found;
      } else if (!m.meta.empty()) {
        co_return Refuse(InvalidArgument("only the first message of an expert call names it"));
      }
      auto chunk = ReadChunk(m, backward, options.max_batch - rows);
      if (!chunk.ok()) co_return chunk.status();
      const uint64_t bytes = static_cast<uint64_t>((*chunk)[0].numel()) * 4 * parts.size();
      if (Status taken = held.Take(bytes); !taken.ok()) co_return Refuse(taken);
      rows += (*chunk)[0].size(0);
      for (size_t i = 0; i < parts.size(); ++i) parts[i].push_back(std::move((*chunk)[i]));
    }
    if (hosted == nullptr) co_return Refuse(InvalidArgument("an expert call without a request"));
    std::vector<at::Tensor> in;
    for (auto& p : parts) in.push_back(p.size() == 1 ? p[0] : at::cat(p, 0));
    parts.clear();  // the chunks' bytes are counted once, in `in`
    // Not a conditional expression of two co_awaits: g++ 12 miscompiles those.
    Result<at::Tensor> out = Unavailable("not computed");
    if (backward) {
      out = co_await hosted->backward->Submit(std::make_pair(in[0], in[1]), source);
    } else {
      out = co_await hosted->forward->Submit(in[0], source);
    }
    if (!out.ok()) co_return out.status();
    auto reply = ChunkRows("", {*out});
    if (!reply.ok()) co_return reply.status();
    for (const auto& m : *reply) {
      Status st = co_await ctx.stream().Write(m);
      if (!st.ok()) co_return st;
    }
    std::lock_guard lock(mu);
    ++(backward ? stats.backwards : stats.forwards);
    co_return Status::Ok();
  }

  Status Declare() {
    return DeclareExperts(node, options.uids, dht::Now() + options.declaration_ttl_seconds);
  }

  std::string CheckpointPath(const std::string& uid) const {
    return (std::filesystem::path(options.checkpoint_dir) / (uid + ".pt")).string();
  }

  Status SaveCheckpoints() {
    if (options.checkpoint_dir.empty()) return Status::Ok();
    std::string failed;
    for (const auto& [uid, hosted] : experts) {
      std::lock_guard lock(hosted->mu);
      Status st = hosted->expert->Save(CheckpointPath(uid));
      if (!st.ok()) failed += (failed.empty() ? "" : "; ") + st.ToString();
    }
    if (!failed.empty()) return Internal("writing expert checkpoints: " + failed);
    return Status::Ok();
  }
};

Result<std::unique_ptr<ExpertServer>> ExpertServer::Start(dht::Node& node,
                                                          ExpertServerOptions options) {
  if (options.uids.empty()) return InvalidArgument("an expert server needs at least one expert");
  if (!(options.request_share_per_address > 0 && options.request_share_per_address <= 1)) {
    return InvalidArgument(fmt::format("request_share_per_address {} outside (0, 1]",
                                       options.request_share_per_address));
  }
  if (options.max_batch < 1 || options.max_batch > (1 << 20)) {
    return InvalidArgument(fmt::format("max_batch {} outside [1, 2^20]", options.max_batch));
  }
  auto impl = std::make_shared<Impl>(node, options);
  for (const auto& uid : options.uids) {
    COLONY_ASSIGN_OR_RETURN(ExpertUid parsed, ParseExpertUid(uid));
    if (parsed.ToString() != uid || impl->experts.contains(uid)) {
      return InvalidArgument(fmt::format("expert id '{}' is repeated", uid));
    }
    ExpertOptions eo = options.expert;
    eo.seed = ExpertSeed(options.expert.seed, uid);
    auto hosted = std::make_unique<HostedExpert>();
    COLONY_ASSIGN_OR_RETURN(hosted->expert, Expert::Create(eo));
    hosted->MakeBatchers(impl->pool, options.max_batch, options.request_share_per_address);
    if (auto w = options.initial_weights.find(uid); w != options.initial_weights.end()) {
      Status st = hosted->expert->SetWeights(w->second);
      if (!st.ok()) return st.WithContext("expert " + uid);
    }
    if (!options.checkpoint_dir.empty()) {
      const std::string path = impl->CheckpointPath(uid);
      if (std::filesystem::exists(path)) {
        COLONY_RETURN_IF_ERROR(hosted->expert->Load(path));
        ++impl->restored;
      }
    }
    impl->experts.emplace(uid, std::move(hosted));
  }
  if (!options.checkpoint_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.checkpoint_dir, ec);
    if (ec) {
      return InvalidArgument(
          fmt::format("cannot create checkpoint dir {}: {}", options.checkpoint_dir, ec.message()));
    }
  }
  net::Host& host = node.host();
  host.RegisterBidiStreaming("moe.forward", [impl](net::CallContext& ctx) {
    return impl->Serve(ctx, /*backward=*/false);
  });
  host.RegisterBidiStreaming("moe.backward", [impl](net::CallContext& ctx) {
    return impl->Serve(ctx, /*backward=*/true);
  });
  COLONY_RETURN_IF_ERROR(impl->Declare());
  impl->declarer = std::make_unique<Periodic>(
      options.declare_interval,
      [raw = impl.get()] {
        Status st = raw->Declare();
        if (!st.ok()) COLONY_LOG_WARN("re-declaring experts: {}", st.ToString());
      },
      Periodic::Start::kAfterInterval);
  if (!options.checkpoint_dir.empty()) {
    impl->checkpointer = std::make_unique<Periodic>(
        options.checkpoint_interval,
        [raw = impl.get()] {
          Status st = raw->SaveCheckpoints();
          if (!st.ok()) COLONY_LOG_WARN("{}", st.ToString());
        },
        Periodic::Start::kAfterInterval);
  }
  return std::unique_ptr<ExpertServer>(new ExpertServer(std::move(impl)));
}

ExpertServer::ExpertServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

ExpertServer::~ExpertServer() { Shutdown(); }

void ExpertServer::Shutdown() {
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
  }
  impl_->declarer.reset();
  impl_->checkpointer.reset();
  impl_->pool.Shutdown();
  Status st = impl_->SaveCheckpoints();
  if (!st.ok()) COLONY_LOG_WARN("{}", st.ToString());
}

Status ExpertServer::SaveCheckpoints() { return impl_->SaveCheckpoints(); }

size_t ExpertServer::restored() const { return impl_->restored; }

ExpertServer::Stats ExpertServer::stats() const {
  Stats s;
  {
    std::lock_guard lock(impl_->mu);
    s = impl_->stats;
  }
  for (const auto& [uid, hosted] : impl_->experts) {
    const auto f = hosted->forward->stats();
    const auto b = hosted->backward->stats();
    s.forward_batches += f.batches;
    s.backward_batches += b.batches;
    s.refused += f.refused + b.refused;
  }
  return s;
}

Result<std::vector<at::Tensor>> ExpertServer::Parameters(const std::string& uid) const {
  auto it = impl_->experts.find(uid);
  if (it == impl_->experts.end()) return NotFound("expert '" + uid + "' is not hosted here");
  std::lock_guard lock(it->second->mu);
  std::vector<at::Tensor> out;
  for (const auto& p : it->second->expert->parameters()) out.push_back(p.detach().clone());
  return out;
}

}  // namespace colony::moe
