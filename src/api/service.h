// The OpenAI-compatible generation API over a swarm (`colony api`, as chat.petals.dev over
// Petals): GET /v1/models and /v1/models/{id}, POST /v1/completions and POST
// /v1/chat/completions, answered whole or as server-sent events token by token, and vLLM's POST
// /tokenize, /detokenize and GET /health, and GET /metrics (Prometheus, api/api_metrics.h). Each
// request (each prompt of a batch) opens its own inference session(s) in the swarm, so
// concurrent requests do not share a KV cache, and a server that dies mid-request is replaced by
// the session's failover without the client noticing.
//
//   auto client = serve::ConnectToSwarm({.model_dir = dir, .initial_peers = {addr}});
//   api::ApiService api(**client, {.model_id = "llama"});
//   auto server = http::Server::Start({.port = 8000}, api.Routes());
//
// n > 1 runs n independent samples (temperature > 0; seeds seed, seed+1, ... when a seed is
// given), or, with temperature 0, beam search with n beams whose answers are the n best beams
// (not streamable). docs/api.md lists every field and what it does.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "api/api_metrics.h"
#include "api/chat_template.h"
#include "api/client_gate.h"
#include "api/json_masks.h"
#include "api/json_mode.h"
#include "api/json_schema_cache.h"
#include "api/model_chat_template.h"
#include "api/openai_request.h"
#include "http/server.h"
#include "http/server_metrics.h"
#include "serve/swarm_client.h"

namespace colony::api {

struct ApiOptions {
  std::string model_id;  // what /v1/models lists and requests may name
  // The chat template: the model's own (a Jinja program) where it has one and the operator did
  // not name a written-out one, which is then unset.
  std::optional<ChatTemplate> chat_template = ChatTemplate::kPlain;
  std::shared_ptr<const ModelChatTemplate> model_template = nullptr;
  // How answers to requests with tools are read for calls, instead of the format the model's
  // template shows (colony api --tool-call-parser).
  std::optional<ToolCallFormat> tool_format = std::nullopt;
  RequestLimits limits = {};
  // API keys and per-client rates (null: anyone who reaches the port, as fast as it likes).
  std::shared_ptr<ClientGate> gate = nullptr;
  // The memory the bits of response_format json_object's masks, kept for every request, may take
  // (api/json_masks.h; colony api --json-mask-mib): 32 MiB holds 1,760 states' masks of a
  // 152,000-token vocabulary.
  size_t json_mask_bytes = size_t{32} << 20;
};

class ApiService {
 public:
  // `client` (with a tokenizer) must outlive the service and every request it serves.
  ApiService(serve::SwarmClient& client, ApiOptions options);
  ~ApiService();
  ApiService(const ApiService&) = delete;
  ApiService& operator=(const ApiService&) = delete;

  http::Router Routes();
  // The HTTP server's counters, which GET /metrics then shows too (http/server_metrics.h); the
  // function must stay callable while the service serves.
  void SetServerStats(std::function<http::ServerStats()> stats);

  struct Choice;
  struct Plan;

 private:
  http::Reply Models() const;
  http::Reply Model(std::string_view id) const;                // GET /v1/models/{id}
  http::Reply Health() const;                                  // GET /health
  http::Reply Tokenize(const http::Request& request) const;    // POST /tokenize (vLLM's)
  http::Reply Detokenize(const http::Request& request) const;  // POST /detokenize (vLLM's)
  http::Reply NoSuchModel(std::string_view id) const;          // 404 model_not_found
  // The prompt (`prompt`, of several) or chat that generation would run on, as token ids (with
  // the chat's stops, end tokens and tool format) into `plan`; InvalidArgument naming the field.
  Status Encode(const GenerationRequest& r, size_t prompt, Plan& plan) const;
  // A generation request, counted in metrics_ until its answer (a stream's last write) ends.
  http::Reply Counted(const http::Request& request, bool chat);
  http::Reply Generate(const http::Request& request, bool chat,
                       const std::shared_ptr<ApiMetrics::Request>& record);
  http::Reply Metrics() const;  // GET /metrics (Prometheus' text format)
  Result<Plan> MakePlan(const GenerationRequest& r, size_t prompt) const;
  // Every token's text (api/json_mode.h) and the masks kept of them for every request
  // (api/json_masks.h), made once, when response_format json_object first needs them.
  std::shared_ptr<JsonMasks> JsonModeMasks() const;

  serve::SwarmClient& client_;
  ApiOptions options_;
  ModelChatTemplate::TurnEnd model_turn_end_;       // of options_.model_template
  ModelChatTemplate::TurnEnd model_tool_turn_end_;  // of the template it runs with tools
  mutable std::once_flag json_masks_once_;
  mutable std::shared_ptr<JsonMasks> json_masks_;     // JsonModeMasks()
  mutable std::atomic<bool> json_masks_made_{false};  // (for /metrics, without making them)
  // response_format json_schema's schemas, each text compiled once for every request that sends
  // it, so that they share its states' masks.
  JsonSchemaCache json_schemas_;
  ApiMetrics metrics_;
  http::ServerStatsSource server_stats_;  // SetServerStats()
  // /health's last answer and when it was found: probes, which need no key, are answered from it
  // for a second, so that any number of them costs one route a second.
  // A probe finds the answer while none is being found (outside the lock); the others meanwhile
  // get the last one (or 503 before the first).
  mutable std::mutex health_mu_;
  mutable std::chrono::steady_clock::time_point health_at_;
  mutable std::optional<http::Reply> health_;
  mutable bool health_finding_ = false;
};

}  // namespace colony::api
