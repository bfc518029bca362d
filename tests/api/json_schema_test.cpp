// JsonSchema and JsonSchemaPrefix (response_format json_schema) against a validator written here
// from the JSON Schema specification (not from the compiled nodes) and nlohmann::json's reader:
// every prefix of documents generated from the schema is taken, random walks over the bytes the
// prefix takes stay completable by Closing() into valid documents, a whole object that the
// prefix calls complete is valid, and what is not supported is refused by name.
#include "api/json_schema.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "../../fuzz/json_schema_checks.h"

namespace colony::api {
namespace {

using json = nlohmann::json;
using schema_checks::Equal;
using schema_checks::SchemaValid;

// ---- Documents generated from a schema, as an answer may write them ----

// Objects and arrays deep, past which Generate writes only what a recursive schema needs.
constexpr int kDeep = 6;

// A random valid value of `schema`, compact, writing only the properties it names (each once,
// in a random order), integers without fractions.
json Generate(const json& schema, const json& root, std::mt19937& rng, int depth = 0) {
  auto pick = [&rng](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  if (schema.is_boolean() || schema.empty() ||
      (schema.size() == 1 && (schema.contains("title") || schema.contains("description")))) {
    const json anys[] = {json(1),       json("x"),  json::object({{"k", json::array({1, "y"})}}),
                         json(nullptr), json(true), json::array()};
    return anys[pick(6)];
  }
  if (schema.contains("$ref")) {
    const std::string ref = schema["$ref"];
    return Generate(root.at(json::json_pointer(ref.substr(1))), root, rng, depth);
  }
  if (schema.contains("allOf")) return Generate(schema["allOf"][0], root, rng, depth);
  // Deep in a recursive schema, what ends it: a branch of no object, array or $ref (null), only
  // the required properties and minItems' items.
  const bool deep = depth >= kDeep;
  for (const char* any_of : {"anyOf", "oneOf"}) {
    if (!schema.contains(any_of)) continue;
    const json& branches = schema[any_of];
    if (deep) {
      for (const json& b : branches) {
        if (b.value("type", json()) == "null") return Generate(b, root, rng, depth);
      }
    }
    return Generate(branches[pick(branches.size())], root, rng, depth);
  }
  if (schema.contains("const")) return schema["const"];
  if (schema.contains("enum")) {
    for (int tries = 0; tries < 100; ++tries) {
      json e = schema["enum"][pick(schema["enum"].size())];
      if (SchemaValid(schema, e, root)) return e;
    }
  }
  std::string type;
  if (schema.contains("type")) {
    type = schema["type"].is_array()
               ? schema["type"][pick(schema["type"].size())].get<std::string>()
               : schema["type"].get<std::string>();
  } else {
    const char* types[] = {"object", "array", "string", "number", "boolean", "null"};
    type = types[pick(6)];
  }
  if (type == "object") {
    json o = json::object();
    if (!schema.contains("properties")) {
      const json more = schema.value("additionalProperties", json(true));
      if (more == json(false)) return o;
      if (more.is_object()) {  // (a map: keys escaped, of several bytes, empty)
        const char* keys[] = {"a", "b c", "q\"d\\", "\xC3\xA9", "", "line\n", "\x01", "k"};
        for (size_t n = deep ? 0 : pick(4); n > 0; --n)
          o[keys[pick(8)]] = Generate(more, root, rng, depth + 1);
        return o;
      }
      o["free"] = json::array({1, 2});
      return o;
    }
    std::vector<std::string> names;
    for (const auto& [k, _] : schema["properties"].items()) names.push_back(k);
    std::shuffle(names.begin(), names.end(), rng);
    const json required = schema.value("required", json::array());
    for (const auto& k : names) {
      const bool must = std::find(required.begin(), required.end(), json(k)) != required.end();
      if (must || (!deep && pick(2) == 0)) {
        o[k] = Generate(schema["properties"][k], root, rng, depth + 1);
      }
    }
    return o;
  }
  if (type == "array") {
    // A tuple's places (prefixItems, or a list of items as draft 7 wrote it), then the rest.
    const bool listed = schema.contains("items") && schema["items"].is_array();
    const json places = listed ? schema["items"] : schema.value("prefixItems", json::array());
    const json rest = schema.value(listed ? "additionalItems" : "items", json(true));
    const size_t lo = schema.value("minItems", 0);
    const size_t most = std::max(lo, places.size()) + 3;
    size_t hi = std::min<size_t>(schema.value("maxItems", most), most);
    if (rest == json(false)) hi = std::min(hi, places.size());
    json a = json::array();
    const size_t n = deep ? lo : lo + pick(hi - lo + 1);
    // (uniqueItems: items equal to one before drawn again; an enum may have fewer than n)
    for (size_t i = 0, tries = 0; i < n && tries < 100 * n; ++tries) {
      json item = Generate(i < places.size() ? places[i] : rest, root, rng, depth + 1);
      if (schema.contains("uniqueItems") && schema["uniqueItems"] == json(true) &&
          std::ranges::any_of(a, [&](const json& x) { return Equal(x, item); })) {
        continue;
      }
      a.push_back(std::move(item));
      ++i;
    }
    return a;
  }
  if (type == "string") {
    if (schema.contains("minLength") || schema.contains("maxLength")) {
      // Characters of one to four bytes, escaped ones among them.
      const char* chars[] = {"a",  " ",        "\"",           "\n",
                             "\\", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"};
      const size_t lo = schema.value("minLength", 0);
      const size_t hi = std::min<size_t>(schema.value("maxLength", lo + 4), lo + 4);
      std::string out;
      for (size_t n = lo + pick(hi - lo + 1); n > 0; --n) out += chars[pick(8)];
      return out;
    }
    const char* s[] = {"", "a b", "\"quoted\" \\ / \n", "\xC3\xA9t\xC3\xA9", "\xF0\x9F\x98\x80"};
    return s[pick(5)];
  }
  if (type == "integer") {
    // Within the bounds, near the least or the greatest of them.
    auto bound = [&](const char* k, double d) { return schema.value(k, json(d)).get<double>(); };
    const auto lo = static_cast<int64_t>(std::max(
        std::ceil(bound("minimum", -1e15)), std::floor(bound("exclusiveMinimum", -1e15 - 1)) + 1));
    const auto hi = static_cast<int64_t>(std::min(
        std::floor(bound("maximum", 1e15)), std::ceil(bound("exclusiveMaximum", 1e15 + 1)) - 1));
    if (lo == -1000000000000000 && hi == 1000000000000000) {
      return static_cast<int64_t>(pick(2001)) - 1000;
    }
    const int64_t span = std::min<int64_t>(hi - lo, 2000);
    const auto step = static_cast<int64_t>(pick(static_cast<size_t>(span) + 1));
    return pick(2) == 0 || hi == 1000000000000000 ? lo + step : hi - step;
  }
  if (type == "number") {
    const char* bounds[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    if (std::none_of(std::begin(bounds), std::end(bounds),
                     [&](const char* k) { return schema.contains(k); })) {
      const json n[] = {json(0), json(-3), json(2.5), json(-0.125), json(1e20)};
      return n[pick(5)];
    }
    // Within the bounds (as doubles compare), near one of them or between, rounded to a few
    // places, written without an exponent (an answer's bounded number has none).
    auto bound = [&](const char* a, const char* b) {
      return schema.contains(a) ? schema[a].get<double>() : schema[b].get<double>();
    };
    const bool has_lo = schema.contains("minimum") || schema.contains("exclusiveMinimum");
    const bool has_hi = schema.contains("maximum") || schema.contains("exclusiveMaximum");
    const double lo =
        has_lo ? bound("minimum", "exclusiveMinimum") : bound("maximum", "exclusiveMaximum") - 1000;
    const double hi = has_hi ? bound("maximum", "exclusiveMaximum") : lo + 1000;
    for (int tries = 0; tries < 200; ++tries) {
      const double u[] = {0,    1,        0.5,
                          1e-9, 1 - 1e-9, std::uniform_real_distribution<double>(0, 1)(rng)};
      double x = lo + (hi - lo) * u[pick(6)];
      const double scale = std::pow(10.0, static_cast<double>(pick(8)));
      if (pick(2) == 0) x = std::round(x * scale) / scale;
      const json v = x;
      if (SchemaValid(schema, v, root) && v.dump().find_first_of("eE") == std::string::npos) {
        return v;
      }
    }
    return (lo + hi) / 2;
  }
  if (type == "boolean") return pick(2) == 0;
  return nullptr;
}

// The written order of an object's keys is the generator's (nlohmann's json sorts them): write
// with a random key order by hand, but for "kind" first (the test schemas' discriminated unions
// tell their objects apart by it, which an answer writes first).
std::string Write(const json& v, std::mt19937& rng) {
  if (v.is_object()) {
    std::vector<std::string> keys;
    for (const auto& [k, _] : v.items()) keys.push_back(k);
    std::shuffle(keys.begin(), keys.end(), rng);
    std::stable_partition(keys.begin(), keys.end(),
                          [](const std::string& k) { return k == "kind"; });
    std::string out = "{";
    for (size_t i = 0; i < keys.size(); ++i) {
      if (i > 0) out += std::uniform_int_distribution<int>(0, 3)(rng) == 0 ? ", " : ",";
      out += json(keys[i]).dump() + ":" + Write(v[keys[i]], rng);
    }
    return out + "}";
  }
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) out += ',';
      out += Write(v[i], rng);
    }
    return out + "]";
  }
  return v.dump();
}

// Schemas as applications send them (pydantic's, with $defs and Optional fields; OpenAI's strict
// ones), and ones that reach each rule.
std::vector<json> Schemas() {
  return {
      json::parse(R"({"type": "object", "properties": {"name": {"type": "string"},
        "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "age"], "additionalProperties": false})"),
      json::parse(R"({"$defs": {"Color": {"enum": ["red", "green", "blue"], "title": "Color",
          "type": "string"},
        "Address": {"properties": {"street": {"title": "Street", "type": "string"},
          "zip": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": null}},
          "required": ["street"], "title": "Address", "type": "object"}},
        "properties": {"color": {"$ref": "#/$defs/Color"},
          "home": {"$ref": "#/$defs/Address"},
          "past": {"items": {"$ref": "#/$defs/Address"}, "type": "array", "maxItems": 2},
          "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "free"}},
        "required": ["color", "home", "past", "note"], "title": "Person", "type": "object"})"),
      json::parse(R"({"type": "object", "properties": {
        "n": {"type": ["number", "null"]}, "b": {"type": "boolean"}, "z": {"type": "null"},
        "k": {"enum": [1, 12, 1.5, "1", true, null, [1, 2], {"a": "b"}, "a,b", "\"q\""]},
        "c": {"const": "fixed"}, "e": {"type": "object", "additionalProperties": false},
        "free": {"type": "object"}, "any": {}, "list": {"type": "array", "minItems": 2,
        "maxItems": 3, "items": {"type": "integer"}}, "a\"b\\c/\u00e9": {"type": "integer"},
        "ab": {"type": "string"}, "abc": {"type": "string"}},
        "required": ["k", "list", "ab"]})"),
      json::parse(R"({"type": "object", "properties": {
        "either": {"anyOf": [{"type": "integer"}, {"type": "number"}, {"type": "string"}]},
        "whole": {"anyOf": [{"type": "integer"}, {"type": "null"}, {"type": "integer"}]}},
        "required": ["either", "whole"]})"),
      json::parse(R"({"type": "object", "properties": {"x": {"type": "object", "properties": {
        "y": {"type": "array", "items": {"type": "array", "items": {"oneOf": [
          {"type": "object", "properties": {"z": {"type": "integer"}}, "required": ["z"]},
          {"type": "string", "enum": ["s", "t"]}, {"type": "integer"}]}}}}, "required": ["y"]}},
        "required": ["x"]})"),
      json::parse(R"({"type": "object"})"),
      json::parse(R"({"type": "object", "properties": {}, "additionalProperties": false})"),
      // An enum of several kinds as the root (the answer takes its object), format (an
      // annotation), allOf of one schema, $id at the root, pydantic's one-member enum (both
      // enum and const).
      json::parse(R"({"$id": "https://example.com/s", "enum": ["x", {"a": [1, {"b": null}]},
        {"a": []}, 3]})"),
      // Strings of bounded length (pydantic's constr and Field(min_length=..., max_length=...)).
      json::parse(R"({"type": "object", "properties": {
        "code": {"type": "string", "minLength": 3, "maxLength": 3},
        "short": {"type": "string", "maxLength": 2}, "none": {"type": "string", "maxLength": 0},
        "long": {"type": "string", "minLength": 5},
        "opt": {"anyOf": [{"type": "string", "minLength": 1, "maxLength": 4}, {"type": "null"}]},
        "list": {"type": "array", "items": {"type": "string", "minLength": 2, "maxLength": 2},
          "minItems": 1},
        "mixed": {"type": ["string", "integer"], "minLength": 2}},
        "required": ["code", "long", "list"]})"),
      // Bounded integers (pydantic's Field(ge=..., le=...), conint).
      json::parse(R"({"type": "object", "properties": {
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
        "below": {"type": "integer", "exclusiveMaximum": -9},
        "big": {"type": "integer", "minimum": 100},
        "mid": {"type": "integer", "minimum": -20, "maximum": -15},
        "fraction": {"type": "integer", "minimum": 0.5, "exclusiveMaximum": 3.5},
        "around": {"type": "integer", "exclusiveMinimum": -3, "maximum": 12},
        "wide": {"type": "integer", "minimum": -1000000000000000, "maximum": 999},
        "opt": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 0}, {"type": "null"}]},
        "union": {"anyOf": [{"type": "integer", "minimum": 5, "maximum": 20},
          {"type": "integer", "minimum": 0, "maximum": 5}, {"type": "string", "maxLength": 1}]},
        "positive": {"type": "integer", "minimum": 1},
        "list": {"type": "array", "items": {"type": "integer", "minimum": 10, "maximum": 19}}},
        "required": ["stars", "below", "big", "mid", "fraction"]})"),
      // Bounded numbers (pydantic's Field(ge=0.0, le=1.0), confloat): decimals that are not
      // doubles, exclusive bounds, and a bound whose double is only just above 0.
      json::parse(R"({"type": "object", "properties": {
        "p": {"type": "number", "minimum": 0, "maximum": 1},
        "open": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "lat": {"type": "number", "minimum": -90, "maximum": 90},
        "c": {"type": "number", "minimum": 0.1, "maximum": 0.3},
        "neg": {"type": "number", "minimum": -2.75, "maximum": -0.5},
        "below": {"type": "number", "exclusiveMaximum": -1.5},
        "gt": {"type": "number", "exclusiveMinimum": 0},
        "big": {"type": "number", "minimum": 999999999999999.5, "maximum": 1e15},
        "opt": {"anyOf": [{"type": "number", "minimum": 0.5, "maximum": 2.5}, {"type": "null"}]},
        "list": {"type": "array", "items": {"type": "number", "minimum": 2.5, "maximum": 3}},
        "mixed": {"type": ["number", "string"], "maximum": 0.001}},
        "required": ["p", "open", "c", "neg", "big"]})"),
      // Tuples (pydantic's tuple[int, str]: prefixItems; draft 7's, and pydantic v1's, a list
      // of items with additionalItems).
      json::parse(R"({"type": "object", "properties": {
        "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
          "minItems": 2, "maxItems": 2},
        "point": {"type": "array", "prefixItems": [{"type": "number", "minimum": -90,
          "maximum": 90}, {"type": "number", "minimum": -180, "maximum": 180}], "items": false},
        "head": {"type": "array", "prefixItems": [{"enum": ["x", "y"]}, {"type": "boolean"}],
          "items": {"type": "integer", "minimum": 0}},
        "rec": {"type": "array", "prefixItems": [{"type": "null"}, {"type": "object",
          "properties": {"k": {"type": "string"}}, "required": ["k"]}], "minItems": 1},
        "v7": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}],
          "additionalItems": false, "minItems": 1},
        "v7more": {"type": "array", "items": [{"type": "boolean"}],
          "additionalItems": {"type": "null"}},
        "none": {"type": "array", "items": false},
        "nested": {"type": "array", "maxItems": 3, "items": {"type": "array", "prefixItems": [
          {"type": "string", "maxLength": 3}, {"type": "integer"}], "minItems": 2, "maxItems": 2}},
        "some": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "integer"},
          {"type": "string"}], "minItems": 1, "maxItems": 5},
        "maybe": {"anyOf": [{"type": "array", "prefixItems": [{"type": "integer"}],
          "items": false, "minItems": 1}, {"type": "null"}]},
        "v7any": {"type": "array", "items": [], "additionalItems": true},
        "many": {"type": "array", "items": {"type": "integer"}, "maxItems": 100}},
        "required": ["pair", "point", "head"]})"),
      // Maps (pydantic's dict[str, X]): additionalProperties a schema, without properties.
      json::parse(R"({"type": "object", "properties": {
        "counts": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
        "people": {"type": "object", "additionalProperties": {"$ref": "#/$defs/P"}},
        "nested": {"type": "object", "additionalProperties": {"type": "object",
          "additionalProperties": {"type": "string", "maxLength": 2}}},
        "anymap": {"type": "object", "additionalProperties": {}},
        "lists": {"type": "object", "additionalProperties": {"type": "array",
          "items": {"type": "boolean"}, "minItems": 1}},
        "opt": {"anyOf": [{"type": "object", "additionalProperties": {"type": "boolean"}},
          {"type": "null"}]}},
        "$defs": {"P": {"type": "object", "properties": {"name": {"type": "string"}},
          "required": ["name"]}},
        "required": ["counts"]})"),
      json::parse(R"({"type": "object", "additionalProperties": {"type": "number"}})"),
      // Sets of an enum's values (pydantic's set[Tag], frozenset[Literal[...]]): uniqueItems.
      json::parse(R"({"type": "object", "properties": {
        "colors": {"type": "array", "items": {"$ref": "#/$defs/Tag"}, "uniqueItems": true},
        "nums": {"type": "array", "items": {"enum": [1, 1.0, 2, 10, 12]}, "uniqueItems": true,
          "minItems": 2},
        "mixed": {"type": "array", "items": {"enum": [true, false, null, "x", [1], {"a": 1}]},
          "uniqueItems": true, "maxItems": 3},
        "one": {"type": "array", "items": {"const": "only"}, "uniqueItems": true},
        "big": {"type": "array", "items": {"enum": [-1, 18446744073709551615,
          1.8446744073709552e19, 9007199254740993, 9007199254740992.0, 9007199254740992]},
          "uniqueItems": true, "minItems": 2},
        "opt": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/Tag"},
          "uniqueItems": true, "minItems": 4}, {"type": "null"}]},
        "list": {"type": "array", "items": {"$ref": "#/$defs/Tag"}, "uniqueItems": false},
        "inner": {"type": "array", "items": {"type": "array", "items": {"enum": ["a", "b"]},
          "uniqueItems": true}}},
        "$defs": {"Tag": {"enum": ["red", "green", "greenish", "blue"], "type": "string"}},
        "required": ["colors", "nums"]})"),
      // Recursive schemas (pydantic's trees, linked lists of Optional["Item"], and a forest of
      // maps and tuples that refer to each other).
      json::parse(R"({"$defs": {"Node": {"title": "Node", "type": "object", "properties": {
          "value": {"type": "integer"}, "children": {"type": "array",
          "items": {"$ref": "#/$defs/Node"}, "default": []}}, "required": ["value"]}},
        "$ref": "#/$defs/Node"})"),
      json::parse(R"({"type": "object", "properties": {"head": {"$ref": "#/$defs/Item"},
          "forest": {"$ref": "#/$defs/Forest"}}, "required": ["head"],
        "$defs": {"Item": {"type": "object", "properties": {"name": {"type": "string",
            "maxLength": 2}, "next": {"anyOf": [{"$ref": "#/$defs/Item"}, {"type": "null"}]}},
            "required": ["name", "next"]},
          "Forest": {"type": "object", "additionalProperties": {"$ref": "#/$defs/Tree"}},
          "Tree": {"type": "array", "prefixItems": [{"type": "integer"}],
            "items": {"$ref": "#/$defs/Forest"}, "minItems": 1}}})"),
      json::parse(R"({"$defs": {"D": {"type": "object", "properties": {
          "d": {"$ref": "#/$defs/D"}, "e": {"type": "array", "items": {"$ref": "#/$defs/D"},
          "minItems": 1}, "w": {"anyOf": [{"type": "object", "properties": {"a": {"type": "array",
          "items": {"$ref": "#/$defs/D"}}}, "required": ["a"]}, {"type": "null"}]}}}},
        "$ref": "#/$defs/D"})"),
      // Discriminated unions (pydantic's Union[Cat, Dog] with Field(discriminator="kind"): a
      // oneOf of $refs with OpenAPI's discriminator; and without one, an anyOf whose object
      // branches each require "kind" of values of their own).
      json::parse(R"({"$defs": {
          "Cat": {"type": "object", "properties": {"kind": {"const": "cat", "enum": ["cat"],
            "type": "string"}, "meows": {"type": "integer", "minimum": 0}},
            "required": ["kind", "meows"]},
          "Dog": {"type": "object", "properties": {"kind": {"const": "dog", "type": "string"},
            "barks": {"type": "boolean"}, "name": {"type": "string", "maxLength": 3}},
            "required": ["barks", "kind"], "additionalProperties": false},
          "Bird": {"type": "object", "properties": {"kind": {"enum": ["bird", "parrot"]},
            "wings": {"type": "integer", "minimum": 2, "maximum": 2}}, "required": ["kind"]}},
        "type": "object", "properties": {
          "pet": {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"},
            {"$ref": "#/$defs/Bird"}], "discriminator": {"propertyName": "kind",
            "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog", "bird": "#/$defs/Bird",
            "parrot": "#/$defs/Bird"}}},
          "pets": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/Dog"},
            {"$ref": "#/$defs/Cat"}, {"type": "null"}]}}},
        "required": ["pet"]})"),
      json::parse(R"({"type": "object", "properties": {
        "when": {"type": "string", "format": "date-time"},
        "who": {"allOf": [{"$ref": "#/$defs/W"}], "description": "a wrapped $ref"},
        "kind": {"const": "person", "enum": ["person"], "type": "string"}},
        "$defs": {"W": {"enum": ["me", "you"]}}, "required": ["who"]})"),
  };
}

// The first of Schemas() with a property `name`; or, with `root`, the one whose
// additionalProperties at the root is a schema (a map).
json SchemaWith(const std::string& name, bool root = false) {
  for (const json& schema : Schemas()) {
    if (root ? schema.contains("additionalProperties") && schema["additionalProperties"].is_object()
             : schema.contains("properties") && schema["properties"].contains(name)) {
      return schema;
    }
  }
  ADD_FAILURE() << "no schema with " << name;
  return json::object();
}

TEST(JsonSchema, GeneratedDocumentsAreTakenWhole) {
  std::mt19937 rng(7);
  for (const json& schema : Schemas()) {
    auto compiled = JsonSchema::Compile(schema);
    ASSERT_TRUE(compiled.ok()) << compiled.status().ToString() << "\n" << schema.dump();
    for (int i = 0; i < 300; ++i) {
      json doc = Generate(schema, schema, rng);
      while (!doc.is_object()) doc = Generate(schema, schema, rng);  // (an answer is an object)
      ASSERT_TRUE(SchemaValid(schema, doc, schema)) << doc.dump();   // (the generator itself)
      const std::string text = Write(doc, rng);
      JsonSchemaPrefix p(compiled->get());
      for (size_t at = 0; at < text.size(); ++at) {
        ASSERT_TRUE(p.Feed(text[at])) << schema.dump() << "\n" << text.substr(0, at + 1);
        ASSERT_FALSE(p.complete() && at + 1 < text.size()) << text.substr(0, at + 1);
      }
      EXPECT_TRUE(p.complete()) << text;
    }
  }
}

// Random walks over the bytes a prefix takes: at every step, the prefix and its Closing() are a
// whole object that the validator accepts; an object the prefix calls complete is valid. States
// with equal keys (by which masks are kept) take the same bytes, into states with equal keys.
TEST(JsonSchema, EveryTakenPrefixClosesIntoAValidDocument) {
  std::mt19937 rng(11);
  for (const json& schema : Schemas()) {
    auto compiled = JsonSchema::Compile(schema);
    ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
    std::map<std::string, std::pair<JsonSchemaPrefix, std::string>> seen;  // by key
    int equal_keys = 0;
    for (int walk = 0; walk < 60; ++walk) {
      JsonSchemaPrefix p(compiled->get());
      std::string text;
      for (int step = 0; step < 300 && !p.complete(); ++step) {
        const auto [it, first] = seen.try_emplace(p.key(), p, text);
        if (!first) {
          ++equal_keys;
          for (int b = 0; b < 256; ++b) {
            JsonSchemaPrefix x = p, y = it->second.first;
            const bool tx = x.Feed(static_cast<char>(b)), ty = y.Feed(static_cast<char>(b));
            ASSERT_EQ(tx, ty) << text << " / " << it->second.second << " + byte " << b;
            if (tx) {
              ASSERT_EQ(x.key(), y.key()) << text << " / " << it->second.second << " + " << b;
            }
          }
        }
        const std::string closing = p.Closing();
        JsonSchemaPrefix closed = p;
        ASSERT_TRUE(closed.Feed(closing) && closed.complete()) << schema.dump() << "\n"
                                                               << text << " + " << closing;
        const json doc = json::parse(text + closing, nullptr, false);
        ASSERT_FALSE(doc.is_discarded()) << text << " + " << closing;
        ASSERT_TRUE(SchemaValid(schema, doc, schema)) << schema.dump() << "\n"
                                                      << text << " + " << closing;
        // The next byte: one of those taken (late in a walk, the closing's first, to end it).
        std::vector<char> taken;
        for (int b = 0; b < 256; ++b) {
          JsonSchemaPrefix next = p;
          if (next.Feed(static_cast<char>(b))) taken.push_back(static_cast<char>(b));
        }
        ASSERT_FALSE(taken.empty()) << text;
        const bool close = step > 100 && std::uniform_int_distribution<int>(0, 1)(rng) == 0;
        const char c = close
                           ? closing[0]
                           : taken[std::uniform_int_distribution<size_t>(0, taken.size() - 1)(rng)];
        ASSERT_TRUE(p.Feed(c));
        text += c;
      }
      if (p.complete()) {
        const json doc = json::parse(text, nullptr, false);
        ASSERT_FALSE(doc.is_discarded()) << text;
        EXPECT_TRUE(SchemaValid(schema, doc, schema)) << schema.dump() << "\n" << text;
      }
    }
    EXPECT_GT(equal_keys, 100);  // (states recur: between values, in names)
  }
}

TEST(JsonSchema, WhatIsNotSupportedIsRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}})",
       "/properties/a/pattern: 'pattern' is not supported"},
      {R"({"type": "object", "properties": {"a": {"type": "string", "minLength": 3,
          "maxLength": 2}}})",
       "/properties/a/maxLength: is below minLength"},
      {R"({"type": "object", "properties": {"a": {"type": "string", "minLength": -1}}})",
       "/properties/a/minLength: must be an integer from 0 to 16384"},
      {R"({"type": "object", "properties": {"a": {"type": "string", "maxLength": 1.5}}})",
       "/properties/a/maxLength: must be an integer from 0 to"},
      {R"({"type": "object", "properties": {"a": {"enum": ["x"], "maxLength": 2}}})",
       "enum or const beside maxLength is not supported"},
      {R"({"type": "object", "properties": {"a": {"type": "string", "minLength": 16384},
          "b": {"type": "string", "minLength": 16384}, "c": {"type": "string",
          "minLength": 16384}, "d": {"type": "string", "minLength": 16384}},
          "required": ["a", "b", "c", "d"]})",
       "shortest valid answer is longer"},
      {R"({"type": "object", "properties": {"a": {"$id": "x", "type": "string"}}})",
       "/properties/a/$id: '$id' is not supported"},
      {R"({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, {}]}}})",
       "must be a list of one schema (more are not supported)"},
      {R"({"type": "object", "properties": {"a": {"enum": ["x", "y"], "const": "z"}}})",
       "/properties/a/const: is not among the enum's values"},
      {R"({"type": "object", "properties": {"a": {"type": ["object", "array"], "minItems": 256,
          "items": {"type": "array", "minItems": 255}}}})",
       "a value it describes (an array) is longer than 65536 bytes at its shortest"},
      {R"({"type": "object", "properties": {"a": {"type": "number", "minimum": 0.5,
          "exclusiveMaximum": 0.5}}})",
       "/properties/a: no number is within its minimum and maximum"},
      {R"({"type": "object", "properties": {"a": {"minimum": 2, "maximum": 1}}})",
       "/properties/a: no number is within"},
      {R"({"type": "object", "properties": {"a": {"type": "number", "minimum": -1e16}}})",
       "/properties/a/minimum: must be a number from -1000000000000000"},
      {R"({"type": "object", "properties": {"a": {"anyOf": [{"type": "integer"},
          {"type": "number", "minimum": 0}]}}})",
       "/properties/a/anyOf: branch 1 is a number with bounds beside other number branches"},
      {R"({"type": "object", "properties": {"a": {"type": "integer", "maximum": 1e16}}})",
       "/properties/a/maximum: must be a number from -1000000000000000 to 1000000000000000"},
      {R"({"type": "object", "properties": {"a": {"type": "integer", "exclusiveMinimum": true}}})",
       "/properties/a/exclusiveMinimum: must be a number"},
      {R"({"type": "object", "properties": {"a": {"type": "integer", "minimum": 2.5,
          "exclusiveMaximum": 3}}})",
       "/properties/a: no integer is within its minimum and maximum"},
      {R"({"type": "object", "properties": {"a": {"enum": [1], "minimum": 0}}})",
       "enum or const beside minimum is not supported"},
      {R"({"type": "object", "properties": {"a": false}})", "false (no value at all)"},
      {R"({"type": "array"})", "the answer is a JSON object"},
      {R"({"type": "object", "required": ["a"]})", "names properties the schema does not"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", "names 'b'"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "items": [{}],
          "prefixItems": [{}]}}})",
       "a list of items beside prefixItems"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "additionalItems": false}}})",
       "only beside a list of items"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "items": false,
          "minItems": 1}}})",
       "is more than the 0 items the array may have (items is false)"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"},
          "uniqueItems": true}}})",
       "/properties/a/uniqueItems: is supported only for items that are an enum"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": true}}})",
       "/properties/a/uniqueItems: is supported only for items that are an enum"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "items": {"anyOf": [
          {"enum": ["x"]}, {"type": "null"}]}, "uniqueItems": true}}})",
       "/properties/a/uniqueItems: is supported only for items that are an enum"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "prefixItems": [{}],
          "items": {"enum": [1]}, "uniqueItems": true}}})",
       "/properties/a/uniqueItems: beside a tuple's places is not supported"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "items": {"enum": [1]},
          "uniqueItems": 1}}})",
       "/properties/a/uniqueItems: must be true or false"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "items": {"enum": [1, 1.0, 2]},
          "uniqueItems": true, "minItems": 3}}})",
       "/properties/a/minItems: is more than the 2 distinct items uniqueItems allows"},
      {R"({"type": "object", "properties": {"a": {"enum": [[1]], "uniqueItems": true}}})",
       "enum or const beside uniqueItems is not supported"},
      {R"({"type": "string", "uniqueItems": "x"})", "/uniqueItems: must be true or false"},
      {R"({"type": "object", "additionalProperties": {"type": "integer"}, "required": ["a"]})",
       "names properties the schema does not describe"},
      {R"({"type": "object", "properties": {"a": {}},
          "additionalProperties": {"type": "string", "pattern": "x"}})",
       "/additionalProperties/pattern"},
      {R"({"type": "object", "properties": {"a": {"type": "string", "prefixItems": 5}}})",
       "/properties/a/prefixItems"},
      {R"({"type": "object", "properties": {"a": {"type": "integer", "properties": {
          "b": {"type": "text"}}}}})",
       "/properties/a/properties/b/type"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "prefixItems": {}}}})",
       "must be a list of at most 256"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "prefixItems": [{}],
          "items": false, "minItems": 2}}})",
       "is more than the 1 items the array may have (items is false)"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "items": [{"type": "x"}]}}})",
       "/properties/a/items/0/type"},
      {R"({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"},
          {"enum": ["x"]}]}}})",
       "branches 0 and 1 can both be a string"},
      {R"({"type": "object", "properties": {"a": {"anyOf": [{"type": "integer", "maximum": -1},
          {"type": "integer", "minimum": 1}]}}})",
       "/properties/a/anyOf: branches 0 and 1 leave the integers from 0 to 0 out"},
      {R"({"type": "object", "properties": {"a": {"anyOf": [{"type": "integer", "minimum": 20,
          "maximum": 30}, {"type": "integer", "minimum": 6, "maximum": 10},
          {"type": "integer", "minimum": 1, "maximum": 5}]}}})",
       "branches 1 and 0 leave the integers from 11 to 19 out"},
      {R"({"type": "object", "properties": {"a": {"type": "string", "minimum": "x"}}})",
       "/properties/a/minimum: must be a number"},
      {R"({"type": "object", "properties": {"a": {"type": "integer", "minLength": -1}}})",
       "/properties/a/minLength: must be an integer from 0"},
      {R"({"type": "object", "properties": {"a": {"oneOf": [{"type": "integer"},
          {"type": "number"}]}}})",
       "branches 0 and 1 can both be a number"},
      // Recursion through a definition that is an anyOf (not an object's or array's schema),
      // without end (every answer would nest forever), and through a node whose parts make any
      // object valid (a map of any values) while a $ref back to it had read it as its own.
      {R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/N"}},
          "$defs": {"N": {"allOf": [{"$ref": "#/$defs/N"}]}}})",
       "#/$defs/N refers to itself through a $ref or allOf of its own"},
      {R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/N"}},
          "$defs": {"N": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/N"}]}}})",
       "/$defs/N/anyOf/1: refers back to an anyOf or oneOf that is being compiled"},
      {R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/N"}}, "required": ["a"],
          "$defs": {"N": {"type": "object", "properties": {"n": {"$ref": "#/$defs/N"}},
          "required": ["n"]}}})",
       "no valid answer nests at most 17 objects and arrays"},
      {R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/N"}},
          "$defs": {"Any": true, "N": {"type": ["object", "array"],
          "additionalProperties": {"$ref": "#/$defs/Any"}, "items": {"$ref": "#/$defs/N"}}}})",
       "/$defs/N: a recursive schema whose parts allow any object or array"},
      {R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/M"}}})", "names no schema"},
      {R"({"type": "object", "properties": {"a": {"$ref": "http://x/y"}}})", "only #/$defs/"},
      {R"({"type": "object", "properties": {"a": {"type": "integer", "enum": ["x", 1.5]}}})",
       "no value of the schema's type"},
      {R"({"type": "object", "properties": {"a": {"type": "text"}}})", "'text' is not a JSON"},
      {R"({"type": "object", "properties": {"a": {"const": 1e300}}})", "cannot write"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "minItems": 3, "maxItems": 2}}})",
       "below minItems"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "minItems": 256, "items": {
          "type": "array", "minItems": 256, "items": {"type": "array", "minItems": 2}}}},
          "required": ["a"]})",
       "shortest valid answer is longer"},
  };
  for (const auto& [schema, message] : cases) {
    auto compiled = JsonSchema::Compile(json::parse(schema));
    ASSERT_FALSE(compiled.ok()) << schema;
    EXPECT_EQ(compiled.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(compiled.status().message().find(message), std::string::npos)
        << compiled.status().message() << "\nwanted: " << message;
  }
  // A tuple of 256 places compiles, of 257 does not.
  json places = json::array();
  for (size_t i = 0; i < JsonSchema::kMaxPrefixItems; ++i) places.push_back({{"type", "null"}});
  json tuple = {{"type", "object"}, {"properties", {{"t", {{"prefixItems", places}}}}}};
  EXPECT_TRUE(JsonSchema::Compile(tuple).ok());
  tuple["properties"]["t"]["prefixItems"].push_back(json::object());
  EXPECT_NE(JsonSchema::Compile(tuple).status().message().find("at most 256 schemas"),
            std::string::npos);
  json deep = json::parse(R"({"type": "integer"})");
  for (int i = 0; i < JsonSchema::kMaxDepth + 1; ++i)
    deep = {{"type", "object"}, {"properties", {{"a", deep}}}};
  EXPECT_NE(JsonSchema::Compile(deep).status().message().find("nest deeper than 16"),
            std::string::npos);
  json branches = {{"type", "integer"}};
  for (int i = 0; i < JsonSchema::kMaxNested; ++i) branches = {{"anyOf", json::array({branches})}};
  EXPECT_NE(JsonSchema::Compile({{"type", "object"}, {"properties", {{"a", branches}}}})
                .status()
                .message()
                .find("nests schemas too deep"),
            std::string::npos);
  json nested = json::array();
  for (int i = 0; i < JsonSchema::kMaxValueNesting; ++i) nested = json::array({nested});
  EXPECT_NE(JsonSchema::Compile({{"type", "object"}, {"properties", {{"a", {{"const", nested}}}}}})
                .status()
                .message()
                .find("a value nested deeper than 32"),
            std::string::npos);
  // A reference is compiled once, whatever its uses: 15 x 64 x 64 uses of a chain of 50 $refs
  // compiled at each use would take millions of compilations. Other schemas are bounded.
  json amplified = {{"type", "object"}, {"properties", json::object()}, {"$defs", json::object()}};
  for (int i = 0; i < 50; ++i) {
    amplified["$defs"]["c" + std::to_string(i)] = {{"$ref", "#/$defs/c" + std::to_string(i + 1)}};
  }
  amplified["$defs"]["c50"] = true;
  for (const char* level : {"O", "T"}) {
    json o = {{"type", "object"}, {"properties", json::object()}};
    for (int i = 0; i < 64; ++i) {
      o["properties"]["p" + std::to_string(i)] = {
          {"$ref", std::string("#/$defs/") + (level[0] == 'O' ? "c0" : "O")}};
    }
    amplified["$defs"][level] = o;
  }
  for (int i = 0; i < 15; ++i)
    amplified["properties"]["t" + std::to_string(i)] = {{"$ref", "#/$defs/T"}};
  EXPECT_TRUE(JsonSchema::Compile(amplified).ok());
  json wide = {{"type", "object"}, {"properties", json::object()}};
  for (int i = 0; i < 64; ++i) {
    json a = {{"type", "object"}, {"properties", json::object()}};
    for (int j = 0; j < 14; ++j) {
      json b = {{"type", "object"}, {"properties", json::object()}};
      for (int k = 0; k < 64; ++k) b["properties"]["t" + std::to_string(k)] = true;
      a["properties"]["b" + std::to_string(j)] = b;
    }
    wide["properties"]["a" + std::to_string(i)] = a;
  }
  EXPECT_NE(JsonSchema::Compile(wide).status().message().find("has more than 16384 schemas"),
            std::string::npos)
      << JsonSchema::Compile(wide).status().ToString();
  json set = {{"type", "array"}, {"uniqueItems", true}, {"items", {{"enum", json::array()}}}};
  for (int i = 0; i < 65; ++i) set["items"]["enum"].push_back(i);
  EXPECT_NE(JsonSchema::Compile({{"type", "object"}, {"properties", {{"a", set}}}})
                .status()
                .message()
                .find("an enum (or const) of at most 64 values"),
            std::string::npos);
  set["items"]["enum"].erase(64);
  EXPECT_TRUE(JsonSchema::Compile({{"type", "object"}, {"properties", {{"a", set}}}}).ok());
  // At most one item is a set whatever the items.
  for (const char* one : {R"({"type": "array", "items": {"type": "string"}, "maxItems": 1,
                              "uniqueItems": true})",
                          R"({"type": "array", "prefixItems": [{}], "items": false,
                              "uniqueItems": true})"}) {
    EXPECT_TRUE(
        JsonSchema::Compile({{"type", "object"}, {"properties", {{"a", json::parse(one)}}}}).ok())
        << one;
  }
  json many = {{"type", "object"}, {"properties", json::object()}};
  for (int i = 0; i < 65; ++i) many["properties"]["p" + std::to_string(i)] = json::object();
  EXPECT_NE(JsonSchema::Compile(many).status().message().find("more than 64 properties"),
            std::string::npos);
}

// Whether a reader of `schema` takes `text`; and is then a whole object.
bool Takes(const JsonSchema* schema, const std::string& text) {
  JsonSchemaPrefix p(schema);
  return p.Feed(text);
}
bool Whole(const JsonSchema* schema, const std::string& text) {
  JsonSchemaPrefix p(schema);
  return p.Feed(text) && p.complete();
}

// Each prefix is taken, and it and its Closing() are a document the reader takes whole and the
// validator accepts.
void ExpectClosingsValid(const json& schema, const JsonSchema* compiled,
                         const std::vector<std::string>& prefixes) {
  for (const std::string& prefix : prefixes) {
    JsonSchemaPrefix p(compiled);
    ASSERT_TRUE(p.Feed(prefix)) << prefix;
    JsonSchemaPrefix closed = p;
    ASSERT_TRUE(closed.Feed(p.Closing()) && closed.complete()) << prefix << " + " << p.Closing();
    const std::string text = prefix + p.Closing();
    const json doc = json::parse(text, nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << text;
    EXPECT_TRUE(SchemaValid(schema, doc, schema)) << text;
  }
}

TEST(JsonSchema, HandPickedTexts) {
  const json schema = Schemas()[0];
  auto compiled = JsonSchema::Compile(schema);
  ASSERT_TRUE(compiled.ok());
  auto takes = [&](const std::string& text) { return Takes(compiled->get(), text); };
  auto whole = [&](const std::string& text) { return Whole(compiled->get(), text); };
  EXPECT_TRUE(whole(R"({"name": "a", "age": 3})"));
  EXPECT_TRUE(whole(R"({"age": -3, "tags": [], "name": ""})"));  // any order
  EXPECT_FALSE(takes(R"({"name": "a", "name")"));                // each once
  EXPECT_FALSE(takes(R"({"nam": )"));                            // no such property
  EXPECT_FALSE(takes(R"({"other)"));
  EXPECT_FALSE(takes(R"({"name": "a"})"));  // age is required
  EXPECT_FALSE(takes(R"({"age": 1.5)"));    // an integer
  EXPECT_FALSE(takes(R"({"age": 1e3)"));
  EXPECT_FALSE(takes(R"({"age": "3")"));
  EXPECT_FALSE(takes(R"({"tags": [1)"));
  EXPECT_TRUE(takes(R"({"tags": ["x", "y"], "age": 10)"));
  EXPECT_FALSE(takes(R"({"name": "a", "age": 3, "tags": [], )"));  // no property is left
  EXPECT_FALSE(takes(R"({"n\u0061me")"));                          // a name as JSON writes it
}

// An integer's bounds are kept at every digit: a digit is taken only while some integer it can
// still become is within them.
TEST(JsonSchema, IntegersStayWithinTheirBounds) {
  const json schema = json::parse(R"({"type": "object", "properties": {
      "r": {"type": "integer", "minimum": 1, "maximum": 5},
      "n": {"type": "integer", "exclusiveMaximum": -9},
      "b": {"type": "integer", "minimum": 100},
      "o": {"type": "integer", "minimum": 150}, "q": {"type": "integer", "maximum": -150},
      "z": {"type": "integer", "minimum": -20, "maximum": -15},
      "e": {"type": "integer", "minimum": 0, "maximum": 0},
      "k": {"type": "integer", "minimum": 0, "maximum": 1000},
      "v": {"type": "integer", "minimum": 5, "maximum": 60},
      "u": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 5}, {"type": "integer"}]},
      "f": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 5}, {"type": "number"}]},
      "h": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 5},
        {"type": ["integer", "null"], "minimum": 6, "maximum": 9}]},
      "g": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 5},
        {"type": "integer", "minimum": 20, "maximum": 30},
        {"type": "integer", "minimum": 6, "maximum": 19}]},
      "p": {"anyOf": [{"type": "integer", "maximum": -1}, {"type": "integer", "minimum": 1},
        {"type": "number"}]}}})");
  auto compiled = JsonSchema::Compile(schema);
  ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
  auto takes = [&](const std::string& text) { return Takes(compiled->get(), text); };
  EXPECT_TRUE(takes(R"({"r": 1,)"));
  EXPECT_TRUE(takes(R"({"r": 5})"));
  EXPECT_FALSE(takes(R"({"r": 0)"));  // (refused at the digit)
  EXPECT_FALSE(takes(R"({"r": 6)"));
  EXPECT_FALSE(takes(R"({"r": 10)"));
  EXPECT_FALSE(takes(R"({"r": -)"));
  EXPECT_TRUE(takes(R"({"n": -1)"));  // (-10 ... -19 follow)
  EXPECT_FALSE(takes(R"({"n": -1})"));
  EXPECT_FALSE(takes(R"({"n": -9 )"));
  EXPECT_TRUE(takes(R"({"n": -10 )"));
  EXPECT_TRUE(takes(R"({"n": -123456789012)"));
  EXPECT_FALSE(takes(R"({"n": 5)"));
  EXPECT_FALSE(takes(R"({"n": -0)"));
  EXPECT_TRUE(takes(R"({"b": 1)"));
  EXPECT_FALSE(takes(R"({"b": 99,)"));
  EXPECT_TRUE(takes(R"({"b": 100,)"));
  EXPECT_TRUE(takes(R"({"b": 99999999999999999999999,)"));  // (past every bound: no maximum)
  EXPECT_FALSE(takes(R"({"b": -)"));
  EXPECT_TRUE(takes(R"({"z": -1)"));
  EXPECT_TRUE(takes(R"({"z": -2)"));
  EXPECT_TRUE(takes(R"({"z": -15})"));
  EXPECT_FALSE(takes(R"({"z": -21)"));
  EXPECT_FALSE(takes(R"({"z": -3)"));
  EXPECT_FALSE(takes(R"({"z": -14)"));
  EXPECT_FALSE(takes(R"({"z": -1})"));
  EXPECT_TRUE(takes(R"({"e": 0})"));
  EXPECT_TRUE(takes(R"({"e": -0})"));  // (-0 is 0)
  EXPECT_FALSE(takes(R"({"e": 1)"));
  EXPECT_TRUE(takes(R"({"u": 100})"));  // (a union: the wider branch)
  EXPECT_TRUE(takes(R"({"f": -2.5})"));
  EXPECT_TRUE(takes(R"({"h": 9})"));  // (ranges that touch: one range)
  EXPECT_TRUE(takes(R"({"h": 1})"));
  EXPECT_FALSE(takes(R"({"h": 10)"));
  EXPECT_FALSE(takes(R"({"h": 0)"));
  EXPECT_TRUE(takes(R"({"h": null})"));
  EXPECT_TRUE(takes(R"({"g": 25})"));  // (whatever the order of the ranges: 1 to 30)
  EXPECT_TRUE(takes(R"({"g": 10})"));
  EXPECT_FALSE(takes(R"({"g": 31)"));
  EXPECT_TRUE(takes(R"({"p": 0.5})"));  // (pydantic's Union[conint(lt=0), conint(gt=0), float])
  // States are keyed by what they can still take: 14 and 24 end differently with a minimum of
  // 150 (149 and 249); 1500 and 2000, past it with no maximum, take the same.
  auto key = [&](const std::string& text) {
    JsonSchemaPrefix p(compiled->get());
    EXPECT_TRUE(p.Feed(text)) << text;
    return p.key();
  };
  EXPECT_NE(key(R"({"o": 14)"), key(R"({"o": 24)"));
  EXPECT_EQ(key(R"({"o": 1500)"), key(R"({"o": 2000)"));
  EXPECT_NE(key(R"({"q": -14)"), key(R"({"q": -24)"));
  EXPECT_EQ(key(R"({"q": -150)"), key(R"({"q": -999)"));
  // Values whose runs (the value, then its ten, hundred... continuations) lie alike inside or
  // outside the bounds take the same: 0 to 1000 reads a few states, not one per value.
  EXPECT_EQ(key(R"({"k": 2)"), key(R"({"k": 9)"));    // (2, 20..29, 200..299 within; 2000..: past)
  EXPECT_EQ(key(R"({"k": 11)"), key(R"({"k": 99)"));  // (110..119: within, 1100..: past)
  EXPECT_EQ(key(R"({"k": 101)"), key(R"({"k": 999)"));
  EXPECT_NE(key(R"({"k": 1)"), key(R"({"k": 2)"));    // (1000 and 1001..1999 follow 1)
  EXPECT_NE(key(R"({"k": 10)"), key(R"({"k": 11)"));  // (100 and 1000 follow 10, not 110)
  EXPECT_NE(key(R"({"k": 100)"), key(R"({"k": 101)"));
  EXPECT_NE(key(R"({"k": 9)"), key(R"({"k": 99)"));     // (90 is still within)
  EXPECT_EQ(key(R"({"z": -16)"), key(R"({"z": -17)"));  // (within, ending there)
  EXPECT_EQ(key(R"({"v": 2)"), key(R"({"v": 4)"));      // (below, then 20..29 or 40..49 within)
  EXPECT_NE(key(R"({"v": 4)"), key(R"({"v": 5)"));      // (4 cannot end there)
  EXPECT_EQ(key(R"({"v": 7)"), key(R"({"v": 9)"));      // (within, then past)
  EXPECT_NE(key(R"({"v": 5)"), key(R"({"v": 6)"));      // (60 and 61 follow 6)
  EXPECT_NE(key(R"({"z": -1)"), key(R"({"z": -2)"));    // (-15..-19 and -20 follow them)
  ExpectClosingsValid(schema, compiled->get(),
                      {R"({"r": )", R"({"n": -)", R"({"n": -1)", R"({"b": 1)", R"({"b": 10)",
                       R"({"z": -)", R"({"z": -2)", R"({"e": -)", R"({"b": 12345678901234567890)"});
}

// A bounded integer's digits, and a bounded number's whole part, key states by how the values
// they can still become meet the bounds, not by their value: every value keyed like one met
// before takes the same texts (digits, then an end, a point, a fraction), into states keyed alike
// again; and there are few keys for a thousand values.
TEST(JsonSchema, BoundedDigitsKeyedAlikeTakeTheSameTexts) {
  const json schema = json::parse(R"({"type": "object", "properties": {
      "a": {"type": "integer", "minimum": 0, "maximum": 1000},
      "b": {"type": "integer", "minimum": 5, "maximum": 60},
      "c": {"type": "integer", "minimum": -20, "maximum": -15},
      "d": {"type": "integer", "minimum": 150},
      "e": {"type": "integer", "maximum": -150},
      "f": {"type": "number", "minimum": 0, "maximum": 29.5},
      "g": {"type": "number", "minimum": 12.5},
      "h": {"type": "number", "exclusiveMinimum": -7.25, "exclusiveMaximum": 300}}})");
  auto compiled = JsonSchema::Compile(schema);
  ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
  std::vector<std::string> rests = {""};
  for (char d = '0'; d <= '9'; ++d) rests.emplace_back(1, d);
  for (const char* dd : {"00", "05", "09", "50", "55", "59", "90", "95", "99"}) rests.push_back(dd);
  int merged = 0;
  for (const char* name : {"a", "b", "c", "d", "e", "f", "g", "h"}) {
    for (const std::string sign : {"", "-"}) {
      const std::string start = std::string("{\"") + name + "\": " + sign;
      std::map<std::string, JsonSchemaPrefix> first;  // by key: the first value met with it
      for (int m = 0; m <= 1100; ++m) {
        JsonSchemaPrefix p(compiled->get());
        if (!p.Feed(start + std::to_string(m))) continue;
        const auto [it, fresh] = first.try_emplace(p.key(), p);
        if (fresh) continue;
        ++merged;
        for (const std::string& rest : rests) {
          for (const char* end : {"", "}", ",", " ", ".", ".0", ".5", ".9", ".49", ".51"}) {
            JsonSchemaPrefix x = p, y = it->second;
            const std::string text = rest + end;
            const bool tx = x.Feed(text), ty = y.Feed(text);
            ASSERT_EQ(tx, ty) << start << m << " + " << text;
            if (tx) {
              ASSERT_EQ(x.key(), y.key()) << start << m << " + " << text;
            }
          }
        }
      }
      EXPECT_LT(first.size(), 40U) << start;  // (not one per value)
    }
  }
  EXPECT_GT(merged, 4000);
}

// A tuple's items each keep to their place's schema, then to items' (additionalItems' in draft
// 7's form); items false ends the array at its places.
TEST(JsonSchema, TuplesKeepEachPlacesSchema) {
  const json schema = SchemaWith("pair");
  auto compiled = JsonSchema::Compile(schema);
  ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
  auto takes = [&](const std::string& text) { return Takes(compiled->get(), text); };
  auto whole = [&](const std::string& text) { return Whole(compiled->get(), text); };
  EXPECT_TRUE(whole(R"({"pair": [1, "a"], "point": [], "head": ["x", true]})"));
  EXPECT_TRUE(takes(R"({"pair": [-1, "a"])"));
  EXPECT_FALSE(takes(R"({"pair": [")"));  // (the first place is an integer)
  EXPECT_FALSE(takes(R"({"pair": [1, 2)"));
  EXPECT_FALSE(takes(R"({"pair": [1])"));  // (minItems 2)
  EXPECT_FALSE(takes(R"({"pair": [1, "a",)"));
  EXPECT_TRUE(takes(R"({"point": [-90, 180])"));
  EXPECT_TRUE(takes(R"({"point": [1.5])"));  // (no minItems)
  EXPECT_FALSE(takes(R"({"point": [91)"));
  EXPECT_FALSE(takes(R"({"point": [0, 181)"));
  EXPECT_FALSE(takes(R"({"point": [0, 180,)"));  // (items false: no third)
  EXPECT_TRUE(takes(R"({"head": ["y", false, 3, 0, 12])"));
  EXPECT_FALSE(takes(R"({"head": ["y", false, -1)"));
  EXPECT_FALSE(takes(R"({"head": ["z)"));
  EXPECT_FALSE(takes(R"({"head": [true)"));
  EXPECT_FALSE(takes(R"({"head": ["x", 1)"));
  EXPECT_TRUE(takes(R"({"rec": [null, {"k": ""}, [1], "any"])"));
  EXPECT_FALSE(takes(R"({"rec": [null, {}])"));
  EXPECT_FALSE(takes(R"({"rec": [])"));
  EXPECT_TRUE(takes(R"({"v7": ["a", 1])"));
  EXPECT_FALSE(takes(R"({"v7": ["a", 1,)"));
  EXPECT_FALSE(takes(R"({"v7": [1)"));
  EXPECT_FALSE(takes(R"({"v7": [])"));
  EXPECT_TRUE(takes(R"({"v7more": [true, null, null])"));
  EXPECT_FALSE(takes(R"({"v7more": [true, 1)"));
  EXPECT_TRUE(takes(R"({"none": [ ])"));
  EXPECT_FALSE(takes(R"({"none": [1)"));
  EXPECT_TRUE(takes(R"({"nested": [["abc", 1], ["", -2]])"));
  EXPECT_FALSE(takes(R"({"nested": [["abcd")"));
  EXPECT_FALSE(takes(R"({"nested": [["a", 1, )"));
  EXPECT_TRUE(takes(R"({"some": [1, 2, "x", "y", 3])"));
  EXPECT_FALSE(takes(R"({"some": [1, "x")"));
  EXPECT_FALSE(takes(R"({"some": [1, 2, "x", 4, 5, 6)"));
  EXPECT_TRUE(takes(R"({"maybe": null)"));
  EXPECT_TRUE(takes(R"({"maybe": [3])"));
  EXPECT_FALSE(takes(R"({"maybe": [3,)"));
  EXPECT_FALSE(takes(R"({"maybe": [])"));
  EXPECT_TRUE(takes(R"({"v7any": [1, "a", null])"));
  // States are keyed by the place: the same place (or, past the places and minItems of an
  // unbounded array, any count) takes the same; the next place does not.
  auto key = [&](const std::string& text) {
    JsonSchemaPrefix p(compiled->get());
    EXPECT_TRUE(p.Feed(text)) << text;
    return p.key();
  };
  EXPECT_EQ(key(R"({"pair": [1, )"), key(R"({"pair": [22, )"));
  EXPECT_NE(key(R"({"head": ["x", )"), key(R"({"head": ["x", true, )"));
  EXPECT_EQ(key(R"({"head": ["x", true, 3, )"), key(R"({"head": ["x", true, 3, 4, 5, )"));
  EXPECT_NE(key(R"({"some": [1, )"), key(R"({"some": [1, 2, )"));
  ExpectClosingsValid(schema, compiled->get(),
                      {R"({)", R"({"pair": [)", R"({"pair": [1, )", R"({"point": [1)",
                       R"({"head": [)", R"({"rec": [)", R"({"rec": [null, )", R"({"v7": [)",
                       R"({"nested": [[)", R"({"nested": [["a", )", R"({"some": [)",
                       R"({"some": [1, 2, )", R"({"maybe": [)", R"({"many": [1, )"});
  // With a mask's longest token, a bounded array's items left key alike past what one token can
  // write: 99 and 98 left alike to 5-byte tokens, not 5 and 4.
  auto key_within = [&](const std::string& text, uint32_t longest) {
    JsonSchemaPrefix p(compiled->get());
    EXPECT_TRUE(p.Feed(text)) << text;
    return p.key(longest);
  };
  std::string items = R"({"many": [)";
  for (int i = 0; i < 94; ++i) items += "1,";
  EXPECT_EQ(key_within(R"({"many": [1,)", 5), key_within(R"({"many": [1,2,)", 5));
  EXPECT_NE(key_within(R"({"many": [1,)", JsonSchema::kUnbounded),
            key_within(R"({"many": [1,2,)", JsonSchema::kUnbounded));
  EXPECT_NE(key_within(items + "1,", 5), key_within(items + "1,1,", 5));
  // Closings written out: each place's shortest value, up to minItems (the required properties
  // in their sorted order; head and point may be empty).
  JsonSchemaPrefix p(compiled->get());
  ASSERT_TRUE(p.Feed(R"({"pair": [)"));
  EXPECT_EQ(p.Closing(), R"(0,""],"head":[],"point":[]})");
  JsonSchemaPrefix q(compiled->get());
  ASSERT_TRUE(q.Feed(R"({"rec": [)"));
  EXPECT_EQ(q.Closing(), R"(null],"head":[],"pair":[0,""],"point":[]})");
}

// A map (additionalProperties a schema, without properties) takes any keys, written any way JSON
// allows, each value valid against its schema.
TEST(JsonSchema, MapsTakeAnyKeys) {
  const json schema = SchemaWith("counts");
  auto compiled = JsonSchema::Compile(schema);
  ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
  auto takes = [&](const std::string& text) { return Takes(compiled->get(), text); };
  auto whole = [&](const std::string& text) { return Whole(compiled->get(), text); };
  EXPECT_TRUE(whole(R"({"counts": {}})"));
  EXPECT_TRUE(whole(R"({"counts": {"a": 1, "b c": 20}, "people": {"x": {"name": "y"}}})"));
  EXPECT_TRUE(takes(R"({"counts": {"\u00e9\n\"": 3, "": 0)"));  // (any key, escaped)
  EXPECT_TRUE(takes(R"({"counts": {"a": 1, "a": 2)"));  // (a key may repeat, as JSON allows)
  EXPECT_FALSE(takes(R"({"counts": {"a": -1)"));
  EXPECT_FALSE(takes(R"({"counts": {"a": ")"));
  EXPECT_FALSE(takes(R"({"counts": {"a": 1, "b": -1)"));  // (every value, not the first)
  EXPECT_FALSE(takes(R"({"counts": {"a": 1, "a": -1)"));  // (a key written again too)
  EXPECT_FALSE(takes(R"({"people": {"x": {})"));          // (name is required)
  EXPECT_FALSE(takes(R"({"nested": {"k": {"j": "abc)"));
  EXPECT_TRUE(takes(R"({"anymap": {"k": [1, {"a": null}], "l": "x"})"));
  EXPECT_FALSE(takes(R"({"lists": {"k": [])"));
  EXPECT_TRUE(takes(R"({"opt": null)"));
  EXPECT_TRUE(takes(R"({"opt": {"k": true})"));
  EXPECT_FALSE(takes(R"({"opt": {"k": 1)"));
  EXPECT_FALSE(takes(R"({"opt": {"k": true, "j": "x)"));
  // A key's state is the syntax's (whatever was written), its value's the map's: keys agree.
  auto key = [&](const std::string& text) {
    JsonSchemaPrefix p(compiled->get());
    EXPECT_TRUE(p.Feed(text)) << text;
    return p.key();
  };
  EXPECT_EQ(key(R"({"counts": {"a": 1, )"), key(R"({"counts": {"abc": 7, "d": 0, )"));
  EXPECT_EQ(key(R"({"counts": {"ab)"), key(R"({"counts": {"x\"yz)"));
  EXPECT_EQ(key(R"({"counts": {"ab)"), key(R"({"counts": {"x": 1, "ab)"));
  EXPECT_NE(key(R"({"counts": {"ab)"), key(R"({"nested": {"ab)"));
  ExpectClosingsValid(
      schema, compiled->get(),
      {R"({"counts": {)", R"({"counts": {"a)", R"({"counts": {"a\)", R"({"counts": {"a\u00)",
       "{\"counts\": {\"\xC3", R"({"counts": {"a")", R"({"counts": {"\ud83d)",
       R"({"counts": {"\ud83d\)", R"({"counts": {"\ud83d\u)", R"({"counts": {"\ud83d\udc)",
       R"({"counts": {"a": )", R"({"counts": {"a": 1, )", R"({"people": {"x)",
       R"({"nested": {"k": {"j)", R"({"lists": {"k)", R"({"opt": {"k)"});
  JsonSchemaPrefix p(compiled->get());
  ASSERT_TRUE(p.Feed(R"({"lists": {"k)"));
  EXPECT_EQ(p.Closing(), R"(":[true]},"counts":{}})");
  JsonSchemaPrefix q(compiled->get());
  ASSERT_TRUE(q.Feed(R"({"counts": {"a": 1, )"));
  EXPECT_EQ(q.Closing(), R"("":0}})");
  // A map at the root: the answer is the map.
  auto root = JsonSchema::Compile(SchemaWith("", true));
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  EXPECT_TRUE(Whole(root->get(), R"({"x": 1.5, "y": -2})"));
  EXPECT_TRUE(Whole(root->get(), R"({})"));
  EXPECT_FALSE(Takes(root->get(), R"({"x": "s)"));
}

// A set (uniqueItems, its items an enum) takes each value at most once, refused at the first byte
// that leaves only values written before; values equal as JSON (1 and 1.0) are one.
TEST(JsonSchema, SetsTakeEachValueOnce) {
  const json schema = SchemaWith("colors");
  auto compiled = JsonSchema::Compile(schema);
  ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
  auto takes = [&](const std::string& text) { return Takes(compiled->get(), text); };
  auto whole = [&](const std::string& text) { return Whole(compiled->get(), text); };
  EXPECT_TRUE(whole(R"({"colors": ["red", "green"], "nums": [1, 2]})"));
  EXPECT_TRUE(
      whole(R"({"nums": [12, 1.0, 10, 2], "colors": ["greenish", "green", "blue", "red"]})"));
  EXPECT_TRUE(takes(R"({"colors": ["red", ")"));
  EXPECT_FALSE(takes(R"({"colors": ["red", "r)"));       // (only red begins so)
  EXPECT_TRUE(takes(R"({"colors": ["green", "green)"));  // (greenish may follow)
  EXPECT_FALSE(takes(R"({"colors": ["green", "green")"));
  EXPECT_TRUE(takes(R"({"colors": ["greenish", "green")"));
  EXPECT_FALSE(takes(R"({"colors": ["red", "blue", "red)"));
  // (maxItems: the four distinct values written)
  EXPECT_FALSE(takes(R"({"colors": ["red", "green", "greenish", "blue", )"));
  EXPECT_TRUE(takes(R"({"nums": [1, 1)"));  // (10 or 12 may follow)
  EXPECT_FALSE(takes(R"({"nums": [1, 1])"));
  EXPECT_FALSE(takes(R"({"nums": [1, 1.)"));  // (1.0 is 1)
  EXPECT_FALSE(takes(R"({"nums": [1.0, 1,)"));
  EXPECT_FALSE(takes(R"({"nums": [1])"));  // (minItems)
  EXPECT_FALSE(takes(R"({"nums": [1, 10, 12, 2, )"));
  EXPECT_TRUE(takes(R"({"mixed": [[1], {"a":1}, null])"));  // (values as JSON writes them)
  EXPECT_FALSE(takes(R"({"mixed": [[1], [)"));
  EXPECT_FALSE(takes(R"({"mixed": [true, false, null, )"));  // (maxItems)
  EXPECT_FALSE(takes(R"({"one": ["only", )"));
  // Numbers equal by their values alone (nlohmann::json's == has 18446744073709551615 equal -1, and
  // 9007199254740993 equal 9007199254740992.0).
  EXPECT_TRUE(takes(R"({"big": [18446744073709551615, -1, 1.8446744073709552e+19])"));
  EXPECT_TRUE(takes(R"({"big": [9007199254740993, 9.007199254740992e+15])"));  // (as JSON
                                                                               // writes it)
  EXPECT_FALSE(takes(R"({"big": [9007199254740992, 9.)"));
  EXPECT_FALSE(takes(R"({"big": [9.007199254740992e+15, 9007199254740992,)"));
  EXPECT_FALSE(takes(R"({"opt": ["red", "blue", "green"])"));
  EXPECT_TRUE(takes(R"({"opt": null)"));
  EXPECT_TRUE(takes(R"({"list": ["red", "red"])"));  // (uniqueItems false: any items)
  EXPECT_TRUE(takes(R"({"inner": [["a", "b"], ["b", "a"], ["a"]])"));  // (each set its own)
  EXPECT_FALSE(takes(R"({"inner": [["a", "b"], ["b", "b)"));
  // A set's state keys the values written, not their order.
  auto key = [&](const std::string& text) {
    JsonSchemaPrefix p(compiled->get());
    EXPECT_TRUE(p.Feed(text)) << text;
    return p.key();
  };
  EXPECT_EQ(key(R"({"colors": ["red", "blue", )"), key(R"({"colors": ["blue", "red", )"));
  EXPECT_NE(key(R"({"colors": ["red", "blue", )"), key(R"({"colors": ["red", "green", )"));
  EXPECT_EQ(key(R"({"nums": [1, )"), key(R"({"nums": [1.0, )"));
  ExpectClosingsValid(
      schema, compiled->get(),
      {R"({"colors": [)", R"({"colors": ["red", )", R"({"colors": ["green)",
       R"({"colors": ["green", "gr)", R"({"nums": [)", R"({"nums": [1)", R"({"nums": [1, )",
       R"({"nums": [10, 1)", R"({"nums": [1.0, 1)", R"({"mixed": [[1], )", R"({"opt": [)",
       R"({"opt": ["blue", "gr)", R"({"inner": [["a", )", R"({"big": [18446744073709551615, )",
       R"({"big": [-1, 9)"});
  // Closings write values not written yet, as few as minItems asks.
  JsonSchemaPrefix p(compiled->get());
  ASSERT_TRUE(p.Feed(R"({"colors": [], "nums": [1.0)"));
  EXPECT_EQ(p.Closing(), ",10]}");
  JsonSchemaPrefix q(compiled->get());
  ASSERT_TRUE(q.Feed(R"({"nums": [1, 10, 2], "colors": ["green", "gr)"));
  EXPECT_EQ(q.Closing(), R"(eenish"]})");
  JsonSchemaPrefix r(compiled->get());
  ASSERT_TRUE(r.Feed(R"({"opt": ["blue", )"));
  EXPECT_EQ(r.Closing(), R"("green","greenish","red"],"colors":[],"nums":[1,10]})");
}

// Every byte taken after each prefix of `text` (which must be taken) leaves a prefix whose
// Closing() the validator accepts: no byte leads where no valid answer is left.
void ExpectNoDeadEndAlong(const json& schema, const JsonSchema* compiled, const std::string& text) {
  JsonSchemaPrefix p(compiled);
  for (size_t at = 0; at <= text.size(); ++at) {
    for (int b = 0; b < 256; ++b) {
      JsonSchemaPrefix next = p;
      if (!next.Feed(static_cast<char>(b))) continue;
      const std::string closing = next.Closing();
      JsonSchemaPrefix closed = next;  // (the reader takes its own closing: no frame too many)
      ASSERT_TRUE(closed.Feed(closing) && closed.complete())
          << text.substr(0, at) << static_cast<char>(b) << " + " << closing;
      const std::string whole = text.substr(0, at) + static_cast<char>(b) + closing;
      const json doc = json::parse(whole, nullptr, false);
      ASSERT_FALSE(doc.is_discarded()) << whole;
      ASSERT_TRUE(SchemaValid(schema, doc, schema)) << whole;
    }
    if (at < text.size()) {
      ASSERT_TRUE(p.Feed(text[at])) << text.substr(0, at + 1);
    }
  }
}

// A recursive schema's values nest as deep as the reader's frames allow (17 objects and arrays
// of the schema's own), and no deeper: a value, key or comma that would need more is refused
// while what can still end is taken, so no prefix taken is a dead end.
TEST(JsonSchema, RecursiveSchemasNestAsDeepAsTheFramesAllow) {
  static_assert(JsonSchema::kMaxFrames == 17);
  {  // A tree: each node an object (a frame), its children an array (another).
    const json schema = Schemas()[Schemas().size() - 5];
    ASSERT_TRUE(schema.contains("$defs") && schema["$defs"].contains("Node")) << schema.dump();
    auto compiled = JsonSchema::Compile(schema);
    ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
    const JsonSchema* c = compiled->get();
    EXPECT_EQ(c->Smallest(c->root()), R"({"value":0})");
    std::string down;  // 8 nodes and their children's arrays: 16 frames
    for (int i = 0; i < 8; ++i) down += R"({"value":1,"children":[)";
    EXPECT_TRUE(Takes(c, down + "]"));
    EXPECT_TRUE(Takes(c, down + R"({"value":2})"));   // the 17th frame: a node
    EXPECT_FALSE(Takes(c, down + R"({"value":2,)"));  // (its children would be the 18th)
    EXPECT_FALSE(Takes(c, down + R"({"c)"));
    EXPECT_FALSE(Takes(c, down + R"({"value":2,"children")"));
    EXPECT_TRUE(Takes(c, down + R"({"v)"));
    std::string up;
    for (int i = 0; i < 8; ++i) up += "]}";
    const std::string deepest = down + R"({"value":2})" + up;
    EXPECT_TRUE(Whole(c, deepest));
    ASSERT_TRUE(SchemaValid(schema, json::parse(deepest), schema));
    // One level less: the 16th frame, an array, takes a node but not the node's children.
    const std::string less =
        down.substr(0, down.size() - std::string(R"({"value":1,"children":[)").size());
    EXPECT_TRUE(Takes(c, less + R"({"value":1,"children":[{"value":1}, {"value":3}]})"));
    ExpectNoDeadEndAlong(schema, c, deepest);
    ExpectClosingsValid(schema, c, {down, down + "{", down + R"({"value":2)", less + "{"});
  }
  {  // A linked list whose next item is required (Optional["Item"]): deep, only null ends it.
    const json schema = SchemaWith("forest");
    auto compiled = JsonSchema::Compile(schema);
    ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
    const JsonSchema* c = compiled->get();
    // The root's frame, then an item's each: the 16th item is the 17th frame.
    std::string items = R"({"head":)";
    for (int i = 0; i < 15; ++i) items += R"({"name":"a","next":)";
    EXPECT_TRUE(Takes(c, items + "{"));
    EXPECT_TRUE(Takes(c, items + R"({"name":"b","next":null})"));
    items += R"({"name":"a","next":)";
    EXPECT_FALSE(Takes(c, items + "{"));  // (an item would be the 18th frame)
    EXPECT_TRUE(Takes(c, items + "null"));
    std::string whole = items + "null";
    for (int i = 0; i < 16; ++i) whole += "}";
    whole += "}";
    EXPECT_TRUE(Whole(c, whole));
    ASSERT_TRUE(SchemaValid(schema, json::parse(whole), schema));
    ExpectNoDeadEndAlong(schema, c, whole);
    // A closing writes the shortest values: null, not items.
    JsonSchemaPrefix p(c);
    ASSERT_TRUE(p.Feed(R"({"head":{"name":"a","next":)"));
    EXPECT_EQ(p.Closing(), "null}}");
  }
  {  // Names that begin one another (a needs two frames, ab one), a tuple whose second place
     // recurs, a set of enum values (one an object): at the 16th frame, "ab" is taken and "a"
     // not, the tuple closes after its first place, the set is written whole.
    const json schema = json::parse(R"({"$defs": {"R": {"type": "object", "properties": {
        "a": {"type": "array", "items": {"$ref": "#/$defs/R"}, "minItems": 1},
        "ab": {"$ref": "#/$defs/R"},
        "t": {"type": "array", "prefixItems": [{"type": "integer"}, {"$ref": "#/$defs/R"}],
          "minItems": 1},
        "s": {"type": "array", "items": {"enum": ["x", {"o": 1}]}, "uniqueItems": true}}}},
      "$ref": "#/$defs/R"})");
    auto compiled = JsonSchema::Compile(schema);
    ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
    const JsonSchema* c = compiled->get();
    std::string down;  // 15 objects: the next is the 16th frame
    for (int i = 0; i < 15; ++i) down += R"({"ab":)";
    EXPECT_TRUE(Takes(c, down + R"({"a)"));
    EXPECT_FALSE(Takes(c, down + R"({"a")"));
    EXPECT_TRUE(Takes(c, down + R"({"ab":{})"));
    EXPECT_TRUE(Takes(c, down + R"({"t":[1])"));
    EXPECT_FALSE(Takes(c, down + R"({"t":[1,)"));
    EXPECT_TRUE(Takes(c, down + R"({"s":["x",{"o":1}])"));
    JsonSchemaPrefix p(c);
    ASSERT_TRUE(p.Feed(down + R"({"a)"));
    EXPECT_EQ(p.Closing(), R"(b":{}})" + std::string(15, '}'));
    ExpectNoDeadEndAlong(schema, c,
                         down + R"({"ab":{},"t":[2],"s":[{"o":1},"x"]})" + std::string(15, '}'));
  }
  {  // A value whose shortest kind (an object, {}) needs a frame: where none is left, its
     // closing writes the other kind (a string of three characters), which the reader takes.
    const json schema = json::parse(R"({"$defs": {"N": {"type": "object", "properties": {
        "p": {"anyOf": [{"$ref": "#/$defs/N"}, {"type": "string", "minLength": 3}]}}}},
      "$ref": "#/$defs/N"})");
    auto compiled = JsonSchema::Compile(schema);
    ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
    const JsonSchema* c = compiled->get();
    std::string down;
    for (int i = 0; i < 17; ++i) down += R"({"p":)";
    JsonSchemaPrefix p(c);
    ASSERT_TRUE(p.Feed(down));
    EXPECT_EQ(p.Closing(), R"("aaa")" + std::string(17, '}'));
    JsonSchemaPrefix q(c);
    ASSERT_TRUE(q.Feed(down.substr(0, down.size() - 5)));
    EXPECT_EQ(q.Closing(), "{}" + std::string(16, '}'));  // ({} for the 16th's p: the 17th frame)
    ExpectNoDeadEndAlong(schema, c, down + R"("abc")" + std::string(17, '}'));
  }
  // Only the frames an answer can give a value bound its shortest text: X at one frame (never
  // given: the root has 17) would be five strings of 16,000 characters, beyond the 64 KiB bound;
  // within the 16 it is given, X's shortest is {"z":{}}.
  EXPECT_TRUE(JsonSchema::Compile(json::parse(R"({"type": "object",
      "required": ["a", "b", "c", "d", "e"], "properties": {"a": {"$ref": "#/$defs/X"},
      "b": {"$ref": "#/$defs/X"}, "c": {"$ref": "#/$defs/X"}, "d": {"$ref": "#/$defs/X"},
      "e": {"$ref": "#/$defs/X"}}, "$defs": {"X": {"type": ["object", "string"],
      "minLength": 16000, "properties": {"z": {"type": "object", "properties": {}}},
      "required": ["z"]}}})"))
                  .ok());
  {  // A binary tree whose both children are required, each a node or null: the shortest
     // answer is short (a node's first kind, an object, written to the deepest frame each time,
     // would be 2^17 nodes long).
    const json schema = json::parse(R"({"$defs": {"B": {"type": "object", "properties": {
        "l": {"anyOf": [{"$ref": "#/$defs/B"}, {"type": "null"}]},
        "r": {"anyOf": [{"$ref": "#/$defs/B"}, {"type": "null"}]}}, "required": ["l", "r"]}},
      "$ref": "#/$defs/B"})");
    auto compiled = JsonSchema::Compile(schema);
    ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
    const JsonSchema* c = compiled->get();
    EXPECT_EQ(c->Smallest(c->root()), R"({"l":null,"r":null})");
    std::string left;
    for (int i = 0; i < 17; ++i) left += R"({"r":null,"l":)";
    EXPECT_TRUE(Takes(c, left + "null}"));
    EXPECT_FALSE(Takes(c, left + "{"));  // (an 18th frame)
    EXPECT_TRUE(Takes(c, left.substr(0, left.size() - 14) + "{"));
    ExpectNoDeadEndAlong(schema, c, left + "null" + std::string(17, '}'));
  }
  {  // Maps and tuples that refer to each other: a forest's trees are [n, forest, ...].
    const json schema = SchemaWith("forest");
    auto compiled = JsonSchema::Compile(schema);
    ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
    const JsonSchema* c = compiled->get();
    // Frames: the root, the forest (a map), then a tree (array) and its forest (map) each.
    std::string down = R"({"head":{"name":"","next":null},"forest":)";
    for (int i = 0; i < 7; ++i) down += R"({"t":[1,)";
    down += "{";                                  // the 16th frame: a forest
    EXPECT_TRUE(Takes(c, down + R"("t":[1])"));   // (a tree: the 17th)
    EXPECT_FALSE(Takes(c, down + R"("t":[1,)"));  // (its forest would be the 18th)
    std::string whole = down + R"("t":[1]})";
    for (int i = 0; i < 7; ++i) whole += "]}";
    whole += "}";
    ASSERT_TRUE(SchemaValid(schema, json::parse(whole), schema)) << whole;
    EXPECT_TRUE(Whole(c, whole));
    ExpectNoDeadEndAlong(schema, c, whole);
  }
  {  // Optional recursion: a node 17 frames deep takes only the property that can be null.
    const json schema = Schemas()[Schemas().size() - 3];
    ASSERT_TRUE(schema.contains("$defs") && schema["$defs"].contains("D")) << schema.dump();
    auto compiled = JsonSchema::Compile(schema);
    ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
    const JsonSchema* c = compiled->get();
    std::string down;
    for (int i = 0; i < 16; ++i) down += R"({"d":)";
    EXPECT_TRUE(Takes(c, down + "{}"));
    EXPECT_FALSE(Takes(c, down + R"({"d)"));
    EXPECT_FALSE(Takes(c, down + R"({"e)"));
    EXPECT_TRUE(Takes(c, down + R"({"w":null})"));
    EXPECT_FALSE(Takes(c, down + R"({"w":null,)"));                         // (nothing else fits)
    EXPECT_FALSE(Takes(c, down.substr(0, down.size() - 5) + R"({"e":[)"));  // (e needs an item)
    EXPECT_TRUE(Takes(c, down.substr(0, down.size() - 10) + R"({"e":[{})"));
    // w's object takes two frames (its a is required): where one is left, only null.
    EXPECT_FALSE(Takes(c, down.substr(0, down.size() - 5) + R"({"w":{)"));
    EXPECT_TRUE(Takes(c, down.substr(0, down.size() - 5) + R"({"w":null})"));
    const std::string w = down.substr(0, down.size() - 10) + R"({"w":{"a":[)";
    EXPECT_TRUE(Takes(c, w + "]"));
    EXPECT_FALSE(Takes(c, w + "{"));
    ExpectNoDeadEndAlong(schema, c, down + "{}" + std::string(16, '}'));
    ExpectNoDeadEndAlong(schema, c, w + "]}}" + std::string(14, '}'));
  }
}

// A discriminated union's object writes its discriminator first; once its value is read, the
// object goes on as that value's branch (its properties, required ones and bounds); closings
// write the value whose branch fits with the shortest object.
TEST(JsonSchema, DiscriminatedUnionsGoOnAsTheBranchTheirValueNames) {
  const json schema = SchemaWith("pet");
  auto compiled = JsonSchema::Compile(schema);
  ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
  const JsonSchema* c = compiled->get();
  auto takes = [&](const std::string& text) { return Takes(c, text); };
  auto whole = [&](const std::string& text) { return Whole(c, text); };
  EXPECT_TRUE(whole(R"({"pet":{"kind":"cat","meows":3}})"));
  EXPECT_TRUE(whole(R"({"pet": {"kind": "dog", "name": "Rex", "barks": true}})"));
  EXPECT_TRUE(whole(R"({"pet":{"kind":"parrot"}})"));
  EXPECT_TRUE(whole(R"({"pet":{"kind":"bird","wings":2},"pets":[null,{"kind":"cat","meows":0}]})"));
  EXPECT_FALSE(takes(R"({"pet":{"meows")"));  // the discriminator first
  EXPECT_FALSE(takes(R"({"pet":{})"));
  EXPECT_FALSE(takes(R"({"pet":{"kind":"co)"));            // no such value
  EXPECT_FALSE(takes(R"({"pet":{"kind":"cat","barks")"));  // a dog's
  EXPECT_FALSE(takes(R"({"pet":{"kind":"cat"})"));         // meows is required
  EXPECT_FALSE(takes(R"({"pet":{"kind":"cat","meows":-1)"));
  EXPECT_FALSE(takes(R"({"pet":{"kind":"dog","name":"Rexy")"));
  EXPECT_FALSE(takes(R"({"pet":{"kind":"dog","kind")"));  // each once
  EXPECT_FALSE(takes(R"({"pet":{"kind":"bird","wings":3)"));
  EXPECT_FALSE(takes(R"({"pets":[{"kind":"bird")"));  // not among the list's branches
  JsonSchemaPrefix p(c);
  ASSERT_TRUE(p.Feed(R"({"pet":{)"));
  EXPECT_EQ(p.Closing(), R"("kind":"bird"}})");  // (the shortest: its branch needs no more)
  JsonSchemaPrefix q(c);
  ASSERT_TRUE(q.Feed(R"({"pet":{"kind":"c)"));
  EXPECT_EQ(q.Closing(), R"(at","meows":0}})");
  JsonSchemaPrefix r(c);
  ASSERT_TRUE(r.Feed(R"({"pets":[{"kind":)"));
  EXPECT_EQ(r.Closing(), R"("cat","meows":0}],"pet":{"kind":"bird"}})");
  ExpectClosingsValid(schema, c,
                      {R"({"pet":{"kind")", R"({"pet":{"kind":)", R"({"pet":{"kind":"dog")",
                       R"({"pet":{"kind":"dog",)", R"({"pets":[{"kind":"dog","barks":false},{)"});
  // The state after a value is its branch's: two texts that chose the same branch differently
  // (bird, parrot) are keyed alike.
  JsonSchemaPrefix bird(c), parrot(c);
  ASSERT_TRUE(bird.Feed(R"({"pet":{"kind":"bird")"));
  ASSERT_TRUE(parrot.Feed(R"({"pet":{"kind":"parrot")"));
  EXPECT_EQ(bird.key(), parrot.key());
  ExpectNoDeadEndAlong(
      schema, c,
      R"({"pet":{"kind":"dog","name":"R","barks":true},"pets":[{"kind":"cat","meows":12},null]})");

  // What is not a discriminated union is refused by name.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type": "object", "properties": {"a": {"anyOf": [
          {"type": "object", "properties": {"x": {"type": "integer"}}},
          {"type": "object", "properties": {"y": {"type": "integer"}}}]}}})",
       "/properties/a/anyOf: branches 0 and 1 can both be an object, and no property tells"},
      {R"({"type": "object", "properties": {"a": {"anyOf": [
          {"type": "object", "properties": {"k": {"const": "x"}}, "required": ["k"]},
          {"type": "object", "properties": {"k": {"enum": ["y", "x"]}}, "required": ["k"]}]}}})",
       "no property tells the object branches apart"},
      {R"({"type": "object", "properties": {"a": {"anyOf": [
          {"type": "object", "properties": {"k": {"const": "x"}}, "required": ["k"]},
          {"type": "object", "properties": {"j": {"const": "y"}}}]}}})",
       "no property tells the object branches apart"},
      {R"({"type": "object", "properties": {"a": {"anyOf": [
          {"type": "object", "properties": {"k": {"const": "x"}}},
          {"type": "object", "properties": {"k": {"const": "y"}}}, {"type": "object"}]}}})",
       "branches 0 and 2 can both be an object: objects in one anyOf or oneOf must be models"},
      {R"({"type": "object", "properties": {"a": {"anyOf": [
          {"type": "object", "properties": {"k": {"const": "x"}}},
          {"anyOf": [{"type": "object", "properties": {"k": {"const": "y"}}},
            {"type": "object", "properties": {"k": {"const": "z"}}}]}]}}})",
       "branches 0 and 1 can both be an object: objects in one anyOf or oneOf must be models"},
      {R"({"type": "object", "properties": {"a": {"anyOf": [
          {"type": "object", "properties": {"k": {"const": "\u0063at"}}},
          {"type": "object", "properties": {"k": {"const": "cat"}}}]}}})",
       "no property tells the object branches apart"},
      {R"({"type": "object", "properties": {"e": {"$ref": "#/$defs/E"}}, "$defs": {
          "E": {"anyOf": [{"type": "object", "properties": {"k": {"const": "x"},
            "n": {"anyOf": [{"$ref": "#/$defs/E"}, {"type": "null"}]}}},
          {"type": "object", "properties": {"k": {"const": "y"}}}]}}})",
       "/$defs/E/anyOf/0/properties/n/anyOf/0: refers back to an anyOf or oneOf that is being"},
      {R"({"type": "object", "properties": {"a": {"anyOf": [
          {"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]},
          {"type": "object", "properties": {"k": {"const": 2}}, "required": ["k"]}]}}})",
       "no property tells the object branches apart"},
      {R"({"type": "object", "properties": {"a": {"anyOf": [{"type": "object"},
          {"type": "object", "properties": {"k": {"const": "y"}}, "required": ["k"]}]}}})",
       "branches 0 and 1 can both be an object: objects in one anyOf or oneOf must be models"},
      {R"({"type": "object", "properties": {"a": {"oneOf": [
          {"type": "object", "properties": {"k": {"const": "x"}, "j": {"const": "p"}},
            "required": ["k", "j"]},
          {"type": "object", "properties": {"k": {"const": "y"}, "j": {"const": "p"}},
            "required": ["k", "j"]}], "discriminator": {"propertyName": "j"}}}})",
       "/properties/a/discriminator: names 'j', which is not a property every object branch"},
      {R"({"type": "object", "properties": {"a": {"oneOf": [{"type": "null"}],
          "discriminator": {"propertyName": "j", "other": 1}}}})",
       "/properties/a/discriminator: 'other' is not supported"},
      {R"({"type": "object", "properties": {"a": {"oneOf": [{"type": "null"}],
          "discriminator": "j"}}})",
       "/properties/a/discriminator: must be an object with a propertyName"},
      {R"({"type": "object", "properties": {"a": {"type": "object", "discriminator": {
          "propertyName": "j"}}}})",
       "/properties/a/discriminator: is supported only beside anyOf or oneOf"},
  };
  for (const auto& [text, message] : cases) {
    auto refused = JsonSchema::Compile(json::parse(text));
    ASSERT_FALSE(refused.ok()) << text;
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find(message), std::string::npos)
        << refused.status().message() << "\nwanted: " << message;
  }
  // A union within the models it unites (an expression tree: an operation's arguments are
  // operations or numbers): deep, only values whose model fits are taken (an operation needs
  // three frames, a number one); closings write the shortest model, not the first ("add").
  {
    const json tree = json::parse(R"({"$defs": {
        "Op": {"type": "object", "properties": {"kind": {"const": "add"}, "args": {
          "type": "array", "items": {"anyOf": [{"$ref": "#/$defs/Op"}, {"$ref": "#/$defs/Num"}]},
          "minItems": 2}}, "required": ["kind", "args"]},
        "Num": {"type": "object", "properties": {"kind": {"const": "num"},
          "value": {"type": "integer"}}, "required": ["kind", "value"]}},
      "$ref": "#/$defs/Op"})");
    auto compiled_tree = JsonSchema::Compile(tree);
    ASSERT_TRUE(compiled_tree.ok()) << compiled_tree.status().ToString();
    const JsonSchema* t = compiled_tree->get();
    std::string down;  // eight operations and their arguments' arrays: 16 frames
    for (int i = 0; i < 8; ++i) down += R"({"kind":"add","args":[)";
    EXPECT_TRUE(Takes(t, down + R"({"kind":"num","value":1})"));
    EXPECT_FALSE(Takes(t, down + R"({"kind":"a)"));  // (an operation would need 19)
    EXPECT_TRUE(Takes(t, down.substr(0, down.size() - 22) + R"({"kind":"add")"));
    JsonSchemaPrefix deep(t);
    ASSERT_TRUE(deep.Feed(down + "{"));
    EXPECT_EQ(deep.Closing().substr(0, 54),
              R"("kind":"num","value":0},{"kind":"num","value":0}]},{"k)");
    std::string text = down + R"({"kind":"num","value":1},{"kind":"num","value":2}]})";
    for (int i = 0; i < 7; ++i) text += R"(,{"kind":"num","value":3}]})";
    ASSERT_TRUE(SchemaValid(tree, json::parse(text), tree)) << text;
    EXPECT_TRUE(Whole(t, text));
    ExpectNoDeadEndAlong(tree, t, text);
    EXPECT_EQ(t->Smallest(t->root()),
              R"({"args":[{"kind":"num","value":0},{"kind":"num","value":0}],"kind":"add"})");
  }
  // A recursive union written as a definition (pydantic's RootModel of a union): compiles
  // whichever model the properties reach first.
  for (const char* first : {"a", "z"}) {
    json expr = json::parse(R"({"type": "object", "properties": {"e": {"$ref": "#/$defs/Expr"}},
        "required": ["e"], "$defs": {
        "Expr": {"oneOf": [{"$ref": "#/$defs/Op"}, {"$ref": "#/$defs/Num"}],
          "discriminator": {"propertyName": "kind"}},
        "Op": {"type": "object", "properties": {"kind": {"const": "add"}, "args": {
          "type": "array", "items": {"$ref": "#/$defs/Expr"}}}, "required": ["kind", "args"]},
        "Num": {"type": "object", "properties": {"kind": {"const": "num"},
          "value": {"type": "integer"}}, "required": ["kind", "value"]}}})");
    expr["properties"][first] = {{"$ref", "#/$defs/Op"}};
    auto e = JsonSchema::Compile(expr);
    ASSERT_TRUE(e.ok()) << first << ": " << e.status().ToString();
    const std::string text =
        R"({"e":{"kind":"add","args":[{"kind":"num","value":1},{"kind":"add","args":[]}]}})";
    EXPECT_TRUE(Whole(e->get(), text));
    ExpectNoDeadEndAlong(expr, e->get(), text);
  }
  // A union at the root, as a map's values and a tuple's place; an optional discriminator (the
  // answer writes it first all the same).
  {
    const json rooted = json::parse(R"({"$defs": {
        "A": {"type": "object", "properties": {"k": {"const": "a"}, "x": {"type": "integer"}}},
        "B": {"type": "object", "properties": {"k": {"const": "b"}}, "required": ["k"]}},
      "anyOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]})");
    auto at_root = JsonSchema::Compile(rooted);
    ASSERT_TRUE(at_root.ok()) << at_root.status().ToString();
    EXPECT_TRUE(Whole(at_root->get(), R"({"k":"a","x":1})"));
    EXPECT_TRUE(Whole(at_root->get(), R"({"k":"a"})"));
    EXPECT_FALSE(Takes(at_root->get(), R"({"x")"));  // (valid against A, but k is written first)
    EXPECT_FALSE(Takes(at_root->get(), R"({"k":"b","x")"));
    ExpectNoDeadEndAlong(rooted, at_root->get(), R"({"k":"a","x":1})");
    const json placed = json::parse(R"({"type": "object", "$defs": {
        "A": {"type": "object", "properties": {"k": {"const": "a"}}},
        "B": {"type": "object", "properties": {"k": {"const": "b"}, "y": {"type": "null"}}},
        "AB": {"anyOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}},
      "properties": {"m": {"type": "object", "additionalProperties": {"$ref": "#/$defs/AB"}},
        "t": {"type": "array", "prefixItems": [{"$ref": "#/$defs/AB"}, {"type": "integer"}]}}})");
    auto in_places = JsonSchema::Compile(placed);
    ASSERT_TRUE(in_places.ok()) << in_places.status().ToString();
    const std::string text = R"({"m":{"p":{"k":"b","y":null},"q":{"k":"a"}},"t":[{"k":"b"},3]})";
    EXPECT_TRUE(Whole(in_places->get(), text));
    ExpectNoDeadEndAlong(placed, in_places->get(), text);
  }
  // One union for every anyOf of the same models (its values kept once), and a bound on the
  // values of all the schema's unions.
  {
    json models = json::object();
    for (const char* m : {"A", "B", "C"}) {
      json values = json::array();
      for (int i = 0; i < 340; ++i)
        values.push_back(std::string(m) + std::string(90, 'v') + std::to_string(i));
      models[m] = {{"type", "object"}, {"properties", {{"k", {{"enum", values}}}}}};
    }
    auto ref = [](const char* m) { return json{{"$ref", std::string("#/$defs/") + m}}; };
    json same = {{"type", "object"}, {"$defs", models}, {"properties", json::object()}};
    for (int i = 0; i < 60; ++i) {
      same["properties"]["p" + std::to_string(i)] = {{"anyOf", {ref("A"), ref("B")}}};
    }
    auto s = JsonSchema::Compile(same);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_LT(s->get()->bytes(), 1'000'000u);  // (one union's 680 values, 64 KiB; not 60)
    json several = {{"type", "object"}, {"$defs", models}, {"properties", json::object()}};
    several["properties"]["ab"] = {{"anyOf", {ref("A"), ref("B")}}};
    several["properties"]["ac"] = {{"anyOf", {ref("A"), ref("C")}}};
    several["properties"]["bc"] = {{"anyOf", {ref("B"), ref("C")}}};
    several["properties"]["abc"] = {{"anyOf", {ref("A"), ref("B"), ref("C")}}};
    auto refused = JsonSchema::Compile(several);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("discriminated unions have more than 262144 bytes"),
              std::string::npos)
        << refused.status().message();
  }
  // Without propertyName, the first property that tells them apart (j does not, k does).
  EXPECT_TRUE(JsonSchema::Compile(json::parse(R"({"type": "object", "properties": {"a": {
      "anyOf": [{"type": "object", "properties": {"k": {"const": "x"}, "j": {"const": "p"}},
        "required": ["k", "j"]},
      {"type": "object", "properties": {"k": {"const": "y"}, "j": {"const": "p"}},
        "required": ["k", "j"]}]}}})"))
                  .ok());
}

// A number's bounds are kept at every digit, compared as decimals with the shortest texts of
// their doubles (an exclusive one's: of the double next to it inside), so that what is taken
// parses to a double within them: a digit is taken only while some number it can still become
// is within them. Exponents are not written.
TEST(JsonSchema, NumbersStayWithinTheirBounds) {
  const json schema = json::parse(R"({"type": "object", "properties": {
      "p": {"type": "number", "minimum": 0, "maximum": 1},
      "x": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
      "c": {"type": "number", "minimum": 0.1, "maximum": 0.3},
      "n": {"type": "number", "minimum": -2.75, "maximum": -0.5},
      "t": {"type": "number", "minimum": 1e-20, "maximum": 3e-20},
      "b": {"type": "number", "minimum": 12.5},
      "w": {"type": "number", "minimum": 999999999999999.5, "maximum": 1e15},
      "h": {"type": "number", "minimum": 0, "maximum": 29.5},
      "m": {"type": "number", "minimum": 150}}})");
  auto compiled = JsonSchema::Compile(schema);
  ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
  auto takes = [&](const std::string& text) { return Takes(compiled->get(), text); };
  // Each text taken whole is valid, and each refused at its last byte has no valid end.
  const std::vector<std::pair<std::string, bool>> cases = {
      {R"({"p": 0})", true},
      {R"({"p": 1})", true},
      {R"({"p": 1.0})", true},
      {R"({"p": 0.5})", true},
      {R"({"p": -0})", true},  // (-0 is 0)
      {R"({"p": -0.0})", true},
      {R"({"p": 1.00001)", false},
      {R"({"p": 2)", false},
      {R"({"p": 10)", false},
      {R"({"p": -0.1)", false},
      {R"({"p": -1)", false},
      {R"({"p": 1e)", false},  // (no exponents)
      {R"({"x": 0})", false},
      {R"({"x": 0.0})", false},
      {R"({"x": 0.000001})", true},
      {R"({"x": 0.9999999999999999})", true},
      {R"({"x": 0.99999999999999999)", false},  // (17 nines: the double 1, not below it)
      {R"({"x": 1)", false},
      {R"({"x": -)", false},
      {R"({"c": 0.1})", true},
      {R"({"c": 0.3})", true},
      {R"({"c": 0.3000000000000000})", true},
      {R"({"c": 0.2})", true},
      {R"({"c": 0.30000000000000004)", false},  // (0.1 + 0.2: above the double 0.3)
      {R"({"c": 0.0)", false},
      {R"({"c": 0})", false},
      {R"({"c": 1)", false},
      {R"({"n": -0.5})", true},
      {R"({"n": -0.6})", true},
      {R"({"n": -2.75})", true},
      {R"({"n": -2.750000})", true},
      {R"({"n": -2.7})", true},
      {R"({"n": -1})", true},
      {R"({"n": -0})", false},
      {R"({"n": -0.4)", false},
      {R"({"n": -2.76)", false},
      {R"({"n": -3)", false},
      {R"({"n": 0)", false},
      {R"({"t": 0.00000000000000000001})", true},
      {R"({"t": 0.00000000000000000003})", true},
      {R"({"t": 0.000000000000000000025})", true},
      {R"({"t": 0.00000000000000000004)", false},
      {R"({"t": 0.00000000000000000000)", false},
      {R"({"t": 0.1)", false},
      {R"({"t": 1)", false},
      {R"({"b": 12.5})", true},
      {R"({"b": 13})", true},
      {R"({"b": 100})", true},
      {R"({"b": 12})", false},
      {R"({"b": 9})", false},
      {R"({"b": 12.4)", false},
      {R"({"b": -)", false},
      {R"({"w": 1000000000000000})", true},
      {R"({"w": 1000000000000000.0})", true},
      {R"({"w": 999999999999999.5})", true},
      {R"({"w": 999999999999999.75})", true},
      {R"({"w": 999999999999999})", false},
      {R"({"w": 999999999999999.4)", false},
      {R"({"w": 1000000000000000.1)", false},
      {R"({"w": 10000000000000000)", false},
  };
  for (const auto& [text, valid] : cases) {
    EXPECT_EQ(takes(text), valid) << text;
    EXPECT_TRUE(takes(text.substr(0, text.size() - 1))) << text;
    if (valid) {
      EXPECT_TRUE(Whole(compiled->get(), text)) << text;
      EXPECT_TRUE(SchemaValid(schema, json::parse(text), schema)) << text;  // (the cases)
    }
  }
  // The keys of states that take the same texts agree; of those that do not, differ.
  auto key = [&](const std::string& text) {
    JsonSchemaPrefix p(compiled->get());
    EXPECT_TRUE(p.Feed(text)) << text;
    return p.key();
  };
  EXPECT_EQ(key(R"({"x": 0.1)"), key(R"({"x": 0.5)"));
  EXPECT_EQ(key(R"({"c": 0.1)"), key(R"({"c": 0.2)"));  // (0.1 is the least: within)
  EXPECT_NE(key(R"({"c": 0.3)"), key(R"({"c": 0.2)"));  // (0.31 is not)
  EXPECT_EQ(key(R"({"c": 0.25)"), key(R"({"c": 0.26)"));
  EXPECT_EQ(key(R"({"b": 13)"), key(R"({"b": 14)"));
  EXPECT_NE(key(R"({"b": 11)"), key(R"({"b": 12)"));  // (12.5 follows 12)
  EXPECT_NE(key(R"({"b": 12)"), key(R"({"b": 13)"));  // (13 ends)
  EXPECT_NE(key(R"({"t": 0.0000)"), key(R"({"t": 0.00000)"));
  // A whole part keys by its runs as an integer's, but one that may reach a bound's whole part
  // (whose fraction then bounds the answer's) keys apart: 29.6 is past 29.5, 19.6 is not.
  EXPECT_EQ(key(R"({"h": 3)"), key(R"({"h": 9)"));
  EXPECT_EQ(key(R"({"h": 11)"), key(R"({"h": 18)"));
  EXPECT_NE(key(R"({"h": 1)"), key(R"({"h": 2)"));
  EXPECT_NE(key(R"({"h": 28)"), key(R"({"h": 29)"));
  EXPECT_EQ(key(R"({"m": 150)"), key(R"({"m": 151)"));  // (150 has no fraction to keep to)
  // Closings write few digits, not a bound's (exclusiveMinimum 0's is 5e-324: 324 of them).
  auto closing = [&](const std::string& text) {
    JsonSchemaPrefix p(compiled->get());
    EXPECT_TRUE(p.Feed(text)) << text;
    return p.Closing();
  };
  EXPECT_EQ(closing(R"({"x")"), ":0.1}");
  EXPECT_EQ(closing(R"({"x": 0.)"), "1}");
  EXPECT_EQ(closing(R"({"x": 0.0)"), "1}");
  EXPECT_EQ(closing(R"({"x": 0.99)"), "}");
  EXPECT_EQ(closing(R"({"c": 0)"), ".1}");
  EXPECT_EQ(closing(R"({"n": -)"), "1}");
  EXPECT_EQ(closing(R"({"n": -0)"), ".5}");
  EXPECT_EQ(closing(R"({"b": 12)"), ".5}");
  EXPECT_EQ(closing(R"({"w": 9)"), "99999999999999.5}");
  EXPECT_EQ(closing(R"({"t": 0.0000)"), "0000000000000001}");
  EXPECT_TRUE(JsonSchema::Compile(json::parse(R"({"type": "object", "properties": {"a": {
      "type": "array", "minItems": 256, "items": {"type": "number", "exclusiveMinimum": 0,
      "exclusiveMaximum": 1}}}, "required": ["a"]})"))
                  .ok());
  ExpectClosingsValid(schema, compiled->get(),
                      {R"({"p": -)",
                       R"({"p": -0.)",
                       R"({"x": 0)",
                       R"({"x": 0.)",
                       R"({"x": 0.99999)",
                       R"({"c": 0)",
                       R"({"c": 0.)",
                       R"({"c": 0.1)",
                       R"({"c": 0.3)",
                       R"({"n": -)",
                       R"({"n": -0)",
                       R"({"n": -2)",
                       R"({"n": -2.7)",
                       R"({"t": 0.0000)",
                       R"({"b": 1)",
                       R"({"b": 12)",
                       R"({"b": 12.)",
                       R"({"w": 9)",
                       R"({"w": 99999999999999)",
                       R"({"w": 1)"});
}

// A string's length is its characters (code points), each counted once however it is written:
// one to four bytes of UTF-8, an escape, a surrogate pair's two escapes.
TEST(JsonSchema, StringLengthsCountCharacters) {
  const json schema = json::parse(R"({"type": "object", "properties": {
      "s": {"type": "string", "minLength": 2, "maxLength": 3}}, "required": ["s"]})");
  auto compiled = JsonSchema::Compile(schema);
  ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
  auto takes = [&](const std::string& text) { return Takes(compiled->get(), text); };
  auto whole = [&](const std::string& text) { return Whole(compiled->get(), text); };
  EXPECT_TRUE(whole(R"({"s": "ab"})"));
  EXPECT_TRUE(whole(R"({"s": "abc"})"));
  EXPECT_FALSE(takes(R"({"s": "a")"));  // too short
  EXPECT_FALSE(takes(R"({"s": "")"));
  EXPECT_FALSE(takes(R"({"s": "abcd)"));                                    // too long
  EXPECT_TRUE(whole("{\"s\": \"\xC3\xA9\xF0\x9F\x98\x80\"}"));              // 2 characters, 6 bytes
  EXPECT_TRUE(whole("{\"s\": \"\xE2\x82\xAC\xC3\xA9\xF0\x9F\x98\x80\"}"));  // 3, 9 bytes
  EXPECT_FALSE(takes("{\"s\": \"\xE2\x82\xAC\xC3\xA9\xF0\x9F\x98\x80\xC3"));
  EXPECT_TRUE(whole(R"({"s": "\u00e9\n\\"})"));     // 3 escapes
  EXPECT_FALSE(takes(R"({"s": "\u00e9\n\\\")"));    // a 4th
  EXPECT_TRUE(whole(R"({"s": "\ud83d\ude00a"})"));  // a pair is one character
  EXPECT_TRUE(whole(R"({"s": "\ud83d\ude00\ud83d\ude00\ud83d\ude00"})"));
  EXPECT_FALSE(takes(R"({"s": "\ud83d\ude00ab\u)"));
  EXPECT_FALSE(takes(R"({"s": "\ud83d\ude00")"));  // one character
  // For a mask's tokens of at most `longest` bytes, counts past it are alike.
  const json wide = json::parse(R"({"type": "object", "properties": {
      "s": {"type": "string", "minLength": 10, "maxLength": 30}}})");
  auto compiled_wide = JsonSchema::Compile(wide);
  ASSERT_TRUE(compiled_wide.ok());
  auto key = [&](const std::string& text, uint32_t longest) {
    JsonSchemaPrefix p(compiled_wide->get());
    EXPECT_TRUE(p.Feed(text)) << text;
    return p.key(longest);
  };
  const std::string s = R"({"s": ")";
  EXPECT_NE(key(s + "a", JsonSchema::kUnbounded), key(s + "ab", JsonSchema::kUnbounded));
  EXPECT_EQ(key(s + "a", 5), key(s + "ab", 5));          // (9 and 8 needed, 29 and 28 left)
  EXPECT_NE(key(s + "abcde", 5), key(s + "abcdef", 5));  // (5 needed: a token may close it)
  EXPECT_NE(key(s + std::string(24, 'a'), 5), key(s + std::string(25, 'a'), 5));
  ExpectClosingsValid(schema, compiled->get(),
                      {R"({"s": "\u00)", R"({"s": "\ud83d\u)", "{\"s\": \"\xF0\x9F", R"({"s": ")",
                       R"({"s": "ab)", R"({"s)"});
}

}  // namespace
}  // namespace colony::api
