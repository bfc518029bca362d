// colony api's counters and histograms, and their Prometheus text.
#include "api/api_metrics.h"

#include <chrono>

namespace colony::api {
namespace {

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

ApiMetrics::ApiMetrics(Clock now)
    : now_(now ? std::move(now) : Clock(SteadySeconds)),
      first_token_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}),
      duration_({0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800}) {}

std::shared_ptr<ApiMetrics::Request> ApiMetrics::Start(std::string endpoint) {
  {
    const std::scoped_lock lock(mu_);
    ++running_;
  }
  return std::make_shared<Request>(*this, std::move(endpoint), Now());
}

ApiMetrics::Request::Request(ApiMetrics& metrics, std::string endpoint, double start)
    : metrics_(metrics), endpoint_(std::move(endpoint)), start_(start) {}

ApiMetrics::Request::~Request() { End(status_); }

void ApiMetrics::Request::Prompt(int64_t tokens) {
  const std::scoped_lock lock(metrics_.mu_);
  metrics_.prompt_tokens_ += tokens;
}

void ApiMetrics::Request::FirstToken() {
  if (std::exchange(first_token_, true)) return;
  const double waited = metrics_.Now() - start_;
  const std::scoped_lock lock(metrics_.mu_);
  metrics_.first_token_.Observe(waited);
}

void ApiMetrics::Request::Generated(int64_t tokens) {
  const std::scoped_lock lock(metrics_.mu_);
  metrics_.generation_tokens_ += tokens;
}

void ApiMetrics::Request::Choice(std::string_view finish_reason) {
  const std::scoped_lock lock(metrics_.mu_);
  auto it = metrics_.choices_.find(finish_reason);
  if (it == metrics_.choices_.end()) it = metrics_.choices_.emplace(finish_reason, 0).first;
  ++it->second;
}

void ApiMetrics::Request::StreamFailed() {
  const std::scoped_lock lock(metrics_.mu_);
  ++metrics_.stream_errors_;
}

void ApiMetrics::Request::End(int status) {
  if (std::exchange(ended_, true)) return;
  const double took = metrics_.Now() - start_;
  const std::scoped_lock lock(metrics_.mu_);
  --metrics_.running_;
  ++metrics_.requests_[{endpoint_, status}];
  metrics_.duration_.Observe(took);
}

std::string ApiMetrics::Text(const Others& others) const {
  using http::PrometheusFamily;
  PrometheusFamily running("colony_api_requests_running", "gauge",
                           "Generation requests being answered now.");
  PrometheusFamily requests("colony_api_requests_total", "counter",
                            "Generation requests answered, by endpoint and HTTP status.");
  PrometheusFamily prompt("colony_api_prompt_tokens_total", "counter",
                          "Prompt tokens of the generation requests run (every prompt).");
  PrometheusFamily generated("colony_api_generation_tokens_total", "counter",
                             "Tokens generated for the answers given, as usage counts them.");
  PrometheusFamily choices("colony_api_choices_total", "counter",
                           "Choices answered, by finish_reason.");
  PrometheusFamily stream_errors("colony_api_stream_errors_total", "counter",
                                 "Streamed answers that failed after their headers were sent.");
  PrometheusFamily first_token("colony_api_time_to_first_token_seconds", "histogram",
                               "From a request's handler start to its first sampled token.");
  PrometheusFamily duration("colony_api_request_duration_seconds", "histogram",
                            "From a request's handler start to the end of its answer.");
  {
    const std::scoped_lock lock(mu_);
    running.Add({}, static_cast<double>(running_));
    for (const auto& [key, n] : requests_) {
      requests.Add({{"endpoint", key.first}, {"status", std::to_string(key.second)}},
                   static_cast<double>(n));
    }
    prompt.Add({}, static_cast<double>(prompt_tokens_));
    generated.Add({}, static_cast<double>(generation_tokens_));
    for (const auto& [reason, n] : choices_)
      choices.Add({{"finish_reason", reason}}, static_cast<double>(n));
    stream_errors.Add({}, static_cast<double>(stream_errors_));
    first_token_.AddTo(first_token);
    duration_.AddTo(duration);
  }
  std::string out;
  for (const PrometheusFamily* f : {&running, &requests, &prompt, &generated, &choices,
                                    &stream_errors, &first_token, &duration}) {
    f->WriteTo(out);
  }
  if (others.gate) {
    PrometheusFamily refused("colony_api_refused_total", "counter",
                             "Requests the API keys or the rate limit refused, by reason.");
    refused.Add({{"reason", "unauthorized"}}, static_cast<double>(others.gate->unauthorized));
    refused.Add({{"reason", "rate_limited"}}, static_cast<double>(others.gate->rate_limited));
    refused.WriteTo(out);
  }
  if (others.masks) {
    const JsonMasks::Counts& m = *others.masks;
    PrometheusFamily lookups("colony_api_json_mask_lookups_total", "counter",
                             "JSON mode's looks for a kept mask of an answer's state, by result.");
    lookups.Add({{"result", "hit"}}, static_cast<double>(m.hits));
    lookups.Add({{"result", "miss"}}, static_cast<double>(m.misses));
    lookups.WriteTo(out);
    http::WritePrometheusSample(out, "colony_api_json_masks_dropped_total", "counter",
                                "Kept JSON mode masks dropped to stay within --json-mask-mib.",
                                static_cast<double>(m.dropped));
    http::WritePrometheusSample(out, "colony_api_json_masks", "gauge", "JSON mode masks kept now.",
                                static_cast<double>(m.masks));
    http::WritePrometheusSample(out, "colony_api_json_mask_bytes", "gauge",
                                "Bytes the kept JSON mode masks take.",
                                static_cast<double>(m.bytes));
  }
  if (others.schemas) {
    PrometheusFamily lookups(
        "colony_api_json_schema_lookups_total", "counter",
        "Requests' JSON schemas looked for among those compiled before, by result.");
    lookups.Add({{"result", "hit"}}, static_cast<double>(others.schemas->hits));
    lookups.Add({{"result", "miss"}}, static_cast<double>(others.schemas->misses));
    lookups.WriteTo(out);
    http::WritePrometheusSample(out, "colony_api_json_schemas", "gauge",
                                "Compiled JSON schemas kept now.",
                                static_cast<double>(others.schemas->schemas));
  }
  return out;
}

}  // namespace colony::api
