// colony api's GET /metrics text for requests whose times and counts are set by hand, against the
// exposition written out by hand (Prometheus' text format 0.0.4: cumulative buckets, a value on a
// bound counted in that bound's bucket).
#include "api/api_metrics.h"

#include <gtest/gtest.h>

#include <string>

namespace colony::api {
namespace {

TEST(ApiMetrics, CountsWhatItsRequestsReport) {
  double now = 0;  // (the differences below are then exact)
  ApiMetrics m([&now] { return now; });
  {
    auto a = m.Start("completions");
    a->Prompt(5);
    a->Prompt(3);
    now += 0.05;  // on the 0.05 bound
    a->FirstToken();
    now += 0.2;
    a->FirstToken();  // not the first
    a->Generated(7);
    a->Choice("length");
    a->Choice("stop");
    a->Choice("stop");
    EXPECT_NE(m.Text({}).find("\ncolony_api_requests_running 1\n"), std::string::npos);
    a->End(200);
    a->End(500);  // counted once
  }
  {
    auto b = m.Start("chat_completions");
    b->Status(503);
    b->StreamFailed();
    now += 700;
  }  // ends with its last status
  m.Start("completions")->End(400);
  { auto thrown = m.Start("completions"); }  // a handler that threw: the server answers 500

  const std::string want =
      R"(# HELP colony_api_requests_running Generation requests being answered now.
# TYPE colony_api_requests_running gauge
colony_api_requests_running 0
# HELP colony_api_requests_total Generation requests answered, by endpoint and HTTP status.
# TYPE colony_api_requests_total counter
colony_api_requests_total{endpoint="chat_completions",status="503"} 1
colony_api_requests_total{endpoint="completions",status="200"} 1
colony_api_requests_total{endpoint="completions",status="400"} 1
colony_api_requests_total{endpoint="completions",status="500"} 1
# HELP colony_api_prompt_tokens_total Prompt tokens of the generation requests run (every prompt).
# TYPE colony_api_prompt_tokens_total counter
colony_api_prompt_tokens_total 8
# HELP colony_api_generation_tokens_total Tokens generated for the answers given, as usage counts them.
# TYPE colony_api_generation_tokens_total counter
colony_api_generation_tokens_total 7
# HELP colony_api_choices_total Choices answered, by finish_reason.
# TYPE colony_api_choices_total counter
colony_api_choices_total{finish_reason="length"} 1
colony_api_choices_total{finish_reason="stop"} 2
# HELP colony_api_stream_errors_total Streamed answers that failed after their headers were sent.
# TYPE colony_api_stream_errors_total counter
colony_api_stream_errors_total 1
# HELP colony_api_time_to_first_token_seconds From a request's handler start to its first sampled token.
# TYPE colony_api_time_to_first_token_seconds histogram
colony_api_time_to_first_token_seconds_bucket{le="0.01"} 0
colony_api_time_to_first_token_seconds_bucket{le="0.025"} 0
colony_api_time_to_first_token_seconds_bucket{le="0.05"} 1
colony_api_time_to_first_token_seconds_bucket{le="0.1"} 1
colony_api_time_to_first_token_seconds_bucket{le="0.25"} 1
colony_api_time_to_first_token_seconds_bucket{le="0.5"} 1
colony_api_time_to_first_token_seconds_bucket{le="1"} 1
colony_api_time_to_first_token_seconds_bucket{le="2.5"} 1
colony_api_time_to_first_token_seconds_bucket{le="5"} 1
colony_api_time_to_first_token_seconds_bucket{le="10"} 1
colony_api_time_to_first_token_seconds_bucket{le="30"} 1
colony_api_time_to_first_token_seconds_bucket{le="60"} 1
colony_api_time_to_first_token_seconds_bucket{le="120"} 1
colony_api_time_to_first_token_seconds_bucket{le="+Inf"} 1
colony_api_time_to_first_token_seconds_sum 0.05
colony_api_time_to_first_token_seconds_count 1
# HELP colony_api_request_duration_seconds From a request's handler start to the end of its answer.
# TYPE colony_api_request_duration_seconds histogram
colony_api_request_duration_seconds_bucket{le="0.1"} 2
colony_api_request_duration_seconds_bucket{le="0.25"} 3
colony_api_request_duration_seconds_bucket{le="0.5"} 3
colony_api_request_duration_seconds_bucket{le="1"} 3
colony_api_request_duration_seconds_bucket{le="2.5"} 3
colony_api_request_duration_seconds_bucket{le="5"} 3
colony_api_request_duration_seconds_bucket{le="10"} 3
colony_api_request_duration_seconds_bucket{le="30"} 3
colony_api_request_duration_seconds_bucket{le="60"} 3
colony_api_request_duration_seconds_bucket{le="120"} 3
colony_api_request_duration_seconds_bucket{le="300"} 3
colony_api_request_duration_seconds_bucket{le="600"} 3
colony_api_request_duration_seconds_bucket{le="1800"} 4
colony_api_request_duration_seconds_bucket{le="+Inf"} 4
colony_api_request_duration_seconds_sum 700.25
colony_api_request_duration_seconds_count 4
)";
  EXPECT_EQ(m.Text({}), want);
}

TEST(ApiMetrics, TheGatesRefusalsAndTheKeptMasksAndSchemasWhenThereAreAny) {
  ApiMetrics m;
  const std::string bare = m.Text({});
  EXPECT_EQ(bare.find("colony_api_refused_total"), std::string::npos);
  EXPECT_EQ(bare.find("colony_api_json_mask"), std::string::npos);
  EXPECT_EQ(bare.find("colony_api_json_schema"), std::string::npos);
  const std::string text =
      m.Text({.gate = ClientGateStats{.unauthorized = 4, .rate_limited = 2},
              .masks =
                  JsonMasks::Counts{
                      .hits = 90, .misses = 10, .dropped = 3, .masks = 7, .bytes = 7 * 19008},
              .schemas = JsonSchemaCache::Counts{
                  .hits = 5, .misses = 2, .dropped = 0, .schemas = 2, .bytes = 900}});
  EXPECT_EQ(
      text.substr(bare.size()),
      R"(# HELP colony_api_refused_total Requests the API keys or the rate limit refused, by reason.
# TYPE colony_api_refused_total counter
colony_api_refused_total{reason="unauthorized"} 4
colony_api_refused_total{reason="rate_limited"} 2
# HELP colony_api_json_mask_lookups_total JSON mode's looks for a kept mask of an answer's state, by result.
# TYPE colony_api_json_mask_lookups_total counter
colony_api_json_mask_lookups_total{result="hit"} 90
colony_api_json_mask_lookups_total{result="miss"} 10
# HELP colony_api_json_masks_dropped_total Kept JSON mode masks dropped to stay within --json-mask-mib.
# TYPE colony_api_json_masks_dropped_total counter
colony_api_json_masks_dropped_total 3
# HELP colony_api_json_masks JSON mode masks kept now.
# TYPE colony_api_json_masks gauge
colony_api_json_masks 7
# HELP colony_api_json_mask_bytes Bytes the kept JSON mode masks take.
# TYPE colony_api_json_mask_bytes gauge
colony_api_json_mask_bytes 133056
# HELP colony_api_json_schema_lookups_total Requests' JSON schemas looked for among those compiled before, by result.
# TYPE colony_api_json_schema_lookups_total counter
colony_api_json_schema_lookups_total{result="hit"} 5
colony_api_json_schema_lookups_total{result="miss"} 2
# HELP colony_api_json_schemas Compiled JSON schemas kept now.
# TYPE colony_api_json_schemas gauge
colony_api_json_schemas 2
)");
}

}  // namespace
}  // namespace colony::api
