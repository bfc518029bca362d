// Fuzz target for reading tool calls out of a model's answer (api/tool_calls), in every format:
// the answer is the model's (and so, through its prompt, a client's) text. Nothing crashes; a
// call names one of the request's tools and carries a JSON object; and the answer streamed in
// pieces passes on exactly the content of the whole answer.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "api/tool_calls.h"

using namespace colony::api;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the pieces' length (1-16 bytes).
  const size_t step = 1 + (data[0] & 15);
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::vector<std::string> names = {"get_weather", "f"};
  for (ToolCallFormat format : {ToolCallFormat::kNone, ToolCallFormat::kHermes,
                                ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral}) {
    const Answer a = ReadToolCalls(format, text, names);
    if (a.calls.empty() && (a.content != text || a.content_null)) __builtin_trap();
    for (const ToolCall& c : a.calls) {
      if (c.name != names[0] && c.name != names[1]) __builtin_trap();
      if (c.arguments.empty() || c.arguments.front() != '{' || c.id.empty()) __builtin_trap();
    }
    ToolCallStream stream(format, names);
    std::string streamed;
    for (size_t at = 0; at < text.size(); at += step) streamed += stream.Add(text.substr(at, step));
    streamed += stream.Finish(a);
    if (streamed != a.content) __builtin_trap();
  }
  return 0;
}
