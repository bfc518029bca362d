// A wake-up primitive for coroutines that share one strand (internal to net).
//
// Waiters loop on their condition: `while (!ready()) co_await n.Wait();`. Notify() wakes every
// current waiter. Because waiters and notifiers run on the same strand, a condition checked just
// before Wait() cannot change before the wait is registered, so no wake-up is lost.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

namespace colony::net {

class Notifier {
 public:
  explicit Notifier(const asio::any_io_executor& ex) : timer_(ex) {}

  // Completes when Notify() is called (or the awaiting coroutine is cancelled: callers check).
  asio::awaitable<void> Wait() {
    timer_.expires_at(asio::steady_timer::time_point::max());
    co_await timer_.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  }
  void Notify() { timer_.cancel(); }

 private:
  asio::steady_timer timer_;
};

}  // namespace colony::net
