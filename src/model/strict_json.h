// Strict parsing of untrusted JSON files (safetensors headers, tokenizer.json): nlohmann-json's
// parser, plus refusing what it accepts silently — a key twice in one object (readers keeping
// the first or the last value would disagree about the file) and nesting deeper than a bound.
//
//   auto doc = ParseStrictJsonObject(text, "header", /*max_depth=*/8);
//   // errors: "header is not valid JSON", "header is not a JSON object",
//   //         "duplicate key \"w\" in header", "header nests deeper than 8"
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "core/status.h"

namespace colony::model {

// Parses `text`, which must hold one JSON object; `what` names it in errors (InvalidArgument).
Result<nlohmann::json> ParseStrictJsonObject(std::string_view text, std::string_view what,
                                             int max_depth);
// The same, keeping every object's keys in the order of the text (what a client sent, e.g. a
// tool's JSON schema that a chat template writes out again).
Result<nlohmann::ordered_json> ParseStrictOrderedJsonObject(std::string_view text,
                                                            std::string_view what, int max_depth);

}  // namespace colony::model
