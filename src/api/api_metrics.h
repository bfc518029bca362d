// What `colony api` has served, for its GET /metrics in Prometheus' text format (as vLLM's API
// server has one): generation requests by endpoint and HTTP status, those running, prompt and
// generated tokens, answered choices by finish_reason, streams that failed after their headers,
// the time to a request's first generated token and its whole duration as histograms, the
// requests the client gate refused, and JSON mode's kept masks.
//
//   ApiMetrics metrics;
//   auto r = metrics.Start("completions");   // then r->Prompt(n), r->FirstToken(), ...
//   r->End(200);
//   std::string text = metrics.Text({});
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "api/client_gate.h"
#include "api/json_masks.h"
#include "api/json_schema_cache.h"
#include "http/prometheus.h"

namespace colony::api {

class ApiMetrics {
 public:
  using Clock = std::function<double()>;  // seconds, monotonic
  explicit ApiMetrics(Clock now = {});    // (default: the steady clock)

  // One request to a generating endpoint, from Start until End (or its destruction, with the
  // status it was last given). Its calls come from one thread at a time.
  class Request {
   public:
    Request(ApiMetrics& metrics, std::string endpoint, double start);
    ~Request();
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;

    void Prompt(int64_t tokens);
    void FirstToken();  // the first generated token of any choice (later calls do nothing)
    void Generated(int64_t tokens);
    void Choice(std::string_view finish_reason);  // an answered choice
    void StreamFailed();                          // an error after a stream's headers
    // The whole answer was handed to the client (a stream's last event written): a hang-up
    // after it is no cut request.
    void Delivered() { delivered_ = true; }
    bool delivered() const { return delivered_; }
    void Status(int status) { status_ = status; }
    void End(int status);  // counts the request with `status` (once)

   private:
    ApiMetrics& metrics_;
    const std::string endpoint_;
    const double start_;
    int status_ = 500;  // until told: a handler that threw is answered 500
    bool first_token_ = false;
    bool delivered_ = false;
    bool ended_ = false;
  };
  std::shared_ptr<Request> Start(std::string endpoint);

  struct Others {
    std::optional<ClientGateStats> gate;             // with a client gate
    std::optional<JsonMasks::Counts> masks;          // once JSON mode has kept masks
    std::optional<JsonSchemaCache::Counts> schemas;  // once a request sent a JSON schema
  };
  std::string Text(const Others& others) const;

 private:
  double Now() const { return now_(); }

  const Clock now_;
  mutable std::mutex mu_;
  int64_t running_ = 0;
  std::map<std::pair<std::string, int>, int64_t> requests_;  // by endpoint and status
  int64_t prompt_tokens_ = 0;
  int64_t generation_tokens_ = 0;
  std::map<std::string, int64_t, std::less<>> choices_;  // by finish_reason
  int64_t stream_errors_ = 0;
  http::PrometheusHistogram first_token_;
  http::PrometheusHistogram duration_;
};

}  // namespace colony::api
