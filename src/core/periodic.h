// Periodic: runs a function every interval on a thread of its own, until destroyed.
//
//   Periodic refresh(std::chrono::seconds(30), [&] { Refresh(); }, Periodic::Start::kNow);
//
// The destructor wakes the thread at once and joins it (a run in progress finishes first), so
// whatever the function uses must outlive the Periodic: declare it last.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace colony {

class Periodic {
 public:
  enum class Start { kNow, kAfterInterval };
  Periodic(std::chrono::milliseconds interval, std::function<void()> fn, Start start);
  ~Periodic();
  Periodic(const Periodic&) = delete;
  Periodic& operator=(const Periodic&) = delete;

 private:
  void Run(Start start);

  std::chrono::milliseconds interval_;
  std::function<void()> fn_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace colony
