// TaskPool: compute threads with a priority queue, so that RPC handlers never run math on the
// network's I/O threads, and urgent work (an inference step) overtakes bulk work (a training
// forward) that is still waiting.
//
//   TaskPool pool({.threads = 1, .max_queued = 256});
//   auto work = [block, x]() -> Result<at::Tensor> { return block->forward(x); };
//   Result<at::Tensor> out = co_await RunOnPool<at::Tensor>(pool, kPriorityInference,
//                                                           std::move(work));
// (Name the lambda first: g++ 12 destroys a temporary closure inside co_await twice.)
//
// Lower priority values run first; equal priorities run in submission order. A full queue
// refuses work at once (ResourceExhausted) instead of growing: a client flooding a server
// cannot exhaust its memory or threads. Slots reserved for urgent work (priority <=
// kPriorityInference) stay free of bulk work, so that a flood of bulk requests cannot get an
// inference step refused. Tasks still queued at Shutdown() complete with Closed.
#pragma once

#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"

namespace colony::runtime {

inline constexpr int kPriorityInference = 0;
inline constexpr int kPriorityTraining = 1;

struct TaskPoolOptions {
  size_t threads = 1;
  // Queued (not yet running) tasks beyond which Submit() refuses work.
  size_t max_queued = 1024;
  // Of max_queued, the slots only urgent tasks (priority <= kPriorityInference) may take.
  size_t reserved_urgent = 0;
  // Called on each compute thread before it takes work (e.g. to set LibTorch's thread count).
  std::function<void()> thread_init = {};
};

class TaskPool {
 public:
  // A task runs with ok = true, or with ok = false when the pool shut down before it ran (it
  // must then only report that and return quickly).
  using Task = std::function<void(bool ok)>;

  explicit TaskPool(TaskPoolOptions options = {});
  ~TaskPool();  // Shutdown()
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  // Queues a task; false (and the task is dropped unrun) when the queue is full or shut down.
  bool Submit(int priority, Task task);
  // Runs the remaining queued tasks with ok = false and joins the threads. Idempotent.
  void Shutdown();

  size_t queued() const;
  size_t running() const;
  bool shut_down() const;

 private:
  void Loop();

  TaskPoolOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, std::deque<Task>> queue_;
  size_t queued_ = 0;
  size_t running_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// Runs `fn` on the pool and resumes the awaiting coroutine on its own executor with the result.
// Errors: ResourceExhausted when the pool's queue is full; Closed when it shut down first.
template <typename T, typename F>
asio::awaitable<Result<T>> RunOnPool(TaskPool& pool, int priority, F fn) {
  auto initiate = [&pool, priority, fn = std::move(fn)](auto handler) mutable {
    using Handler = decltype(handler);
    auto shared = std::make_shared<Handler>(std::move(handler));
    auto task = [shared, fn = std::move(fn)](bool ok) mutable {
      Result<T> result = Closed("the compute pool shut down");
      if (ok) {
        try {
          result = fn();
        } catch (const std::exception& e) {  // LibTorch throws c10::Error on bad shapes
          result = Internal(std::string("computation failed: ") + e.what());
        }
      }
      auto ex = asio::get_associated_executor(*shared);
      asio::post(ex,
                 [shared, result = std::move(result)]() mutable { (*shared)(std::move(result)); });
    };
    if (!pool.Submit(priority, std::move(task))) {
      auto ex = asio::get_associated_executor(*shared);
      asio::post(ex, [shared]() mutable {
        (*shared)(Result<T>(ResourceExhausted(
            "the server's compute queue is full; retry later or use another server")));
      });
    }
  };
  co_return co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(Result<T>)>(
      std::move(initiate), asio::use_awaitable);
}

}  // namespace colony::runtime
