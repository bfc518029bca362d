// Runs a coroutine on a strand and returns its result to the caller's executor (internal).
// When the caller already runs on the strand the coroutine runs inline. The hop forwards the
// caller's cancellation; the coroutine sees it through its cancellation state rather than as an
// exception, so the transport's operations report cancellation as a Status.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

namespace colony::net {

// Callers pass a named lambda (std::move(fn)), never a temporary one: g++ 12 destroys a temporary
// closure that appears inside a co_await expression twice (also when it is handed to co_spawn).
// The same rule holds everywhere in Colony: bind lambdas to a name before co_await-ing on them.
// T must be default-constructible (asio's co_spawn requires it); Result<T> and Status are.
template <typename T, typename Executor, typename F>
asio::awaitable<T> RunOnStrand(const Executor& strand, F f) {
  if (strand.running_in_this_thread()) co_return co_await f();
  auto on_strand = [f = std::move(f)]() mutable -> asio::awaitable<T> {
    co_await asio::this_coro::throw_if_cancelled(false);
    co_return co_await f();
  };
  co_return co_await asio::co_spawn(strand, std::move(on_strand), asio::use_awaitable);
}

}  // namespace colony::net
