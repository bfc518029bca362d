// Who may use an HTTP API and how fast (`colony api --api-keys FILE --requests-per-minute N`): API
// keys, which OpenAI clients send as `Authorization: Bearer KEY`, and a token bucket per client
// (its key, or when no keys are set its IP address, an IPv6 one's /64). A request without a
// valid key gets the OpenAI API's 401 `invalid_api_key`; one over its client's rate gets 429
// `rate_limit_exceeded` with `Retry-After`.
//
//   auto gate = api::ClientGate::Create({.keys = *api::LoadApiKeys("keys.txt"),
//                                        .requests_per_minute = 60});
//   router.Add("POST", "/v1/completions", gate->Guard(handler));
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/token_buckets.h"
#include "http/server.h"

namespace colony::api {

inline constexpr size_t kMinApiKeyBytes = 16;
inline constexpr size_t kMaxApiKeyBytes = 256;
inline constexpr size_t kMaxApiKeys = 4096;

// The token of an "Authorization: Bearer TOKEN" header (the scheme in any case, spaces around
// the token dropped); empty when there is none.
std::string_view BearerToken(std::string_view header);

// The keys in `path`, one per line (blank lines and lines starting with '#' skipped). A key
// shorter than kMinApiKeyBytes (guessable), longer than kMaxApiKeyBytes, or holding spaces or
// control characters is an error naming its line; so is a file with no key.
Result<std::vector<std::string>> LoadApiKeys(const std::string& path);

struct ClientGateOptions {
  std::vector<std::string> keys = {};  // empty: no key needed
  double requests_per_minute = 0;  // per client, in bursts of up to a minute's worth; 0: no limit
  // Clients whose buckets are remembered at once; past it the idlest are forgotten (a forgotten
  // client starts again with a full bucket, so the cap bounds memory, not the rate of a client
  // that keeps sending).
  size_t max_clients = 65536;
};

struct ClientGateStats {
  int64_t unauthorized = 0;  // 401: no key or a wrong one
  int64_t rate_limited = 0;  // 429
};

class ClientGate : public std::enable_shared_from_this<ClientGate> {
 public:
  static Result<std::shared_ptr<ClientGate>> Create(ClientGateOptions options);

  // The reply that refuses `request` (401 or 429), or nullopt when it may be served.
  std::optional<http::Reply> Admit(const http::Request& request);
  // `handler`, run only for requests Admit lets through.
  http::Handler Guard(http::Handler handler);

  ClientGateStats stats() const;
  size_t clients_remembered() const;

 private:
  explicit ClientGate(ClientGateOptions options);
  // Which key `request` carries; nullopt when none matches.
  std::optional<size_t> MatchKey(const http::Request& request) const;

  const ClientGateOptions options_;
  mutable std::mutex mu_;
  TokenBuckets buckets_;  // per client, a minute's worth of requests at once
  ClientGateStats stats_;
};

}  // namespace colony::api
