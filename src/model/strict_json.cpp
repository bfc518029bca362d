// Strict JSON (strict_json.h): a parser callback that tracks the keys of each open object and
// the nesting depth.
#include "model/strict_json.h"

#include <fmt/format.h>

#include <set>
#include <string>
#include <vector>

namespace colony::model {

namespace {

template <class json>
Result<json> ParseStrict(std::string_view text, std::string_view what, int max_depth) {
  bool too_deep = false;
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  typename json::parser_callback_t cb = [&](int depth, typename json::parse_event_t event,
                                            json& parsed) {
    if (depth > max_depth) too_deep = true;
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.template get<std::string>()).second &&
            duplicate.empty()) {
          duplicate = parsed.template get<std::string>();
        }
        break;
      default:
        break;
    }
    return !too_deep;  // discards the rest: the document is refused below
  };
  json doc;
  try {
    doc = json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/false);
  } catch (const std::exception& e) {  // allocation failures in the callback
    return InvalidArgument(fmt::format("{} cannot be parsed: {}", what, e.what()));
  }
  if (too_deep) return InvalidArgument(fmt::format("{} nests deeper than {}", what, max_depth));
  if (doc.is_discarded()) return InvalidArgument(fmt::format("{} is not valid JSON", what));
  if (!doc.is_object()) return InvalidArgument(fmt::format("{} is not a JSON object", what));
  if (!duplicate.empty()) {
    return InvalidArgument(
        fmt::format("duplicate key \"{}\" in {}", duplicate.substr(0, 256), what));
  }
  return doc;
}

}  // namespace

Result<nlohmann::json> ParseStrictJsonObject(std::string_view text, std::string_view what,
                                             int max_depth) {
  return ParseStrict<nlohmann::json>(text, what, max_depth);
}

Result<nlohmann::ordered_json> ParseStrictOrderedJsonObject(std::string_view text,
                                                            std::string_view what, int max_depth) {
  return ParseStrict<nlohmann::ordered_json>(text, what, max_depth);
}

}  // namespace colony::model
