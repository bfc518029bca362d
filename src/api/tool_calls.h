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
// A format by its name (hermes, llama3_json, mistral; vLLM's --tool-call-parser names):
// InvalidArgument naming the ones there are.
Result<ToolCallFormat> ParseToolCallFormat(std::string_view name);

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

// Where a JSON object or array that arrives in pieces ends: its brackets outside strings
// balanced. Feed() is given the value's text so far (starting with '{' or '['), each time longer,
// and reads only what it has not read yet; the end (one past the last bracket) or npos.
class BracketScan {
 public:
  size_t Feed(std::string_view value_so_far);

 private:
  size_t pos_ = 0;
  int depth_ = 0;
  bool in_string_ = false;
};

// A streamed answer's text, passed on until a call may have begun: Add() returns the text that
// is certainly not part of a call (never whitespace that may precede one, never the start of a
// call's marker). What is held is passed on as soon as it can no longer be well-formed calls to
// the request's tools (a call that names another tool or is malformed, text after a call: a
// Llama answer that starts with '{' but is not a call, say), as ReadToolCalls would read the
// whole answer; otherwise it is decided at the end, by ReadToolCalls on the whole text. The work
// is linear in the answer: each byte is read a bounded number of times, however it is split.
class ToolCallStream {
 public:
  // `names`: the request's tools.
  ToolCallStream(ToolCallFormat format, std::vector<std::string> names)
      : format_(format), names_(std::move(names)) {}
  std::string Add(std::string_view delta);
  // At the end, once ReadToolCalls has read the whole answer: the rest of its content that was
  // held (without calls all the text held; with calls, what of `content`, the text before them,
  // was not passed on yet).
  std::string Finish(const Answer& whole);

 private:
  // Starts holding: calls may begin at text_[at] (after their marker, if any).
  void Hold(size_t at, bool bare);
  // Reads what came since: false once the held text cannot be well-formed calls.
  bool MayBeCalls();
  // The held text turned out to be text: what of it may be passed on now.
  std::string Release();
  // What may be passed on from text_, not holding.
  std::string Scan();

  ToolCallFormat format_;
  std::vector<std::string> names_;
  std::string text_;      // everything so far (nothing kept once it is known to be text)
  size_t passed_ = 0;     // how much of it Add() returned
  size_t tail_ = 0;       // not holding: text_[passed_, tail_) is whitespace
  bool holding_ = false;  // a call may have begun: everything from passed_ on is held
  // While holding: how far the held text was read (text_[at_] is the next unread place outside
  // a call), whether a call is being read (from unit_, its brackets by scan_), whether one
  // ended last (then a separator or the end must follow), and whether the hold is a bare
  // Mistral array at the start (no [TOOL_CALLS] marker) or the Llama <|python_tag|> or a call's
  // start was seen.
  size_t at_ = 0;
  bool in_unit_ = false;
  size_t unit_ = 0;
  BracketScan scan_;
  bool after_call_ = false;
  bool bare_ = false;
  bool bare_refused_ = false;
  bool tag_seen_ = false;
  bool call_seen_ = false;
};

}  // namespace colony::api
