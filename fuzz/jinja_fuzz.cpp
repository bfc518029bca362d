// Fuzz target for Colony's Jinja (api/jinja_*): the input is a template, parsed and then
// rendered over a conversation whose messages carry the input too (a template is the model
// directory's, the messages a client's). Nothing crashes, overflows the stack or runs away:
// every error names what failed, and rendering stays within its limits.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "api/jinja_template.h"

using namespace colony;
using namespace colony::api::jinja;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  auto t = Template::Parse(source);
  if (!t.ok()) {
    if (t.status().message().empty()) __builtin_trap();
    return 0;
  }
  const auto message = [&](const char* role) {
    return Value::FromDict(
        {{"role", Value::String(role)}, {"content", Value::String(std::string(source))}});
  };
  const Dict context = {
      {"messages", Value::FromList({message("system"), message("user"), message("assistant")})},
      {"add_generation_prompt", Value::Bool(true)},
      {"bos_token", Value::String("<s>")},
      {"eos_token", Value::String("</s>")},
      {"tools", Value::None()},
  };
  RenderLimits limits;
  limits.max_output_bytes = 1 << 16;
  limits.max_list_items = 1 << 10;
  limits.max_steps = 20000;
  limits.max_call_depth = 8;
  auto out = t->Render(context, limits);
  if (!out.ok()) {
    if (out.status().message().empty()) __builtin_trap();
    return 0;
  }
  if (out->size() > limits.max_output_bytes) __builtin_trap();
  return 0;
}
