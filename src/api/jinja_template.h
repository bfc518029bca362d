// A Jinja template, parsed once and rendered many times: how `colony api` runs a model's own
// chat template (tokenizer_config.json's chat_template, or chat_template.jinja) as transformers'
// apply_chat_template does.
//
//   auto t = jinja::Template::Parse(source);          // errors name the line
//   auto text = t->Render({{"messages", ...}, {"add_generation_prompt", Value::Bool(true)}});
//
// Parse refuses filters and tests it does not know, by name, so a template Colony cannot run
// fails when `colony api` starts, not on a user's request. Rendering is bounded (RenderLimits):
// the messages in a request are a client's, and a template loops over them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "api/jinja_syntax.h"
#include "api/jinja_value.h"
#include "core/status.h"

namespace colony::api::jinja {

struct RenderLimits {
  // Of the output and of any string or list built on the way.
  size_t max_output_bytes = 16 << 20;
  size_t max_list_items = 1 << 20;
  // Statements and expressions evaluated, plus loop iterations.
  uint64_t max_steps = 10'000'000;
  // Macro calls within macro calls.
  int max_call_depth = 32;
};

class Template {
 public:
  // InvalidArgument "line N: ..." for a template that is malformed or uses what is unsupported.
  static Result<Template> Parse(std::string_view source);

  // Renders with `context`'s names defined (and the globals range, namespace, dict,
  // raise_exception, strftime_now). FailedPrecondition with its message as it is when the
  // template refuses the context itself (raise_exception), InvalidArgument "line N: ..." for
  // what fails in it (an undefined value's attribute, a type error), ResourceExhausted past
  // `limits`.
  Result<std::string> Render(const Dict& context, const RenderLimits& limits = {}) const;

 private:
  explicit Template(std::shared_ptr<const Body> body) : body_(std::move(body)) {}
  std::shared_ptr<const Body> body_;
};

}  // namespace colony::api::jinja
