// A wake-up primitive for coroutines that share one strand (internal to net).
//
// Waiters loop on their condition: `while (!ready()) co_await n.Wait();`. Notify() wakes every
// current waiter. Because waiters and notifiers run on the same strand, a condition checked just
// before Wait() cannot change before the wait is registered, so no wake-up is lost.
//
// Each wait has a timer of its own: one timer shared by several waiters would not do, because
// arming it again (asio's expires_at) cancels the waits already pending on it, so two waiters
// would keep waking each other and spin.
#pragma once

#include <algorithm>
#include <asio/awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <vector>

namespace colony::net {

class Notifier {
 public:
  using TimePoint = asio::steady_timer::time_point;

  explicit Notifier(asio::any_io_executor ex) : ex_(std::move(ex)) {}
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  // Completes when Notify() is called (or the awaiting coroutine is cancelled: callers check).
  asio::awaitable<void> Wait() { return WaitUntil(TimePoint::max()); }
  // As Wait(), and also completes at `until`.
  asio::awaitable<void> WaitUntil(TimePoint until) {
    asio::steady_timer timer(ex_, until);
    Registration registration(waiters_, &timer);
    co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  }
  void Notify() {
    for (asio::steady_timer* t : waiters_) t->cancel();
  }

 private:
  // Keeps a waiting timer listed for exactly as long as its coroutine frame holds it (a frame
  // destroyed while suspended unlists it too).
  class Registration {
   public:
    Registration(std::vector<asio::steady_timer*>& list, asio::steady_timer* timer)
        : list_(list), timer_(timer) {
      list_.push_back(timer_);
    }
    ~Registration() { list_.erase(std::find(list_.begin(), list_.end(), timer_)); }
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;

   private:
    std::vector<asio::steady_timer*>& list_;
    asio::steady_timer* timer_;
  };

  asio::any_io_executor ex_;
  std::vector<asio::steady_timer*> waiters_;
};

}  // namespace colony::net
