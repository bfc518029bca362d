// Reading tool calls out of an answer's text, format by format, and holding back a streamed
// answer's text from where a call may begin.
#include "api/tool_calls.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "model/strict_json.h"

namespace colony::api {

namespace {

using json = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr int kMaxDepth = 32;
constexpr std::string_view kSpace = " \t\r\n";

std::string_view TrimLeft(std::string_view s) {
  const size_t first = s.find_first_not_of(kSpace);
  return first == std::string_view::npos ? std::string_view() : s.substr(first);
}

std::string_view TrimRight(std::string_view s) {
  const size_t last = s.find_last_not_of(kSpace);
  return last == std::string_view::npos ? std::string_view() : s.substr(0, last + 1);
}

// One call written as {"name": ..., "<arguments_key>": {...}}: none unless the name is one of
// `names` and the arguments an object (absent: none).
std::optional<ToolCall> CallFrom(const json& j, const std::vector<std::string>& names) {
  if (!j.is_object()) return std::nullopt;
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return std::nullopt;
  const auto& n = name->get_ref<const std::string&>();
  if (std::ranges::find(names, n) == names.end()) return std::nullopt;
  const json* args = nullptr;
  for (const char* key : {"arguments", "parameters"}) {
    if (auto it = j.find(key); it != j.end()) {
      if (args != nullptr) return std::nullopt;  // both: which one was meant is a guess
      args = &*it;
    }
  }
  for (const auto& [key, value] : j.items()) {
    if (key != "name" && key != "arguments" && key != "parameters" && key != "id") {
      return std::nullopt;
    }
  }
  if (args != nullptr && !args->is_object()) return std::nullopt;
  return ToolCall{.id = "",
                  .name = n,
                  .arguments = args == nullptr
                                   ? std::string("{}")
                                   : args->dump(-1, ' ', false, json::error_handler_t::replace)};
}

std::optional<json> ParseObject(std::string_view text) {
  auto parsed = model::ParseStrictOrderedJsonObject(text, "a tool call", kMaxDepth);
  if (!parsed.ok()) return std::nullopt;
  return std::move(*parsed);
}

// The call that the text of one JSON object is (Hermes' block, Llama's object).
std::optional<ToolCall> CallIn(std::string_view object, const std::vector<std::string>& names) {
  const auto parsed = ParseObject(object);
  return parsed ? CallFrom(*parsed, names) : std::nullopt;
}

// The calls of a Mistral array, given as exactly one array (its brackets balanced at its end),
// parsed as the value of an object (the strict parser reads objects); none unless every item is
// a call.
std::vector<ToolCall> CallsInArray(std::string_view array, const std::vector<std::string>& names) {
  const auto parsed = ParseObject(fmt::format("{{\"calls\": {}}}", array));
  if (!parsed || !(*parsed)["calls"].is_array()) return {};
  std::vector<ToolCall> calls;
  for (const auto& item : (*parsed)["calls"]) {
    std::optional<ToolCall> call = CallFrom(item, names);
    if (!call) return {};
    calls.push_back(std::move(*call));
  }
  return calls;
}

}  // namespace

size_t BracketScan::Feed(std::string_view s) {
  for (; pos_ < s.size(); ++pos_) {
    const char c = s[pos_];
    if (in_string_) {
      if (c == '\\') {
        if (pos_ + 1 == s.size()) break;  // what it escapes has not come yet
        ++pos_;
      } else if (c == '"') {
        in_string_ = false;
      }
    } else if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if (c == '}' || c == ']') {
      if (--depth_ <= 0) return ++pos_;
    }
  }
  return std::string_view::npos;
}

namespace {

// The end of the JSON value that starts at s[0] == '{' or '[' (brackets outside strings
// balanced), or npos.
size_t ObjectEnd(std::string_view s) { return BracketScan().Feed(s); }

std::vector<ToolCall> ReadHermes(std::string_view rest, const std::vector<std::string>& names) {
  std::vector<ToolCall> calls;
  while (!(rest = TrimLeft(rest)).empty()) {
    if (!rest.starts_with(kHermesOpen)) return {};
    rest.remove_prefix(kHermesOpen.size());
    const size_t close = rest.find(kHermesClose);
    // The last block may end at the end of the answer (an end token right after the call).
    const std::string_view body = rest.substr(0, close);
    rest = close == std::string_view::npos ? std::string_view()
                                           : rest.substr(close + kHermesClose.size());
    std::optional<ToolCall> call = CallIn(TrimLeft(TrimRight(body)), names);
    if (!call) return {};
    calls.push_back(std::move(*call));
  }
  return calls;
}

std::vector<ToolCall> ReadLlama3(std::string_view rest, const std::vector<std::string>& names) {
  std::vector<ToolCall> calls;
  rest = TrimLeft(rest);
  if (rest.starts_with(kPythonTag)) rest = TrimLeft(rest.substr(kPythonTag.size()));
  while (!rest.empty()) {
    if (!calls.empty()) {  // calls separated by ';'
      if (rest.front() != ';') return {};
      rest = TrimLeft(rest.substr(1));
      if (rest.empty()) break;
    }
    if (rest.front() != '{') return {};
    const size_t end = ObjectEnd(rest);
    if (end == std::string_view::npos) return {};
    std::optional<ToolCall> call = CallIn(rest.substr(0, end), names);
    if (!call) return {};
    calls.push_back(std::move(*call));
    rest = TrimLeft(rest.substr(end));
  }
  return calls;
}

std::vector<ToolCall> ReadMistral(std::string_view rest, const std::vector<std::string>& names) {
  // One array and nothing after it (the object CallsInArray wraps it in would take in what
  // follows: `], "k": 1` would be its member).
  rest = TrimLeft(TrimRight(rest));
  if (!rest.starts_with('[') || ObjectEnd(rest) != rest.size()) return {};
  return CallsInArray(rest, names);
}

// The longest end of `text` that is a proper start of `marker`.
size_t PartialMarker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

std::string NewId(ToolCallFormat format, std::mt19937_64& rng) {
  static constexpr std::string_view kAlnum =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  // Mistral's templates refuse ids other than 9 letters and digits.
  const size_t n = format == ToolCallFormat::kMistral ? 9 : 24;
  std::string id = format == ToolCallFormat::kMistral ? "" : "call_";
  for (size_t i = 0; i < n; ++i) id += kAlnum[rng() % kAlnum.size()];
  return id;
}

}  // namespace

ToolCallFormat DetectToolCallFormat(std::string_view source) {
  if (source.find("tools") == std::string_view::npos) return ToolCallFormat::kNone;
  if (source.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (source.find(kMistralMarker) != std::string_view::npos) return ToolCallFormat::kMistral;
  if (source.find(kPythonTag) != std::string_view::npos ||
      source.find("\"parameters\": dictionary of argument name") != std::string_view::npos) {
    return ToolCallFormat::kLlama3Json;
  }
  return ToolCallFormat::kNone;
}

std::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kMistral:
      return "mistral";
    case ToolCallFormat::kNone:
      break;
  }
  return "none";
}

Result<ToolCallFormat> ParseToolCallFormat(std::string_view name) {
  constexpr ToolCallFormat kFormats[] = {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json,
                                         ToolCallFormat::kMistral};
  std::vector<std::string_view> names;
  for (ToolCallFormat f : kFormats) {
    if (ToolCallFormatName(f) == name) return f;
    names.push_back(ToolCallFormatName(f));
  }
  return InvalidArgument(
      fmt::format("unknown tool call format '{}' (one of: {})", name, fmt::join(names, ", ")));
}

Answer ReadToolCalls(ToolCallFormat format, std::string_view text,
                     const std::vector<std::string>& names) {
  Answer answer{.content = std::string(text), .content_null = false, .calls = {}};
  if (names.empty()) return answer;
  std::string_view before;  // the content besides the calls
  std::vector<ToolCall> calls;
  switch (format) {
    case ToolCallFormat::kHermes:
      if (const size_t at = text.find(kHermesOpen); at != std::string_view::npos) {
        before = text.substr(0, at);
        calls = ReadHermes(text.substr(at), names);
      }
      break;
    case ToolCallFormat::kLlama3Json:
      calls = ReadLlama3(text, names);
      break;
    case ToolCallFormat::kMistral:
      if (const size_t at = text.find(kMistralMarker); at != std::string_view::npos) {
        before = text.substr(0, at);
        calls = ReadMistral(text.substr(at + kMistralMarker.size()), names);
      } else if (TrimLeft(text).starts_with('[')) {
        calls = ReadMistral(text, names);
      }
      break;
    case ToolCallFormat::kNone:
      break;
  }
  if (calls.empty()) return answer;
  answer.content = std::string(TrimRight(before));
  answer.content_null = answer.content.empty();
  std::random_device rd;
  std::mt19937_64 rng((static_cast<uint64_t>(rd()) << 32) | rd());
  for (ToolCall& call : calls) call.id = NewId(format, rng);
  answer.calls = std::move(calls);
  return answer;
}

nlohmann::json ToolCallsJson(const std::vector<ToolCall>& calls, bool indexed) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    nlohmann::json call = {
        {"id", calls[k].id},
        {"type", "function"},
        {"function", {{"name", calls[k].name}, {"arguments", calls[k].arguments}}}};
    if (indexed) call["index"] = k;
    out.push_back(std::move(call));
  }
  return out;
}

std::string ToolCallStream::Add(std::string_view delta) {
  if (format_ == ToolCallFormat::kNone) return std::string(delta);  // all of it, kept nowhere
  text_ += delta;
  if (!holding_) return Scan();
  return MayBeCalls() ? std::string() : Release();
}

std::string ToolCallStream::Scan() {
  size_t end = text_.size();  // what may be passed on: [passed_, end)
  const std::string_view all = text_;
  // What was not passed on is whitespace up to tail_, then at most a marker's start: no call
  // begins before tail_, and where nothing was passed on, the answer starts there.
  const std::string_view start = TrimLeft(all.substr(tail_));
  switch (format_) {
    case ToolCallFormat::kHermes:
    case ToolCallFormat::kMistral: {
      const std::string_view marker =
          format_ == ToolCallFormat::kHermes ? kHermesOpen : kMistralMarker;
      // A bare array at the start of a Mistral answer may be its calls ([TOOL_CALLS] decoded
      // away).
      if (format_ == ToolCallFormat::kMistral && passed_ == 0 && !bare_refused_ &&
          start.starts_with('[')) {
        tail_ = all.size() - start.size();
        Hold(0, /*bare=*/true);
        return MayBeCalls() ? std::string() : Release();
      }
      if (const size_t at = all.find(marker, tail_); at != std::string_view::npos) {
        // Hermes' calls begin with their marker, Mistral's array after it.
        Hold(format_ == ToolCallFormat::kHermes ? at : at + marker.size(), /*bare=*/false);
        end = at;
      } else {
        end -= PartialMarker(all, marker);
      }
      break;
    }
    case ToolCallFormat::kLlama3Json:
      // Calls are the whole answer: held while it may be one.
      if (start.empty() || start.starts_with('{') || start.starts_with(kPythonTag) ||
          std::string_view(kPythonTag).starts_with(start)) {
        if (!start.empty() && !std::string_view(kPythonTag).starts_with(start)) {
          Hold(0, /*bare=*/false);
          if (!MayBeCalls()) return Release();
        }
        tail_ = all.size() - start.size();
        return {};
      }
      return Release();  // text: passed on as it comes from now on
    case ToolCallFormat::kNone:
      break;
  }
  // Whitespace that may precede a call is not passed on yet: [tail_, end) read back to its last
  // other byte (before tail_ all is whitespace), so that a long run is not read again each time.
  size_t last = end;
  while (last > tail_ && kSpace.find(all[last - 1]) != std::string_view::npos) --last;
  if (last == tail_) last = passed_;
  std::string out = last > passed_ ? text_.substr(passed_, last - passed_) : std::string();
  passed_ = std::max(passed_, last);
  tail_ = std::max(passed_, end);
  if (holding_ && !MayBeCalls()) out += Release();
  return out;
}

void ToolCallStream::Hold(size_t at, bool bare) {
  holding_ = true;
  at_ = at;
  in_unit_ = false;
  scan_ = BracketScan();
  after_call_ = false;
  bare_ = bare;
  tag_seen_ = false;
  call_seen_ = false;
}

std::string ToolCallStream::Release() {
  holding_ = false;
  if (bare_) {
    // Not a bare array of calls; [TOOL_CALLS] may still come, as ReadToolCalls would find it.
    bare_refused_ = true;
    bare_ = false;
    return Scan();
  }
  // The first call (Hermes, Mistral) or the whole answer (Llama) is not one, so the whole
  // answer is text, as ReadToolCalls reads it: passed on as it comes from now on.
  format_ = ToolCallFormat::kNone;
  std::string out = text_.substr(passed_);
  passed_ = text_.size();
  text_ = std::string();
  return out;
}

bool ToolCallStream::MayBeCalls() {
  const std::string_view all = text_;
  while (true) {
    if (in_unit_) {
      // A call (Hermes: the body after <tool_call>; Llama: an object; Mistral: the array).
      std::string_view body;
      size_t next = 0;
      if (format_ == ToolCallFormat::kHermes) {
        // The close tag may have begun in what was read before.
        const size_t from =
            std::max(unit_, at_ >= kHermesClose.size() ? at_ - kHermesClose.size() : 0);
        const size_t close = all.find(kHermesClose, from);
        if (close == std::string_view::npos) {
          at_ = all.size();
          return true;
        }
        body = TrimLeft(TrimRight(all.substr(unit_, close - unit_)));
        next = close + kHermesClose.size();
      } else {
        const size_t end = scan_.Feed(all.substr(unit_));
        if (end == std::string_view::npos) return true;
        body = all.substr(unit_, end);
        next = unit_ + end;
      }
      // The scan ended the unit where its brackets balance: Mistral's array is read as it is.
      if (format_ == ToolCallFormat::kMistral ? CallsInArray(body, names_).empty()
                                              : !CallIn(body, names_)) {
        return false;
      }
      in_unit_ = false;
      after_call_ = true;
      at_ = next;
      continue;
    }
    const size_t first = all.find_first_not_of(kSpace, at_);
    if (first == std::string_view::npos) {
      at_ = all.size();
      return true;
    }
    at_ = first;
    const std::string_view rest = all.substr(at_);
    switch (format_) {
      case ToolCallFormat::kHermes:  // blocks, whitespace between them
        if (!rest.starts_with(kHermesOpen)) return kHermesOpen.starts_with(rest);
        at_ += kHermesOpen.size();
        unit_ = at_;
        in_unit_ = true;
        break;
      case ToolCallFormat::kLlama3Json:   // [<|python_tag|>] object (; object)*
        if (!tag_seen_ && !call_seen_) {  // the tag only before the first call
          if (rest.starts_with(kPythonTag)) {
            tag_seen_ = true;
            at_ += kPythonTag.size();
            break;
          }
          if (std::string_view(kPythonTag).starts_with(rest)) return true;
        }
        if (after_call_) {
          if (rest.front() != ';') return false;
          after_call_ = false;
          ++at_;
          break;
        }
        if (rest.front() != '{') return false;
        unit_ = at_;
        scan_ = BracketScan();
        in_unit_ = true;
        call_seen_ = true;
        break;
      case ToolCallFormat::kMistral:  // one array, only whitespace after it
        if (after_call_ || rest.front() != '[') return false;
        unit_ = at_;
        scan_ = BracketScan();
        in_unit_ = true;
        break;
      case ToolCallFormat::kNone:
        return false;
    }
  }
}

std::string ToolCallStream::Finish(const Answer& whole) {
  if (format_ == ToolCallFormat::kNone) return {};  // passed on as it came (never calls)
  // What was passed on is the start of the content either way.
  const std::string_view content = whole.calls.empty() ? std::string_view(text_) : whole.content;
  std::string rest(content.substr(std::min(passed_, content.size())));
  passed_ = text_.size();
  return rest;
}

}  // namespace colony::api
