// Parsing and validating OpenAI completion and chat requests: each field by its type and range,
// the no-op values of the fields Colony does not implement, and nothing else.
#include "api/openai_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "api/model_chat_template.h"
#include "model/strict_json.h"

namespace colony::api {

namespace {

using json = nlohmann::ordered_json;  // keys in the client's order (tools' schemas)

// Deep enough for the JSON schemas of tools' parameters; the parser does not recurse.
constexpr int kMaxDepth = 32;
constexpr size_t kMaxIdBytes = 256;

Status Bad(std::string_view field, std::string_view what) {
  return InvalidArgument(fmt::format("'{}' {}", field, what));
}

// response_format {"type": "json_schema", "json_schema": {"name", "description", "schema",
// "strict"}} (OpenAI's structured outputs): the schema compiled (api/json_schema.h); without one,
// any object. The answer keeps to it whether or not "strict" is set.
Status ParseJsonSchema(const json& v, GenerationRequest& q) {
  for (const auto& [key, _] : v.items()) {
    if (key != "type" && key != "json_schema") {
      return Bad("response_format", fmt::format("has no field '{}'", key.substr(0, 64)));
    }
  }
  if (!v.contains("json_schema") || !v["json_schema"].is_object()) {
    return Bad("response_format", "json_schema needs a \"json_schema\" object");
  }
  const json& spec = v["json_schema"];
  for (const auto& [key, value] : spec.items()) {
    if (key == "name" || key == "description") {
      if (!value.is_string() || value.get_ref<const std::string&>().size() > 1024) {
        return Bad("response_format",
                   fmt::format("json_schema.{} must be a string of at most 1024 bytes", key));
      }
    } else if (key == "strict") {
      if (!value.is_boolean() && !value.is_null()) {
        return Bad("response_format", "json_schema.strict must be true or false");
      }
    } else if (key != "schema") {
      return Bad("response_format",
                 fmt::format("json_schema has no field '{}'", key.substr(0, 64)));
    }
  }
  q.json_object = true;
  if (!spec.contains("schema") || spec["schema"].is_null()) return Status::Ok();
  const nlohmann::json sorted = spec["schema"];  // (keys sorted: one text for any order)
  auto schema = JsonSchema::Compile(sorted);
  if (!schema.ok()) return Bad("response_format", schema.status().message());
  q.json_schema = std::move(*schema);
  q.json_schema_text = sorted.dump();  // (the body was read as UTF-8: it dumps)
  return Status::Ok();
}

Result<double> Number(const json& v, std::string_view field, double lo, double hi) {
  if (!v.is_number()) return Bad(field, "must be a number");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    return Bad(field, fmt::format("must be between {} and {}", lo, hi));
  }
  return x;
}

Result<int64_t> Integer(const json& v, std::string_view field, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) return Bad(field, "must be an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return Bad(field, fmt::format("must be between {} and {}", lo, hi));
  }
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) return Bad(field, fmt::format("must be between {} and {}", lo, hi));
  return x;
}

Result<bool> Bool(const json& v, std::string_view field) {
  if (!v.is_boolean()) return Bad(field, "must be true or false");
  return v.get<bool>();
}

Result<std::string> Text(const json& v, std::string_view field) {
  if (!v.is_string()) return Bad(field, "must be a string");
  return v.get<std::string>();
}

// logit_bias: {"token id": bias}, ids as decimal text without sign or leading zeros (so that no
// two keys name one token), biases in [-100, 100]. Kept in the order of the ids.
Status ParseLogitBias(const json& v, const RequestLimits& limits, GenerationRequest& r) {
  if (v.is_null()) return Status::Ok();
  if (!v.is_object()) return Bad("logit_bias", "must be an object of token ids and biases");
  if (v.size() > limits.max_logit_bias) {
    return Bad("logit_bias",
               fmt::format("holds {} tokens; at most {}", v.size(), limits.max_logit_bias));
  }
  std::vector<std::pair<int64_t, double>> bias;
  for (const auto& [key, value] : v.items()) {
    const bool canonical = !key.empty() && key.size() <= 10 &&
                           std::ranges::all_of(key, [](char c) { return c >= '0' && c <= '9'; }) &&
                           (key == "0" || key.front() != '0');
    const std::string field = "logit_bias." + key.substr(0, 32);
    const int64_t id = canonical ? std::stoll(key) : -1;
    if (id < 0 || id > INT32_MAX) {
      return Bad(field, "is not a token id (a key is a token id in decimal, e.g. \"50256\")");
    }
    COLONY_ASSIGN_OR_RETURN(double b, Number(value, field, -100, 100));
    bias.emplace_back(id, b);
  }
  std::ranges::sort(bias);
  r.logit_bias = std::move(bias);
  return Status::Ok();
}

Status ParseStop(const json& v, const RequestLimits& limits, GenerationRequest& r) {
  if (v.is_null()) return Status::Ok();
  std::vector<std::string> stops;
  if (v.is_string()) {
    stops.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    if (v.size() > limits.max_stop) {
      return Bad("stop", fmt::format("holds {} strings; at most {}", v.size(), limits.max_stop));
    }
    for (const auto& s : v) {
      if (!s.is_string()) return Bad("stop", "must be a string or an array of strings");
      stops.push_back(s.get<std::string>());
    }
  } else {
    return Bad("stop", "must be a string or an array of strings");
  }
  for (const auto& s : stops) {
    if (s.empty()) return Bad("stop", "must not hold an empty string");
    if (s.size() > limits.max_stop_bytes) {
      return Bad("stop", fmt::format("strings are at most {} bytes", limits.max_stop_bytes));
    }
  }
  r.stop = std::move(stops);
  return Status::Ok();
}

// stop_token_ids: token ids in [0, 2^31); an id given twice counts once.
Status ParseStopTokenIds(const json& v, const RequestLimits& limits, GenerationRequest& r) {
  if (v.is_null()) return Status::Ok();
  if (!v.is_array()) return Bad("stop_token_ids", "must be an array of token ids");
  if (v.size() > limits.max_stop_token_ids) {
    return Bad("stop_token_ids",
               fmt::format("holds {} tokens; at most {}", v.size(), limits.max_stop_token_ids));
  }
  std::vector<int64_t> ids;
  for (size_t i = 0; i < v.size(); ++i) {
    COLONY_ASSIGN_OR_RETURN(int64_t id,
                            Integer(v[i], fmt::format("stop_token_ids[{}]", i), 0, INT32_MAX));
    if (std::ranges::find(ids, id) == ids.end()) ids.push_back(id);
  }
  r.stop_token_ids = std::move(ids);
  return Status::Ok();
}

// allowed_token_ids: at least one token id in [0, 2^31); sorted, an id given twice counts once.
Status ParseAllowedTokenIds(const json& v, const RequestLimits& limits, GenerationRequest& r) {
  if (v.is_null()) return Status::Ok();
  if (!v.is_array()) return Bad("allowed_token_ids", "must be an array of token ids");
  if (v.empty()) return Bad("allowed_token_ids", "must hold at least one token id");
  if (v.size() > limits.max_allowed_token_ids) {
    return Bad("allowed_token_ids",
               fmt::format("holds {} tokens; at most {}", v.size(), limits.max_allowed_token_ids));
  }
  std::vector<int64_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    COLONY_ASSIGN_OR_RETURN(int64_t id,
                            Integer(v[i], fmt::format("allowed_token_ids[{}]", i), 0, INT32_MAX));
    ids.push_back(id);
  }
  std::ranges::sort(ids);
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  r.allowed_token_ids = std::move(ids);
  return Status::Ok();
}

// prompt: a string, token ids, or an array of several of either (each answered with n
// choices).
Status ParsePrompt(const json& v, const RequestLimits& limits, GenerationRequest& r) {
  constexpr std::string_view kShape =
      "must be a string, an array of token ids, or an array of strings or of arrays of token ids";
  auto tokens = [&limits](const json& ids,
                          const std::string& field) -> Result<std::vector<int64_t>> {
    if (ids.empty()) return Bad(field, "must not be empty");
    if (ids.size() > limits.max_prompt_tokens) {
      return Bad(field,
                 fmt::format("holds {} tokens; at most {}", ids.size(), limits.max_prompt_tokens));
    }
    std::vector<int64_t> out;
    for (const auto& t : ids) {
      COLONY_ASSIGN_OR_RETURN(int64_t id, Integer(t, field, 0, INT32_MAX));
      out.push_back(id);
    }
    return out;
  };
  std::vector<GenerationRequest::Prompt> prompts;
  if (v.is_string()) {
    prompts.push_back({.text = v.get<std::string>(), .tokens = {}, .is_tokens = false});
  } else if (!v.is_array() || v.empty()) {
    return Bad("prompt", kShape);
  } else if (v[0].is_number()) {  // one prompt of token ids
    COLONY_ASSIGN_OR_RETURN(auto ids, tokens(v, "prompt"));
    prompts.push_back({.text = {}, .tokens = std::move(ids), .is_tokens = true});
  } else {
    if (v.size() > limits.max_prompts) {
      return Bad("prompt",
                 fmt::format("holds {} prompts; at most {}", v.size(), limits.max_prompts));
    }
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string field = v.size() == 1 ? "prompt" : fmt::format("prompt[{}]", i);
      if (v[i].is_string()) {
        prompts.push_back({.text = v[i].get<std::string>(), .tokens = {}, .is_tokens = false});
      } else if (v[i].is_array()) {
        COLONY_ASSIGN_OR_RETURN(auto ids, tokens(v[i], field));
        prompts.push_back({.text = {}, .tokens = std::move(ids), .is_tokens = true});
      } else {
        return Bad(field, kShape);
      }
    }
  }
  r.prompts = std::move(prompts);
  return Status::Ok();
}

Result<std::string> MessageContent(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) return Bad("messages.content", "must be a string or an array of text parts");
  std::string out;
  for (const auto& part : v) {
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
        !part["text"].is_string() || part.size() != 2) {
      return Bad("messages.content",
                 "parts must be {\"type\": \"text\", \"text\": ...}; colony api serves text "
                 "models only");
    }
    out += part["text"].get<std::string>();
  }
  return out;
}

// 1 to 64 ASCII letters, digits and '_' (and '-' where `dash`).
bool IsName(std::string_view s, bool dash) {
  return !s.empty() && s.size() <= 64 && std::ranges::all_of(s, [dash](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || (dash && c == '-');
  });
}

// OpenAI's rule for function names.
Status FunctionName(const json& v, std::string_view field, std::string& out) {
  COLONY_ASSIGN_OR_RETURN(out, Text(v, field));
  if (!IsName(out, /*dash=*/true)) return Bad(field, "must be 1 to 64 letters, digits, '_' or '-'");
  return Status::Ok();
}

// A call in an assistant's message: {"id", "type": "function", "function": {"name",
// "arguments": the text of a JSON object}}.
Result<ToolCall> ParseToolCall(const json& v) {
  if (!v.is_object()) return Bad("messages.tool_calls", "must hold objects");
  ToolCall call;
  bool has_function = false;
  for (const auto& [key, value] : v.items()) {
    if (key == "id") {
      COLONY_ASSIGN_OR_RETURN(call.id, Text(value, "messages.tool_calls.id"));
      if (call.id.size() > kMaxIdBytes) {
        return Bad("messages.tool_calls.id", fmt::format("is at most {} bytes", kMaxIdBytes));
      }
    } else if (key == "type") {
      if (value != "function") return Bad("messages.tool_calls.type", "must be \"function\"");
    } else if (key == "function") {
      if (!value.is_object()) return Bad("messages.tool_calls.function", "must be an object");
      has_function = true;
      for (const auto& [fkey, fvalue] : value.items()) {
        if (fkey == "name") {
          COLONY_RETURN_IF_ERROR(
              FunctionName(fvalue, "messages.tool_calls.function.name", call.name));
        } else if (fkey == "arguments") {
          COLONY_ASSIGN_OR_RETURN(call.arguments,
                                  Text(fvalue, "messages.tool_calls.function.arguments"));
          if (auto parsed = model::ParseStrictOrderedJsonObject(
                  call.arguments, "'messages.tool_calls.function.arguments'", kMaxDepth);
              !parsed.ok()) {
            return parsed.status();
          }
        } else {
          return Bad("messages.tool_calls.function." + fkey, "is not supported by colony api");
        }
      }
    } else {
      return Bad("messages.tool_calls." + key, "is not supported by colony api");
    }
  }
  if (call.id.empty()) return Bad("messages.tool_calls.id", "is missing");
  if (!has_function || call.name.empty()) {
    return Bad("messages.tool_calls.function.name", "is missing");
  }
  if (call.arguments.empty()) return Bad("messages.tool_calls.function.arguments", "is missing");
  return call;
}

// `tools`: [{"type": "function", "function": {"name", "description", "parameters", "strict"}}].
Status ParseTools(const json& v, const RequestLimits& limits, GenerationRequest& r) {
  if (v.is_null()) return Status::Ok();
  if (!v.is_array()) return Bad("tools", "must be an array");
  if (v.size() > limits.max_tools) {
    return Bad("tools", fmt::format("holds {} tools; at most {}", v.size(), limits.max_tools));
  }
  std::vector<std::string> names;
  for (const auto& tool : v) {
    if (!tool.is_object() || tool.value("type", json()) != "function" ||
        !tool.contains("function") || tool.size() != 2) {
      return Bad("tools", "must hold {\"type\": \"function\", \"function\": {...}} objects");
    }
    const json& f = tool["function"];
    if (!f.is_object()) return Bad("tools.function", "must be an object");
    std::string name;
    for (const auto& [key, value] : f.items()) {
      if (key == "name") {
        COLONY_RETURN_IF_ERROR(FunctionName(value, "tools.function.name", name));
      } else if (key == "description") {
        COLONY_RETURN_IF_ERROR(Text(value, "tools.function.description").status());
      } else if (key == "parameters") {
        if (!value.is_object())
          return Bad("tools.function.parameters", "must be a JSON schema object");
      } else if (key == "strict") {
        COLONY_ASSIGN_OR_RETURN(bool strict, Bool(value, "tools.function.strict"));
        if (strict) {
          return Bad("tools.function.strict",
                     "is not supported by colony api (no constrained decoding); leave it out");
        }
      } else {
        return Bad("tools.function." + key, "is not supported by colony api");
      }
    }
    if (name.empty()) return Bad("tools.function.name", "is missing");
    if (std::ranges::find(names, name) != names.end()) {
      return Bad("tools.function.name", fmt::format("'{}' names two tools", name));
    }
    names.push_back(std::move(name));
  }
  r.tools_json = names.empty() ? "" : v.dump();
  r.tool_names = std::move(names);
  return Status::Ok();
}

Status ParseMessages(const json& v, const RequestLimits& limits, GenerationRequest& r) {
  if (!v.is_array() || v.empty()) return Bad("messages", "must be a non-empty array");
  if (v.size() > limits.max_messages) {
    return Bad("messages",
               fmt::format("holds {} messages; at most {}", v.size(), limits.max_messages));
  }
  for (const auto& m : v) {
    if (!m.is_object()) return Bad("messages", "must hold objects");
    ChatMessage msg;
    for (const auto& [key, value] : m.items()) {
      if (key == "role") {
        COLONY_ASSIGN_OR_RETURN(msg.role, Text(value, "messages.role"));
      } else if (key == "content") {
        if (value.is_null()) {
          msg.content_null = true;
        } else {
          COLONY_ASSIGN_OR_RETURN(msg.content, MessageContent(value));
        }
      } else if (key == "tool_calls") {
        if (!value.is_array()) return Bad("messages.tool_calls", "must be an array");
        if (value.size() > limits.max_tool_calls) {
          return Bad("messages.tool_calls", fmt::format("holds {} calls; at most {}", value.size(),
                                                        limits.max_tool_calls));
        }
        for (const auto& call : value) {
          COLONY_ASSIGN_OR_RETURN(ToolCall c, ParseToolCall(call));
          msg.tool_calls.push_back(std::move(c));
        }
      } else if (key == "tool_call_id") {
        COLONY_ASSIGN_OR_RETURN(msg.tool_call_id, Text(value, "messages.tool_call_id"));
        if (msg.tool_call_id.empty() || msg.tool_call_id.size() > kMaxIdBytes) {
          return Bad("messages.tool_call_id", fmt::format("must be 1 to {} bytes", kMaxIdBytes));
        }
      } else {
        return Bad("messages." + key, "is not supported by colony api (text messages only)");
      }
    }
    if (msg.role == "developer") msg.role = "system";
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" &&
        msg.role != "tool") {
      return Bad(
          "messages.role",
          fmt::format("'{}' is not one of system, developer, user, assistant, tool", msg.role));
    }
    // Content may only be left out (or null) by an assistant's message that calls tools.
    if (msg.tool_calls.empty() && (!m.contains("content") || msg.content_null)) {
      return Bad("messages.content", m.contains("content") ? "must not be null" : "is missing");
    }
    if (m.contains("tool_calls") && msg.role != "assistant") {
      return Bad("messages.tool_calls", "belong to an assistant's message");
    }
    if ((msg.role == "tool") != m.contains("tool_call_id")) {
      return Bad("messages.tool_call_id", msg.role == "tool"
                                              ? "is missing (a tool's message answers a call)"
                                              : "belongs to a tool's message");
    }
    if (!m.contains("content")) msg.content_null = true;
    r.messages.push_back(std::move(msg));
  }
  return Status::Ok();
}

using FieldParser = std::function<Status(const json&, GenerationRequest&)>;

// chat_template_kwargs (vLLM's): more variables of the model's own template, by name.
Status ParseTemplateKwargs(const json& v, GenerationRequest& q) {
  if (v.is_null()) return Status::Ok();
  if (!v.is_object()) return Bad("chat_template_kwargs", "must be an object");
  for (const auto& [key, value] : v.items()) {
    if (ModelChatTemplate::SetsVariable(key)) {
      return Bad("chat_template_kwargs." + key,
                 "is set by colony api from the request itself; send it there");
    }
    if (!IsName(key, /*dash=*/false) ||
        std::isdigit(static_cast<unsigned char>(key.front())) != 0) {
      return Bad("chat_template_kwargs." + key.substr(0, 64),
                 "is not a template variable's name (letters, digits and '_')");
    }
  }
  if (!v.empty()) q.template_kwargs_json = v.dump();
  return Status::Ok();
}

Result<GenerationRequest> Parse(std::string_view body, bool chat, const RequestLimits& limits,
                                const model::SamplingDefaults& defaults) {
  COLONY_ASSIGN_OR_RETURN(json j,
                          model::ParseStrictOrderedJsonObject(body, "the request body", kMaxDepth));
  GenerationRequest r;
  r.chat = chat;
  r.temperature = defaults.temperature;
  r.top_k = defaults.top_k;
  r.top_p = defaults.top_p;
  r.repetition_penalty = defaults.repetition_penalty;
  bool chat_logprobs = false;  // chat's logprobs: true
  bool tool_choice_none = false;
  std::optional<int64_t> top_logprobs;  // chat's top_logprobs
  std::optional<int64_t> best_of;       // completions'
  const std::map<std::string, FieldParser, std::less<>> common = {
      {"model",
       [](const json& v, GenerationRequest& q) -> Status {
         COLONY_ASSIGN_OR_RETURN(q.model, Text(v, "model"));
         return Status::Ok();
       }},
      {"max_tokens",
       [](const json& v, GenerationRequest& q) -> Status {
         if (v.is_null()) return Status::Ok();
         // 0 only with echo (checked at the end): scoring a prompt, as lm-eval-harness does.
         COLONY_ASSIGN_OR_RETURN(q.max_tokens, Integer(v, "max_tokens", 0, 1 << 20));
         return Status::Ok();
       }},
      {"temperature",
       [](const json& v, GenerationRequest& q) -> Status {
         if (v.is_null()) return Status::Ok();
         COLONY_ASSIGN_OR_RETURN(q.temperature, Number(v, "temperature", 0, 2));
         return Status::Ok();
       }},
      {"top_p",
       [](const json& v, GenerationRequest& q) -> Status {
         if (v.is_null()) return Status::Ok();
         COLONY_ASSIGN_OR_RETURN(q.top_p, Number(v, "top_p", 0, 1));
         if (q.top_p == 0) return Bad("top_p", "must be above 0");
         return Status::Ok();
       }},
      {"top_k",
       [](const json& v, GenerationRequest& q) -> Status {
         if (v.is_null()) return Status::Ok();
         COLONY_ASSIGN_OR_RETURN(q.top_k, Integer(v, "top_k", -1, 1 << 20));
         if (q.top_k < 0) q.top_k = 0;  // vLLM's -1: off
         return Status::Ok();
       }},
      {"repetition_penalty",
       [](const json& v, GenerationRequest& q) -> Status {
         if (v.is_null()) return Status::Ok();
         COLONY_ASSIGN_OR_RETURN(q.repetition_penalty, Number(v, "repetition_penalty", 0.01, 100));
         return Status::Ok();
       }},
      {"n",
       [&limits](const json& v, GenerationRequest& q) -> Status {
         if (v.is_null()) return Status::Ok();
         COLONY_ASSIGN_OR_RETURN(q.n, Integer(v, "n", 1, limits.max_n));
         return Status::Ok();
       }},
      {"stream",
       [](const json& v, GenerationRequest& q) -> Status {
         if (v.is_null()) return Status::Ok();
         COLONY_ASSIGN_OR_RETURN(q.stream, Bool(v, "stream"));
         return Status::Ok();
       }},
      {"stream_options",
       [](const json& v, GenerationRequest& q) -> Status {
         if (v.is_null()) return Status::Ok();
         if (!v.is_object()) return Bad("stream_options", "must be an object");
         for (const auto& [key, value] : v.items()) {
           if (key != "include_usage") {
             return Bad("stream_options." + key, "is not supported by colony api");
           }
           COLONY_ASSIGN_OR_RETURN(q.include_usage, Bool(value, "stream_options.include_usage"));
         }
         return Status::Ok();
       }},
      {"stop", [&limits](const json& v, GenerationRequest& q) { return ParseStop(v, limits, q); }},
      {"seed",
       [](const json& v, GenerationRequest& q) -> Status {
         if (v.is_null()) return Status::Ok();
         COLONY_ASSIGN_OR_RETURN(int64_t s, Integer(v, "seed", INT64_MIN, INT64_MAX));
         q.seed = static_cast<uint64_t>(s);
         return Status::Ok();
       }},
      {"user",
       [](const json& v, GenerationRequest&) -> Status {
         if (!v.is_string() && !v.is_null()) return Bad("user", "must be a string");
         return Status::Ok();  // an end-user id for the provider's abuse monitoring
       }},
      {"presence_penalty",
       [](const json& v, GenerationRequest& q) -> Status {
         if (v.is_null()) return Status::Ok();
         COLONY_ASSIGN_OR_RETURN(q.presence_penalty, Number(v, "presence_penalty", -2, 2));
         return Status::Ok();
       }},
      {"frequency_penalty",
       [](const json& v, GenerationRequest& q) -> Status {
         if (v.is_null()) return Status::Ok();
         COLONY_ASSIGN_OR_RETURN(q.frequency_penalty, Number(v, "frequency_penalty", -2, 2));
         return Status::Ok();
       }},
      {"logit_bias",
       [&limits](const json& v, GenerationRequest& q) { return ParseLogitBias(v, limits, q); }},
      {"min_p",
       [](const json& v, GenerationRequest& q) -> Status {
         if (v.is_null()) return Status::Ok();
         COLONY_ASSIGN_OR_RETURN(q.min_p, Number(v, "min_p", 0, 1));
         return Status::Ok();
       }},
      {"ignore_eos",
       [](const json& v, GenerationRequest& q) -> Status {
         if (v.is_null()) return Status::Ok();
         COLONY_ASSIGN_OR_RETURN(q.ignore_eos, Bool(v, "ignore_eos"));
         return Status::Ok();
       }},
      {"include_stop_str_in_output",
       [](const json& v, GenerationRequest& q) -> Status {
         if (v.is_null()) return Status::Ok();
         COLONY_ASSIGN_OR_RETURN(q.include_stop, Bool(v, "include_stop_str_in_output"));
         return Status::Ok();
       }},
      {"allowed_token_ids",
       [&limits](const json& v, GenerationRequest& q) {
         return ParseAllowedTokenIds(v, limits, q);
       }},
      {"stop_token_ids",
       [&limits](const json& v, GenerationRequest& q) { return ParseStopTokenIds(v, limits, q); }},
      {"min_tokens",
       [](const json& v, GenerationRequest& q) -> Status {
         if (v.is_null()) return Status::Ok();
         COLONY_ASSIGN_OR_RETURN(q.min_tokens, Integer(v, "min_tokens", 0, 1 << 20));
         return Status::Ok();
       }},
      {"response_format",
       [](const json& v, GenerationRequest& q) -> Status {
         if (v.is_null() || v == json({{"type", "text"}})) return Status::Ok();
         if (v == json({{"type", "json_object"}})) {
           q.json_object = true;
           return Status::Ok();
         }
         if (v.is_object() && v.contains("type") && v["type"] == "json_schema") {
           return ParseJsonSchema(v, q);
         }
         return Bad("response_format",
                    "must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": "
                    "\"json_schema\", \"json_schema\": {...}}");
       }},
      {"return_tokens_as_token_ids",
       [](const json& v, GenerationRequest& q) -> Status {
         if (v.is_null()) return Status::Ok();
         COLONY_ASSIGN_OR_RETURN(q.tokens_as_ids, Bool(v, "return_tokens_as_token_ids"));
         return Status::Ok();
       }},
  };
  std::map<std::string, FieldParser, std::less<>> own;
  if (chat) {
    own = {
        {"messages",
         [&limits](const json& v, GenerationRequest& q) { return ParseMessages(v, limits, q); }},
        {"max_completion_tokens",
         [](const json& v, GenerationRequest& q) -> Status {
           if (v.is_null()) return Status::Ok();
           COLONY_ASSIGN_OR_RETURN(q.max_tokens, Integer(v, "max_completion_tokens", 1, 1 << 20));
           return Status::Ok();
         }},
        {"logprobs",
         [&chat_logprobs](const json& v, GenerationRequest&) -> Status {
           if (v.is_null()) return Status::Ok();
           COLONY_ASSIGN_OR_RETURN(chat_logprobs, Bool(v, "logprobs"));
           return Status::Ok();
         }},
        {"top_logprobs",
         [&limits, &top_logprobs](const json& v, GenerationRequest&) -> Status {
           if (v.is_null()) return Status::Ok();
           COLONY_ASSIGN_OR_RETURN(top_logprobs,
                                   Integer(v, "top_logprobs", 0, limits.max_top_logprobs));
           return Status::Ok();
         }},
        {"tools",
         [&limits](const json& v, GenerationRequest& q) { return ParseTools(v, limits, q); }},
        {"tool_choice",
         [&tool_choice_none](const json& v, GenerationRequest&) -> Status {
           if (v.is_null() || v == "auto") return Status::Ok();
           if (v == "none") {
             tool_choice_none = true;
             return Status::Ok();
           }
           return Bad("tool_choice",
                      "is not supported by colony api but as \"auto\" or \"none\" (making the "
                      "model call a tool needs constrained decoding)");
         }},
        {"chat_template_kwargs", ParseTemplateKwargs},
        {"parallel_tool_calls",
         [](const json& v, GenerationRequest&) -> Status {
           if (v.is_null() || v == true) return Status::Ok();
           return Bad("parallel_tool_calls",
                      "is not supported by colony api but as true (it cannot keep a model from "
                      "writing several calls); leave it out");
         }},
    };
  } else {
    own = {
        {"prompt",
         [&limits](const json& v, GenerationRequest& q) { return ParsePrompt(v, limits, q); }},
        {"logprobs",
         [&limits](const json& v, GenerationRequest& q) -> Status {
           if (v.is_null()) return Status::Ok();
           COLONY_ASSIGN_OR_RETURN(q.logprobs, Integer(v, "logprobs", 0, limits.max_top_logprobs));
           return Status::Ok();
         }},
        {"echo",
         [](const json& v, GenerationRequest& q) -> Status {
           if (v.is_null()) return Status::Ok();
           COLONY_ASSIGN_OR_RETURN(q.echo, Bool(v, "echo"));
           return Status::Ok();
         }},
        {"suffix",
         [](const json& v, GenerationRequest&) -> Status {
           if (v.is_null() || v == "") return Status::Ok();
           return Bad("suffix", "is not supported by colony api (no insertion)");
         }},
        {"best_of",
         [&limits, &best_of](const json& v, GenerationRequest&) -> Status {
           if (v.is_null()) return Status::Ok();
           COLONY_ASSIGN_OR_RETURN(best_of, Integer(v, "best_of", 1, limits.max_n));
           return Status::Ok();
         }},
    };
  }
  for (const auto& [key, value] : j.items()) {
    const FieldParser* parse = nullptr;
    if (auto it = own.find(key); it != own.end()) parse = &it->second;
    if (auto it = common.find(key); parse == nullptr && it != common.end()) parse = &it->second;
    if (parse == nullptr) {
      return Bad(key, chat ? "is not a field of a chat completion request that colony api knows"
                           : "is not a field of a completion request that colony api knows");
    }
    COLONY_RETURN_IF_ERROR((*parse)(value, r));
  }
  if (chat && r.messages.empty()) return Bad("messages", "is missing");
  r.best_of = best_of.value_or(r.n);
  if (r.best_of < r.n) {
    return Bad("best_of",
               fmt::format("is {}, fewer than the {} choices asked for (n)", r.best_of, r.n));
  }
  if (r.best_of > r.n && r.stream) {
    return Bad("best_of", "cannot be streamed: which candidates are best is known only at the end");
  }
  if (tool_choice_none) {  // the model is not told about tools, so it does not call them
    r.tools_json.clear();
    r.tool_names.clear();
  }
  if (r.json_object && !r.tools_json.empty()) {
    return Bad("response_format",
               fmt::format("{} with tools is not supported (an answer kept to a JSON object could "
                           "not call a tool in the model's format); send tool_choice \"none\" or "
                           "no tools",
                           r.json_schema ? "json_schema" : "json_object"));
  }
  if (!chat && !j.contains("prompt")) return Bad("prompt", "is missing");
  if (chat && top_logprobs.value_or(0) > 0 && !chat_logprobs) {
    return Bad("top_logprobs", "needs \"logprobs\": true");
  }
  if (chat_logprobs) r.logprobs = top_logprobs.value_or(0);
  // Two names for one bound: both given must agree, or which one counts would be a guess.
  if (chat && j.contains("max_tokens") && !j["max_tokens"].is_null() &&
      j.contains("max_completion_tokens") && !j["max_completion_tokens"].is_null() &&
      j["max_tokens"] != j["max_completion_tokens"]) {
    return Bad("max_completion_tokens",
               fmt::format("is {} and max_tokens {}: send one of them (they name the same bound)",
                           j["max_completion_tokens"].dump(), j["max_tokens"].dump()));
  }
  // Options of a stream that is not asked for would be ignored.
  if (j.contains("stream_options") && !j["stream_options"].is_null() && !r.stream) {
    return Bad("stream_options", "is only allowed with \"stream\": true");
  }
  if (r.max_tokens == 0 && !r.echo) {
    return Bad(j.contains("max_tokens") ? "max_tokens" : "max_completion_tokens",
               "must be at least 1 (0 only with \"echo\": true, to score a prompt)");
  }
  if (r.max_tokens && r.min_tokens > *r.max_tokens) {
    const bool completion_tokens =
        j.contains("max_completion_tokens") && !j["max_completion_tokens"].is_null();
    return Bad("min_tokens", fmt::format("is {}, more than {} ({})", r.min_tokens,
                                         completion_tokens ? "max_completion_tokens" : "max_tokens",
                                         *r.max_tokens));
  }
  return r;
}

}  // namespace

Result<GenerationRequest> ParseCompletionRequest(std::string_view body, const RequestLimits& limits,
                                                 const model::SamplingDefaults& defaults) {
  return Parse(body, /*chat=*/false, limits, defaults);
}

Result<GenerationRequest> ParseChatRequest(std::string_view body, const RequestLimits& limits,
                                           const model::SamplingDefaults& defaults) {
  return Parse(body, /*chat=*/true, limits, defaults);
}

Result<TokenizeRequest> ParseTokenizeRequest(std::string_view body, const RequestLimits& limits) {
  COLONY_ASSIGN_OR_RETURN(json j,
                          model::ParseStrictOrderedJsonObject(body, "the request body", kMaxDepth));
  TokenizeRequest t;
  GenerationRequest& r = t.what;
  std::optional<bool> add_special_tokens;
  // Fields whose only value Colony does what it says for (vLLM's defaults).
  auto only = [](const json& v, std::string_view field, const json& value,
                 std::string_view why) -> Status {
    if (v.is_null() || v == value) return Status::Ok();
    return Bad(field, fmt::format("is only supported as {} ({})", value.dump(), why));
  };
  for (const auto& [key, value] : j.items()) {
    if (key == "model") {
      COLONY_ASSIGN_OR_RETURN(r.model, Text(value, "model"));
    } else if (key == "prompt") {
      COLONY_RETURN_IF_ERROR(ParsePrompt(value, limits, r));
      if (r.prompts.size() != 1 || r.prompts[0].is_tokens) return Bad("prompt", "must be a string");
    } else if (key == "messages") {
      r.chat = true;
      COLONY_RETURN_IF_ERROR(ParseMessages(value, limits, r));
    } else if (key == "tools") {
      COLONY_RETURN_IF_ERROR(ParseTools(value, limits, r));
    } else if (key == "chat_template_kwargs") {
      COLONY_RETURN_IF_ERROR(ParseTemplateKwargs(value, r));
    } else if (key == "add_special_tokens") {
      if (!value.is_null()) {
        COLONY_ASSIGN_OR_RETURN(add_special_tokens, Bool(value, "add_special_tokens"));
      }
    } else if (key == "add_generation_prompt") {
      COLONY_RETURN_IF_ERROR(only(value, key, true, "chats are tokenized as they are generated"));
    } else if (key == "continue_final_message") {
      COLONY_RETURN_IF_ERROR(only(value, key, false, "chats are tokenized as they are generated"));
    } else if (key == "return_token_strs") {
      COLONY_RETURN_IF_ERROR(only(value, key, false, "tokens are ids; /detokenize gives text"));
    } else {
      return Bad(key, "is not a field of a tokenize request that colony api knows");
    }
  }
  if (j.contains("prompt") == j.contains("messages")) {
    return Bad("prompt", "or 'messages' must be given, and not both");
  }
  if (!r.chat) {
    for (const char* field :
         {"tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message"}) {
      if (j.contains(field)) return Bad(field, "needs 'messages'");
    }
  }
  // A chat's template writes its own special tokens: vLLM adds none by default.
  if (r.chat && add_special_tokens.value_or(false)) {
    return Bad("add_special_tokens",
               "is only supported as false with messages (the chat "
               "template writes the special tokens)");
  }
  t.add_special_tokens = !r.chat && add_special_tokens.value_or(true);
  return t;
}

Result<DetokenizeRequest> ParseDetokenizeRequest(std::string_view body,
                                                 const RequestLimits& limits) {
  COLONY_ASSIGN_OR_RETURN(json j,
                          model::ParseStrictOrderedJsonObject(body, "the request body", kMaxDepth));
  DetokenizeRequest d;
  for (const auto& [key, value] : j.items()) {
    if (key == "model") {
      COLONY_ASSIGN_OR_RETURN(d.model, Text(value, "model"));
    } else if (key == "tokens") {
      if (!value.is_array()) return Bad("tokens", "must be an array of token ids");
      if (value.size() > limits.max_prompt_tokens) {
        return Bad("tokens", fmt::format("holds {} tokens; at most {}", value.size(),
                                         limits.max_prompt_tokens));
      }
      for (size_t i = 0; i < value.size(); ++i) {
        COLONY_ASSIGN_OR_RETURN(int64_t id,
                                Integer(value[i], fmt::format("tokens[{}]", i), 0, INT32_MAX));
        d.tokens.push_back(id);
      }
    } else {
      return Bad(key, "is not a field of a detokenize request that colony api knows");
    }
  }
  if (!j.contains("tokens")) return Bad("tokens", "is missing");
  return d;
}

}  // namespace colony::api
