// A validator of the JSON Schema keywords api::JsonSchema supports, written from the
// specification (draft 2020-12: type, enum, const, anyOf, oneOf, allOf, $ref, properties,
// required, additionalProperties, items, prefixItems, minItems, maxItems, uniqueItems, minLength,
// maxLength, minimum, maximum, exclusiveMinimum, exclusiveMaximum; format asserts nothing; and
// draft 7's tuples, a list of items with additionalItems), not from the compiled nodes; and a check
// that every prefix of a text that JsonSchemaPrefix takes closes into a valid document. Used by the
// fuzz target and the unit tests.
#pragma once

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "api/json_schema.h"

namespace schema_checks {

using json = nlohmann::json;

inline bool SchemaValid(const nlohmann::json& schema, const nlohmann::json& v,
                        const nlohmann::json& root);

inline bool OfType(const std::string& type, const json& v) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  if (type == "integer") {
    return v.is_number_integer() ||
           (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  }
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  return false;
}

// A number's value as exact decimal digits: an integer's; an integral double's (printed whole,
// exactly); another double's shortest text (no integer equals it).
inline std::string ExactNumber(const json& v) {
  if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  const double d = v.get<double>();
  if (d == 0) return "0";  // (and -0)
  if (std::floor(d) != d) return v.dump();
  char digits[400];
  std::snprintf(digits, sizeof digits, "%.0f", d);
  return digits;
}

// Equality as the specification defines it: numbers by their values, arrays item by item,
// objects by their members.
inline bool Equal(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return ExactNumber(a) == ExactNumber(b);
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!Equal(a[i], b[i])) return false;
    }
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [k, x] : a.items()) {
      if (!b.contains(k) || !Equal(x, b[k])) return false;
    }
    return true;
  }
  return a == b;
}

inline bool SchemaValid(const json& schema, const json& v, const json& root) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("$ref")) {
    const std::string ref = schema["$ref"];
    return SchemaValid(root.at(json::json_pointer(ref.substr(1))), v, root);
  }
  if (schema.contains("type")) {
    const json types = schema["type"].is_array() ? schema["type"] : json::array({schema["type"]});
    bool any = false;
    for (const auto& t : types) any = any || OfType(t.get<std::string>(), v);
    if (!any) return false;
  }
  if (schema.contains("enum")) {
    bool found = false;
    for (const auto& e : schema["enum"]) found = found || Equal(e, v);
    if (!found) return false;
  }
  if (schema.contains("const") && !Equal(schema["const"], v)) return false;
  if (schema.contains("anyOf")) {
    bool any = false;
    for (const auto& s : schema["anyOf"]) any = any || SchemaValid(s, v, root);
    if (!any) return false;
  }
  if (schema.contains("allOf")) {
    for (const auto& s : schema["allOf"]) {
      if (!SchemaValid(s, v, root)) return false;
    }
  }
  if (schema.contains("oneOf")) {
    int n = 0;
    for (const auto& s : schema["oneOf"]) n += SchemaValid(s, v, root) ? 1 : 0;
    if (n != 1) return false;
  }
  if (v.is_object()) {
    const json props = schema.value("properties", json::object());
    for (const auto& r : schema.value("required", json::array())) {
      if (!v.contains(r.get<std::string>())) return false;
    }
    for (const auto& [k, x] : v.items()) {
      if (props.contains(k)) {
        if (!SchemaValid(props[k], x, root)) return false;
      } else if (schema.contains("additionalProperties") &&
                 !SchemaValid(schema["additionalProperties"], x, root)) {
        return false;
      }
    }
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (schema.contains("minimum") && x < schema["minimum"].get<double>()) return false;
    if (schema.contains("maximum") && x > schema["maximum"].get<double>()) return false;
    if (schema.contains("exclusiveMinimum") && x <= schema["exclusiveMinimum"].get<double>()) {
      return false;
    }
    if (schema.contains("exclusiveMaximum") && x >= schema["exclusiveMaximum"].get<double>()) {
      return false;
    }
  }
  if (v.is_string()) {
    // Its length: Unicode code points (nlohmann holds UTF-8: the bytes that are not 10xxxxxx).
    size_t length = 0;
    for (unsigned char c : v.get_ref<const std::string&>()) length += (c & 0xC0U) != 0x80U ? 1 : 0;
    if (schema.contains("minLength") && length < schema["minLength"].get<size_t>()) return false;
    if (schema.contains("maxLength") && length > schema["maxLength"].get<size_t>()) return false;
  }
  if (v.is_array()) {
    if (schema.contains("minItems") && v.size() < schema["minItems"].get<size_t>()) return false;
    if (schema.contains("maxItems") && v.size() > schema["maxItems"].get<size_t>()) return false;
    // (1 and 1.0 are one item twice)
    if (schema.contains("uniqueItems") && schema["uniqueItems"] == json(true)) {
      for (size_t i = 0; i < v.size(); ++i) {
        for (size_t j = 0; j < i; ++j) {
          if (Equal(v[i], v[j])) return false;
        }
      }
    }
    // The tuple's places: prefixItems, or items as a list (draft 7); the other items: items, or
    // additionalItems beside a list.
    const bool listed = schema.contains("items") && schema["items"].is_array();
    const json places = listed ? schema["items"] : schema.value("prefixItems", json::array());
    const char* rest = listed ? "additionalItems" : "items";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i < places.size()) {
        if (!SchemaValid(places[i], v[i], root)) return false;
      } else if (schema.contains(rest) && !SchemaValid(schema[rest], v[i], root)) {
        return false;
      }
    }
  }
  return true;
}

// Feeds `text` to a JsonSchemaPrefix of `compiled` byte by byte: each prefix it takes, followed by
// its Closing(), must be taken whole and be a document nlohmann reads and `schema` validates; a
// prefix it calls complete must be valid as it is. Returns what failed, or "".
inline std::string CheckSchemaPrefixes(const json& schema, const colony::api::JsonSchema& compiled,
                                       std::string_view text) {
  colony::api::JsonSchemaPrefix p(&compiled);
  auto check = [&](std::string_view prefix) -> std::string {
    const std::string closing = p.Closing();
    colony::api::JsonSchemaPrefix closed = p;
    if (!closed.Feed(closing) || !closed.complete()) {
      return "the closing is not taken whole: " + std::string(prefix) + " + " + closing;
    }
    const json doc = json::parse(std::string(prefix) + closing, nullptr, false);
    if (doc.is_discarded()) return "not JSON: " + std::string(prefix) + " + " + closing;
    if (!SchemaValid(schema, doc, schema)) {
      return "not valid: " + std::string(prefix) + " + " + closing;
    }
    if (p.complete() && !SchemaValid(schema, json::parse(prefix), schema)) {
      return "complete but not valid: " + std::string(prefix);
    }
    return "";
  };
  if (std::string e = check(""); !e.empty()) return e;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!p.Feed(text[i])) return "";
    if (std::string e = check(text.substr(0, i + 1)); !e.empty()) return e;
  }
  return "";
}

}  // namespace schema_checks
