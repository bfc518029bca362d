// The requests of the OpenAI API that `colony api` serves (POST /v1/completions and
// /v1/chat/completions), parsed from untrusted JSON into one validated struct. Torch-free (fuzzed).
//
//   auto r = ParseCompletionRequest(body, {});  // or ParseChatRequest
//   if (!r.ok()) return http::JsonError(400, r.status().message());
//
// Every field of the API either is understood, or is accepted only with the value that changes
// nothing (suffix "", tool_choice "auto", ...), or makes the request fail with a message that
// names the field. Unknown fields fail too: a client that asks for something Colony would not do
// is told so instead of getting a different answer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api/json_schema.h"
#include "core/status.h"
#include "model/generation_config.h"

namespace colony::api {

// A function call an assistant's message made (or an answer makes): `arguments` is the text of
// a JSON object, as the OpenAI API carries it.
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;
  bool operator==(const ToolCall&) const = default;
};

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string r, std::string c) : role(std::move(r)), content(std::move(c)) {}

  std::string role;  // system, user, assistant or tool ("developer" is read as system)
  std::string content;
  bool content_null = false;         // an assistant's message that only calls tools
  std::vector<ToolCall> tool_calls;  // an assistant's
  std::string tool_call_id;          // a tool's: the call it answers
};

struct GenerationRequest {
  bool chat = false;
  std::string model;  // as asked; empty when absent
  // Completions: the prompts, each as text or as token ids (is_tokens). Several (OpenAI's array
  // of prompts, a batch) are each answered with n choices.
  struct Prompt {
    std::string text;
    std::vector<int64_t> tokens;
    bool is_tokens = false;
  };
  std::vector<Prompt> prompts;
  std::vector<ChatMessage> messages;  // chat
  std::optional<int64_t> max_tokens;  // absent: completions 16, chat the context's room
  double temperature = 1.0;           // 0: greedy (omitted: the defaults', see below)
  double top_p = 1.0;
  int64_t top_k = 0;                // an extension (as vLLM's); 0: off
  double repetition_penalty = 1.0;  // an extension (as vLLM's); 1: off
  // An extension (as vLLM's): tokens less likely than min_p times the most likely one (at the
  // temperature) are not sampled; 0: off; nothing at temperature 0.
  double min_p = 0;
  // OpenAI's penalties, in [-2, 2] (0: off): a token's logit is lowered by frequency_penalty
  // for each time the answer has it so far and by presence_penalty once it has it at all.
  double presence_penalty = 0;
  double frequency_penalty = 0;
  // logit_bias: token ids, each once and in increasing order, and what is added to their
  // logits, in [-100, 100], 0 included (whether an id is in the model's vocabulary is the
  // service's check).
  std::vector<std::pair<int64_t, double>> logit_bias;
  std::vector<std::string> stop;
  // An extension (as vLLM's): token ids that end the answer as the EOS does (not part of its
  // text unless include_stop; ignore_eos leaves them; min_tokens holds them back as it holds the
  // end tokens). Each id once, in the request's order (whether an id is in the model's vocabulary
  // is the service's check).
  std::vector<int64_t> stop_token_ids;
  // An extension (as vLLM's): when not empty, only these tokens can be generated (the end tokens
  // too: an answer whose list has none ends at max_tokens). Increasing, each id once (whether an
  // id is in the model's vocabulary is the service's check).
  std::vector<int64_t> allowed_token_ids;
  int64_t n = 1;
  // An extension (as vLLM's): generation goes on past the EOS and the model's other end tokens
  // (generation_config.json's, a chat template's end of turn) up to max_tokens; stop strings
  // still end it.
  bool ignore_eos = false;
  // An extension (as vLLM's include_stop_str_in_output): the answer ends with the stop string
  // or stop token that ended it (a token's text as the decoder writes it: none for a special
  // token), and that token is part of its log-probabilities.
  bool include_stop = false;
  // An extension (as vLLM's): at least this many tokens are generated (at most max_tokens): the
  // end tokens are not chosen until then, and a stop string counts only where it ends after
  // their text.
  int64_t min_tokens = 0;
  // Completions: how many candidates are generated, of which the n best are answered (>= n;
  // the parser sets n when the request has none). Sampled, the best have the highest mean
  // log-probability per token; at temperature 0 it is the beam search's width.
  int64_t best_of = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::optional<uint64_t> seed;
  // Log-probabilities in the answer: the chosen tokens' and this many most likely tokens' at
  // each position (completions: `logprobs` N; chat: `logprobs: true` with `top_logprobs` N).
  // Absent: none.
  std::optional<int64_t> logprobs;
  bool echo = false;           // completions: the answer starts with the prompt (and its logprobs)
  bool tokens_as_ids = false;  // return_tokens_as_token_ids (vLLM's): tokens as "token_id:N"
  // Chat: the functions the model may call (`tools` with tool_choice "auto", the default), as
  // the client wrote them (a JSON array, keys in its order), and their names. Empty: none
  // (also with tool_choice "none").
  std::string tools_json;
  std::vector<std::string> tool_names;
  // response_format {"type": "json_object"} or {"type": "json_schema"}: the answer (a
  // completion's too, after its prompt) is kept to a JSON object (api/json_mode.h), valid against
  // json_schema when the request gave one (api/json_schema.h).
  bool json_object = false;
  std::shared_ptr<const JsonSchema> json_schema;
  std::string json_schema_text;  // its canonical text: nlohmann::json's dump, keys sorted
  // Chat: more variables for the model's own chat template (`chat_template_kwargs`, vLLM's, e.g.
  // Qwen3's {"enable_thinking": false}), as the text of a JSON object. Empty: none.
  std::string template_kwargs_json;
};

struct RequestLimits {
  int64_t max_n = 8;  // n and best_of
  size_t max_messages = 256;
  size_t max_stop = 4;  // as OpenAI
  size_t max_stop_bytes = 256;
  size_t max_stop_token_ids = 64;          // each is looked for in every row at every step
  size_t max_allowed_token_ids = 1 << 16;  // a mask built once per request
  size_t max_prompts = 16;                 // in one completions request (each runs n choices)
  size_t max_prompt_tokens = 1 << 16;      // a prompt given as token ids
  int64_t max_top_logprobs = 20;           // as OpenAI's top_logprobs
  size_t max_tools = 128;                  // as OpenAI
  size_t max_tool_calls = 128;             // in one message
  size_t max_logit_bias = 1024;            // tokens in logit_bias (each costs work at every step)
};

// OpenAI's values for the sampling fields a request leaves out (colony api puts a model's
// generation_config.json over them, as vLLM does: GenerationConfig::Over).
inline constexpr model::SamplingDefaults kOpenAiSampling{
    .temperature = 1.0, .top_k = 0, .top_p = 1.0, .repetition_penalty = 1.0};

// POST /tokenize (vLLM's): a prompt (text) or a chat (messages, with tools and
// chat_template_kwargs) to turn into the token ids that generation would run on.
struct TokenizeRequest {
  GenerationRequest what;  // model, prompts (one text) or chat's messages, tools, kwargs
  // A prompt's BOS first (vLLM's default; its add_special_tokens). A chat's template writes its
  // own special tokens: false there.
  bool add_special_tokens = true;
};

// POST /detokenize (vLLM's): token ids to turn into text.
struct DetokenizeRequest {
  std::string model;            // as asked; empty when absent
  std::vector<int64_t> tokens;  // each in [0, 2^31); whether in the vocabulary is the service's
};

// InvalidArgument naming the field (its message starts with the field's name in quotes). The
// sampling fields a request leaves out are `defaults`'.
Result<GenerationRequest> ParseCompletionRequest(
    std::string_view body, const RequestLimits& limits,
    const model::SamplingDefaults& defaults = kOpenAiSampling);
Result<GenerationRequest> ParseChatRequest(
    std::string_view body, const RequestLimits& limits,
    const model::SamplingDefaults& defaults = kOpenAiSampling);
Result<TokenizeRequest> ParseTokenizeRequest(std::string_view body, const RequestLimits& limits);
Result<DetokenizeRequest> ParseDetokenizeRequest(std::string_view body,
                                                 const RequestLimits& limits);

}  // namespace colony::api
