// A JSON Schema compiled into nodes by the kind of a value's first byte, and a byte-at-a-time
// reader of the objects valid against it: JsonObjectPrefix checks the syntax, a stack of frames
// (one per object or array the schema describes) what the schema allows.
#include "api/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <charconv>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>

namespace colony::api {
namespace {

using json = nlohmann::json;

// An enum value at the schema's deepest level stays within the syntax's nesting bound.
static_assert(JsonSchema::kMaxDepth + 1 + JsonSchema::kMaxValueNesting <
              JsonObjectPrefix::kMaxDepth);

constexpr std::array<std::string_view, JsonSchema::kSlots> kSlotNames = {
    "an object", "an array", "a string", "a number", "a boolean", "null"};

// The kind of value a first byte begins; kSlots for none.
JsonSchema::Slot SlotOf(unsigned char c) {
  switch (c) {
    case '{':
      return JsonSchema::kObject;
    case '[':
      return JsonSchema::kArray;
    case '"':
      return JsonSchema::kString;
    case 't':
    case 'f':
      return JsonSchema::kBoolean;
    case 'n':
      return JsonSchema::kNull;
    default:
      return c == '-' || (c >= '0' && c <= '9') ? JsonSchema::kNumber : JsonSchema::kSlots;
  }
}

// How deep a value's arrays and objects nest (0 for a number, string, literal).
int Nesting(const json& v) {
  int deepest = 0;
  if (v.is_object() || v.is_array()) {
    for (const auto& item : v) deepest = std::max(deepest, Nesting(item));
    return deepest + 1;
  }
  return 0;
}

// An enum's first value of the kind `slot` (by_slot names an enum for the kinds it has values of).
const std::string& FirstOfKind(const JsonSchema::Node& n, size_t slot) {
  for (const std::string& v : n.values) {
    if (SlotOf(static_cast<unsigned char>(v[0])) == slot) return v;
  }
  return n.values.front();  // (unreached)
}

// Whether a double holds exactly the integer i (an integer-valued double within int64's range, or
// uint64's for u).
bool DoubleIs(double d, int64_t i) {
  return std::floor(d) == d && d >= -0x1p63 && d < 0x1p63 && static_cast<int64_t>(d) == i;
}
bool DoubleIs(double d, uint64_t u) {
  return std::floor(d) == d && d >= 0 && d < 0x1p64 && static_cast<uint64_t>(d) == u;
}

// JSON Schema's equality (uniqueItems): numbers by their values, exactly (nlohmann::json's
// == compares an unsigned and a signed integer as int64, and an integer and a double as doubles:
// 18446744073709551615 == -1 and 9007199254740993 == 9007199254740992.0 to it, which are not
// equal; it is not transitive), arrays item by item, objects by their members.
bool SameValue(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_number_float() || b.is_number_float()) {
      const json& f = a.is_number_float() ? a : b;
      const json& o = a.is_number_float() ? b : a;
      const auto d = f.get<double>();
      if (o.is_number_float()) return d == o.get<double>();
      return o.is_number_unsigned() ? DoubleIs(d, o.get<uint64_t>())
                                    : DoubleIs(d, o.get<int64_t>());
    }
    if (a.is_number_unsigned() != b.is_number_unsigned()) {
      const json& u = a.is_number_unsigned() ? a : b;
      const json& i = a.is_number_unsigned() ? b : a;
      return i.get<int64_t>() >= 0 && static_cast<uint64_t>(i.get<int64_t>()) == u.get<uint64_t>();
    }
    return a == b;
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), SameValue);
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [k, v] : a.items()) {
      if (!b.contains(k) || !SameValue(v, b[k])) return false;
    }
    return true;
  }
  return a == b;
}

bool IsSpace(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool IsNumberByte(unsigned char c) {
  return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

// A JSON pointer's token escaped (RFC 6901), for error messages.
std::string PointerToken(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

const std::set<std::string, std::less<>>& Annotations() {
  static const std::set<std::string, std::less<>>
      k =
          {
              "title",       "description", "default",  "examples",  "$schema",
              "$comment",    "deprecated",  "readOnly", "writeOnly", "$defs",
              "definitions", "format"};  // (2020-12's default: an annotation, asserting nothing)
  return k;
}

// A schema of annotations alone: any value.
bool AnyValue(const json& schema) {
  if (!schema.is_object()) return schema == json(true);
  for (const auto& [key, value] : schema.items()) {
    if (!Annotations().contains(key)) return false;
  }
  return true;
}

const std::set<std::string, std::less<>>& Keywords() {
  static const std::set<std::string, std::less<>> k = {"type",
                                                       "enum",
                                                       "const",
                                                       "anyOf",
                                                       "oneOf",
                                                       "allOf",
                                                       "$ref",
                                                       "properties",
                                                       "required",
                                                       "additionalProperties",
                                                       "items",
                                                       "prefixItems",
                                                       "additionalItems",
                                                       "minItems",
                                                       "maxItems",
                                                       "uniqueItems",
                                                       "minLength",
                                                       "maxLength",
                                                       "minimum",
                                                       "maximum",
                                                       "exclusiveMinimum",
                                                       "exclusiveMaximum",
                                                       "discriminator"};
  return k;
}

}  // namespace

struct JsonSchema::Compiler {
  const json& root;
  std::vector<Node> nodes;
  std::vector<const json*> resolving;  // the $refs' targets being compiled
  // The $refs' targets compiled: their node, and how many levels of containers below the depth
  // they were compiled at they reach (nodes are shared: every use of a $ref is the same node).
  struct Compiled {
    int node;
    int height;
  };
  std::map<const json*, Compiled> refs;
  // The $refs' targets being compiled whose node is taken (an object or array schema's, taken
  // before its parts are compiled): a $ref to one of them from its parts is that node (a
  // recursive schema), whose kinds and bounds are set before its parts are compiled.
  std::map<const json*, int> taken;
  std::set<int> recursed;  // those nodes, where a $ref from their parts used them
  struct PendingUnion {    // an anyOf's or oneOf's object branches (node, branch), made a union
    int16_t node;          // once every model is compiled
    std::vector<std::pair<int16_t, size_t>> objects;
    std::optional<std::string> named;
    std::string at;
  };
  std::vector<PendingUnion> unions;
  // The anyOf and oneOf $ref targets being compiled: a $ref back to one is its node, whose kinds
  // are not known yet (as an object's property or array's items it is fine; as a branch, not).
  std::set<int> unfinished;
  // Unions made, by their models and property (one node however many times a schema repeats
  // them), and the values' texts they hold in all (kMaxUnionTextBytes).
  std::map<std::pair<std::vector<int16_t>, std::string>, int16_t> made;
  size_t union_text_bytes = 0;
  int deepest = 0;   // the deepest level of containers a Compile call reached
  int nested = 0;    // Compile calls in progress (properties, items, anyOf, $refs)
  size_t calls = 0;  // Compile calls made

  static Status Error(const std::string& at, std::string_view what) {
    return InvalidArgument(fmt::format(
        "json_schema: {}: {}", at.empty() ? std::string("the schema") : at.substr(0, 256), what));
  }

  static Node Blank() {
    Node n;
    n.by_slot.fill(-1);
    return n;
  }

  Result<int> Add(Node n) {
    if (nodes.size() >= kMaxNodes) {
      return InvalidArgument(fmt::format(
          "json_schema: the schema has more than {} parts (a $ref's target counted once)",
          kMaxNodes));
    }
    nodes.push_back(std::move(n));
    return static_cast<int>(nodes.size() - 1);
  }

  Result<int> Compile(const json& s, const std::string& at, int depth) {
    struct Nested {
      int& n;
      explicit Nested(int& count) : n(++count) {}
      ~Nested() { --n; }
      Nested(const Nested&) = delete;
      Nested& operator=(const Nested&) = delete;
    } nested_here(nested);
    if (nested > kMaxNested) return Error(at, "nests schemas too deep");
    if (++calls > kMaxCompiled) {
      return Error(at, fmt::format("has more than {} schemas", kMaxCompiled));
    }
    if (depth > kMaxDepth) {
      return Error(at, fmt::format("objects and arrays nest deeper than {}", kMaxDepth));
    }
    deepest = std::max(deepest, depth);
    if (s.is_boolean()) {
      if (s.get<bool>()) return 0;
      return Error(at, "false (no value at all) is not supported");
    }
    if (!s.is_object()) return Error(at, "must be a schema (an object or true)");
    int constraints = 0;
    for (const auto& [key, value] : s.items()) {
      if (key == "$id" && at.empty()) continue;  // (elsewhere it would move the $refs' base)
      if (Annotations().contains(key)) continue;
      if (!Keywords().contains(key)) {
        return Error(at + "/" + PointerToken(key),
                     fmt::format("'{}' is not supported by colony api (supported: type, enum, "
                                 "const, anyOf, oneOf, discriminator, allOf of one schema, $ref, "
                                 "properties, required, additionalProperties, items, prefixItems, "
                                 "additionalItems, minItems, maxItems, uniqueItems of enum items, "
                                 "minLength, maxLength, minimum, maximum, exclusiveMinimum, "
                                 "exclusiveMaximum)",
                                 key.substr(0, 64)));
      }
      ++constraints;
    }
    if (s.contains("$ref")) {
      if (constraints > 1) return Error(at, "$ref beside other keywords is not supported");
      return Ref(s["$ref"], at + "/$ref", depth);
    }
    if (s.contains("allOf")) {  // (pydantic's wrapper of a $ref beside a description)
      const json& all = s["allOf"];
      if (constraints > 1) return Error(at, "allOf beside other keywords is not supported");
      if (!all.is_array() || all.size() != 1) {
        return Error(at + "/allOf", "must be a list of one schema (more are not supported)");
      }
      return Compile(all[0], at + "/allOf/0", depth);
    }
    const json* discriminator = s.contains("discriminator") ? &s["discriminator"] : nullptr;
    for (const char* one_of : {"anyOf", "oneOf"}) {
      if (!s.contains(one_of)) continue;
      if (constraints > (discriminator != nullptr ? 2 : 1)) {
        return Error(at, fmt::format("{} beside other keywords (but discriminator) is not "
                                     "supported",
                                     one_of));
      }
      // (a $ref's target: its node taken first, so that its models may refer back to it, as a
      // recursive union's do: an operation whose arguments are operations or numbers)
      int reserved = -1;
      if (!resolving.empty() && resolving.back() == &s) {
        COLONY_ASSIGN_OR_RETURN(reserved, Add(Blank()));
        taken[&s] = reserved;
        unfinished.insert(reserved);
      }
      auto any_of =
          AnyOf(s[one_of], at + "/" + one_of, depth, one_of[0] == 'o', discriminator, reserved);
      if (reserved >= 0) {
        taken.erase(&s);
        unfinished.erase(reserved);
      }
      return any_of;
    }
    if (discriminator != nullptr) {
      return Error(at + "/discriminator", "is supported only beside anyOf or oneOf");
    }
    // The kinds a value may be.
    std::array<bool, kSlots> kinds{};
    bool integer = false;
    if (s.contains("type")) {
      COLONY_RETURN_IF_ERROR(Types(s["type"], at + "/type", kinds, integer));
    } else {
      kinds.fill(true);
    }
    if (s.contains("enum") || s.contains("const")) {
      for (const char* k :
           {"properties", "required", "additionalProperties", "items", "prefixItems",
            "additionalItems", "minItems", "maxItems", "uniqueItems", "minLength", "maxLength",
            "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
        if (s.contains(k))
          return Error(at, fmt::format("enum or const beside {} is not supported", k));
      }
      if (s.contains("enum") && s.contains("const")) {  // (pydantic's one-member enums)
        json both = json::array();
        if (s["enum"].is_array()) {
          for (const json& v : s["enum"]) {
            if (v == s["const"]) both.push_back(v);
          }
        }
        if (both.empty()) return Error(at + "/const", "is not among the enum's values");
        return Enum(both, at + "/enum", kinds, integer);
      }
      return Enum(s.contains("const") ? json::array({s["const"]}) : s["enum"],
                  at + (s.contains("const") ? "/const" : "/enum"), kinds, integer);
    }
    Node n = Blank();
    n.integer = integer;
    // The node's index, taken before its children are compiled (they come after it).
    COLONY_ASSIGN_OR_RETURN(const int index, Add(Blank()));
    const auto self = static_cast<int16_t>(index);
    // (Bounds are checked whatever the type: a malformed one is an error even where it asserts
    // nothing. They are read only on the kinds they bound.)
    if (s.contains("minLength")) {
      COLONY_ASSIGN_OR_RETURN(n.min_length, Bound(s, "minLength", at, kMaxMinLength));
    }
    if (s.contains("maxLength")) {
      COLONY_ASSIGN_OR_RETURN(n.max_length, Bound(s, "maxLength", at, kUnbounded - 1));
    }
    if (n.max_length < n.min_length) return Error(at + "/maxLength", "is below minLength");
    COLONY_RETURN_IF_ERROR(NumberBounds(s, at, kinds[kNumber], n));
    for (Slot k : {kString, kNumber, kBoolean, kNull}) {
      if (kinds[k]) n.by_slot[k] = self;
    }
    // What a $ref from its parts back to it sees (the parts of an object or array come later):
    // its kinds, bounds, and whether any object or array is valid (read from the keywords; had
    // the parts said otherwise of a node used so, an error below).
    const json* more = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    const bool object_said =
        s.contains("properties") ||
        (more != nullptr && (*more == json(false) || (more->is_object() && !AnyValue(*more))));
    const bool array_said = s.contains("items") || s.contains("prefixItems") ||
                            s.contains("additionalItems") || s.contains("minItems") ||
                            s.contains("maxItems") || s.contains("uniqueItems");
    if (kinds[kObject]) n.by_slot[kObject] = object_said ? self : int16_t{0};
    if (kinds[kArray]) n.by_slot[kArray] = array_said ? self : int16_t{0};
    nodes[static_cast<size_t>(self)] = n;
    const bool target = !resolving.empty() && resolving.back() == &s;
    if (target) taken[&s] = index;
    // (An object's and an array's keywords are compiled, so checked, whatever the type: one that
    // is malformed or not supported is an error even where it asserts nothing.)
    Node unused = Blank();
    auto own_object = Object(s, at, depth, kinds[kObject] ? n : unused);
    auto own_array = own_object.ok() ? Array(s, at, depth, kinds[kArray] ? n : unused)
                                     : Result<bool>(own_object.status());
    if (target) taken.erase(&s);
    if (!own_array.ok()) return own_array.status();
    if (recursed.contains(index) && ((kinds[kObject] && *own_object != object_said) ||
                                     (kinds[kArray] && *own_array != array_said))) {
      return Error(at,
                   "a recursive schema whose parts allow any object or array is not "
                   "supported");
    }
    if (kinds[kObject]) n.by_slot[kObject] = *own_object ? self : int16_t{0};
    if (kinds[kArray]) n.by_slot[kArray] = *own_array ? self : int16_t{0};
    nodes[static_cast<size_t>(self)] = std::move(n);
    return index;
  }

  // Sets `kinds` (and `integer`: integers without other numbers) from "type".
  static Status Types(const json& t, const std::string& at, std::array<bool, kSlots>& kinds,
                      bool& integer) {
    const json list = t.is_array() ? t : json::array({t});
    if (list.empty()) return Error(at, "must name at least one type");
    bool number = false, whole = false;
    for (const json& name : list) {
      if (!name.is_string()) return Error(at, "must be a type's name or a list of them");
      const std::string& n = name.get_ref<const std::string&>();
      if (n == "object") {
        kinds[kObject] = true;
      } else if (n == "array") {
        kinds[kArray] = true;
      } else if (n == "string") {
        kinds[kString] = true;
      } else if (n == "number") {
        number = true;
      } else if (n == "integer") {
        whole = true;
      } else if (n == "boolean") {
        kinds[kBoolean] = true;
      } else if (n == "null") {
        kinds[kNull] = true;
      } else {
        return Error(at, fmt::format("'{}' is not a JSON Schema type", n.substr(0, 64)));
      }
    }
    kinds[kNumber] = number || whole;
    integer = whole && !number;
    return Status::Ok();
  }

  // An object's part of node `n`: its properties into n; false when any object is valid.
  Result<bool> Object(const json& s, const std::string& at, int depth, Node& n) {
    const bool closed = s.contains("additionalProperties") && s["additionalProperties"] == false;
    if (s.contains("additionalProperties") && !s["additionalProperties"].is_boolean() &&
        !s["additionalProperties"].is_object()) {
      return Error(at + "/additionalProperties", "must be a boolean or a schema");
    }
    if (!s.contains("properties")) {
      if (s.contains("required") && !s["required"].empty()) {
        return Error(at + "/required", "names properties the schema does not describe");
      }
      if (s.contains("additionalProperties") && s["additionalProperties"].is_object()) {
        // A map: any keys, each value valid against the schema (one of annotations alone, or
        // true through a $ref: any object).
        COLONY_ASSIGN_OR_RETURN(const int values, Compile(s["additionalProperties"],
                                                          at + "/additionalProperties", depth + 1));
        if (values == 0 || AnyValue(s["additionalProperties"])) return false;
        n.additional = static_cast<int16_t>(values);
        return true;
      }
      return closed;
    }
    if (s.contains("additionalProperties") && s["additionalProperties"].is_object()) {
      // (Beside properties it changes nothing, but is checked as any schema is.)
      COLONY_ASSIGN_OR_RETURN(const int checked, Compile(s["additionalProperties"],
                                                         at + "/additionalProperties", depth + 1));
      static_cast<void>(checked);
    }
    const json& props = s["properties"];
    if (!props.is_object()) return Error(at + "/properties", "must be an object");
    if (props.size() > kMaxProperties) {
      return Error(at + "/properties", fmt::format("has more than {} properties", kMaxProperties));
    }
    std::vector<std::pair<std::string, int16_t>> named;
    for (const auto& [name, schema] : props.items()) {
      std::string text;
      COLONY_ASSIGN_OR_RETURN(text, Text(json(name), at + "/properties"));
      text = text.substr(1, text.size() - 2);  // (between its quotes)
      COLONY_ASSIGN_OR_RETURN(const int child,
                              Compile(schema, at + "/properties/" + PointerToken(name), depth + 1));
      named.emplace_back(std::move(text), static_cast<int16_t>(child));
    }
    std::ranges::sort(named);
    for (auto& [text, child] : named) {
      n.names.push_back(std::move(text));
      n.properties.push_back(child);
    }
    if (s.contains("required")) {
      const json& required = s["required"];
      if (!required.is_array()) return Error(at + "/required", "must be a list of names");
      for (const json& r : required) {
        if (!r.is_string()) return Error(at + "/required", "must be a list of names");
        std::string text;
        COLONY_ASSIGN_OR_RETURN(text, Text(r, at + "/required"));
        const auto it = std::ranges::find(n.names, text.substr(1, text.size() - 2));
        if (it == n.names.end()) {
          return Error(at + "/required",
                       fmt::format("names '{}', which is not among the properties",
                                   r.get_ref<const std::string&>().substr(0, 64)));
        }
        n.required |= uint64_t{1} << static_cast<unsigned>(it - n.names.begin());
      }
    }
    return true;
  }

  // An array's part of node `n`; false when any array is valid. A tuple's places are
  // prefixItems (2020-12) or a list of items with additionalItems (the drafts before it).
  Result<bool> Array(const json& s, const std::string& at, int depth, Node& n) {
    if (!s.contains("items") && !s.contains("prefixItems") && !s.contains("additionalItems") &&
        !s.contains("minItems") && !s.contains("maxItems") && !s.contains("uniqueItems")) {
      return false;
    }
    const bool listed = s.contains("items") && s["items"].is_array();
    if (listed && s.contains("prefixItems")) {
      return Error(at + "/items", "a list of items beside prefixItems is not supported");
    }
    if (s.contains("additionalItems") && !listed) {
      return Error(at + "/additionalItems",
                   "is supported only beside a list of items (a tuple as drafts before 2020-12 "
                   "wrote it; 2020-12 writes prefixItems, then items for the rest)");
    }
    bool more = true;  // whether items may follow the tuple's places
    if (listed || s.contains("prefixItems")) {
      const std::string places = listed ? "/items" : "/prefixItems";
      const json& list = listed ? s["items"] : s["prefixItems"];
      if (!list.is_array() || list.size() > kMaxPrefixItems) {
        return Error(at + places,
                     fmt::format("must be a list of at most {} schemas", kMaxPrefixItems));
      }
      for (size_t i = 0; i < list.size(); ++i) {
        COLONY_ASSIGN_OR_RETURN(const int place,
                                Compile(list[i], fmt::format("{}{}/{}", at, places, i), depth + 1));
        n.prefix.push_back(static_cast<int16_t>(place));
      }
    }
    const char* rest = listed ? "additionalItems" : "items";
    if (s.contains(rest)) {
      if (s[rest] == json(false)) {  // (no value at all: no items past the places)
        more = false;
      } else {
        COLONY_ASSIGN_OR_RETURN(const int items, Compile(s[rest], at + "/" + rest, depth + 1));
        n.items = static_cast<int16_t>(items);
      }
    }
    if (s.contains("minItems")) {
      COLONY_ASSIGN_OR_RETURN(n.min_items, Bound(s, "minItems", at, kMaxMinItems));
    }
    if (s.contains("maxItems")) {
      COLONY_ASSIGN_OR_RETURN(n.max_items, Bound(s, "maxItems", at, kUnbounded - 1));
    }
    if (n.max_items < n.min_items) return Error(at + "/maxItems", "is below minItems");
    if (!more) {
      if (n.min_items > n.prefix.size()) {
        return Error(at + "/minItems",
                     fmt::format("is more than the {} items the array may have ({} is false)",
                                 n.prefix.size(), rest));
      }
      n.max_items = std::min(n.max_items, static_cast<uint32_t>(n.prefix.size()));
    }
    if (s.contains("uniqueItems")) COLONY_RETURN_IF_ERROR(Unique(s["uniqueItems"], at, n));
    return true;
  }

  // uniqueItems into array node n (its items compiled): distinct items, each of its enum's values
  // at most once. A reader's state is fixed-size: it can remember which of at most 64 values were
  // written (a bit each), not which strings or numbers were.
  Status Unique(const json& unique, const std::string& at, Node& n) {
    if (!unique.is_boolean()) return Error(at + "/uniqueItems", "must be true or false");
    if (!unique.get<bool>() || n.max_items <= 1) return Status::Ok();  // (one item is unique)
    if (!n.prefix.empty()) {
      return Error(at + "/uniqueItems", "beside a tuple's places is not supported");
    }
    Node& e = nodes[static_cast<size_t>(n.items)];
    if (e.any || e.values.empty() || e.values.size() > kMaxUniqueValues) {
      return Error(at + "/uniqueItems",
                   fmt::format("is supported only for items that are an enum (or const) of at "
                               "most {} values, such as pydantic's set[SomeEnum] (the items "
                               "written must be remembered: a set of any strings or numbers "
                               "cannot be)",
                               kMaxUniqueValues));
    }
    // The values equal to each (1 and 1.0, whose texts differ, are one item twice): once per
    // enum, however many sets share it through a $ref.
    if (e.alike.empty()) {
      std::vector<json> parsed;
      for (const std::string& t : e.values) parsed.push_back(json::parse(t));
      e.alike.assign(e.values.size(), 0);
      for (size_t i = 0; i < parsed.size(); ++i) {
        for (size_t j = 0; j < parsed.size(); ++j) {
          if (j == i || SameValue(parsed[i], parsed[j])) e.alike[i] |= uint64_t{1} << j;
        }
      }
    }
    size_t distinct = 0;  // (an equivalence: a value is the first of its kind, or alike to it)
    for (size_t i = 0; i < e.alike.size(); ++i) {
      distinct += std::countr_zero(e.alike[i]) == static_cast<int>(i) ? 1 : 0;
    }
    if (n.min_items > distinct) {
      return Error(at + "/minItems",
                   fmt::format("is more than the {} distinct items uniqueItems allows", distinct));
    }
    n.max_items = std::min(n.max_items, static_cast<uint32_t>(distinct));
    n.unique = true;
    return Status::Ok();
  }

  // minimum, maximum, exclusiveMinimum, exclusiveMaximum into n's inclusive integer bounds, or
  // its sides if it may have a fraction (`numbers`: whether the node's values may be numbers; if
  // not, they are only checked).
  static Status NumberBounds(const json& s, const std::string& at, bool numbers, Node& n) {
    std::optional<double> low, high;  // a number's, exclusive ones made inclusive
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!s.contains(key)) continue;
      const std::string where = at + "/" + key;
      const json& v = s[key];
      if (!v.is_number() || !(std::abs(v.get<double>()) <= static_cast<double>(kMaxBound))) {
        return Error(where, fmt::format("must be a number from -{} to {} (a bound on strings, "
                                        "such as a date's, is not supported)",
                                        kMaxBound, kMaxBound));
      }
      if (!numbers) continue;
      const double d = v.get<double>();  // (an integer's: exact, at most 10^15)
      const std::string_view k = key;
      if (!n.integer) {
        // (The next double inside an exclusive bound: none lies between them.)
        const double inf = std::numeric_limits<double>::infinity();
        if (k == "minimum" || k == "exclusiveMinimum") {
          const double b = k == "minimum" ? d : std::nextafter(d, inf);
          low = std::max(low.value_or(b), b);
        } else {
          const double b = k == "maximum" ? d : std::nextafter(d, -inf);
          high = std::min(high.value_or(b), b);
        }
        continue;
      }
      if (k == "minimum") {
        n.minimum = std::max(n.minimum, static_cast<int64_t>(std::ceil(d)));
      } else if (k == "exclusiveMinimum") {
        n.minimum = std::max(n.minimum, static_cast<int64_t>(std::floor(d)) + 1);
      } else if (k == "maximum") {
        n.maximum = std::min(n.maximum, static_cast<int64_t>(std::floor(d)));
      } else {
        n.maximum = std::min(n.maximum, static_cast<int64_t>(std::ceil(d)) - 1);
      }
    }
    if (n.minimum > n.maximum) return Error(at, "no integer is within its minimum and maximum");
    if (!low && !high) return Status::Ok();
    if (low && high && *low > *high) {
      return Error(at, "no number is within its minimum and maximum");
    }
    // (0 and -0 are within both sides' where 0 is within the bounds.)
    n.decimal = true;
    Side& positive = n.sides[0];
    positive.allowed = !high || *high >= 0;
    if (low && *low > 0) positive.low = Decimal(*low);
    positive.capped = high.has_value();
    if (high && *high >= 0) positive.high = Decimal(*high);
    Side& negative = n.sides[1];
    negative.allowed = !low || *low <= 0;
    if (high && *high < 0) negative.low = Decimal(-*high);
    negative.capped = low.has_value();
    if (low && *low <= 0) negative.high = Decimal(-*low);
    return Status::Ok();
  }

  // The shortest decimal text of |d| (at most about 10^15) that reads back as |d|.
  static Magnitude Decimal(double d) {
    std::array<char, 400> text{};  // (at most 16 digits before the point, 340 after it)
    const auto end =
        std::to_chars(text.data(), text.data() + text.size(), std::abs(d), std::chars_format::fixed)
            .ptr;
    const std::string_view digits(text.data(), static_cast<size_t>(end - text.data()));
    const size_t point = std::min(digits.find('.'), digits.size());
    Magnitude m;
    std::from_chars(digits.data(), digits.data() + point, m.whole);
    if (point < digits.size()) m.fraction = digits.substr(point + 1);
    while (!m.fraction.empty() && m.fraction.back() == '0') m.fraction.pop_back();
    return m;
  }

  // A count's bound (minItems, maxLength, ...): an integer from 0 to `most`.
  static Result<uint32_t> Bound(const json& s, const char* key, const std::string& at,
                                uint32_t most) {
    const json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > most) {
      return Error(at + "/" + key, fmt::format("must be an integer from 0 to {}", most));
    }
    return static_cast<uint32_t>(v.get<int64_t>());
  }

  // A value's JSON text, as an answer must write it.
  static Result<std::string> Text(const json& v, const std::string& at) {
    std::string text;
    try {
      text = v.dump();
    } catch (const json::exception&) {
      return Error(at, "holds a string that is not UTF-8");
    }
    if (text.size() > kMaxTextBytes) {
      return Error(at, fmt::format("holds a value longer than {} bytes as JSON", kMaxTextBytes));
    }
    // (Written inside the schema's own nesting, within JsonObjectPrefix::kMaxDepth.)
    if (Nesting(v) > kMaxValueNesting) {
      return Error(at, fmt::format("holds a value nested deeper than {}", kMaxValueNesting));
    }
    // (A number with more digits than an answer may write cannot be one.)
    JsonObjectPrefix p;
    if (!p.Feed("{\"\":") || !p.Feed(text) || !p.Feed('}') || !p.complete()) {
      return Error(at, fmt::format("holds {}, which an answer cannot write", text.substr(0, 64)));
    }
    return text;
  }

  Result<int> Enum(const json& values, const std::string& at, const std::array<bool, kSlots>& kinds,
                   bool integer) {
    if (!values.is_array() || values.empty() || values.size() > kMaxEnumValues) {
      return Error(at, fmt::format("must be a list of 1 to {} values", kMaxEnumValues));
    }
    Node n = Blank();
    const auto self = static_cast<int16_t>(nodes.size());
    for (const json& v : values) {
      std::string text;
      COLONY_ASSIGN_OR_RETURN(text, Text(v, at));
      const Slot slot = SlotOf(static_cast<unsigned char>(text[0]));
      // Values not of the type cannot be valid: left out.
      const bool whole = v.is_number_integer() ||
                         (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
      if (!kinds[slot] || (slot == kNumber && integer && !whole)) continue;
      n.values.push_back(std::move(text));
      n.by_slot[slot] = self;
    }
    std::ranges::sort(n.values);
    n.values.erase(std::unique(n.values.begin(), n.values.end()), n.values.end());
    if (n.values.empty()) return Error(at, "has no value of the schema's type");
    return Add(std::move(n));
  }

  // Whether node i reads a number as any number (or integer), not as an enum's or any value.
  bool Plain(int i) const {
    const Node& t = nodes[static_cast<size_t>(i)];
    return !t.any && t.values.empty();
  }

  // The union of an anyOf's plain number branches (node, branch), whatever their order: unbounded
  // numbers take every number, an unbounded integer every bounded one; bounded integers make one
  // range (a node of its own: the branches' may be shared) if, in order, each overlaps or touches
  // the ones before it; a gap is refused, and so is a bounded number beside integer or bounded
  // number branches.
  Result<int16_t> NumberUnion(std::vector<std::pair<int16_t, size_t>> numbers,
                              const std::string& at) {
    auto node = [this](int16_t i) -> const Node& { return nodes[static_cast<size_t>(i)]; };
    for (const auto& [i, b] : numbers) {
      if (!node(i).integer && !node(i).decimal) return i;
    }
    for (const auto& [i, b] : numbers) {
      if (node(i).decimal) {
        return Error(at, fmt::format("branch {} is a number with bounds beside other number "
                                     "branches, which is not supported (one number branch with "
                                     "bounds, or integer branches, are)",
                                     b));
      }
    }
    for (const auto& [i, b] : numbers) {
      if (!node(i).bounded()) return i;
    }
    std::ranges::sort(numbers, [&](const auto& x, const auto& y) {
      return node(x.first).minimum < node(y.first).minimum;
    });
    Node hull = Blank();
    hull.integer = true;
    hull.minimum = node(numbers[0].first).minimum;
    hull.maximum = node(numbers[0].first).maximum;
    size_t last = numbers[0].second;  // the branch whose range reaches hull.maximum
    for (const auto& [i, b] : numbers) {
      const Node& r = node(i);
      if (hull.maximum != kNoMaximum && r.minimum != kNoMinimum && hull.maximum < r.minimum - 1) {
        return Error(at, fmt::format("branches {} and {} leave the integers from {} to {} out: "
                                     "integer branches must make one range",
                                     last, b, hull.maximum + 1, r.minimum - 1));
      }
      if (r.maximum > hull.maximum) {
        hull.maximum = r.maximum;
        last = b;
      }
    }
    hull.by_slot[kNumber] = static_cast<int16_t>(nodes.size());
    COLONY_ASSIGN_OR_RETURN(const int index, Add(std::move(hull)));
    return static_cast<int16_t>(index);
  }

  // anyOf, or oneOf (`one`: a value valid against two branches is not valid); `discriminator`
  // (OpenAPI's, as pydantic writes it beside a union of models), if any, names the property
  // that tells object branches apart.
  Result<int> AnyOf(const json& branches, const std::string& at, int depth, bool one,
                    const json* discriminator, int reserved) {
    if (!branches.is_array() || branches.empty() || branches.size() > kMaxBranches) {
      return Error(at, fmt::format("must be a list of 1 to {} schemas", kMaxBranches));
    }
    std::optional<std::string> named;  // the discriminator's property name as JSON writes it
    if (discriminator != nullptr) {
      const std::string where = at.substr(0, at.rfind('/')) + "/discriminator";
      if (!discriminator->is_object() || !discriminator->contains("propertyName") ||
          !(*discriminator)["propertyName"].is_string()) {
        return Error(where, "must be an object with a propertyName");
      }
      for (const auto& [key, value] : discriminator->items()) {
        if (key != "propertyName" && key != "mapping") {
          return Error(where, fmt::format("'{}' is not supported (propertyName and mapping are)",
                                          key.substr(0, 64)));
        }
      }
      std::string text;
      COLONY_ASSIGN_OR_RETURN(text, Text((*discriminator)["propertyName"], where));
      named = text.substr(1, text.size() - 2);
    }
    Node n = Blank();
    std::array<size_t, kSlots> from{};
    std::vector<std::pair<int16_t, size_t>> numbers;  // plain number branches (node, branch)
    std::vector<std::pair<int16_t, size_t>> objects;  // object branches (node, branch)
    for (size_t b = 0; b < branches.size(); ++b) {
      COLONY_ASSIGN_OR_RETURN(const int branch,
                              Compile(branches[b], fmt::format("{}/{}", at, b), depth));
      if (unfinished.contains(branch)) {
        return Error(fmt::format("{}/{}", at, b),
                     "refers back to an anyOf or oneOf that is being compiled, as a branch of "
                     "another: not supported (as an object's property or an array's items it "
                     "is)");
      }
      for (size_t k = 0; k < kSlots; ++k) {
        const int16_t to = nodes[static_cast<size_t>(branch)].by_slot[k];
        if (to < 0) continue;
        if (!one && k == kNumber && Plain(to) && (n.by_slot[k] < 0 || !numbers.empty())) {
          // Integers or numbers (pydantic's Union[int, float]): their union, once all are read,
          // where it is one branch or one range. Not in a oneOf: 3 would be valid against both
          // branches, and so not against the oneOf.
          if (numbers.empty()) {
            n.by_slot[k] = to;
            from[k] = b;
          }
          numbers.emplace_back(to, b);
          continue;
        }
        if (k == kObject) {  // (several: a discriminated union, below)
          if (objects.empty()) {
            n.by_slot[k] = to;
            from[k] = b;
          }
          objects.emplace_back(to, b);
          continue;
        }
        if (n.by_slot[k] >= 0) {
          return Error(at, fmt::format("branches {} and {} can both be {}: the branches must "
                                       "differ in the kind of value (an object or null, a "
                                       "string or a number)",
                                       from[k], b, kSlotNames[k]));
        }
        n.by_slot[k] = to;
        from[k] = b;
      }
    }
    if (numbers.size() > 1) {
      COLONY_ASSIGN_OR_RETURN(n.by_slot[kNumber], NumberUnion(std::move(numbers), at));
    }
    if (objects.size() > 1) {
      // (its parts once every model is compiled, Unions(): a model may be one being compiled,
      // whose properties are not known yet, as a recursive union's are)
      COLONY_ASSIGN_OR_RETURN(const int u, Add(Blank()));
      nodes[static_cast<size_t>(u)].by_slot[kObject] = static_cast<int16_t>(u);
      unions.push_back({.node = static_cast<int16_t>(u),
                        .objects = std::move(objects),
                        .named = std::move(named),
                        .at = at});
      n.by_slot[kObject] = static_cast<int16_t>(u);
    }
    if (reserved >= 0) {
      nodes[static_cast<size_t>(reserved)] = std::move(n);
      return reserved;
    }
    return Add(std::move(n));
  }

  // A discriminated union of an anyOf's object branches (node, branch): each branch an object
  // with properties that has one property (`named`, or the first of the first branch's names,
  // in the order of their JSON texts, that will do) whose values are strings, from an enum or
  // const, that no other branch has; required or not, the answer writes it first, so that the
  // object is valid against its value's branch alone. Its node (`self`, taken by the anyOf)
  // reads that property first (its only name; its value an enum of every branch's values),
  // then, as the object of the value's branch, the rest.
  Status Unions() {
    for (const PendingUnion& u : unions) {
      COLONY_RETURN_IF_ERROR(Union(u.node, u.objects, u.named, u.at));
    }
    return Status::Ok();
  }
  Status Union(int16_t self, const std::vector<std::pair<int16_t, size_t>>& objects,
               const std::optional<std::string>& named, const std::string& at) {
    auto node = [this](int16_t i) -> const Node& { return nodes[static_cast<size_t>(i)]; };
    for (size_t j = 0; j < objects.size(); ++j) {
      const Node& t = node(objects[j].first);
      if (t.any || !t.values.empty() || t.names.empty() || !t.branches.empty()) {
        return Error(at, fmt::format("branches {} and {} can both be an object: objects in one "
                                     "anyOf or oneOf must be models (not any object, a map, an "
                                     "enum's or another union's) that each have a property "
                                     "whose string values (an enum or const) no other has (a "
                                     "discriminated union)",
                                     std::min(objects[j == 0 ? 1 : 0].second, objects[j].second),
                                     std::max(objects[j == 0 ? 1 : 0].second, objects[j].second)));
      }
    }
    std::vector<int16_t> models;
    for (const auto& [i, b] : objects) models.push_back(i);
    std::ranges::sort(models);
    // The values (as JSON texts) that `name` takes in branch node i, if it will do there.
    auto values = [&](int16_t i,
                      const std::string& name) -> std::optional<std::vector<std::string>> {
      const Node& t = node(i);
      const auto it = std::ranges::lower_bound(t.names, name);
      if (it == t.names.end() || *it != name) return std::nullopt;
      const auto p = static_cast<size_t>(it - t.names.begin());
      const int16_t v = t.properties[p];
      const Node& e = node(v);
      if (e.any || e.values.empty()) return std::nullopt;
      for (size_t k = 0; k < kSlots; ++k) {
        if (e.by_slot[k] >= 0 && (k != kString || e.by_slot[k] != v)) return std::nullopt;
      }
      return e.values;
    };
    std::vector<std::string> names;
    if (named) {
      names.push_back(*named);
    } else {
      names = node(objects[0].first).names;
    }
    for (const std::string& name : names) {
      std::vector<std::pair<std::string, int16_t>> by_value;  // (value, branch node)
      bool will_do = true;
      for (const auto& [i, b] : objects) {
        const auto v = values(i, name);
        if (!v) {
          will_do = false;
          break;
        }
        for (const std::string& text : *v) by_value.emplace_back(text, i);
      }
      std::ranges::sort(by_value);
      for (size_t j = 1; will_do && j < by_value.size(); ++j) {
        will_do = by_value[j].first != by_value[j - 1].first;
      }
      if (!will_do || by_value.size() > kMaxEnumValues) continue;
      if (const auto it = made.find({models, name}); it != made.end()) {
        // (the same models and property made a union before: that node, for every use of this)
        for (Node& n : nodes) {
          if (n.by_slot[kObject] == self) n.by_slot[kObject] = it->second;
        }
        return Status::Ok();
      }
      for (const auto& [text, i] : by_value) union_text_bytes += text.size();
      if (union_text_bytes > kMaxUnionTextBytes) {
        return Error(at, fmt::format("the schema's discriminated unions have more than {} bytes "
                                     "of values in all",
                                     kMaxUnionTextBytes));
      }
      made[{models, name}] = self;
      Node e = Blank();
      const auto e_index = static_cast<int16_t>(nodes.size());
      e.by_slot[kString] = e_index;
      Node u = Blank();
      u.names = {name};
      u.required = 1;
      for (auto& [text, i] : by_value) {
        e.values.push_back(std::move(text));
        const Node& t = node(i);
        const auto p = std::ranges::lower_bound(t.names, name) - t.names.begin();
        u.branches.emplace_back(i, static_cast<uint8_t>(p));
      }
      COLONY_ASSIGN_OR_RETURN(const int added, Add(std::move(e)));
      u.properties = {static_cast<int16_t>(added)};
      u.by_slot[kObject] = self;
      nodes[static_cast<size_t>(self)] = std::move(u);
      return Status::Ok();
    }
    if (named) {
      return Error(at.substr(0, at.rfind('/')) + "/discriminator",
                   fmt::format("names '{}', which is not a property every object branch "
                               "has, with string values (an enum or const) that no other "
                               "branch has",
                               named->substr(0, 64)));
    }
    return Error(at, fmt::format("branches {} and {} can both be an object, and no property "
                                 "tells the object branches apart: each must have one, with "
                                 "string values (an enum or const) that no other has (a "
                                 "discriminated union; at most 1,024 values)",
                                 objects[0].second, objects[1].second));
  }

  Result<int> Ref(const json& ref, const std::string& at, int depth) {
    if (!ref.is_string()) return Error(at, "must be a string");
    const std::string& r = ref.get_ref<const std::string&>();
    if (!r.starts_with("#/$defs/") && !r.starts_with("#/definitions/")) {
      return Error(at, "only #/$defs/... and #/definitions/... are supported");
    }
    const json* target = nullptr;
    try {
      target = &root.at(json::json_pointer(r.substr(1)));
    } catch (const json::exception&) {
      return Error(at, fmt::format("{} names no schema", r.substr(0, 128)));
    }
    if (std::ranges::find(resolving, target) != resolving.end()) {
      // A recursive schema: the node being compiled (its values nest as deep as an answer
      // writes them, up to kMaxFrames: JsonSchemaPrefix refuses a value that could not end
      // within them).
      const auto it = taken.find(target);
      if (it == taken.end()) {
        return Error(at, fmt::format("{} refers to itself through a $ref or allOf of its own: "
                                     "recursive schemas are supported where the recursion goes "
                                     "through an object's or an array's schema",
                                     r.substr(0, 128)));
      }
      recursed.insert(it->second);
      return it->second;
    }
    if (const auto it = refs.find(target); it != refs.end()) {  // (compiled at another use)
      if (depth + it->second.height > kMaxDepth) {
        return Error(at, fmt::format("objects and arrays nest deeper than {}", kMaxDepth));
      }
      deepest = std::max(deepest, depth + it->second.height);
      return it->second.node;
    }
    resolving.push_back(target);
    const int outer = std::exchange(deepest, depth);
    auto compiled = Compile(*target, r.substr(1, 256), depth);
    resolving.pop_back();
    if (compiled.ok()) refs[target] = {.node = *compiled, .height = deepest - depth};
    deepest = std::max(outer, deepest);
    return compiled;
  }

  // Node::frames, least and tallest of every node. Level by level: a value of a kind fits in d
  // frames when it takes none (any value, an enum's, a string, number or literal), or when it
  // takes one and what it must hold (required properties, minItems' items) fits in d - 1 (a
  // recursive schema's nodes are their own parts: no order of the nodes would do).
  void Frames() {
    for (Node& n : nodes) n.frames.fill(kTooTall);
    auto least = [this](int i) {
      const Node& n = nodes[static_cast<size_t>(i)];
      uint8_t m = kTooTall;
      for (size_t k = 0; k < kSlots; ++k) {
        if (n.by_slot[k] >= 0) m = std::min(m, n.frames[k]);
      }
      return m;
    };
    for (int d = 0; d <= kMaxFrames; ++d) {
      for (Node& n : nodes) {
        for (size_t k = 0; k < kSlots; ++k) {
          if (n.by_slot[k] < 0 || n.frames[k] != kTooTall) continue;
          const Node& t = nodes[static_cast<size_t>(n.by_slot[k])];
          bool fits = true;
          if (k == kObject && !t.branches.empty()) {
            // (a union: its frame becomes the value's branch's; fits where some branch does,
            // the reader taking only values whose branch fits)
            fits = std::ranges::any_of(t.branches, [&](const auto& b) {
              return nodes[static_cast<size_t>(b.first)].frames[kObject] <= d;
            });
          } else if ((k == kObject || k == kArray) && !t.any && t.values.empty()) {
            fits = d > 0;
            for (size_t p = 0; fits && k == kObject && p < t.names.size(); ++p) {
              if (((t.required >> p) & 1U) != 0) fits = least(t.properties[p]) < d;
            }
            // (a unique array's items are an enum's values; past the places, all items alike)
            const uint32_t items =
                std::min<uint32_t>(t.min_items, static_cast<uint32_t>(t.prefix.size()) + 1);
            for (uint32_t j = 0; fits && k == kArray && !t.unique && j < items; ++j) {
              fits = least(t.item(j)) < d;
            }
          }
          if (fits) n.frames[k] = static_cast<uint8_t>(d);
        }
      }
    }
    for (size_t i = 0; i < nodes.size(); ++i) {
      Node& n = nodes[i];
      n.least = least(static_cast<int>(i));
      n.tallest = 0;
      for (int16_t p : n.properties) n.tallest = std::max(n.tallest, least(p));
      if (n.additional >= 0) n.tallest = std::max(n.tallest, least(n.additional));
    }
  }

  // Which numbers of frames an answer may give each node's values: the answer's 17, and within
  // a value that fits, its parts one fewer (a union's branch as many: it goes on in its frame).
  std::vector<std::array<bool, kMaxFrames + 1>> Given(int answer) const {
    std::vector<std::array<bool, kMaxFrames + 1>> given(nodes.size());
    std::vector<std::pair<int, int>> todo = {{answer, kMaxFrames}};
    auto give = [&](int i, int frames) {
      if (frames >= 0 && !given[static_cast<size_t>(i)][static_cast<size_t>(frames)]) {
        todo.emplace_back(i, frames);
      }
    };
    while (!todo.empty()) {
      const auto [i, frames] = todo.back();
      todo.pop_back();
      if (given[static_cast<size_t>(i)][static_cast<size_t>(frames)]) continue;
      given[static_cast<size_t>(i)][static_cast<size_t>(frames)] = true;
      const Node& n = nodes[static_cast<size_t>(i)];
      for (size_t k = 0; k < kSlots; ++k) {
        if (n.by_slot[k] < 0 || n.frames[k] > frames || (k != kObject && k != kArray)) continue;
        const Node& t = nodes[static_cast<size_t>(n.by_slot[k])];
        if (t.any || !t.values.empty()) continue;
        if (k == kObject) {
          for (const auto& [branch, p] : t.branches) give(branch, frames);
          for (int16_t p : t.properties) give(p, frames - 1);
          if (t.additional >= 0) give(t.additional, frames - 1);
        } else {
          for (int16_t p : t.prefix) give(p, frames - 1);
          give(t.items, frames - 1);
        }
      }
    }
    return given;
  }

  // A union's value v's shortest object within `frames` (the union's own frame included): its
  // property and v, then v's branch's other required properties.
  size_t UnionBytes(const Node& t, size_t v, int frames, std::vector<size_t>& memo) const {
    const auto [branch, first] = t.branches[v];
    const Node& o = nodes[static_cast<size_t>(branch)];
    size_t b =
        2 + t.names[0].size() + 3 + nodes[static_cast<size_t>(t.properties[0])].values[v].size();
    for (size_t p = 0; p < o.names.size() && b <= kMaxSmallestAnswer; ++p) {
      if (((o.required >> p) & 1U) != 0 && p != first) {
        b += o.names[p].size() + 4 + SmallestBytes(o.properties[p], frames - 1, memo);
      }
    }
    return b;
  }
  // The union's value whose branch fits in `frames` with the shortest object (ties: the first;
  // 0 if none fits: not asked).
  size_t UnionValue(const Node& t, int frames, std::vector<size_t>& memo) const {
    size_t best = 0, bytes = 0;
    bool found = false;
    for (size_t v = 0; v < t.branches.size(); ++v) {
      if (nodes[static_cast<size_t>(t.branches[v].first)].frames[kObject] > frames) continue;
      const size_t b = UnionBytes(t, v, frames, memo);
      if (!found || b < bytes) {
        best = v;
        bytes = b;
        found = true;
      }
    }
    return best;
  }

  // The kind of node i whose shortest value within `frames` is the shortest (ties: the first in
  // Slot's order; kSlots: none fits), and the bytes of that value (what Smallest writes) and of
  // the shortest value of kind k after node i, saturating at kMaxSmallestAnswer + 1; memo: a
  // byte count + 1 per node, kind and frames (0: not yet).
  size_t ShortestKind(int i, int frames, std::vector<size_t>& memo) const {
    const Node& n = nodes[static_cast<size_t>(i)];
    size_t best = kSlots, bytes = 0;
    for (size_t k = 0; k < kSlots; ++k) {
      if (n.by_slot[k] < 0 || n.frames[k] > frames) continue;
      const size_t b = KindBytes(i, k, frames, memo);
      if (best == kSlots || b < bytes) {
        best = k;
        bytes = b;
      }
    }
    return best;
  }
  size_t SmallestBytes(int i, int frames, std::vector<size_t>& memo) const {
    const size_t k = ShortestKind(i, frames, memo);
    return k == kSlots ? 4 : KindBytes(i, k, frames, memo);
  }
  size_t KindBytes(int i, size_t k, int frames, std::vector<size_t>& memo) const {
    size_t& m = memo[(static_cast<size_t>(i) * kSlots + k) * (kMaxFrames + 1) +
                     static_cast<size_t>(frames)];
    if (m != 0) return m - 1;
    const Node& t = nodes[static_cast<size_t>(nodes[static_cast<size_t>(i)].by_slot[k])];
    size_t b = 4;  // (at most: {}, [], "", 0, true, null)
    if (!t.any && !t.values.empty()) {
      b = FirstOfKind(t, k).size();
    } else if (!t.any && k == kObject && !t.branches.empty()) {
      b = UnionBytes(t, UnionValue(t, frames, memo), frames, memo);
    } else if (!t.any && k == kObject) {
      b = 2;
      for (size_t p = 0; p < t.names.size(); ++p) {
        if (((t.required >> p) & 1U) != 0) {
          b += t.names[p].size() + 4 + SmallestBytes(t.properties[p], frames - 1, memo);
        }
      }
    } else if (!t.any && k == kArray && t.unique) {
      // (closings write distinct values, which ones depending on those written: at most the
      // longest ones)
      std::vector<size_t> sizes;
      for (const std::string& v : nodes[static_cast<size_t>(t.items)].values) {
        sizes.push_back(v.size());
      }
      std::ranges::sort(sizes, std::greater<>());
      b = 2;
      for (uint32_t j = 0; j < t.min_items; ++j) b += 1 + sizes[j];
    } else if (!t.any && k == kArray) {
      b = 2;
      for (uint32_t j = 0; j < t.min_items && b <= kMaxSmallestAnswer; ++j) {
        b += 1 + SmallestBytes(t.item(j), frames - 1, memo);
      }
    } else if (!t.any && k == kString) {
      b = 2 + size_t{t.min_length};
    } else if (!t.any && k == kNumber) {
      b = SmallestNumber(t).size();
    }
    b = std::min(b, kMaxSmallestAnswer + 1);
    m = b + 1;
    return b;
  }
};

Result<std::shared_ptr<const JsonSchema>> JsonSchema::Compile(const nlohmann::json& schema) {
  Compiler c{.root = schema,
             .nodes = {},
             .resolving = {},
             .refs = {},
             .taken = {},
             .recursed = {},
             .unions = {},
             .unfinished = {},
             .made = {},
             .union_text_bytes = 0};
  Node any = Compiler::Blank();
  any.by_slot.fill(0);
  any.any = true;
  c.nodes.push_back(any);
  COLONY_ASSIGN_OR_RETURN(const int root, c.Compile(schema, "", 0));
  COLONY_RETURN_IF_ERROR(c.Unions());
  if (c.nodes[static_cast<size_t>(root)].by_slot[kObject] < 0) {
    return Compiler::Error("", "the answer is a JSON object, which the schema does not allow");
  }
  Node only_object = Compiler::Blank();  // (the root as an answer begins it)
  only_object.by_slot[kObject] = c.nodes[static_cast<size_t>(root)].by_slot[kObject];
  c.nodes.push_back(only_object);
  const int answer = static_cast<int>(c.nodes.size() - 1);
  c.Frames();
  if (c.nodes[static_cast<size_t>(answer)].frames[kObject] > kMaxFrames) {
    return Compiler::Error(
        "", fmt::format("no valid answer nests at most {} objects and arrays (a recursive schema "
                        "whose required properties or minItems recur without end?)",
                        kMaxFrames));
  }
  std::vector<size_t> memo(c.nodes.size() * kSlots * (kMaxFrames + 1));
  if (c.SmallestBytes(answer, kMaxFrames, memo) > kMaxSmallestAnswer) {
    return Compiler::Error(
        "", fmt::format("its shortest valid answer is longer than {} bytes", kMaxSmallestAnswer));
  }
  // Every kind of every value it describes too, within the frames an answer may give it (a value
  // an answer may begin, whose shortest end Closing() writes); and which kind Smallest writes.
  const std::vector<std::array<bool, kMaxFrames + 1>> given = c.Given(answer);
  for (size_t i = 0; i < c.nodes.size(); ++i) {
    for (int frames = 0; frames <= kMaxFrames; ++frames) {
      c.nodes[i].shortest[static_cast<size_t>(frames)] =
          static_cast<uint8_t>(c.ShortestKind(static_cast<int>(i), frames, memo));
      if (!c.nodes[i].branches.empty()) {
        c.nodes[i].value[static_cast<size_t>(frames)] =
            static_cast<uint16_t>(c.UnionValue(c.nodes[i], frames, memo));
      }
    }
    for (size_t k = 0; k < kSlots; ++k) {
      if (c.nodes[i].by_slot[k] < 0) continue;
      for (int frames = c.nodes[i].frames[k]; frames <= kMaxFrames; ++frames) {
        if (given[i][static_cast<size_t>(frames)] &&
            c.KindBytes(static_cast<int>(i), k, frames, memo) > kMaxSmallestAnswer) {
          return Compiler::Error(
              "", fmt::format("a value it describes ({}) is longer than {} bytes at its shortest",
                              kSlotNames[k], kMaxSmallestAnswer));
        }
      }
    }
  }
  auto out = std::make_shared<JsonSchema>();
  out->nodes_ = std::move(c.nodes);
  out->root_ = answer;
  static std::atomic<uint64_t> compiled{0};
  out->id_ = compiled.fetch_add(1, std::memory_order_relaxed) + 1;
  out->bytes_ = sizeof(JsonSchema) + out->nodes_.capacity() * sizeof(Node);
  for (const Node& n : out->nodes_) {
    for (const auto* texts : {&n.names, &n.values}) {
      out->bytes_ += texts->capacity() * sizeof(std::string);
      for (const std::string& t : *texts) out->bytes_ += t.capacity() + 1;
    }
    out->bytes_ += (n.properties.capacity() + n.prefix.capacity()) * sizeof(int16_t) +
                   n.alike.capacity() * sizeof(uint64_t) +
                   n.branches.capacity() * sizeof(n.branches[0]);
    for (const Side& s : n.sides)
      out->bytes_ += s.low.fraction.capacity() + s.high.fraction.capacity();
  }
  return std::shared_ptr<const JsonSchema>(std::move(out));
}

std::string JsonSchema::UnusedValue(int e, uint64_t& used) const {
  const Node& n = node(e);
  const auto i = static_cast<size_t>(std::countr_one(used));  // (a unique array's: some is left)
  if (i >= n.values.size()) return "null";  // (none: the array's count refuses a next item first)
  used |= n.alike[i];
  return n.values[i];
}

std::string JsonSchema::Smallest(int i, int frames) const {
  const Node& n = node(i);
  if (frames >= 0 && frames <= kMaxFrames) {
    const size_t k = n.shortest[static_cast<size_t>(frames)];
    const int to = k < kSlots ? n.by_slot[k] : -1;
    if (to < 0) return "null";  // (none fits: not asked of a reader's value)
    const Node& t = node(to);
    if (!t.any && !t.values.empty()) return FirstOfKind(t, k);
    switch (k) {
      case kObject: {
        std::string out = "{";
        const Node* o = &t;  // (a union's: its value's branch, that value written first)
        size_t first = t.names.size();
        if (!t.branches.empty()) {
          const size_t v = t.value[static_cast<size_t>(frames)];
          out += '"' + t.names[0] + "\":" + node(t.properties[0]).values[v];
          o = &node(t.branches[v].first);
          first = t.branches[v].second;
        }
        for (size_t p = 0; !o->any && p < o->names.size(); ++p) {
          if (((o->required >> p) & 1U) == 0 || p == first) continue;
          if (out.size() > 1) out += ',';
          out += '"' + o->names[p] + "\":" + Smallest(o->properties[p], frames - 1);
        }
        return out + "}";
      }
      case kArray: {
        std::string out = "[";
        uint64_t used = 0;  // (a unique array's values written)
        for (uint32_t j = 0; !t.any && j < t.min_items; ++j) {
          if (j > 0) out += ',';
          out += t.unique ? UnusedValue(t.items, used) : Smallest(t.item(j), frames - 1);
        }
        return out + "]";
      }
      case kString:
        return '"' + std::string(t.any ? 0 : t.min_length, 'a') + '"';
      case kNumber:
        return SmallestNumber(t);
      case kBoolean:
        return "true";
      default:
        return "null";
    }
  }
  return "null";  // (frames out of range: not asked)
}

// ---- JsonSchemaPrefix ----

namespace {

constexpr int64_t kSaturated = 100 * JsonSchema::kMaxBound;  // past every bound

int64_t SaturatingMul(int64_t x, int64_t y) { return x > kSaturated / y ? kSaturated : x * y; }

// Of the integers whose digits begin with those of m > 0 (m itself, then [10m, 10m + 9], ...),
// the least within [lo, hi] (kNo...: unbounded), if any.
std::optional<int64_t> LeastExtending(int64_t m, int64_t lo, int64_t hi) {
  for (int64_t p = 1;; p *= 10) {
    const int64_t first = SaturatingMul(m, p);
    if (first > hi) return std::nullopt;  // (and every later run begins past it too)
    if (SaturatingMul(m + 1, p) - 1 >= lo) return std::max(first, lo);
    // (A run ends below lo <= kMaxBound only while m p < kMaxBound: p stays far from overflow.)
  }
}

// How the integers whose digits begin with those of m > 0 meet [lo, hi] (kNo...: unbounded), as
// a key: of each run [m 10^j, (m + 1) 10^j - 1], j = 0, 1, ..., whether it lies wholly inside or
// wholly outside, up to one past hi (every later one is too) or, without a hi, one inside (every
// later one is too); nullopt if a run lies partly inside (its digits then matter). With
// `strict_lo` (`strict_hi`), a run that holds lo (hi) lies partly inside (a bounded number's
// whole part equal to a bound's is held to that bound's fraction). Magnitudes keyed alike take the
// same digits and ends, into states keyed alike again (10m + d's runs lie within m's next ones): a
// bounded value's digits are a few states, not one per value read.
std::optional<uint32_t> RunsKey(int64_t m, int64_t lo, int64_t hi, bool strict_lo, bool strict_hi) {
  uint32_t key = 1;  // (a leading 1: keys of different lengths differ)
  for (int64_t p = 1;; p *= 10) {
    const int64_t first = SaturatingMul(m, p), last = SaturatingMul(m + 1, p) - 1;
    if (first > hi) return key << 2U | 2U;
    const bool inside =
        (strict_lo ? first > lo : first >= lo) && (strict_hi ? last < hi : last <= hi);
    if (!inside && last >= lo) return std::nullopt;
    if (inside && hi == JsonSchema::kNoMaximum) return key << 2U | 3U;
    key = key << 1U | (inside ? 1U : 0U);
    // (Within 18 runs: first reaches a bounded hi <= kMaxBound, or a lo <= kMaxBound.)
  }
}

// The magnitudes [lo, hi] of negative integers in [minimum, maximum].
std::pair<int64_t, int64_t> NegativeMagnitudes(int64_t minimum, int64_t maximum) {
  return {maximum == JsonSchema::kNoMaximum ? JsonSchema::kNoMinimum : -maximum,
          minimum == JsonSchema::kNoMinimum ? JsonSchema::kNoMaximum : -minimum};
}

// The least integer at least a magnitude.
int64_t Ceil(const JsonSchema::Magnitude& m) { return m.whole + (m.fraction.empty() ? 0 : 1); }

// The fewest fraction digits that, after the `place` digits read (after the whole part of side
// s's magnitudes; equal so far to its least's if tight_low, to its greatest's if tight_high),
// make a magnitude within them: the least's digits while they are the greatest's too (or 9s),
// then one above the least's (or the least's last). Empty if not tight to the least.
std::string ShortestFraction(const JsonSchema::Side& s, size_t place, bool tight_low,
                             bool tight_high) {
  auto digit = [](const JsonSchema::Magnitude& m, size_t i) {
    return i < m.fraction.size() ? m.fraction[i] : '0';
  };
  std::string out;
  for (size_t i = place; tight_low; ++i) {
    const char a = digit(s.low, i), b = tight_high ? digit(s.high, i) : '9';
    if (i + 1 >= s.low.fraction.size()) {
      out += a;  // (the least itself)
      break;
    }
    if (a < b) {
      out += static_cast<char>(a + 1);
      break;
    }
    out += a;
  }
  return out;
}

// A short magnitude of side s: its least integer if one is within it, else its whole part and
// the fewest fraction digits (no integer within: its least and greatest share their whole part).
std::string ShortestMagnitude(const JsonSchema::Side& s) {
  if (!s.capped || Ceil(s.low) <= s.high.whole) return std::to_string(Ceil(s.low));
  return std::to_string(s.low.whole) + "." + ShortestFraction(s, 0, true, true);
}

}  // namespace

std::string JsonSchema::SmallestNumber(const Node& t) {
  if (t.decimal) {
    for (size_t sign = 0; sign < 2; ++sign) {  // (the positive side first: it holds 0)
      const Side& s = t.sides[sign];
      if (!s.allowed) continue;
      return (sign == 1 ? "-" : "") + ShortestMagnitude(s);
    }
  }
  if (t.minimum > 0) return std::to_string(t.minimum);
  if (t.maximum < 0) return std::to_string(t.maximum);
  return "0";
}

JsonSchemaPrefix& JsonSchemaPrefix::operator=(const JsonSchemaPrefix& other) {
  if (this == &other) return *this;
  schema_ = other.schema_;
  syntax_ = other.syntax_;
  bad_ = other.bad_;
  done_ = other.done_;
  scalar_ = other.scalar_;
  escape_ = other.escape_;
  integer_ = other.integer_;
  negative_ = other.negative_;
  digit_ = other.digit_;
  magnitude_ = other.magnitude_;
  point_ = other.point_;
  tight_low_ = other.tight_low_;
  tight_high_ = other.tight_high_;
  place_ = other.place_;
  need_ = other.need_;
  room_ = other.room_;
  pos_ = other.pos_;
  lo_ = other.lo_;
  hi_ = other.hi_;
  node_ = other.node_;
  any_depth_ = other.any_depth_;
  any_string_ = other.any_string_;
  any_scalar_ = other.any_scalar_;
  any_base_ = other.any_base_;
  depth_ = other.depth_;
  std::copy_n(other.frames_.begin(), depth_, frames_.begin());
  return *this;
}

bool JsonSchemaPrefix::FeedSchema(std::string_view bytes) {
  for (char c : bytes) {
    if (!Feed(c)) return false;
  }
  return !bad_;
}

bool JsonSchemaPrefix::Feed(char byte) {
  if (bad_) return false;
  const int syntax_depth = syntax_.depth();
  const bool starts = syntax_.between_string_characters();
  if (!syntax_.Feed(byte)) {
    bad_ = true;
    return false;
  }
  if (schema_ == nullptr) return true;
  if (scalar_ == Scalar::kNone && syntax_depth >= 0) any_base_ = static_cast<uint8_t>(syntax_depth);
  if (!Take(static_cast<unsigned char>(byte), starts)) bad_ = true;
  return !bad_;
}

bool JsonSchemaPrefix::Take(unsigned char c, bool starts) {
  switch (scalar_) {
    case Scalar::kNone:
      return Structural(c);
    case Scalar::kKey:
      return Key(c);
    case Scalar::kString:
      // Each character counted at its first byte (a surrogate pair's second escape is read
      // within its first: one character, as a decoder makes it).
      if (!starts) return true;
      if (c == '"') {
        if (need_ > 0) return false;
        scalar_ = Scalar::kNone;
        return ValueEnded();
      }
      if (room_ == 0) return false;
      if (room_ != JsonSchema::kUnbounded) --room_;
      if (need_ > 0) --need_;
      return true;
    case Scalar::kNumber: {
      const JsonSchema::Node& n = schema_->node(node_);
      if (IsNumberByte(c)) {
        if (integer_ && (c == '.' || c == 'e' || c == 'E')) return false;
        if (n.decimal) return DecimalByte(c);
        return !n.bounded() || IntegerByte(c);
      }
      const int64_t value = negative_ ? -magnitude_ : magnitude_;
      if (n.bounded() && (value < n.minimum || value > n.maximum)) return false;
      if (n.decimal && !DecimalEnds()) return false;
      scalar_ = Scalar::kNone;
      return ValueEnded() && Structural(c);
    }
    case Scalar::kLiteral:
      if (c >= 'a' && c <= 'z') return true;
      scalar_ = Scalar::kNone;
      return ValueEnded() && Structural(c);
    case Scalar::kEnum: {
      if (Enum(c)) {
        // A whole string, object or array ends with its last byte (no other value extends it);
        // a number or literal at the byte after it.
        const std::string& v = schema_->node(node_).values[lo_];
        if (v.size() == pos_ && (c == '"' || c == '}' || c == ']')) return EnumEnded();
        return true;
      }
      if (schema_->node(node_).values[lo_].size() != pos_) return false;
      return EnumEnded() && Structural(c);
    }
    case Scalar::kAny:
      return AnyByte(c);
    case Scalar::kMapKey:  // (any key: the syntax checks it; it ends at a '"' that starts)
      if (starts && c == '"') {
        Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
        f.value = schema_->node(f.node).additional;
        f.stage = Stage::kColon;
        scalar_ = Scalar::kNone;
      }
      return true;
  }
  return false;
}

bool JsonSchemaPrefix::AnyByte(unsigned char c) {
  if (any_string_) {
    if (escape_) {
      escape_ = false;
    } else if (c == '\\') {
      escape_ = true;
    } else if (c == '"') {
      any_string_ = false;
      if (any_depth_ == 0) {
        scalar_ = Scalar::kNone;
        return ValueEnded();
      }
    }
    return true;
  }
  if (any_scalar_) {
    if (IsNumberByte(c) || (c >= 'a' && c <= 'z')) return true;
    scalar_ = Scalar::kNone;
    return ValueEnded() && Structural(c);
  }
  if (c == '"') {
    any_string_ = true;
  } else if (c == '{' || c == '[') {
    ++any_depth_;
  } else if (c == '}' || c == ']') {
    if (--any_depth_ == 0) {
      scalar_ = Scalar::kNone;
      return ValueEnded();
    }
  }
  return true;  // (the syntax checks the rest)
}

namespace {

// Of the sorted texts [lo, hi), which share their first `pos` bytes, the run whose next byte is
// c (binary searches: the one that ends at pos, if any, comes first, then the rest by that byte
// as std::string orders them, unsigned).
std::pair<uint16_t, uint16_t> Run(const std::vector<std::string>& texts, uint16_t lo, uint16_t hi,
                                  uint16_t pos, unsigned char c) {
  const auto first = texts.begin() + lo, last = texts.begin() + hi;
  const auto below = [pos, c](const std::string& t) {
    return t.size() <= pos || static_cast<unsigned char>(t[pos]) < c;
  };
  const auto not_above = [pos, c](const std::string& t) {
    return t.size() <= pos || static_cast<unsigned char>(t[pos]) <= c;
  };
  return {static_cast<uint16_t>(std::partition_point(first, last, below) - texts.begin()),
          static_cast<uint16_t>(std::partition_point(first, last, not_above) - texts.begin())};
}

}  // namespace

const JsonSchema::Node* JsonSchemaPrefix::Union() const {
  if (depth_ == 0) return nullptr;
  const Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
  const JsonSchema::Node& n = schema_->node(f.node);
  return !f.array && !n.branches.empty() ? &n : nullptr;
}

bool JsonSchemaPrefix::BranchFits(const JsonSchema::Node& u, uint16_t value) const {
  // (the branch goes on in the union's frame, the top one)
  return depth_ - 1 + schema_->node(u.branches[value].first).frames[JsonSchema::kObject] <=
         kMaxFrames;
}

const JsonSchemaPrefix::Frame* JsonSchemaPrefix::UniqueArray() const {
  if (depth_ == 0) return nullptr;
  const Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
  return f.array && schema_->node(f.node).unique ? &f : nullptr;
}

uint64_t JsonSchemaPrefix::Written() const {
  const Frame* f = UniqueArray();
  return f != nullptr ? f->used : 0;
}

bool JsonSchemaPrefix::Enum(unsigned char c) {
  const auto [lo, hi] = Run(schema_->node(node_).values, lo_, hi_, pos_, c);
  if (lo == hi) return false;
  if (const JsonSchema::Node* u = Union(); u != nullptr) {
    // (a union's property: a value whose branch fits in the frames left must remain)
    bool any = false;
    for (uint16_t v = lo; v < hi && !any; ++v) any = BranchFits(*u, v);
    if (!any) return false;
  }
  if (const uint64_t written = Written(); written != 0) {
    // (a unique array's: a value not written yet must remain; at most 64 values, hi <= 64)
    const uint64_t run =
        (hi == 64 ? ~uint64_t{0} : (uint64_t{1} << hi) - 1) & ~((uint64_t{1} << lo) - 1);
    if ((run & ~written) == 0) return false;
  }
  lo_ = lo;
  hi_ = hi;
  ++pos_;
  return true;
}

bool JsonSchemaPrefix::EnumEnded() {
  // (the value read is values[lo_], the shortest of the run; in a unique array, not written yet;
  // a union's, one whose branch fits)
  if (const uint64_t written = Written(); written != 0 && ((written >> lo_) & 1U) != 0) {
    return false;
  }
  if (const JsonSchema::Node* u = Union(); u != nullptr && !BranchFits(*u, lo_)) return false;
  if (UniqueArray() != nullptr) {
    frames_[static_cast<size_t>(depth_ - 1)].used |= schema_->node(node_).alike[lo_];
  }
  scalar_ = Scalar::kNone;
  return ValueEnded();
}

bool JsonSchemaPrefix::IntegerByte(unsigned char c) {
  const JsonSchema::Node& n = schema_->node(node_);
  if (c == '-') {
    negative_ = true;
    return n.minimum <= 0;  // (-0 is 0)
  }
  digit_ = true;
  magnitude_ = std::min(SaturatingMul(magnitude_, 10) + (c - '0'), kSaturated);
  if (magnitude_ == 0) return n.minimum <= 0 && n.maximum >= 0;  // ("0" ends there)
  if (!negative_) return LeastExtending(magnitude_, n.minimum, n.maximum).has_value();
  const auto [lo, hi] = NegativeMagnitudes(n.minimum, n.maximum);
  return LeastExtending(magnitude_, lo, hi).has_value();
}

bool JsonSchemaPrefix::DecimalByte(unsigned char c) {
  const JsonSchema::Node& n = schema_->node(node_);
  if (c == '-') {
    negative_ = true;
    return n.sides[1].allowed;
  }
  const JsonSchema::Side& s = n.sides[negative_ ? 1 : 0];
  if (!s.allowed) return false;
  const int64_t top = s.capped ? s.high.whole : JsonSchema::kNoMaximum;
  if (c == '.') {  // (then [m, m + 1) must meet the bounds)
    if (magnitude_ < s.low.whole || magnitude_ > top) return false;
    point_ = true;
    digit_ = false;
    tight_low_ = magnitude_ == s.low.whole && !s.low.fraction.empty();
    tight_high_ = s.capped && magnitude_ == s.high.whole;
    place_ = 0;
    return true;
  }
  if (c < '0' || c > '9') return false;  // (an exponent)
  digit_ = true;
  if (!point_) {  // (the numbers that begin with these digits: runs [m 10^j, (m + 1) 10^j))
    magnitude_ = std::min(SaturatingMul(magnitude_, 10) + (c - '0'), kSaturated);
    if (magnitude_ == 0) return s.low.whole == 0;  // ("0" alone: [0, 1))
    return LeastExtending(magnitude_, s.low.whole, top).has_value();
  }
  // A fraction digit: compared with the bounds' at the same place while equal to them so far.
  auto digit = [this](const JsonSchema::Magnitude& m) {
    return place_ < m.fraction.size() ? m.fraction[place_] : '0';
  };
  if (tight_low_) {
    if (c < digit(s.low)) return false;
    tight_low_ = c == digit(s.low);
  }
  if (tight_high_) {
    if (c > digit(s.high)) return false;
    tight_high_ = c == digit(s.high);
  }
  place_ = static_cast<uint16_t>(
      std::min<size_t>(place_ + 1U, std::max(s.low.fraction.size(), s.high.fraction.size())));
  if (place_ >= s.low.fraction.size()) tight_low_ = false;  // (equal to the least: within)
  return true;
}

bool JsonSchemaPrefix::DecimalEnds() const {
  const JsonSchema::Side& s = schema_->node(node_).sides[negative_ ? 1 : 0];
  if (point_) return !tight_low_;  // (tight to the greatest, or below it)
  return magnitude_ >= Ceil(s.low) && (!s.capped || magnitude_ <= s.high.whole);
}

uint64_t JsonSchemaPrefix::Open(const Frame& f, const JsonSchema::Node& n, int left) const {
  const size_t count = n.names.size();
  uint64_t open = ~f.used & (count == 64 ? ~uint64_t{0} : (uint64_t{1} << count) - 1);
  if (n.tallest <= left) return open;  // (every value fits)
  for (size_t p = 0; p < count; ++p) {
    if (schema_->node(n.properties[p]).least > left) open &= ~(uint64_t{1} << p);
  }
  return open;
}

bool JsonSchemaPrefix::Key(unsigned char c) {
  Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
  const JsonSchema::Node& n = schema_->node(f.node);
  const uint64_t open = Open(f, n, kMaxFrames - depth_);
  auto unused = [open](size_t i) { return ((open >> i) & 1U) != 0; };
  if (c == '"' && !escape_) {
    // The name read must be a whole name not written yet whose value fits (the shortest of the
    // run: lo_).
    if (lo_ == hi_ || n.names[lo_].size() != pos_ || !unused(lo_)) return false;
    f.used |= uint64_t{1} << lo_;
    f.value = n.properties[lo_];
    f.stage = Stage::kColon;
    scalar_ = Scalar::kNone;
    return true;
  }
  escape_ = !escape_ && c == '\\';
  const auto [lo, hi] = Run(n.names, lo_, hi_, pos_, c);
  bool any = false;  // (a name not written yet, whose value fits, must remain)
  for (uint16_t i = lo; i < hi && !any; ++i) any = unused(i);
  if (!any) return false;
  lo_ = lo;
  hi_ = hi;
  ++pos_;
  return true;
}

bool JsonSchemaPrefix::StartValue(int node, unsigned char c) {
  const JsonSchema::Slot slot = SlotOf(c);
  if (slot == JsonSchema::kSlots) return false;
  const int to = schema_->node(node).by_slot[slot];
  if (to < 0) return false;
  const JsonSchema::Node& t = schema_->node(to);
  if (t.any) {
    scalar_ = Scalar::kAny;
    escape_ = false;
    any_string_ = slot == JsonSchema::kString;
    any_depth_ = slot == JsonSchema::kObject || slot == JsonSchema::kArray ? 1 : 0;
    any_scalar_ = any_depth_ == 0 && !any_string_;
    return true;
  }
  if (!t.values.empty()) {
    scalar_ = Scalar::kEnum;
    node_ = static_cast<int16_t>(to);
    pos_ = 0;
    lo_ = 0;
    hi_ = static_cast<uint16_t>(t.values.size());
    return Enum(c);  // (a value of one byte is a digit: it ends at the byte after it)
  }
  switch (slot) {
    case JsonSchema::kObject:
    case JsonSchema::kArray:
      // (one that could not end within the frames left: a recursive schema's, nested deep)
      if (depth_ + schema_->node(node).frames[slot] > kMaxFrames) return false;
      frames_[static_cast<size_t>(depth_++)] = Frame{.used = 0,
                                                     .count = 0,
                                                     .node = static_cast<int16_t>(to),
                                                     .value = 0,
                                                     .array = slot == JsonSchema::kArray,
                                                     .stage = Stage::kOpen};
      return true;
    case JsonSchema::kString:
      scalar_ = Scalar::kString;
      need_ = t.min_length;
      room_ = t.max_length;
      return true;
    case JsonSchema::kNumber:
      scalar_ = Scalar::kNumber;
      integer_ = t.integer;
      node_ = static_cast<int16_t>(to);
      negative_ = false;
      digit_ = false;
      magnitude_ = 0;
      point_ = false;
      tight_low_ = false;
      tight_high_ = false;
      place_ = 0;
      if (t.decimal) return DecimalByte(c);
      return !t.bounded() || IntegerByte(c);
    default:
      scalar_ = Scalar::kLiteral;
      return true;
  }
}

bool JsonSchemaPrefix::ValueEnded() {
  if (depth_ == 0) {
    done_ = true;
    return true;
  }
  Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
  if (f.array && f.count < JsonSchema::kUnbounded) ++f.count;
  f.stage = Stage::kAfter;
  if (!f.array) Chosen(f, lo_);
  return true;
}

void JsonSchemaPrefix::Chosen(Frame& f, uint16_t value) const {
  const JsonSchema::Node& n = schema_->node(f.node);
  if (n.branches.empty()) return;
  const auto [branch, index] = n.branches[value];
  f.node = branch;
  f.used = uint64_t{1} << index;
}

bool JsonSchemaPrefix::Structural(unsigned char c) {
  if (IsSpace(c)) return true;  // (the syntax bounds where, and how many)
  if (depth_ == 0) return !done_ && StartValue(schema_->root(), c);
  Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
  const JsonSchema::Node& n = schema_->node(f.node);
  auto pop = [this] {
    --depth_;
    return ValueEnded();
  };
  if (f.array) {
    switch (f.stage) {
      case Stage::kOpen:
        if (c == ']') return n.min_items == 0 && pop();
        return n.max_items > 0 && StartValue(n.item(0), c);
      case Stage::kAfter:
        if (c == ']') return f.count >= n.min_items && pop();
        if (c != ',' || f.count >= n.max_items || !Fits(n.item(f.count))) return false;
        // (a set's: some value not written yet; max_items says so too, as the values alike make
        // an equivalence)
        if (n.unique &&
            std::popcount(f.used) >= static_cast<int>(schema_->node(n.items).values.size())) {
          return false;
        }
        f.stage = Stage::kValue;
        return true;
      default:
        return StartValue(n.item(f.count), c);
    }
  }
  switch (f.stage) {
    case Stage::kOpen:
      if (c == '}') return n.required == 0 && pop();
      [[fallthrough]];
    case Stage::kKey:
      if (c == '"' && n.additional >= 0) {  // (a map's key: the first as the others)
        if (!Fits(n.additional)) return false;
        scalar_ = Scalar::kMapKey;
        f.stage = Stage::kKey;
        return true;
      }
      if (c != '"' || Open(f, n, kMaxFrames - depth_) == 0) return false;
      scalar_ = Scalar::kKey;
      escape_ = false;
      pos_ = 0;
      lo_ = 0;
      hi_ = static_cast<uint16_t>(n.names.size());
      return true;
    case Stage::kColon:
      if (c != ':') return false;
      f.stage = Stage::kValue;
      return true;
    case Stage::kValue:
      return StartValue(f.value, c);
    case Stage::kAfter:
      if (c == '}') return (n.required & ~f.used) == 0 && pop();
      if (c != ',' ||
          (n.additional >= 0 ? !Fits(n.additional) : Open(f, n, kMaxFrames - depth_) == 0)) {
        return false;
      }
      f.stage = Stage::kKey;
      return true;
  }
  return false;
}

std::string JsonSchemaPrefix::key(uint32_t longest) const {
  const JsonObjectPrefix::Key k = syntax_.key();
  std::string out(k.begin(), k.end());
  if (schema_ == nullptr) return out;
  auto put = [&out](auto v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);  // (the same process reads it)
  };
  // A bounded number's digits read: how their runs meet the bounds (RunsKey), else their value.
  auto put_magnitude = [&](std::optional<uint32_t> runs) {
    put(runs.has_value());
    if (runs) {
      put(*runs);
    } else {
      put(magnitude_);
    }
  };
  put(static_cast<uint8_t>(bad_));
  put(static_cast<uint8_t>(done_));
  put(static_cast<uint8_t>(scalar_));
  switch (scalar_) {
    case Scalar::kKey:  // (of the top frame's node)
      put(escape_);
      put(pos_);
      put(lo_);
      put(hi_);
      break;
    case Scalar::kEnum:
      put(node_);
      put(pos_);
      put(lo_);
      put(hi_);
      break;
    case Scalar::kString: {
      const uint32_t most = longest == JsonSchema::kUnbounded ? longest : longest + 1;
      put(std::min(need_, most));
      put(std::min(room_, most));
      break;
    }
    case Scalar::kNumber:
      put(integer_);
      if (const JsonSchema::Node& n = schema_->node(node_); n.bounded()) {
        put(node_);
        put(negative_);
        put(digit_);
        // The digits read as how their runs meet the bounds, where that is all that matters.
        const auto [lo, hi] =
            negative_ ? NegativeMagnitudes(n.minimum, n.maximum) : std::pair{n.minimum, n.maximum};
        put_magnitude(digit_ && magnitude_ > 0 ? RunsKey(magnitude_, lo, hi, false, false)
                                               : std::nullopt);
      } else if (n.decimal) {
        put(node_);
        put(negative_);
        put(digit_);
        put(point_);
        if (point_) {  // (the whole part matters no more: only whether it was the bounds')
          put(tight_low_);
          put(tight_high_);
          put(tight_low_ || tight_high_ ? place_ : uint16_t{0});
        } else {
          const JsonSchema::Side& s = n.sides[negative_ ? 1 : 0];
          const int64_t top = s.capped ? s.high.whole : JsonSchema::kNoMaximum;
          put_magnitude(digit_ && magnitude_ > 0 && s.allowed
                            // (the least's whole part alone, without a fraction, is within)
                            ? RunsKey(magnitude_, s.low.whole, top, !s.low.fraction.empty(), true)
                            : std::nullopt);
        }
      }
      break;
    case Scalar::kAny:
      put(escape_);
      put(any_depth_);
      put(any_string_);
      put(any_scalar_);
      break;
    default:
      break;
  }
  put(static_cast<uint8_t>(depth_));
  for (int d = 0; d < depth_; ++d) {
    const Frame& f = frames_[static_cast<size_t>(d)];
    const JsonSchema::Node& n = schema_->node(f.node);
    put(f.node);
    put(f.stage);
    put(f.array);
    if (f.array) {
      // Past its minimum and its tuple's places only how many items it may still take matters,
      // and with `longest` no more of them than a token can write (a byte each at least).
      const auto settled = std::max(n.min_items, static_cast<uint32_t>(n.prefix.size()));
      put(std::min(f.count, settled));
      if (n.unique) put(f.used);  // (its enum's values written)
      if (f.count >= settled) {
        const uint32_t left =
            n.max_items == JsonSchema::kUnbounded ? JsonSchema::kUnbounded : n.max_items - f.count;
        put(longest == JsonSchema::kUnbounded ? left : std::min(left, longest + 1));
      }
    } else {
      put(f.used);
      put(f.stage == Stage::kValue || f.stage == Stage::kColon ? f.value : int16_t{0});
    }
  }
  return out;
}

void JsonSchemaPrefix::CloseFrame(Frame f, int depth, std::string& out) const {
  const JsonSchema::Node& n = schema_->node(f.node);
  const int left = kMaxFrames - depth - 1;  // (frames for the values inside it)
  if (f.array) {
    auto item = [&] {  // (a unique array's: a value not written yet)
      return n.unique ? schema_->UnusedValue(n.items, f.used)
                      : schema_->Smallest(n.item(f.count), left);
    };
    if (f.stage == Stage::kValue || (f.stage == Stage::kOpen && n.min_items > 0)) {
      out += item();
      ++f.count;
    }
    for (; f.count < n.min_items; ++f.count) out += "," + item();
    out += ']';
    return;
  }
  if (!n.branches.empty()) {
    // A union before its property's value was read: the property, the value whose branch fits
    // with the shortest object (Node::value), then the object of that value's branch.
    if (f.stage == Stage::kOpen) out += '"' + n.names[0] + '"';
    if (f.stage != Stage::kValue) out += ':';
    const size_t v = n.value[static_cast<size_t>(kMaxFrames - depth)];
    out += schema_->node(n.properties[0]).values[v];
    Chosen(f, static_cast<uint16_t>(v));
    f.stage = Stage::kAfter;
    CloseFrame(f, depth, out);
    return;
  }
  auto write = [&](size_t p) {
    out += '"' + n.names[p] + "\":" + schema_->Smallest(n.properties[p], left);
    f.used |= uint64_t{1} << p;
  };
  bool first = f.stage == Stage::kOpen;
  if (f.stage == Stage::kColon) out += ':';
  if (f.stage == Stage::kColon || f.stage == Stage::kValue) {
    out += schema_->Smallest(f.value, left);
  }
  if (f.stage == Stage::kKey && n.additional >= 0) {  // (a map's: any key)
    out += "\"\":" + schema_->Smallest(n.additional, left);
  } else if (f.stage == Stage::kKey) {
    // After a comma (allowed while some property not written yet fits): a required one, if any
    // is left, else the first one left that fits.
    const uint64_t required = n.required & ~f.used;
    write(static_cast<size_t>(std::countr_zero(required != 0 ? required : Open(f, n, left))));
  }
  for (size_t p = 0; p < n.names.size(); ++p) {
    if ((((n.required & ~f.used) >> p) & 1U) == 0) continue;
    if (!first) out += ',';
    first = false;
    write(p);
  }
  out += '}';
}

std::string JsonSchemaPrefix::IntegerClosing() const {
  const JsonSchema::Node& n = schema_->node(node_);
  if (!digit_) return n.maximum >= 0 ? "0" : std::to_string(-n.maximum);  // (after '-')
  if (magnitude_ == 0) return "";
  auto [lo, hi] =
      negative_ ? NegativeMagnitudes(n.minimum, n.maximum) : std::pair{n.minimum, n.maximum};
  const std::string read = std::to_string(magnitude_);
  return std::to_string(LeastExtending(magnitude_, lo, hi).value_or(magnitude_))
      .substr(read.size());
}

std::string JsonSchemaPrefix::DecimalClosing() const {
  const JsonSchema::Side& s = schema_->node(node_).sides[negative_ ? 1 : 0];
  if (point_) {
    const std::string rest = ShortestFraction(s, place_, tight_low_, tight_high_);
    return rest.empty() && !digit_ ? "0" : rest;
  }
  if (!digit_) return ShortestMagnitude(s);  // (after '-')
  if (DecimalEnds()) return "";
  // The least integer in the runs the digits begin that is at least the least magnitude's
  // whole part; if it is that whole part (below the least), a fraction after it.
  const int64_t top = s.capped ? s.high.whole : JsonSchema::kNoMaximum;
  const int64_t least =
      magnitude_ == 0 ? 0 : LeastExtending(magnitude_, s.low.whole, top).value_or(magnitude_);
  std::string out = std::to_string(least).substr(std::to_string(magnitude_).size());
  if (least < Ceil(s.low)) {
    out += "." + ShortestFraction(s, 0, true, s.capped && s.high.whole == least);
  }
  return out;
}

std::string JsonSchemaPrefix::Closing() const {
  if (schema_ == nullptr) return syntax_.Closing();
  if (bad_) return "";
  if (done_) return syntax_.Closing();  // (whitespace after the object: nothing)
  if (depth_ == 0 && scalar_ == Scalar::kNone)
    return schema_->Smallest(schema_->root(), kMaxFrames);
  std::string out;
  std::array<Frame, kMaxFrames> frames;  // (those in use)
  std::copy_n(frames_.begin(), depth_, frames.begin());
  bool ended = true;  // whether a value ended (its frame goes on after it)
  switch (scalar_) {
    case Scalar::kNone:
      ended = false;
      break;
    case Scalar::kKey: {
      Frame& f = frames[static_cast<size_t>(depth_ - 1)];
      const JsonSchema::Node& n = schema_->node(f.node);
      uint16_t p = lo_;
      const uint64_t open = Open(f, n, kMaxFrames - depth_);
      while (((open >> p) & 1U) == 0) ++p;  // (Key keeps an open one in the run)
      out += n.names[p].substr(pos_) + '"';
      f.used |= uint64_t{1} << p;
      f.value = n.properties[p];
      f.stage = Stage::kColon;
      ended = false;
      break;
    }
    case Scalar::kString: {  // (the character in progress ended, then those it still needs)
      const std::string end = syntax_.Closing(syntax_.depth());
      out += end.substr(0, end.size() - 1) + std::string(need_, 'a') + '"';
      break;
    }
    case Scalar::kNumber:
      if (schema_->node(node_).bounded()) {
        out += IntegerClosing();
        break;
      }
      if (schema_->node(node_).decimal) {
        out += DecimalClosing();
        break;
      }
      [[fallthrough]];
    case Scalar::kLiteral:
      out += syntax_.Closing(syntax_.depth());
      break;
    case Scalar::kEnum: {
      const JsonSchema::Node& e = schema_->node(node_);
      uint16_t i = lo_;
      if (const JsonSchema::Node* u = Union(); u != nullptr) {
        while (!BranchFits(*u, i)) ++i;  // (Enum keeps one that fits in the run)
      }
      if (UniqueArray() != nullptr) {
        Frame& f = frames[static_cast<size_t>(depth_ - 1)];
        while (((f.used >> i) & 1U) != 0) ++i;  // (Enum keeps one not written in the run)
        f.used |= e.alike[i];
      }
      out += e.values[i].substr(pos_);
      if (depth_ > 0 && !frames[static_cast<size_t>(depth_ - 1)].array) {
        Chosen(frames[static_cast<size_t>(depth_ - 1)], i);  // (a union's property: its branch)
      }
      break;
    }
    case Scalar::kAny:
      out += syntax_.Closing(any_base_);
      break;
    case Scalar::kMapKey: {  // (the key's string closed; the syntax's closing then adds ":0")
      const std::string end = syntax_.Closing(syntax_.depth());
      out += end.substr(0, end.rfind('"') + 1);
      Frame& f = frames[static_cast<size_t>(depth_ - 1)];
      f.value = schema_->node(f.node).additional;
      f.stage = Stage::kColon;
      ended = false;
      break;
    }
  }
  for (int d = depth_ - 1; d >= 0; --d) {
    Frame f = frames[static_cast<size_t>(d)];
    if (ended) {
      if (f.array) ++f.count;
      f.stage = Stage::kAfter;
    }
    CloseFrame(f, d, out);
    ended = true;
  }
  return out;
}

}  // namespace colony::api
