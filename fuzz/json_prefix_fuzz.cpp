// Fuzz target for api::JsonObjectPrefix, which reads the answers response_format json_object
// keeps to (a model's output, steered by a client's prompt): on every prefix of the input it
// agrees with nlohmann::json on whether the text can still become a JSON object and whether it is
// one, and its Closing() completes each viable prefix (fuzz/json_prefix_checks.h).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "json_prefix_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 1024) return 0;  // every prefix is parsed: quadratic
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (!CheckJsonObjectPrefixes(text).empty()) __builtin_trap();
  return 0;
}
