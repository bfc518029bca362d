// Internals shared by the client's files (routing.cpp, remote_forward.cpp,
// remote_sequential.cpp, inference_session.cpp). Not part of the public API.
#pragma once

#include <ATen/ATen.h>

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/use_future.hpp>
#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <string_view>
#include <vector>

#include "net/host.h"
#include "serve/remote_forward.h"
#include "serve/routing.h"
#include "serve/wire.h"

namespace colony::serve {

// Runs a coroutine on the host's threads and waits for it for at most `timeout`; on timeout
// `on_timeout` runs (e.g. cancels a stream, which makes the coroutine finish) and the result
// is still awaited.
template <typename T>
Result<T> RunSync(net::Host& host, asio::awaitable<Result<T>> op, std::chrono::milliseconds timeout,
                  const std::function<void()>& on_timeout) {
  auto future = asio::co_spawn(host.io_context(), std::move(op), asio::use_future);
  if (future.wait_for(timeout) == std::future_status::timeout && on_timeout) on_timeout();
  try {
    return future.get();
  } catch (const std::exception& e) {
    return Internal(std::string("client operation failed: ") + e.what());
  }
}

// Errors that are the caller's fault, found by this client before any server saw the request:
// retrying on another server cannot help.
bool IsClientError(const Status& st);
// How this client takes a call's failure reported by a server or its connection: never as its
// own error. A server refusing a request as invalid (invalid_argument) is unavailable for it,
// like any other failing server, so that the request is retried elsewhere and the server is
// avoided for a while: the refusal may be a hostile server's way to fail every call it gets
// without being banned, or an honest server's smaller limits (--max-length, --max-batch).
Status ServerFailure(Status st);
Result<Multiaddr> AddressOf(const ServerRecord& r);
// 16 random bytes: a session id (and the capability to push into that session).
std::string RandomId();
// The tensors a request sends must be finite (servers refuse NaN and infinity): checked here,
// so that such a request is the caller's error rather than every server's failure.
Status CheckFinite(const at::Tensor& t, std::string_view what);
// Reply tensor `index` as hidden states of exactly `shape`, finite.
Result<at::Tensor> HiddenFrom(const net::Message& m, size_t index, at::IntArrayRef shape);
// The tuning metadata of a BlockRequest or an OpenSession.
TuningSpec TuningOf(int64_t prompt_length, const LoraSpec& lora);
// The deep prompts of a span's blocks, from prompts of the blocks from `offset` on.
at::Tensor PromptsOf(const at::Tensor& prompts, int64_t offset, const RouteSpan& span);
// The request tensors of a span besides hidden (and grad): its deep prompts and its adapters.
void AppendSpanInputs(std::vector<at::Tensor>& tensors, int64_t offset, const RouteSpan& span,
                      const at::Tensor& prompts, const LoraSpec& lora,
                      const std::vector<at::Tensor>& adapters);
Status CheckLora(int64_t start, int64_t end, const LoraSpec& lora,
                 const std::vector<at::Tensor>& adapters);
// Sleeps before retry `attempt` (retry_backoff x attempt, at most 8x).
void Backoff(SequenceManager& m, int attempt);

}  // namespace colony::serve
