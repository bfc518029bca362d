// TaskPool (runtime/task_pool.h): priorities, the bounded queue, and shutdown with queued work.
#include "runtime/task_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "test_support.h"

namespace colony::runtime {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Occupies the pool's only thread with a task that waits for `gate`: true once it runs.
bool BlockTheOnlyThread(TaskPool& pool, std::shared_future<void> gate) {
  if (!pool.Submit(kPriorityTraining, [gate](bool) { gate.wait(); })) return false;
  const auto started = Clock::now() + 5s;
  while (pool.running() != 1 && Clock::now() < started) std::this_thread::yield();
  return pool.running() == 1;
}

TEST(TaskPool, RunsHigherPriorityFirstAndBoundsItsQueue) {
  TaskPool pool({.threads = 1, .max_queued = 4});
  std::mutex mu;
  std::vector<int> order;
  std::promise<void> release;
  auto gate = release.get_future().share();
  // Block the only thread, then queue training work before inference work.
  ASSERT_TRUE(BlockTheOnlyThread(pool, gate));
  auto record = [&](int v) {
    return [&, v](bool ok) {
      std::lock_guard lock(mu);
      order.push_back(ok ? v : -v);
    };
  };
  ASSERT_TRUE(pool.Submit(kPriorityTraining, record(1)));
  ASSERT_TRUE(pool.Submit(kPriorityTraining, record(2)));
  ASSERT_TRUE(pool.Submit(kPriorityInference, record(3)));
  ASSERT_TRUE(pool.Submit(kPriorityInference, record(4)));
  EXPECT_FALSE(pool.Submit(kPriorityInference, record(5)));  // queue full
  release.set_value();
  colony::test::WaitUntil(
      [&] {
        std::lock_guard lock(mu);
        return order.size() == 4;
      },
      5s);
  std::lock_guard lock(mu);
  EXPECT_EQ(order, (std::vector<int>{3, 4, 1, 2}));
}

// Bulk work fills only the unreserved slots: urgent work is still taken once bulk work is
// refused, up to the whole queue.
TEST(TaskPool, BulkWorkCannotTakeTheSlotsReservedForUrgentWork) {
  TaskPool pool({.threads = 1, .max_queued = 5, .reserved_urgent = 2});
  std::promise<void> release;
  auto gate = release.get_future().share();
  ASSERT_TRUE(BlockTheOnlyThread(pool, gate));
  std::atomic<int> ran{0};
  auto task = [&](bool ok) { ran += ok ? 1 : 0; };
  int bulk = 0;
  while (bulk < 10 && pool.Submit(kPriorityTraining, task)) ++bulk;
  EXPECT_EQ(bulk, 3);
  EXPECT_TRUE(pool.Submit(kPriorityInference, task));
  EXPECT_TRUE(pool.Submit(kPriorityInference, task));
  EXPECT_FALSE(pool.Submit(kPriorityInference, task));  // the whole queue is full now
  EXPECT_FALSE(pool.Submit(kPriorityTraining, task));
  release.set_value();
  colony::test::WaitUntil([&] { return ran == 5; }, 5s);
  EXPECT_EQ(ran, 5);
}

TEST(TaskPool, QueuedTasksCompleteWithClosedAtShutdown) {
  TaskPool pool({.threads = 1, .max_queued = size_t{1} << 20});
  std::promise<void> release;
  auto gate = release.get_future().share();
  std::atomic<int> cancelled{0}, ran{0};
  ASSERT_TRUE(pool.Submit(0, [gate](bool) { gate.wait(); }));
  auto task = [&](bool ok) { (ok ? ran : cancelled) += 1; };
  int submitted = 0;
  for (int i = 0; i < 3; ++i) submitted += pool.Submit(0, task);
  std::thread stopper([&] { pool.Shutdown(); });
  // Submit succeeds until Shutdown has begun; only then let the running task finish.
  while (pool.Submit(0, task)) ++submitted;
  release.set_value();
  stopper.join();
  EXPECT_EQ(cancelled.load() + ran.load(), submitted);
  EXPECT_GE(cancelled.load(), 3);
  EXPECT_FALSE(pool.Submit(0, [](bool) {}));
}

}  // namespace
}  // namespace colony::runtime
