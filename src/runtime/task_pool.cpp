#include "runtime/task_pool.h"

#include <algorithm>

namespace colony::runtime {

TaskPool::TaskPool(TaskPoolOptions options) : options_(std::move(options)) {
  if (options_.threads == 0) options_.threads = 1;
  for (size_t i = 0; i < options_.threads; ++i) threads_.emplace_back([this] { Loop(); });
}

TaskPool::~TaskPool() { Shutdown(); }

bool TaskPool::Submit(int priority, Task task) {
  {
    std::lock_guard lock(mu_);
    const size_t limit =
        priority <= kPriorityInference
            ? options_.max_queued
            : options_.max_queued - std::min(options_.reserved_urgent, options_.max_queued);
    if (stop_ || queued_ >= limit) return false;
    queue_[priority].push_back(std::move(task));
    ++queued_;
  }
  cv_.notify_one();
  return true;
}

void TaskPool::Shutdown() {
  std::map<int, std::deque<Task>> left;
  {
    std::lock_guard lock(mu_);
    if (stop_ && threads_.empty()) return;
    stop_ = true;
    left.swap(queue_);
    queued_ = 0;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
  for (auto& [priority, tasks] : left) {
    for (auto& task : tasks) task(false);
  }
}

size_t TaskPool::queued() const {
  std::lock_guard lock(mu_);
  return queued_;
}

bool TaskPool::shut_down() const {
  std::lock_guard lock(mu_);
  return stop_;
}

size_t TaskPool::running() const {
  std::lock_guard lock(mu_);
  return running_;
}

void TaskPool::Loop() {
  if (options_.thread_init) options_.thread_init();
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || queued_ > 0; });
    if (stop_) return;
    auto it = queue_.begin();
    Task task = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) queue_.erase(it);
    --queued_;
    ++running_;
    lock.unlock();
    task(true);
    lock.lock();
    --running_;
  }
}

}  // namespace colony::runtime
