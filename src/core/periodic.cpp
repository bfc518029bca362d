// Periodic: a function run every interval on its own thread (periodic.h).
#include "core/periodic.h"

namespace colony {

Periodic::Periodic(std::chrono::milliseconds interval, std::function<void()> fn, Start start)
    : interval_(interval), fn_(std::move(fn)), thread_([this, start] { Run(start); }) {}

Periodic::~Periodic() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Periodic::Run(Start start) {
  if (start == Start::kNow) fn_();
  for (;;) {
    {
      std::unique_lock lock(mu_);
      if (cv_.wait_for(lock, interval_, [this] { return stop_; })) return;
    }
    fn_();
  }
}

}  // namespace colony
