// Fuzz target for the requests of colony api (the body of POST /v1/completions,
// /v1/chat/completions, /tokenize and /detokenize, from any HTTP client). Parsing never crashes,
// every error names what is wrong, and an accepted request is within the documented ranges and
// limits (tools and tool calls included).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "api/openai_request.h"

using namespace colony;
using namespace colony::api;

namespace {

void Check(const Result<GenerationRequest>& r, const RequestLimits& limits) {
  if (!r.ok()) {
    if (r.status().message().empty()) __builtin_trap();
    return;
  }
  if (r->n < 1 || r->n > limits.max_n) __builtin_trap();
  if (r->best_of < r->n || r->best_of > limits.max_n || (r->best_of > r->n && r->stream)) {
    __builtin_trap();
  }
  if (!(r->temperature >= 0 && r->temperature <= 2)) __builtin_trap();
  if (!(r->top_p > 0 && r->top_p <= 1)) __builtin_trap();
  if (r->top_k < 0 || !std::isfinite(r->repetition_penalty)) __builtin_trap();
  if (!(r->min_p >= 0 && r->min_p <= 1)) __builtin_trap();
  // allowed_token_ids: increasing (each once), within the limit.
  if (r->allowed_token_ids.size() > limits.max_allowed_token_ids) __builtin_trap();
  for (size_t i = 1; i < r->allowed_token_ids.size(); ++i) {
    if (r->allowed_token_ids[i - 1] >= r->allowed_token_ids[i]) __builtin_trap();
  }
  // max_tokens 0 only scores an echoed prompt.
  if (r->max_tokens && (*r->max_tokens < 0 || (*r->max_tokens == 0 && !r->echo))) {
    __builtin_trap();
  }
  // min_tokens is at most max_tokens.
  if (r->min_tokens < 0 || (r->max_tokens && r->min_tokens > *r->max_tokens)) __builtin_trap();
  if (r->logprobs && (*r->logprobs < 0 || *r->logprobs > limits.max_top_logprobs)) {
    __builtin_trap();
  }
  if (r->chat && r->echo) __builtin_trap();
  if (!(std::fabs(r->presence_penalty) <= 2 && std::fabs(r->frequency_penalty) <= 2)) {
    __builtin_trap();
  }
  // Biases: ids in increasing order, each once, within int32; values in [-100, 100].
  if (r->logit_bias.size() > limits.max_logit_bias) __builtin_trap();
  for (size_t i = 0; i < r->logit_bias.size(); ++i) {
    const auto& [token, bias] = r->logit_bias[i];
    if (token < 0 || token > INT32_MAX || !(std::fabs(bias) <= 100)) __builtin_trap();
    if (i > 0 && token <= r->logit_bias[i - 1].first) __builtin_trap();
  }
  if (r->stop.size() > limits.max_stop) __builtin_trap();
  for (const auto& s : r->stop) {
    if (s.empty() || s.size() > limits.max_stop_bytes) __builtin_trap();
  }
  // stop_token_ids: ids within int32, each once.
  if (r->stop_token_ids.size() > limits.max_stop_token_ids) __builtin_trap();
  for (size_t i = 0; i < r->stop_token_ids.size(); ++i) {
    const int64_t t = r->stop_token_ids[i];
    if (t < 0 || t > INT32_MAX) __builtin_trap();
    for (size_t k = 0; k < i; ++k) {
      if (r->stop_token_ids[k] == t) __builtin_trap();
    }
  }
  if (r->chat) {
    if (r->messages.empty() || r->messages.size() > limits.max_messages) __builtin_trap();
    for (const auto& m : r->messages) {
      if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
        __builtin_trap();
      }
      // Calls are an assistant's, each with an id, a name and an object's text; a tool's message
      // answers a call.
      if (!m.tool_calls.empty() && m.role != "assistant") __builtin_trap();
      if (m.tool_calls.size() > limits.max_tool_calls) __builtin_trap();
      for (const auto& c : m.tool_calls) {
        if (c.id.empty() || c.name.empty() || c.arguments.empty()) __builtin_trap();
      }
      if ((m.role == "tool") == m.tool_call_id.empty()) __builtin_trap();
      if (m.content_null && m.role != "assistant") __builtin_trap();
    }
    if (r->tool_names.size() > limits.max_tools) __builtin_trap();
    if (r->tool_names.empty() != r->tools_json.empty()) __builtin_trap();
    if (!r->prompts.empty()) __builtin_trap();  // completions' only
  } else if (!r->tools_json.empty() || !r->template_kwargs_json.empty()) {
    __builtin_trap();  // chat's only
  } else {
    // One to max_prompts prompts, those of token ids non-empty, bounded and within int32.
    if (r->prompts.empty() || r->prompts.size() > limits.max_prompts) __builtin_trap();
    for (const auto& p : r->prompts) {
      if (!p.is_tokens && !p.tokens.empty()) __builtin_trap();
      if (p.is_tokens && (p.tokens.empty() || p.tokens.size() > limits.max_prompt_tokens)) {
        __builtin_trap();
      }
      for (int64_t t : p.tokens) {
        if (t < 0 || t > INT32_MAX) __builtin_trap();
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const RequestLimits limits{.max_n = 4,
                             .max_messages = 8,
                             .max_stop = 2,
                             .max_stop_bytes = 16,
                             .max_stop_token_ids = 4,
                             .max_prompts = 3,
                             .max_prompt_tokens = 32,
                             .max_top_logprobs = 20,
                             .max_tools = 4,
                             .max_tool_calls = 4};
  Check(ParseCompletionRequest(body, limits), limits);
  Check(ParseChatRequest(body, limits), limits);
  // /tokenize: one text prompt or a chat's messages (the chat's checks above hold for them);
  // /detokenize: bounded ids within int32.
  if (auto t = ParseTokenizeRequest(body, limits); t.ok()) {
    const GenerationRequest& r = t->what;
    if (r.chat ? (r.messages.empty() || !r.prompts.empty() || t->add_special_tokens)
               : (r.prompts.size() != 1 || r.prompts[0].is_tokens || !r.messages.empty() ||
                  !r.tools_json.empty() || !r.template_kwargs_json.empty())) {
      __builtin_trap();
    }
    if (r.messages.size() > limits.max_messages || r.tool_names.size() > limits.max_tools) {
      __builtin_trap();
    }
  } else if (t.status().message().empty()) {
    __builtin_trap();
  }
  if (auto d = ParseDetokenizeRequest(body, limits); d.ok()) {
    if (d->tokens.size() > limits.max_prompt_tokens) __builtin_trap();
    for (int64_t id : d->tokens) {
      if (id < 0 || id > INT32_MAX) __builtin_trap();
    }
  } else if (d.status().message().empty()) {
    __builtin_trap();
  }
  return 0;
}
