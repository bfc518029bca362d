// colony api: an OpenAI-compatible HTTP API that generates through the swarm (api/service.h).
// Part of colony-torch.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdio>

#include "api/chat_template.h"
#include "api/model_chat_template.h"
#include "api/service.h"
#include "core/clock.h"
#include "core/log.h"
#include "http/server.h"
#include "tools/commands.h"
#include "tools/swarm_args.h"

namespace colony::cli {
namespace {

struct ApiArgs {
  SwarmArgs swarm;
  std::string http = "127.0.0.1:8000";
  std::string model_id;
  std::string chat_template;
  std::string tool_call_parser = "auto";
  int max_concurrent = 16;
  int max_connections = 256;
  size_t max_body_bytes = 1 << 20;
  int64_t max_n = 8;
  size_t max_prompts = 16;
  double request_timeout = 600;
  std::string api_keys;
  double requests_per_minute = 0;
  size_t json_mask_mib = 32;
  HttpServeArgs serving;
};

int RunApi(const ApiArgs& a) {
  if (a.swarm.threads > 0) at::set_num_threads(a.swarm.threads);
  auto where = ParseHostPort(a.http);
  if (!where.ok()) return Fail(where.status());
  api::ApiOptions options;
  options.model_id = a.model_id.empty() ? ModelName(a.swarm) : a.model_id;
  options.limits.max_n = a.max_n;
  options.limits.max_prompts = a.max_prompts;
  options.json_mask_bytes = a.json_mask_mib << 20;
  if (a.tool_call_parser != "auto") {
    auto format = api::ParseToolCallFormat(a.tool_call_parser);
    if (!format.ok()) return Fail(format.status().WithContext("--tool-call-parser"));
    options.tool_format = *format;
  }
  if (!a.chat_template.empty()) {
    auto t = api::ParseChatTemplate(a.chat_template);
    if (!t.ok()) return Fail(t.status().WithContext("--chat-template"));
    options.chat_template = *t;
  } else {
    auto own = api::ModelChatTemplate::Load(a.swarm.model);
    const Status checked = !own.ok()          ? own.status()
                           : own->has_value() ? (*own)->Check()
                                              : Status::Ok();
    if (!checked.ok()) {
      return Fail(fmt::format(
          "{}; name a written-out template with --chat-template plain|chatml|llama3|llama2|mistral "
          "to serve chats without it (docs/api.md)",
          checked.message()));
    }
    if (own->has_value()) {
      COLONY_LOG_INFO("api: chat template from {}{} (tool calls: {}{})", (*own)->file(),
                      (*own)->has_tool_use() ? ", with tools from " + (*own)->file(true) : "",
                      api::ToolCallFormatName(options.tool_format.value_or((*own)->tool_format())),
                      options.tool_format ? ", --tool-call-parser" : "");
      options.chat_template.reset();
      options.model_template = std::make_shared<const api::ModelChatTemplate>(std::move(**own));
    }
  }
  if (options.tool_format && !options.model_template) {
    return Fail(fmt::format(
        "--tool-call-parser reads the calls a model's own chat template teaches it; {}",
        a.chat_template.empty()
            ? "the model directory has none (chat_template.jinja, tokenizer_config.json)"
            : "the written-out template '" + a.chat_template +
                  "' (--chat-template) takes no tools"));
  }
  if (!a.api_keys.empty() || a.requests_per_minute > 0) {
    api::ClientGateOptions gate;
    gate.requests_per_minute = a.requests_per_minute;
    if (!a.api_keys.empty()) {
      auto keys = api::LoadApiKeys(a.api_keys);
      if (!keys.ok()) return Fail(keys.status().WithContext("--api-keys"));
      gate.keys = std::move(*keys);
    }
    auto made = api::ClientGate::Create(std::move(gate));
    if (!made.ok()) return Fail(made.status().WithContext("--requests-per-minute"));
    options.gate = std::move(*made);
  }
  if (a.api_keys.empty() && !IsLoopbackHost(where->first)) {
    COLONY_LOG_WARN(
        "api: listening on {} without --api-keys: anyone who reaches this port can generate "
        "through the swarm",
        where->first);
  }
  BlockTerminationSignals();
  auto started = StartClient(a.swarm);
  if (!started.ok()) return Fail(started.status());
  if (!started->client->tokenizer) {
    return Fail(fmt::format(
        "{} has no tokenizer.model or tokenizer.json; colony api answers in text and needs one",
        a.swarm.model));
  }
  if (options.chat_template) {
    if (Status st = api::CheckChatTemplate(*options.chat_template, *started->client->tokenizer);
        !st.ok()) {
      return Fail(st.WithContext("--chat-template"));
    }
  }
  api::ApiService service(*started->client, options);
  http::ServerOptions http_options{.host = where->first,
                                   .port = where->second,
                                   .max_body_bytes = a.max_body_bytes,
                                   .max_concurrent_requests = a.max_concurrent,
                                   .max_connections = a.max_connections,
                                   .request_timeout = SecondsToMillis(a.request_timeout)};
  a.serving.ApplyTo(http_options);
  auto server = http::Server::Start(http_options, service.Routes());
  if (!server.ok()) return Fail(server.status().WithContext(a.serving.OptionNames()));
  service.SetServerStats([s = server->get()] { return s->stats(); });
  const std::string url = (*server)->BaseUrl() + "/v1";
  std::printf("%s\n", url.c_str());
  std::fflush(stdout);
  COLONY_LOG_INFO("api: serving model '{}' at {}", options.model_id, url);
  const std::string sig = WaitForTerminationSignal();
  COLONY_LOG_INFO("api: {} received; stopping", sig);
  (*server)->Stop();
  const auto stats = (*server)->stats();
  COLONY_LOG_INFO("api: {} requests, {} bad, {} refused as busy, {} streams cut, {} abandoned{}",
                  stats.requests, stats.bad_requests, stats.busy, stats.cancelled_streams,
                  stats.abandoned_requests,
                  a.serving.tls()
                      ? fmt::format(", {} failed TLS handshakes", stats.tls_handshake_failures)
                      : "");
  if (options.gate) {
    const auto refused = options.gate->stats();
    COLONY_LOG_INFO("api: {} refused without a valid key, {} over their rate", refused.unauthorized,
                    refused.rate_limited);
  }
  started->access.Stop();
  started->client->node->Shutdown();
  return 0;
}

}  // namespace

void AddApiCommand(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands) {
  auto a = std::make_shared<ApiArgs>();
  auto* cmd = app.add_subcommand(
      "api",
      "serve generation through the swarm over HTTP, compatible with the OpenAI API "
      "(/v1/completions, /v1/chat/completions, /v1/models; vLLM's /tokenize, /detokenize and "
      "/health; Prometheus' /metrics; docs/api.md)");
  AddSwarmOptions(cmd, a->swarm);
  cmd->add_option("--http", a->http,
                  "host:port to listen on (default 127.0.0.1:8000: loopback only; port 0 picks a "
                  "free one, printed on stdout)")
      ->capture_default_str();
  AddHttpServeOptions(cmd, a->serving);
  cmd->add_option("--model-id", a->model_id,
                  "the model's id in the API (default: its name in the DHT)");
  cmd->add_option("--chat-template", a->chat_template,
                  "chat template: plain, chatml, llama3, llama2 or mistral, written out "
                  "(default: the model's own Jinja template, from chat_template.jinja or "
                  "tokenizer_config.json, where it has one, otherwise plain; docs/api.md)");
  cmd->add_option("--tool-call-parser", a->tool_call_parser,
                  "how answers to requests with tools are read for calls: auto (the format the "
                  "model's chat template shows), hermes, llama3_json or mistral (docs/api.md)")
      ->capture_default_str();
  cmd->add_option("--max-concurrent", a->max_concurrent,
                  "requests generating at once (each has its own inference session); more get "
                  "503")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--max-connections", a->max_connections, "open HTTP connections at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--max-body-bytes", a->max_body_bytes, "largest request body")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1024}, size_t{64} << 20));
  cmd->add_option("--max-n", a->max_n,
                  "largest n and best_of (choices and candidates per request: rows of one session)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  cmd->add_option("--max-prompts", a->max_prompts,
                  "most prompts in one completions request (an array of prompts: run one after "
                  "another, each with its n choices)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1024}));
  cmd->add_option("--request-timeout", a->request_timeout,
                  "seconds a request may take from arrival to the end of its answer")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 86400.0));
  cmd->add_option("--api-keys", a->api_keys,
                  "file of API keys, one per line (16-256 characters, e.g. `openssl rand -hex "
                  "24`): requests must send one as 'Authorization: Bearer KEY' (401 otherwise)");
  cmd->add_option("--requests-per-minute", a->requests_per_minute,
                  "requests each client may make per minute, in bursts of up to a minute's worth "
                  "(a client is its API key, or its IP address without --api-keys; 429 with "
                  "Retry-After past it; 0: no limit)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--json-mask-mib", a->json_mask_mib,
                  "MiB that the bits of response_format json_object's and json_schema's masks (a "
                  "bit per token for each state of an answer) may take, kept for every request "
                  "(least recently used dropped first; 32 MiB: 1,760 states of a 152,000-token "
                  "vocabulary)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{65536}));
  commands.emplace_back(cmd, [a] { return RunApi(*a); });
}

}  // namespace colony::cli
