// Tool calls in a model's answer: how a family writes them (the format its chat template teaches
// it), reading them out of the answer's text into OpenAI's `tool_calls`, and holding back the
// text of a call while an answer streams. Torch-free (fuzzed).
//
//   const ToolCallFormat format = DetectToolCallFormat(template_source);  // e.g. kHermes
//   Answer a = ReadToolCalls(format, text, {"get_weather"});
//   // a.calls: [{id, "get_weather", "{\"city\":\"Paris\"}"}], a.content: the text before them
//
// The formats, as the families' own templates describe them to the model:
// - kHermes (Qwen2.5, Qwen3, Hermes): `<tool_call>\n{"name": ..., "arguments":
// {...}}\n</tool_call>`,
//   one block per call, after optional text;
// - kLlama3Json (Llama 3.1-3.3): the whole answer is `{"name": ..., "parameters": {...}}`
//   (optionally after <|python_tag|>, calls separated by ';');
// - kMistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` ([TOOL_CALLS] is a special
//   token, which decoding drops, so an answer that is only such an array counts too).
// An answer is read as calls only when every call in it parses and names one of the request's
// tools; otherwise it is text, whole, as vLLM's parsers leave what they cannot read.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "api/openai_request.h"

namespace colony::api {

enum class ToolCallFormat { kNone, kHermes, kLlama3Json, kMistral };

// From the text of a chat template: the format it describes to the model (kNone: none Colony
// knows, or the template takes no tools).
ToolCallFormat DetectToolCallFormat(std::string_view template_source);
std::string_view ToolCallFormatName(ToolCallFormat format);

struct Answer {
  std::string content;  // the text besides the calls (with calls: before them, trimmed)
  bool content_null = false;
  // Each with a new random id: "call_" and 24 letters and digits (Mistral: 9 letters and
  // digits, the only ids its templates take back).
  std::vector<ToolCall> calls;
};

// `names`: the request's tools (none: the text is content).
Answer ReadToolCalls(ToolCallFormat format, std::string_view text,
                     const std::vector<std::string>& names);

// The calls as OpenAI writes them in a message's "tool_calls" ({"id", "type": "function",
// "function": {"name", "arguments"}}); `indexed` (a stream's delta): each with its "index" too.
nlohmann::json ToolCallsJson(const std::vector<ToolCall>& calls, bool indexed);

// A streamed answer's text, passed on until a call may have begun: Add() returns the text that
// is certainly not part of a call (never whitespace that may precede one, never the start of a
// call's marker); what is held is decided at the end, by ReadToolCalls on the whole text.
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat format) : format_(format) {}
  std::string Add(std::string_view delta);
  // At the end, once ReadToolCalls has read the whole answer: the rest of its content that was
  // held (without calls all the text held; with calls, what of `content`, the text before them,
  // was not passed on yet).
  std::string Finish(const Answer& whole);

 private:
  ToolCallFormat format_;
  std::string text_;      // everything so far (nothing kept once it is known to be text)
  size_t passed_ = 0;     // how much of it Add() returned
  bool holding_ = false;  // a call may have begun: everything from passed_ on is held
};

}  // namespace colony::api
