// API keys and per-client request rates in front of an HTTP API.
#include "api/client_gate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>

#include "core/address_key.h"

namespace colony::api {
namespace {

// Whether `a` equals `b`, in time that depends on their lengths only, not on where they differ.
bool SameBytes(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    differ |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return differ == 0;
}

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// The client of a request without keys: its address's SourceAddressKey (an IPv6 client's /64),
// from "ip:port" or "[ipv6]:port"; the text itself when it is not an address.
std::string ClientOf(const std::string& remote_address) {
  const size_t colon = remote_address.rfind(':');
  std::string ip = colon == std::string::npos ? remote_address : remote_address.substr(0, colon);
  if (ip.size() >= 2 && ip.front() == '[' && ip.back() == ']') ip = ip.substr(1, ip.size() - 2);
  std::string key = SourceAddressKey(ip);
  return key.empty() ? ip : key;
}

}  // namespace

std::string_view BearerToken(std::string_view header) {
  constexpr std::string_view kScheme = "bearer";
  if (header.size() <= kScheme.size() ||
      !EqualsIgnoringCase(header.substr(0, kScheme.size()), kScheme) ||
      header[kScheme.size()] != ' ') {
    return {};
  }
  std::string_view token = header.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && token.back() == ' ') token.remove_suffix(1);
  return token;
}

Result<std::vector<std::string>> LoadApiKeys(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(fmt::format("cannot read the API key file {}", path));
  std::vector<std::string> keys;
  std::string line;
  for (size_t lineno = 1; std::getline(in, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.front() == '#') continue;
    const auto where = [&] { return fmt::format("{} line {}", path, lineno); };
    if (line.size() < kMinApiKeyBytes || line.size() > kMaxApiKeyBytes) {
      return InvalidArgument(fmt::format(
          "{}: an API key has {} to {} characters (this one has {}; e.g. `openssl rand -hex 24`)",
          where(), kMinApiKeyBytes, kMaxApiKeyBytes, line.size()));
    }
    if (std::any_of(line.begin(), line.end(), [](char c) {
          return static_cast<unsigned char>(c) <= ' ' || static_cast<unsigned char>(c) == 0x7f;
        })) {
      return InvalidArgument(
          fmt::format("{}: an API key holds no spaces or control characters", where()));
    }
    if (keys.size() >= kMaxApiKeys) {
      return InvalidArgument(fmt::format("{}: more than {} API keys", where(), kMaxApiKeys));
    }
    keys.push_back(std::move(line));
  }
  if (keys.empty()) return InvalidArgument(fmt::format("{} holds no API key", path));
  return keys;
}

Result<std::shared_ptr<ClientGate>> ClientGate::Create(ClientGateOptions options) {
  if (!(options.requests_per_minute >= 0) || !std::isfinite(options.requests_per_minute)) {
    return InvalidArgument(
        fmt::format("requests per minute {} must be finite and not negative (0: no limit)",
                    options.requests_per_minute));
  }
  if (options.max_clients == 0) return InvalidArgument("max_clients must be at least 1");
  return std::shared_ptr<ClientGate>(new ClientGate(std::move(options)));
}

std::optional<size_t> ClientGate::MatchKey(const http::Request& request) const {
  const std::string_view token = BearerToken(request.Header("authorization"));
  std::optional<size_t> match;
  // Every key is compared, so the time taken does not say which one came close.
  for (size_t i = 0; i < options_.keys.size(); ++i) {
    if (SameBytes(token, options_.keys[i])) match = i;
  }
  return match;
}

ClientGate::ClientGate(ClientGateOptions options)
    : options_(std::move(options)),
      buckets_({.per_second = std::max(options_.requests_per_minute, 0.0) / 60.0,
                .burst = std::max(1.0, options_.requests_per_minute),
                .max_keys = options_.max_clients}) {}

std::optional<http::Reply> ClientGate::Admit(const http::Request& request) {
  std::string client;
  if (!options_.keys.empty()) {
    const std::optional<size_t> key = MatchKey(request);
    if (!key) {
      const bool sent = !BearerToken(request.Header("authorization")).empty();
      http::Reply reply = http::JsonError(
          401,
          sent ? "Incorrect API key provided. Ask the operator of this API for a valid key."
               : "You didn't provide an API key. Send it in an Authorization header: "
                 "'Authorization: Bearer YOUR_KEY'.",
          "invalid_request_error", "invalid_api_key");
      reply.headers.emplace_back("WWW-Authenticate", "Bearer");
      std::lock_guard lock(mu_);
      ++stats_.unauthorized;
      return reply;
    }
    client = fmt::format("key {}", *key);
  } else {
    client = ClientOf(request.remote_address);
  }
  if (options_.requests_per_minute <= 0) return std::nullopt;
  std::lock_guard lock(mu_);
  const std::optional<double> wait = buckets_.Take(client, std::chrono::steady_clock::now());
  if (!wait) return std::nullopt;
  ++stats_.rate_limited;
  const auto retry_after = static_cast<int64_t>(std::ceil(*wait));
  http::Reply reply = http::JsonError(
      429,
      fmt::format("Rate limit reached: {} requests per minute per client. Try again in {} s.",
                  options_.requests_per_minute, retry_after),
      "requests", "rate_limit_exceeded");
  reply.headers.emplace_back("Retry-After", std::to_string(retry_after));
  return reply;
}

http::Handler ClientGate::Guard(http::Handler handler) {
  return [self = shared_from_this(), handler = std::move(handler)](const http::Request& r) {
    if (auto refused = self->Admit(r)) return std::move(*refused);
    return handler(r);
  };
}

ClientGateStats ClientGate::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

size_t ClientGate::clients_remembered() const {
  std::lock_guard lock(mu_);
  return buckets_.keys();
}

}  // namespace colony::api
