// The API's handlers: parse and plan a request (prompt tokens, room, stop strings, sampling), run
// its choices as the rows of one inference session, and answer in the OpenAI wire format, whole or
// as server-sent events.
#include "api/service.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "api/json_mode.h"
#include "api/logit_adjustments.h"
#include "api/text_stream.h"
#include "api/token_logprobs.h"
#include "api/tool_calls.h"
#include "core/log.h"
#include "serve/generation.h"
#include "serve/remote_sequential.h"

namespace colony::api {

namespace {

using json = nlohmann::json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string RandomId(std::string_view prefix) {
  std::random_device rd;
  return fmt::format("{}{:08x}{:08x}{:08x}", prefix, rd(), rd(), rd());
}

int64_t UnixTime() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A swarm failure in the OpenAI error shape: 503 when no server could take the request.
http::Reply SwarmError(const Status& st) {
  return http::JsonError(
      st.code() == StatusCode::kInvalidArgument ? 400 : 503,
      "the swarm could not serve this request: " + st.message(),
      st.code() == StatusCode::kInvalidArgument ? "invalid_request_error" : "server_error");
}

// The OpenAI API's model object of the served model.
json ModelObject(const std::string& id) {
  return {{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "colony"}};
}

// How an error names a request's prompt: by its index when it is one of several.
std::string PromptField(const GenerationRequest& r, size_t prompt) {
  return r.prompts.size() > 1 ? fmt::format("prompt[{}]", prompt) : std::string("prompt");
}

// A path segment with its %XX escapes decoded (others kept as sent).
std::string PercentDecoded(std::string_view s) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && digit(s[i + 1]) >= 0 && digit(s[i + 2]) >= 0) {
      out += static_cast<char>(digit(s[i + 1]) * 16 + digit(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

struct ApiService::Plan {
  std::vector<int64_t> prompt;
  int64_t max_new_tokens = 0;
  // The request's stop strings (the first request_stops), then a chat template's end of turn
  // written as text.
  std::vector<std::string> stops;
  size_t request_stops = 0;
  bool beams = false;     // best_of (n when absent) > 1 at temperature 0, with tokens to generate
  std::string echo_text;  // what the answer starts with (echo: the prompt)
  // Tokens that end the answer: the EOS, generation_config.json's end tokens, a chat template's
  // end of turn (none of these with ignore_eos), and the request's stop_token_ids.
  std::vector<int64_t> end_tokens;
  size_t model_end_tokens = 0;  // the first of them, before the stop_token_ids
  // The request's tools, and how the model writes calls to them (kNone: no tools).
  ToolCallFormat tool_format = ToolCallFormat::kNone;
  std::vector<std::string> tool_names;

  int64_t max_length() const { return static_cast<int64_t>(prompt.size()) + max_new_tokens; }
};

namespace {

// An inference session of its own over the whole model (closed when this goes), with the decoder
// that the generation code steps: max_length positions, `rows` rows (beams).
struct SwarmDecoder {
  SwarmDecoder(serve::SwarmClient& client, int64_t max_length, int64_t rows)
      : session(serve::RemoteSequential(client.manager)
                    .OpenSession({.max_length = max_length, .batch_size = rows})),
        backend(client.head, *session, max_length) {}

  std::unique_ptr<serve::InferenceSession> session;
  serve::RemoteBackend backend;
};

// Beam search keeps each beam's running score, not its tokens' log-probabilities: a beam that is
// answered is scored again, in a session of its own, as an echoed prompt is.
Result<std::vector<TokenLogprob>> ScoreBeam(serve::SwarmClient& client,
                                            const std::vector<int64_t>& prompt,
                                            const std::vector<int64_t>& answer, int64_t top,
                                            bool echo) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> all = prompt;
  all.insert(all.end(), answer.begin(), answer.end());
  SwarmDecoder decoder(client, static_cast<int64_t>(all.size()), 1);
  LogprobRecorder recorder(decoder.backend, top, /*score_prompt=*/true);
  COLONY_RETURN_IF_ERROR(
      recorder.Step(at::tensor(all, at::kLong).unsqueeze(0), 0, {}, serve::StepLogits::kLast)
          .status());
  std::vector<TokenLogprob> entries = recorder.Take();
  if (!echo)
    entries.erase(entries.begin(), entries.begin() + static_cast<ptrdiff_t>(prompt.size()));
  return entries;
}

}  // namespace

struct ApiService::Choice {
  std::string text;
  int64_t tokens = 0;  // generated (stop strings included)
  std::string finish_reason;
  // vLLM's: the request's stop string or the token id that ended the answer; null when it ended
  // at the tokenizer's EOS (unless ignore_eos made that a stop token id), at a chat template's
  // end of turn written as text, or at max_tokens.
  json stop_reason;
  std::vector<TokenLogprob> logprobs;  // when asked for (and not streamed)
  // With tools: the calls the answer makes (then `text` is the content besides them, null
  // when there is none).
  std::vector<ToolCall> calls;
  bool content_null = false;
  // best_of's rank: the mean log-probability of the generated tokens, the end token's included.
  double rank_score = 0;

  // Reads the calls out of the text, as the plan's format writes them.
  void ReadCalls(const Plan& plan) {
    if (plan.tool_format == ToolCallFormat::kNone) return;
    Answer a = ReadToolCalls(plan.tool_format, text, plan.tool_names);
    if (a.calls.empty()) return;
    text = std::move(a.content);
    content_null = a.content_null;
    calls = std::move(a.calls);
    finish_reason = "tool_calls";
  }
};

ApiService::ApiService(serve::SwarmClient& client, ApiOptions options)
    : client_(client), options_(std::move(options)) {
  if (options_.model_template && client_.tokenizer) {
    model_turn_end_ = options_.model_template->EndOfTurn(*client_.tokenizer);
    model_tool_turn_end_ = options_.model_template->has_tool_use()
                               ? options_.model_template->EndOfTurn(*client_.tokenizer, true)
                               : model_turn_end_;
  }
}

ApiService::~ApiService() = default;

http::Router ApiService::Routes() {
  const auto guarded = [this](http::Handler h) {
    return options_.gate ? options_.gate->Guard(std::move(h)) : h;
  };
  http::Router router;
  router.Add("GET", "/v1/models", guarded([this](const http::Request&) { return Models(); }));
  router.AddPrefix("GET", "/v1/models/", guarded([this](const http::Request& r) {
                     return Model(std::string_view(r.path).substr(std::size("/v1/models/") - 1));
                   }));
  router.Add("POST", "/tokenize", guarded([this](const http::Request& r) { return Tokenize(r); }));
  router.Add("POST", "/detokenize",
             guarded([this](const http::Request& r) { return Detokenize(r); }));
  // Whether a route through the swarm serves the model now, for load balancers' probes: no key
  // is asked for (it tells nothing a server's DHT records do not).
  router.Add("GET", "/health", [this](const http::Request&) { return Health(); });
  router.Add("POST", "/v1/completions",
             guarded([this](const http::Request& r) { return Counted(r, /*chat=*/false); }));
  router.Add("POST", "/v1/chat/completions",
             guarded([this](const http::Request& r) { return Counted(r, /*chat=*/true); }));
  // What the API has served, in Prometheus' text format (behind the keys, as the endpoints
  // whose traffic it counts).
  router.Add("GET", "/metrics", guarded([this](const http::Request&) { return Metrics(); }));
  return router;
}

http::Reply ApiService::Counted(const http::Request& request, bool chat) {
  // (An exception out of Generate ends the record with its first status, 500, as the server
  // answers it.)
  auto record = metrics_.Start(chat ? "chat_completions" : "completions");
  http::Reply reply = Generate(request, chat, record);
  // A request whose handler was told to stop before its answer was whole (its client gone, its
  // --request-timeout passed, the server stopping): 499, as nginx counts a client that closed
  // its request.
  constexpr int kCut = 499;
  record->Status(reply.status);  // (should the stream never run)
  if (!reply.stream) {
    record->End(request.cancelled() ? kCut : reply.status);
    return reply;
  }
  reply.stream = [inner = std::move(reply.stream), record,
                  status = reply.status](http::StreamWriter& out) {
    try {
      inner(out);
    } catch (...) {
      record->StreamFailed();
      record->End(status);
      throw;
    }
    record->End(out.cancelled() && !record->delivered() ? kCut : status);
  };
  return reply;
}

void ApiService::SetServerStats(std::function<http::ServerStats()> stats) {
  server_stats_.Attach(std::move(stats));
}

http::Reply ApiService::Metrics() const {
  ApiMetrics::Others others;
  if (options_.gate) others.gate = options_.gate->stats();
  if (json_masks_made_.load(std::memory_order_acquire)) others.masks = json_masks_->counts();
  if (const auto c = json_schemas_.counts(); c.hits + c.misses > 0) others.schemas = c;
  http::Reply r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = metrics_.Text(others);
  server_stats_.AddTo(r.body);
  return r;
}

http::Reply ApiService::NoSuchModel(std::string_view id) const {
  return http::JsonError(404,
                         fmt::format("the model '{}' does not exist; this server serves '{}'",
                                     id.substr(0, 256), options_.model_id),
                         "invalid_request_error", "model_not_found");
}

http::Reply ApiService::Models() const {
  return http::Json(
      200, Dump({{"object", "list"}, {"data", json::array({ModelObject(options_.model_id)})}}));
}

http::Reply ApiService::Model(std::string_view id) const {
  // An id with a '/' (an organisation's model) may come percent-encoded.
  const std::string decoded = PercentDecoded(id);
  if (decoded != options_.model_id) return NoSuchModel(decoded);
  return http::Json(200, Dump(ModelObject(options_.model_id)));
}

http::Reply ApiService::Tokenize(const http::Request& request) const {
  auto parsed = ParseTokenizeRequest(request.body, options_.limits);
  if (!parsed.ok()) return http::JsonError(400, parsed.status().message());
  const GenerationRequest& r = parsed->what;
  if (!r.model.empty() && r.model != options_.model_id) return NoSuchModel(r.model);
  Plan plan;
  if (Status st = Encode(r, 0, plan); !st.ok()) return http::JsonError(400, st.message());
  // (A text prompt's tokens begin with the BOS that Encode put first, when the model has one.)
  if (!r.chat && !parsed->add_special_tokens && client_.tokenizer->bos_id() >= 0) {
    plan.prompt.erase(plan.prompt.begin());
  }
  return http::Json(200, Dump({{"count", plan.prompt.size()},
                               {"max_model_len", client_.head->config().max_seq_len},
                               {"tokens", plan.prompt},
                               {"token_strs", nullptr}}));
}

http::Reply ApiService::Detokenize(const http::Request& request) const {
  auto parsed = ParseDetokenizeRequest(request.body, options_.limits);
  if (!parsed.ok()) return http::JsonError(400, parsed.status().message());
  if (!parsed->model.empty() && parsed->model != options_.model_id) {
    return NoSuchModel(parsed->model);
  }
  if (!client_.tokenizer) {
    return http::JsonError(400, "the model directory has no tokenizer");
  }
  const int64_t vocab = client_.head->config().vocab_size;
  std::vector<int32_t> ids;
  for (size_t i = 0; i < parsed->tokens.size(); ++i) {
    const int64_t t = parsed->tokens[i];
    if (t >= vocab) {
      return http::JsonError(
          400,
          fmt::format("'tokens[{}]': token {} is outside the vocabulary [0, {})", i, t, vocab));
    }
    ids.push_back(static_cast<int32_t>(t));
  }
  return http::Json(200, Dump({{"prompt", client_.tokenizer->Decode(ids)}}));
}

http::Reply ApiService::Health() const {
  {
    std::lock_guard lock(health_mu_);
    const bool fresh =
        health_ && std::chrono::steady_clock::now() - health_at_ < std::chrono::seconds(1);
    if (fresh || health_finding_) {
      if (health_) return *health_;
      return http::JsonError(503, "colony api is finding its first route through the swarm",
                             "server_error");
    }
    health_finding_ = true;
  }
  // However this ends (a throw included), the next probe may look again.
  struct Found {
    std::mutex& mu;
    bool& finding;
    ~Found() {
      std::lock_guard lock(mu);
      finding = false;
    }
  } found{health_mu_, health_finding_};
  const int64_t blocks = client_.manager->options().num_blocks;
  auto route = client_.manager->MakeRoute(0, blocks, serve::RoutingMode::kMinLatency);
  http::Reply reply =
      route.ok() ? http::Json(200, Dump({{"status", "ok"},
                                         {"model", options_.model_id},
                                         {"blocks", blocks},
                                         {"route_servers", route->size()}}))
                 : http::JsonError(
                       503, "the swarm cannot serve the model now: " + route.status().message(),
                       "server_error");
  std::lock_guard lock(health_mu_);
  health_ = reply;
  health_at_ = std::chrono::steady_clock::now();  // (finding it may have taken seconds)
  return reply;
}

Status ApiService::Encode(const GenerationRequest& r, size_t prompt, Plan& plan) const {
  if (!client_.tokenizer) return FailedPrecondition("the model directory has no tokenizer");
  const model::Tokenizer& tok = *client_.tokenizer;
  if (r.chat) {
    const bool tool_turns = std::ranges::any_of(r.messages, [](const ChatMessage& m) {
      return m.role == "tool" || !m.tool_calls.empty() || m.content_null;
    });
    if (options_.chat_template && !r.template_kwargs_json.empty()) {
      return InvalidArgument(fmt::format(
          "'chat_template_kwargs': this server runs the written-out template '{}' (colony api "
          "--chat-template), which has no variables",
          ChatTemplateName(*options_.chat_template)));
    }
    if (options_.chat_template && (!r.tools_json.empty() || tool_turns)) {
      return InvalidArgument(fmt::format(
          "'{}': tools need the model's own chat template; this server runs the written-out "
          "template '{}' (colony api --chat-template)",
          r.tools_json.empty() ? "messages" : "tools", ChatTemplateName(*options_.chat_template)));
    }
    if (options_.chat_template) {
      COLONY_ASSIGN_OR_RETURN(auto pieces, RenderChat(*options_.chat_template, r.messages));
      plan.prompt = EncodeChat(pieces, tok);
      plan.stops = ChatStops(*options_.chat_template);
      plan.end_tokens = ChatStopTokens(*options_.chat_template, tok);
    } else if (options_.model_template) {
      const ModelChatTemplate& model_template = *options_.model_template;
      const ToolCallFormat format = options_.tool_format.value_or(model_template.tool_format());
      if (!r.tools_json.empty() && format == ToolCallFormat::kNone) {
        return InvalidArgument(fmt::format(
            "'tools': colony api does not know how this model writes tool calls: its chat "
            "template ({}) shows none of Hermes' and Qwen's <tool_call>, Llama 3.1's "
            "<|python_tag|> or Mistral's [TOOL_CALLS] (colony api --tool-call-parser names "
            "one)",
            model_template.file(true)));
      }
      COLONY_ASSIGN_OR_RETURN(
          auto pieces, model_template.Render(r.messages, r.tools_json, r.template_kwargs_json));
      if (!r.tools_json.empty()) {
        plan.tool_format = format;
        plan.tool_names = r.tool_names;
      }
      plan.prompt = EncodeChat(pieces, tok);
      const auto& turn_end = r.tools_json.empty() ? model_turn_end_ : model_tool_turn_end_;
      plan.stops = turn_end.stops;
      plan.end_tokens = turn_end.tokens;
    } else {
      return FailedPrecondition("colony api was started without a chat template");
    }
  } else if (r.prompts.at(prompt).is_tokens) {
    plan.prompt = r.prompts[prompt].tokens;
  } else {
    if (tok.bos_id() >= 0) plan.prompt.push_back(tok.bos_id());
    for (int32_t id : tok.Encode(r.prompts[prompt].text)) plan.prompt.push_back(id);
  }
  const std::string prompt_field = PromptField(r, prompt);
  if (plan.prompt.empty()) return InvalidArgument(fmt::format("'{}' is empty", prompt_field));
  return Status::Ok();
}

Result<ApiService::Plan> ApiService::MakePlan(const GenerationRequest& r, size_t prompt) const {
  Plan plan;
  COLONY_RETURN_IF_ERROR(Encode(r, prompt, plan));
  const auto& config = client_.head->config();
  const model::Tokenizer& tok = *client_.tokenizer;
  const std::string prompt_field = PromptField(r, prompt);
  for (int64_t t : plan.prompt) {
    if (t < 0 || t >= config.vocab_size) {
      return InvalidArgument(fmt::format("'{}': token {} is outside the vocabulary [0, {})",
                                         prompt_field, t, config.vocab_size));
    }
  }
  const int64_t room = config.max_seq_len - static_cast<int64_t>(plan.prompt.size());
  if (room < r.max_tokens.value_or(1)) {
    return Status(StatusCode::kOutOfRange,
                  fmt::format("this model's context is {} tokens; the prompt has {} and {} were "
                              "asked to be generated",
                              config.max_seq_len, plan.prompt.size(), r.max_tokens.value_or(1)));
  }
  plan.max_new_tokens =
      r.max_tokens ? *r.max_tokens : (r.chat ? room : std::min<int64_t>(16, room));
  if (r.min_tokens > plan.max_new_tokens) {  // (an explicit max_tokens was checked in parsing)
    if (plan.max_new_tokens == room) {
      return Status(StatusCode::kOutOfRange,
                    fmt::format("'min_tokens' is {}, more than the {} tokens this model's context "
                                "of {} leaves after the prompt's {}",
                                r.min_tokens, room, config.max_seq_len, plan.prompt.size()));
    }
    return InvalidArgument(
        fmt::format("'min_tokens' is {}, more than max_tokens' default ({}); send max_tokens",
                    r.min_tokens, plan.max_new_tokens));
  }
  plan.stops.insert(plan.stops.begin(), r.stop.begin(), r.stop.end());
  plan.request_stops = r.stop.size();
  // The EOS and the model's generation_config.json's end tokens end an answer.
  auto end_with = [&plan](int64_t t) {
    if (std::ranges::find(plan.end_tokens, t) == plan.end_tokens.end()) {
      plan.end_tokens.push_back(t);
    }
  };
  for (int64_t t : client_.generation.eos_token_ids) end_with(t);
  if (tok.eos_id() >= 0) end_with(tok.eos_id());
  // ignore_eos: the model's end tokens are tokens like any other, and a chat template's end of
  // turn written as text is no stop string; the request's stop strings stay.
  if (r.ignore_eos) {
    plan.end_tokens.clear();
    plan.stops = r.stop;
  }
  // stop_token_ids (vLLM's) end the answer as the end tokens do, ignore_eos or not.
  plan.model_end_tokens = plan.end_tokens.size();
  for (int64_t t : r.stop_token_ids) {
    if (t >= config.vocab_size) {
      return InvalidArgument(
          fmt::format("'stop_token_ids': token {} is outside the vocabulary "
                      "[0, {})",
                      t, config.vocab_size));
    }
    end_with(t);
  }
  // (max_tokens 0 with echo scores the prompt: no beams to search.)
  plan.beams = r.best_of > 1 && r.temperature == 0 && plan.max_new_tokens > 0;
  if (r.echo) {
    std::vector<int32_t> ids(plan.prompt.begin(), plan.prompt.end());
    plan.echo_text = r.prompts.at(prompt).is_tokens ? tok.Decode(ids) : r.prompts[prompt].text;
  }
  for (const auto& [token, bias] : r.logit_bias) {
    if (token >= config.vocab_size) {
      return InvalidArgument(fmt::format("'logit_bias.{}' is outside the vocabulary [0, {})", token,
                                         config.vocab_size));
    }
  }
  if (!r.allowed_token_ids.empty()) {
    if (r.allowed_token_ids.back() >= config.vocab_size) {  // (sorted)
      return InvalidArgument(
          fmt::format("'allowed_token_ids': token {} is outside the vocabulary [0, {})",
                      r.allowed_token_ids.back(), config.vocab_size));
    }
    // While min_tokens holds the end tokens back, some allowed token must be left to choose.
    const bool only_ends = std::ranges::all_of(r.allowed_token_ids, [&plan](int64_t t) {
      return std::ranges::find(plan.end_tokens, t) != plan.end_tokens.end();
    });
    if (r.min_tokens > 0 && only_ends) {
      return InvalidArgument(
          "'allowed_token_ids': every allowed token is an end or stop token, which min_tokens "
          "keeps from being chosen");
    }
  }
  if (plan.beams && (r.presence_penalty != 0 || r.frequency_penalty != 0 || !r.logit_bias.empty() ||
                     r.min_tokens > 0 || !r.allowed_token_ids.empty() || r.json_object)) {
    const std::string_view field = r.best_of > r.n ? "best_of" : "n";
    return InvalidArgument(fmt::format(
        "'{}': {} > 1 at temperature 0 runs beam search, which presence_penalty, "
        "frequency_penalty, logit_bias, min_tokens, allowed_token_ids and response_format "
        "json_object or json_schema do not apply to; ask for a temperature above 0 (the model's "
        "default temperature may be 0) for samples",
        field, field));
  }
  if (r.json_object) {
    // The answer ends with its object: a chat template's end of turn written as text is no stop
    // (a model could write it inside a string); the request's stops stay.
    plan.stops.resize(plan.request_stops);
    if (!r.allowed_token_ids.empty()) {
      return InvalidArgument(fmt::format(
          "'allowed_token_ids' cannot be asked for with response_format {} (each keeps tokens "
          "from being chosen: together they could leave none)",
          r.json_schema ? "json_schema" : "json_object"));
    }
    if (!JsonModeMasks()->texts()->begins_object) {  // (read once, at the first such request)
      return InvalidArgument(fmt::format(
          "'response_format': {} needs a token that begins a JSON object ('{{'), and this "
          "model's tokenizer has none",
          r.json_schema ? "json_schema" : "json_object"));
    }
  }
  if (plan.beams && r.stream) {
    return InvalidArgument(
        "'stream': n > 1 at temperature 0 runs beam search, whose answers are known only at the "
        "end; use stream: false, or a temperature above 0 for n samples");
  }
  return plan;
}

std::shared_ptr<JsonMasks> ApiService::JsonModeMasks() const {
  std::call_once(json_masks_once_, [this] {
    json_masks_ =
        std::make_shared<JsonMasks>(ReadTokenTexts(*client_.tokenizer), options_.json_mask_bytes);
    json_masks_made_.store(true, std::memory_order_release);
  });
  return json_masks_;
}

http::Reply ApiService::Generate(const http::Request& request, bool chat,
                                 const std::shared_ptr<ApiMetrics::Request>& record) {
  const model::SamplingDefaults defaults = client_.generation.Over(kOpenAiSampling);
  auto parsed = chat ? ParseChatRequest(request.body, options_.limits, defaults)
                     : ParseCompletionRequest(request.body, options_.limits, defaults);
  if (!parsed.ok()) return http::JsonError(400, parsed.status().message());
  GenerationRequest r = std::move(*parsed);
  if (!r.model.empty() && r.model != options_.model_id) return NoSuchModel(r.model);
  // One plan per prompt (chat: one), all made before anything runs: a bad prompt among
  // several fails the request.
  auto plans = std::make_shared<std::vector<Plan>>();
  for (size_t k = 0; k < (chat ? 1 : r.prompts.size()); ++k) {
    auto planned = MakePlan(r, k);
    if (!planned.ok()) {
      const auto code = planned.status().code();
      return http::JsonError(400, planned.status().message(), "invalid_request_error",
                             code == StatusCode::kOutOfRange ? "context_length_exceeded" : "");
    }
    plans->push_back(std::move(*planned));
  }
  for (const Plan& plan : *plans) record->Prompt(static_cast<int64_t>(plan.prompt.size()));
  // A schema sent before is that compilation (by whose id its states' masks are kept).
  if (r.json_schema) r.json_schema = json_schemas_.Intern(r.json_schema_text, r.json_schema);
  auto req = std::make_shared<GenerationRequest>(std::move(r));
  const std::string id = RandomId(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = UnixTime();
  const std::string object = chat ? "chat.completion" : "text_completion";
  auto cancelled = request.cancelled;

  const model::Tokenizer tok = *client_.tokenizer;
  auto decode = [tok](std::span<const int32_t> ids) { return tok.Decode(ids); };
  // vLLM's stop_reason of an answer that ended at token t: null at the tokenizer's EOS (unless
  // ignore_eos, when it can only be a stop token id), else the id (a stop token id,
  // generation_config.json's end token, a chat turn's end).
  auto stop_reason = [req, eos = tok.eos_id()](int64_t t) {
    return t == eos && !req->ignore_eos ? json(nullptr) : json(t);
  };
  // ... and of one a stop string ended: the request's stop string, null for a chat template's
  // end of turn written as text (as at the EOS).
  auto text_stop_reason = [](const Plan& plan, const TextStream& text) {
    const int64_t i = text.stop_index();
    return i >= 0 && static_cast<size_t>(i) < plan.request_stops
               ? json(plan.stops[static_cast<size_t>(i)])
               : json(nullptr);
  };
  // include_stop_str_in_output keeps the request's stop strings in the text, not a template's.
  auto kept_stops = [req](const Plan& plan) { return req->include_stop ? plan.request_stops : 0; };
  std::random_device rd;
  const uint64_t base_seed = req->seed.value_or((static_cast<uint64_t>(rd()) << 32) | rd());
  // The seed of prompt k's first row (row i samples with it + i): a request's seed for every
  // prompt (as vLLM), else seeds of their own.
  auto first_seed = [req, base_seed](size_t k) {
    return req->seed ? *req->seed : base_seed + k * static_cast<uint64_t>(req->best_of);
  };

  // Runs a plan's n choices side by side, each a row of one session (one pass through the
  // swarm per token for all of them); on_delta(i, text, logprobs) sees choice i's text as it is
  // released, with the log-probabilities of its tokens since the last call (when asked for).
  using OnDelta = std::function<void(int64_t, const std::string&, std::vector<TokenLogprob>)>;
  auto run_choices = [this, req, decode, cancelled, stop_reason, text_stop_reason, kept_stops,
                      record](
                         const Plan& plan, uint64_t seed, const OnDelta& on_delta,
                         const std::function<bool()>& stop_early) -> Result<std::vector<Choice>> {
    at::NoGradGuard no_grad;
    // best_of > n: every candidate is a row, and the n best are answered (not streamed), ranked
    // by their tokens' log-probabilities, the end token's included.
    // (A scored prompt alone, max_tokens 0, has no candidates to rank.)
    const bool rank = req->best_of > req->n && plan.max_new_tokens > 0;
    const int64_t n = rank ? req->best_of : req->n;
    SwarmDecoder decoder(client_, plan.max_length(), n);
    std::optional<LogprobRecorder> recorder;
    // Ranking alone needs no scores of an echoed prompt.
    const bool score_prompt = req->echo && req->logprobs;
    if (req->logprobs || rank)
      recorder.emplace(decoder.backend, req->logprobs.value_or(0), score_prompt);
    serve::DecoderBackend* backend =
        recorder ? static_cast<serve::DecoderBackend*>(&*recorder) : &decoder.backend;
    // The penalties, biases, min_tokens and min_p go over the recorder: log-probabilities are
    // the model's own. With any of them the repetition penalty is applied there too, in vLLM's
    // order (after the biases, before the other penalties and min_p), and not by the sampler.
    LogitAdjustments adjustments{.presence_penalty = req->presence_penalty,
                                 .frequency_penalty = req->frequency_penalty,
                                 .logit_bias = {},
                                 .min_tokens = req->min_tokens,
                                 .end_tokens = plan.end_tokens,
                                 .min_p = req->min_p,
                                 .temperature = req->temperature,
                                 .repetition_penalty = req->repetition_penalty,
                                 .allowed_tokens = req->allowed_token_ids};
    for (const auto& [token, bias] : req->logit_bias) {
      if (bias != 0) adjustments.logit_bias.emplace_back(token, bias);  // 0 changes nothing
    }
    // response_format json_object masks the model's logits before those (as vLLM's structured
    // outputs do), the end tokens allowed only after a whole object: the model's, and the
    // stop_token_ids without text (special tokens); a stop token id with text is a token like
    // any other to the mask (it still ends the answer). (A prompt scored alone, max_tokens 0,
    // has no answer to mask.)
    std::optional<JsonObjectLogits> json_mode;
    std::vector<int64_t> json_ends;
    if (req->json_object && plan.max_new_tokens > 0) {
      const auto masks = JsonModeMasks();
      const auto& texts = masks->texts();
      for (size_t k = 0; k < plan.end_tokens.size(); ++k) {
        const auto t = static_cast<size_t>(plan.end_tokens[k]);
        if (k < plan.model_end_tokens || t >= texts->within.size() || texts->within[t].empty())
          json_ends.push_back(plan.end_tokens[k]);
      }
      backend = &json_mode.emplace(*backend, JsonModeOptions{.texts = texts,
                                                             .schema = req->json_schema,
                                                             .end_tokens = json_ends,
                                                             .min_tokens = req->min_tokens,
                                                             .cache_masks = true,
                                                             .masks = masks});
    }
    std::optional<AdjustedLogits> adjusted;
    if (!adjustments.none()) backend = &adjusted.emplace(*backend, adjustments);
    struct Row {
      TextStream text;
      std::string echo;  // until the row's first delta
      bool ended_with_eos = false;
      bool whole_object = false;  // json_object without end tokens: ended at the object's end
      Choice choice;
    };
    std::vector<Row> rows;
    for (int64_t i = 0; i < n; ++i) {
      rows.push_back({.text = TextStream(decode, plan.stops, req->min_tokens, kept_stops(plan)),
                      .echo = plan.echo_text,
                      .ended_with_eos = false,
                      .whole_object = false,
                      .choice = {}});
    }
    auto emit = [&](int64_t i, const std::string& d) {
      if (!on_delta) return;
      Row& row = rows[static_cast<size_t>(i)];
      std::vector<TokenLogprob> logprobs =
          recorder ? recorder->Take(i) : std::vector<TokenLogprob>{};
      if (d.empty() && row.echo.empty() && logprobs.empty()) return;
      on_delta(i, std::exchange(row.echo, {}) + d, std::move(logprobs));
    };
    if (plan.max_new_tokens == 0) {
      // echo with max_tokens 0: the prompt is scored, nothing is generated.
      const at::Tensor prompt = at::tensor(plan.prompt, at::kLong).unsqueeze(0).repeat({n, 1});
      if (auto scored = backend->Step(prompt, 0, {}, serve::StepLogits::kLast); !scored.ok())
        return scored.status();
    } else {
      std::vector<model::SamplingOptions> options;
      for (int64_t i = 0; i < n; ++i) {
        options.push_back(
            {.max_new_tokens = plan.max_new_tokens,
             .temperature = req->temperature,
             .top_k = req->top_k,
             .top_p = req->top_p,
             .repetition_penalty = adjusted.has_value() ? 1.0 : req->repetition_penalty,
             .seed = seed + static_cast<uint64_t>(i)});
      }
      auto tokens = serve::GenerateRows(
          *backend, plan.prompt, options, /*eos_id=*/-1,  // the plan's end tokens end rows
          [&](int64_t i, int64_t t) {
            record->FirstToken();
            Row& row = rows[static_cast<size_t>(i)];
            ++row.choice.tokens;
            if (std::ranges::find(plan.end_tokens, t) != plan.end_tokens.end()) {
              row.ended_with_eos = true;
              row.choice.stop_reason = stop_reason(t);
              // Not part of the text, so not of its log-probabilities (but of the candidate's
              // rank), unless include_stop_str_in_output asked for it (its text is then the
              // decoder's, special tokens' none).
              if (!req->include_stop) {
                if (rank) recorder->Chose(t, i);
                return;
              }
            }
            if (recorder) recorder->Chose(t, i);
            if (std::string d = row.text.Add(t); !d.empty()) emit(i, d);
            // response_format json_object with no end token to choose (a tokenizer without an
            // EOS, its chat turn ending in text): the answer ends with its object (ignore_eos
            // goes on, with whitespace).
            row.whole_object = json_mode && json_ends.empty() && !req->ignore_eos &&
                               row.choice.tokens >= req->min_tokens && json_mode->WholeWith(i, t);
          },
          [&](int64_t i) {
            const Row& row = rows[static_cast<size_t>(i)];
            const bool stop = row.ended_with_eos || row.whole_object || row.text.stopped() ||
                              cancelled() || (stop_early && stop_early());
            if (json_mode && stop) json_mode->End(i);  // its logits are no longer read
            return stop;
          });
      if (!tokens.ok()) return tokens.status();
    }
    if (cancelled()) return Cancelled("the client went away");
    std::vector<Choice> choices;
    for (int64_t i = 0; i < n; ++i) {
      Row& row = rows[static_cast<size_t>(i)];
      emit(i, row.text.Finish());
      Choice c = std::move(row.choice);
      c.text = plan.echo_text + row.text.text();
      c.finish_reason =
          row.text.stopped() || row.ended_with_eos || row.whole_object ? "stop" : "length";
      // (A stop token's text that holds a stop string: the token ended it, as vLLM says.)
      if (row.text.stopped() && !row.ended_with_eos)
        c.stop_reason = text_stop_reason(plan, row.text);
      c.ReadCalls(plan);
      if (recorder) c.logprobs = recorder->Take(i);
      if (rank) {
        // The mean over the generated tokens (an echoed prompt's are first, and not counted).
        const size_t from = score_prompt ? plan.prompt.size() : 0;
        double sum = 0;
        for (size_t k = from; k < c.logprobs.size(); ++k) sum += c.logprobs[k].logprob.value_or(0);
        const size_t count = c.logprobs.size() - std::min(from, c.logprobs.size());
        c.rank_score = count > 0 ? sum / static_cast<double>(count) : 0;
        if (row.ended_with_eos && !req->include_stop && c.logprobs.size() > from)
          c.logprobs.pop_back();
        if (!req->logprobs) c.logprobs.clear();
      }
      choices.push_back(std::move(c));
    }
    if (rank) std::ranges::stable_sort(choices, std::ranges::greater{}, &Choice::rank_score);
    return choices;
  };

  const LogprobFormat::Kind logprobs_kind =
      chat ? LogprobFormat::kChat : LogprobFormat::kCompletion;
  // A plan's log-probabilities: their first entry follows its prompt, unless it is echoed.
  auto logprob_format = [req, tok, logprobs_kind](const Plan& plan) {
    return LogprobFormat(tok, logprobs_kind, req->tokens_as_ids,
                         req->echo ? std::vector<int64_t>{} : plan.prompt);
  };
  auto choice_json = [chat, req, logprob_format](const Plan& plan, int64_t index, const Choice& c) {
    json j = {{"index", index},
              {"logprobs", nullptr},
              {"finish_reason", c.finish_reason},
              {"stop_reason", c.stop_reason}};
    if (req->logprobs) j["logprobs"] = logprob_format(plan).Answer(c.logprobs);
    if (chat) {
      j["message"] = {{"role", "assistant"},
                      {"content", c.content_null ? json(nullptr) : json(c.text)}};
      if (!c.calls.empty()) j["message"]["tool_calls"] = ToolCallsJson(c.calls, false);
    } else {
      j["text"] = c.text;
    }
    return j;
  };
  // Every prompt's tokens and every choice's (or candidate's, or beam's) generated tokens.
  auto usage = [plans](int64_t completion_tokens) {
    int64_t prompt_tokens = 0;
    for (const Plan& plan : *plans) prompt_tokens += static_cast<int64_t>(plan.prompt.size());
    return json{{"prompt_tokens", prompt_tokens},
                {"completion_tokens", completion_tokens},
                {"total_tokens", prompt_tokens + completion_tokens}};
  };

  // Several prompts run one after another, each with its n choices: prompt k's choice i is
  // choice k * n + i of the answer (as OpenAI numbers them).
  if (!req->stream) {
    json out = {{"id", id}, {"object", object}, {"created", created}, {"model", options_.model_id}};
    out["choices"] = json::array();
    int64_t generated = 0;  // every candidate's tokens: they were all generated
    for (size_t k = 0; k < plans->size(); ++k) {
      const Plan& plan = (*plans)[k];
      if (cancelled()) return SwarmError(Cancelled("the client went away"));
      std::vector<Choice> choices;
      if (plan.beams) {
        at::NoGradGuard no_grad;
        SwarmDecoder decoder(client_, plan.max_length(), req->best_of);
        // A beam ends at any of the end tokens (the EOS, generation_config.json's, a chat turn's
        // end, the request's stop_token_ids), as transformers' beam search ends at each id of its
        // eos list. The repetition penalty (the request's, else the model's
        // generation_config.json's) applies to the beams as transformers applies it to its beam
        // search. best_of is the beams' width, of which the n best are answered.
        auto beams = serve::BeamSearch(decoder.backend, plan.prompt, req->best_of,
                                       plan.max_new_tokens, plan.end_tokens,
                                       /*length_penalty=*/1.0, req->repetition_penalty);
        if (!beams.ok()) return SwarmError(beams.status());
        beams->resize(std::min(beams->size(), static_cast<size_t>(req->n)));
        for (const auto& b : *beams) {
          TextStream text(decode, plan.stops, 0, kept_stops(plan));
          Choice c;
          bool ended = false;
          std::vector<int64_t> said;  // the tokens of the text, as a sampled choice records them
          for (int64_t t : b.tokens) {
            if (text.stopped()) break;
            ended = std::ranges::find(plan.end_tokens, t) != plan.end_tokens.end();
            if (ended) c.stop_reason = stop_reason(t);
            if (ended && !req->include_stop) break;
            said.push_back(t);
            text.Add(t);
            if (ended) break;
          }
          c.tokens = static_cast<int64_t>(b.tokens.size());
          text.Finish();
          c.text = plan.echo_text + text.text();
          c.finish_reason = b.finished || ended || text.stopped() ? "stop" : "length";
          if (text.stopped() && !ended) c.stop_reason = text_stop_reason(plan, text);
          c.ReadCalls(plan);
          if (req->logprobs) {
            if (cancelled()) return SwarmError(Cancelled("the client went away"));
            auto scored = ScoreBeam(client_, plan.prompt, said, *req->logprobs, req->echo);
            if (!scored.ok()) return SwarmError(scored.status());
            c.logprobs = std::move(*scored);
          }
          choices.push_back(std::move(c));
        }
      } else {
        // best_of > n: the candidates, best first, of which the first n are answered.
        auto sampled = run_choices(plan, first_seed(k), {}, {});
        if (!sampled.ok()) return SwarmError(sampled.status());
        choices = std::move(*sampled);
      }
      for (size_t i = 0; i < choices.size(); ++i) {
        if (i < static_cast<size_t>(req->n)) {
          out["choices"].push_back(choice_json(plan, std::ssize(out["choices"]), choices[i]));
        }
        generated += choices[i].tokens;
      }
    }
    out["usage"] = usage(generated);
    // (Counted once the whole answer is: a prompt that failed after others fails the request.)
    record->Generated(generated);
    for (const auto& c : out["choices"]) record->Choice(c["finish_reason"].get<std::string>());
    return http::Json(200, Dump(out));
  }

  // Streaming: one event per released piece of text, a last one per choice with its
  // finish_reason, optionally the usage, then [DONE]. An error after the headers went out is an
  // event with the error object, and the stream ends without [DONE].
  http::Reply reply;
  reply.content_type = "text/event-stream";
  const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
  const std::string model_id = options_.model_id;
  reply.stream = [req, chat, id, created, chunk_object, model_id, run_choices, usage,
                  logprob_format, plans, first_seed, record](http::StreamWriter& out) {
    auto event = [&](json choices, const json* extra = nullptr) {
      json j = {{"id", id},
                {"object", chunk_object},
                {"created", created},
                {"model", model_id},
                {"choices", std::move(choices)}};
      if (extra != nullptr) j.update(*extra);
      return out.Write("data: " + Dump(j) + "\n\n");
    };
    const auto n = static_cast<size_t>(req->n);
    // Each choice's log-probabilities, written as its tokens arrive.
    std::vector<std::optional<LogprobFormat>> formats(plans->size() * n);
    auto piece = [&](int64_t index, const std::string& text, const json& finish,
                     const std::vector<TokenLogprob>& logprobs = {}, const json& reason = nullptr) {
      json c = {{"index", index}, {"logprobs", nullptr}, {"finish_reason", finish}};
      if (!finish.is_null()) c["stop_reason"] = reason;  // (vLLM's, on the last event)
      auto& format = formats[static_cast<size_t>(index)];
      if (format && !logprobs.empty()) c["logprobs"] = format->Answer(logprobs);
      if (chat) {
        c["delta"] = finish.is_null() ? json{{"content", text}} : json::object();
      } else {
        c["text"] = text;
      }
      return event(json::array({c}));
    };
    for (size_t i = 0; chat && i < n; ++i) {  // (chat has one plan)
      json c = {{"index", i},
                {"delta", {{"role", "assistant"}, {"content", ""}}},
                {"logprobs", nullptr},
                {"finish_reason", nullptr}};
      if (!event(json::array({c}))) return;
    }
    bool client_gone = false;
    int64_t generated = 0;
    for (size_t k = 0; k < plans->size(); ++k) {
      const Plan& plan = (*plans)[k];
      const size_t first = k * n;  // the index of the plan's first choice
      for (size_t i = 0; req->logprobs && i < n; ++i)
        formats[first + i].emplace(logprob_format(plan));
      // With tools, each choice's text is passed on until a call may have begun.
      std::vector<ToolCallStream> calls_held(n, ToolCallStream(plan.tool_format, plan.tool_names));
      // The choices' pieces interleave, each event naming its choice's index.
      auto choices = run_choices(
          plan, first_seed(k),
          [&](int64_t i, const std::string& d, const std::vector<TokenLogprob>& logprobs) {
            const std::string text = calls_held[static_cast<size_t>(i)].Add(d);
            if (text.empty() && logprobs.empty()) return;
            const auto index = static_cast<int64_t>(first) + i;
            if (!client_gone && !piece(index, text, nullptr, logprobs)) client_gone = true;
          },
          [&] { return client_gone || out.cancelled(); });
      if (client_gone || out.cancelled()) return;
      if (!choices.ok()) {
        COLONY_LOG_WARN("api: a streamed request failed: {}", choices.status().ToString());
        record->StreamFailed();
        out.Write("data: " + SwarmError(choices.status()).body + "\n\n");
        return;
      }
      for (const Choice& c : *choices) {  // (all generated, whether or not all are sent)
        record->Generated(c.tokens);
        record->Choice(c.finish_reason);
      }
      for (size_t i = 0; i < choices->size(); ++i) {
        const Choice& c = (*choices)[i];
        const auto index = static_cast<int64_t>(first + i);
        generated += c.tokens;
        const Answer whole{.content = c.text, .content_null = c.content_null, .calls = c.calls};
        if (const std::string rest = calls_held[i].Finish(whole); !rest.empty()) {
          if (!piece(index, rest, nullptr)) return;
        }
        if (!c.calls.empty()) {
          json delta = {{"index", index},
                        {"delta", {{"tool_calls", ToolCallsJson(c.calls, true)}}},
                        {"logprobs", nullptr},
                        {"finish_reason", nullptr}};
          if (!event(json::array({delta}))) return;
        }
        if (!piece(index, "", c.finish_reason, {}, c.stop_reason)) return;
      }
    }
    if (req->include_usage) {
      const json extra = {{"usage", usage(generated)}};
      if (!event(json::array(), &extra)) return;
    }
    if (out.Write("data: [DONE]\n\n")) record->Delivered();
  };
  return reply;
}

}  // namespace colony::api
