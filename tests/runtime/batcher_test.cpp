// Batcher (runtime/batcher.h): requests that arrive while a batch computes join the next one (in
// order, up to max_rows), each gets its own result; a flood beyond max_pending_rows is refused at
// once, and one source's requests beyond its share of the waiting rows too; a failing batch fails
// its requests only; queued requests get Closed at shutdown.
#include "runtime/batcher.h"

#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <future>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_support.h"

namespace colony::runtime {
namespace {

using namespace std::chrono_literals;

// Inputs are row counts; a batch answers each input with (its rows, the batch's size, the batch's
// index), so the test sees how requests were grouped.
struct Answer {
  size_t rows, batch_size, batch_index;
};
using TestBatcher = Batcher<size_t, Answer>;

class Batching : public ::testing::Test {
 protected:
  std::shared_ptr<TestBatcher> Make(BatcherOptions o, std::shared_future<void> gate = {}) {
    return std::make_shared<TestBatcher>(
        pool_, o, [](const size_t& rows) { return rows; },
        [this, gate](std::vector<size_t>& inputs) {
          if (gate.valid()) gate.wait();
          const size_t index = batches_++;
          for (size_t rows : inputs) {
            if (rows == 13) throw std::runtime_error("unlucky");
          }
          std::vector<Result<Answer>> out;
          for (size_t rows : inputs) out.emplace_back(Answer{rows, inputs.size(), index});
          return out;
        });
  }
  // Submits `rows` from a coroutine on io_; the result lands in `slot`.
  void Spawn(std::shared_ptr<TestBatcher> b, size_t rows, std::optional<Result<Answer>>& slot,
             std::string source = {}) {
    asio::co_spawn(
        io_,
        [b, rows, &slot, source]() -> asio::awaitable<void> {
          slot = co_await b->Submit(rows, source);
        },
        asio::detached);
  }
  // Spawns `rows` held by the gate (the batch that runs while the others wait).
  void SpawnRunning(std::shared_ptr<TestBatcher> b, size_t rows,
                    std::optional<Result<Answer>>& slot) {
    Spawn(std::move(b), rows, slot);
    io_.run_for(50ms);
    io_.restart();
    const auto started = std::chrono::steady_clock::now() + test::HangGuard(5s);
    while (pool_.running() != 1 && std::chrono::steady_clock::now() < started) {
      std::this_thread::yield();
    }
    ASSERT_EQ(pool_.running(), 1u);
  }
  // Runs io_ until every slot holds a result.
  void RunUntilAll(std::vector<std::optional<Result<Answer>>>& slots) {
    std::vector<std::optional<Result<Answer>>*> all;
    for (auto& s : slots) all.push_back(&s);
    RunUntilDone(all);
  }
  void RunUntilDone(const std::vector<std::optional<Result<Answer>>*>& slots) {
    const auto deadline = std::chrono::steady_clock::now() + test::HangGuard(10s);
    auto done = [&] {
      for (const auto* s : slots) {
        if (!s->has_value()) return false;
      }
      return true;
    };
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io_.run_for(10ms);
      io_.restart();
    }
    ASSERT_TRUE(done());
  }

  TaskPool pool_{{.threads = 1, .max_queued = 16}};
  asio::io_context io_;
  std::atomic<size_t> batches_{0};
};

TEST_F(Batching, RequestsThatArriveDuringABatchJoinTheNextOneUpToMaxRows) {
  std::promise<void> release;
  auto b = Make({.max_rows = 10, .max_pending_rows = 100}, release.get_future().share());
  std::vector<std::optional<Result<Answer>>> slots(6);
  ASSERT_NO_FATAL_FAILURE(SpawnRunning(b, 4, slots[0]));  // runs at once, held by the gate
  // These five wait: 3 + 3 + 4 fit max_rows 10, then 6 and 2 form the next batch.
  const size_t rows[] = {3, 3, 4, 6, 2};
  for (size_t i = 0; i < 5; ++i) Spawn(b, rows[i], slots[i + 1]);
  io_.run_for(50ms);
  io_.restart();
  release.set_value();
  ASSERT_NO_FATAL_FAILURE(RunUntilAll(slots));
  const size_t want_batch[] = {0, 1, 1, 1, 2, 2};
  const size_t want_size[] = {1, 3, 3, 3, 2, 2};
  for (size_t i = 0; i < slots.size(); ++i) {
    ASSERT_TRUE(slots[i]->ok()) << i << ": " << slots[i]->status().ToString();
    EXPECT_EQ((*slots[i])->rows, i == 0 ? 4u : rows[i - 1]) << i;
    EXPECT_EQ((*slots[i])->batch_index, want_batch[i]) << i;
    EXPECT_EQ((*slots[i])->batch_size, want_size[i]) << i;
  }
  EXPECT_EQ(b->stats().batches, 3u);
  EXPECT_EQ(b->stats().requests, 6u);
}

TEST_F(Batching, AFloodBeyondThePendingRowsIsRefusedAndAFailingBatchFailsOnlyItself) {
  std::promise<void> release;
  auto b = Make({.max_rows = 100, .max_pending_rows = 10}, release.get_future().share());
  std::vector<std::optional<Result<Answer>>> slots(5);
  ASSERT_NO_FATAL_FAILURE(SpawnRunning(b, 1, slots[0]));  // running, held
  Spawn(b, 13, slots[1]);  // alone beyond the budget: waits (one request always may)
  Spawn(b, 5, slots[2]);   // 13 + 5 > 10: refused at once
  io_.run_for(50ms);
  io_.restart();
  ASSERT_TRUE(slots[2].has_value());
  EXPECT_EQ(slots[2]->status().code(), StatusCode::kResourceExhausted);
  release.set_value();
  ASSERT_NO_FATAL_FAILURE(RunUntilDone({&slots[0], &slots[1], &slots[2]}));
  EXPECT_TRUE(slots[0]->ok());
  ASSERT_FALSE(slots[1]->ok());  // its batch threw
  EXPECT_NE(slots[1]->status().message().find("unlucky"), std::string::npos);
  // The batcher goes on.
  Spawn(b, 2, slots[3]);
  ASSERT_NO_FATAL_FAILURE(RunUntilDone({&slots[3]}));
  EXPECT_TRUE(slots[3]->ok());
  EXPECT_EQ(b->stats().refused, 1u);
}

// One client (source "attacker") keeps the queue full while a batch computes: past the first
// request it may have only its share of the waiting rows, so another client's request still fits
// under max_pending_rows. Without the share the attacker's ten rows fill the queue and the honest
// request is refused.
TEST_F(Batching, OneSourceKeepingTheQueueFullLeavesRoomForOthers) {
  std::promise<void> release;
  auto b = Make({.max_rows = 100, .max_pending_rows = 10, .max_pending_rows_per_source = 3},
                release.get_future().share());
  std::vector<std::optional<Result<Answer>>> slots(14);
  ASSERT_NO_FATAL_FAILURE(SpawnRunning(b, 1, slots[0]));
  // The attacker's first request waits whatever its size (it has none waiting)...
  Spawn(b, 5, slots[1], "attacker");
  // ... and then every request of its flood is over its share.
  for (size_t i = 2; i < 7; ++i) Spawn(b, 1, slots[i], "attacker");
  io_.run_for(50ms);
  io_.restart();
  for (size_t i = 2; i < 7; ++i) {
    ASSERT_TRUE(slots[i].has_value()) << i;
    EXPECT_EQ(slots[i]->status().code(), StatusCode::kResourceExhausted) << i;
    EXPECT_NE(slots[i]->status().message().find(
                  "attacker has 5 rows of requests waiting for this computation and one client "
                  "address may have 3"),
              std::string::npos)
        << slots[i]->status().ToString();
  }
  // Another source's request fits: 5 + 5 rows waiting.
  Spawn(b, 5, slots[7], "honest");
  // Requests without a source only meet max_pending_rows: the queue is full now.
  Spawn(b, 1, slots[8]);
  io_.run_for(50ms);
  io_.restart();
  EXPECT_FALSE(slots[7].has_value()) << slots[7]->status().ToString();
  ASSERT_TRUE(slots[8].has_value());
  EXPECT_EQ(slots[8]->status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(slots[8]->status().message().find("too many requests waiting"), std::string::npos)
      << slots[8]->status().ToString();
  EXPECT_EQ(b->stats().refused, 6u);
  EXPECT_EQ(b->stats().refused_over_share, 5u);

  release.set_value();
  ASSERT_NO_FATAL_FAILURE(RunUntilDone({&slots[0], &slots[1], &slots[7]}));
  EXPECT_TRUE(slots[0]->ok());
  ASSERT_TRUE(slots[1]->ok()) << slots[1]->status().ToString();
  ASSERT_TRUE(slots[7]->ok()) << slots[7]->status().ToString();
  EXPECT_EQ((*slots[1])->batch_index, (*slots[7])->batch_index);  // they waited together
  // Once its rows left the queue, the attacker's share is its own again.
  Spawn(b, 3, slots[9], "attacker");
  ASSERT_NO_FATAL_FAILURE(RunUntilDone({&slots[9]}));
  EXPECT_TRUE(slots[9]->ok()) << slots[9]->status().ToString();
}

TEST_F(Batching, RequestsStillWaitingAtShutdownGetClosed) {
  std::promise<void> release;
  auto b = Make({.max_rows = 1, .max_pending_rows = 100}, release.get_future().share());
  std::vector<std::optional<Result<Answer>>> slots(3);
  for (auto& s : slots) Spawn(b, 1, s);
  io_.run_for(50ms);
  io_.restart();
  std::thread stopper([&] { pool_.Shutdown(); });
  std::this_thread::sleep_for(50ms);
  release.set_value();
  stopper.join();
  ASSERT_NO_FATAL_FAILURE(RunUntilAll(slots));
  EXPECT_TRUE(slots[0]->ok());
  for (size_t i = 1; i < slots.size(); ++i) {
    ASSERT_FALSE(slots[i]->ok());
    EXPECT_EQ(slots[i]->status().code(), StatusCode::kClosed) << slots[i]->status().ToString();
  }
}

}  // namespace
}  // namespace colony::runtime
