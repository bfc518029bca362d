// Fuzz target for api::JsonSchema and JsonSchemaPrefix (response_format json_schema: a client's
// schema, then a model's output the client's prompt steers). The input is a schema's JSON text,
// a NUL byte, then an answer: a schema that compiles must give a reader whose every taken prefix
// closes (Closing()) into a document the validator written from the specification accepts
// (fuzz/json_schema_checks.h); one that does not must be refused with InvalidArgument.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "json_schema_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;  // every prefix is closed and parsed: quadratic
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const auto schema = nlohmann::json::parse(input.substr(0, nul), nullptr, false);
  if (schema.is_discarded()) return 0;
  auto compiled = colony::api::JsonSchema::Compile(schema);
  if (!compiled.ok()) {
    if (compiled.status().code() != colony::StatusCode::kInvalidArgument) __builtin_trap();
    return 0;
  }
  const std::string_view answer = nul == std::string_view::npos ? "" : input.substr(nul + 1);
  if (answer.size() > 512) return 0;
  if (!schema_checks::CheckSchemaPrefixes(schema, **compiled, answer).empty()) __builtin_trap();
  return 0;
}
