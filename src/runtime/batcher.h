// Batcher: requests for the same computation (one expert's forward, say) that arrive while it is
// busy join one batch, so the pool runs one task for many requests (hivemind's TaskPool batching)
// without waiting on a timer: a lone request runs at once, and under load each batch takes what
// came in while the previous one ran, up to max_rows rows. One batch of a Batcher runs at a time.
//
//   auto b = std::make_shared<Batcher<at::Tensor, at::Tensor>>(pool, BatcherOptions{
//       .max_rows = 4096, .max_pending_rows = 16384},
//       [](const at::Tensor& x) { return static_cast<size_t>(x.size(0)); },
//       [&](std::vector<at::Tensor>& xs) { ... one Result per input ... });
//   Result<at::Tensor> y = co_await b->Submit(x);   // from any coroutine
//
// Requests beyond max_pending_rows waiting rows are refused at once (ResourceExhausted), so a
// flood of requests cannot grow memory without bound; so are requests when the pool's queue is
// full. A request may name its source (a client address, net::SourceKey): with
// max_pending_rows_per_source set, a source's request is refused when that source already has
// rows waiting and this one would take it past its share, so that one client keeping the queue
// full cannot make every other client's requests refused. `process` runs on a pool thread and
// returns one result per input, in order (or throws: every request of the batch gets the error).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "runtime/task_pool.h"

namespace colony::runtime {

struct BatcherOptions {
  int priority = kPriorityTraining;
  size_t max_rows = 4096;           // rows in one batch (a request larger than this runs alone)
  size_t max_pending_rows = 16384;  // rows waiting for a batch beyond which requests are refused
  // Rows one named source may have waiting (0: no per-source cap). A source with none waiting may
  // always submit one request, as max_pending_rows lets a lone request wait.
  size_t max_pending_rows_per_source = 0;
};

template <typename In, typename Out>
class Batcher : public std::enable_shared_from_this<Batcher<In, Out>> {
 public:
  using Rows = std::function<size_t(const In&)>;
  using Process = std::function<std::vector<Result<Out>>(std::vector<In>&)>;

  Batcher(TaskPool& pool, BatcherOptions options, Rows rows, Process process)
      : pool_(pool), options_(options), rows_(std::move(rows)), process_(std::move(process)) {}

  // `source`: who asks (empty: no per-source cap applies).
  asio::awaitable<Result<Out>> Submit(In input, std::string source = {}) {
    auto self = this->shared_from_this();
    auto initiate = [self, input = std::move(input),
                     source = std::move(source)](auto handler) mutable {
      using Handler = decltype(handler);
      auto shared = std::make_shared<Handler>(std::move(handler));
      Done done = [shared](Result<Out> result) {
        auto ex = asio::get_associated_executor(*shared);
        asio::post(
            ex, [shared, result = std::move(result)]() mutable { (*shared)(std::move(result)); });
      };
      self->Enqueue(std::move(input), std::move(source), std::move(done));
    };
    co_return co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(Result<Out>)>(
        std::move(initiate), asio::use_awaitable);
  }

  struct Stats {
    uint64_t requests = 0;
    uint64_t batches = 0;
    uint64_t refused = 0;
    uint64_t refused_over_share = 0;  // of them, a source's over max_pending_rows_per_source
  };
  Stats stats() const {
    std::lock_guard lock(mu_);
    return stats_;
  }

 private:
  using Done = std::function<void(Result<Out>)>;
  struct Entry {
    In input;
    size_t rows;
    std::string source;
    Done done;
  };

  void Enqueue(In input, std::string source, Done done) {
    const size_t rows = rows_(input);
    {
      std::lock_guard lock(mu_);
      if (!source.empty() && options_.max_pending_rows_per_source > 0) {
        auto it = pending_by_source_.find(source);
        const size_t mine = it == pending_by_source_.end() ? 0 : it->second;
        if (mine > 0 && mine + rows > options_.max_pending_rows_per_source) {
          ++stats_.refused;
          ++stats_.refused_over_share;
          done(ResourceExhausted(fmt::format(
              "{} has {} rows of requests waiting for this computation and one client address may "
              "have {}; wait for them to be answered or use another server",
              source, mine, options_.max_pending_rows_per_source)));
          return;
        }
      }
      if (pending_rows_ + rows > options_.max_pending_rows && !pending_.empty()) {
        ++stats_.refused;
        done(ResourceExhausted(
            "the server has too many requests waiting for this computation; retry later or use "
            "another server"));
        return;
      }
      ++stats_.requests;
      pending_rows_ += rows;
      if (!source.empty()) pending_by_source_[source] += rows;
      pending_.push_back({std::move(input), rows, std::move(source), std::move(done)});
      if (scheduled_) return;
      scheduled_ = true;
    }
    Schedule();
  }

  // Queues the next batch's task; without room in the pool, fails what waits.
  void Schedule() {
    auto self = this->shared_from_this();
    if (pool_.Submit(options_.priority, [self](bool ok) { self->RunBatch(ok); })) return;
    std::deque<Entry> failed;
    {
      std::lock_guard lock(mu_);
      failed.swap(pending_);
      pending_rows_ = 0;
      pending_by_source_.clear();
      scheduled_ = false;
      stats_.refused += failed.size();
    }
    const Status why =
        pool_.shut_down()
            ? Closed("the compute pool shut down")
            : ResourceExhausted(
                  "the server's compute queue is full; retry later or use another server");
    for (auto& e : failed) e.done(why);
  }

  void RunBatch(bool ok) {
    std::vector<Entry> batch;
    {
      std::lock_guard lock(mu_);
      size_t rows = 0;
      while (!pending_.empty() &&
             (batch.empty() || rows + pending_.front().rows <= options_.max_rows)) {
        rows += pending_.front().rows;
        pending_rows_ -= pending_.front().rows;
        Release(pending_.front());
        batch.push_back(std::move(pending_.front()));
        pending_.pop_front();
      }
      ++stats_.batches;
    }
    std::vector<Result<Out>> results;
    if (!ok) {
      results.assign(batch.size(), Closed("the compute pool shut down"));
    } else {
      std::vector<In> inputs;
      inputs.reserve(batch.size());
      for (auto& e : batch) inputs.push_back(std::move(e.input));
      try {
        results = process_(inputs);
        if (results.size() != batch.size()) {
          results.assign(batch.size(), Internal("a batch gave the wrong number of results"));
        }
      } catch (const std::exception& e) {  // LibTorch throws c10::Error on bad shapes
        results.assign(batch.size(), Internal(std::string("computation failed: ") + e.what()));
      }
    }
    for (size_t i = 0; i < batch.size(); ++i) batch[i].done(std::move(results[i]));
    bool more = false;
    {
      std::lock_guard lock(mu_);
      more = !pending_.empty();
      if (!more) scheduled_ = false;
    }
    if (more) Schedule();
  }

  // Takes a waiting entry's rows off its source's count; under mu_.
  void Release(const Entry& e) {
    if (e.source.empty()) return;
    auto it = pending_by_source_.find(e.source);
    if (it == pending_by_source_.end()) return;
    it->second -= std::min(it->second, e.rows);
    if (it->second == 0) pending_by_source_.erase(it);
  }

  TaskPool& pool_;
  const BatcherOptions options_;
  const Rows rows_;
  const Process process_;
  mutable std::mutex mu_;
  std::deque<Entry> pending_;
  size_t pending_rows_ = 0;
  std::map<std::string, size_t> pending_by_source_;  // rows waiting, by named source
  bool scheduled_ = false;                           // a task of this batcher is queued or running
  Stats stats_;
};

}  // namespace colony::runtime
