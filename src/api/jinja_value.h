// The values a Jinja chat template computes with, and how Python (whose semantics Jinja has)
// prints, compares, adds and serialises them: what transformers' apply_chat_template gives is
// the reference, so `{{ 1.0 }}` prints "1.0", `{{ [1, 'a'] }}` prints "[1, 'a']" and `tojson`
// writes `{"a": 1}` (transformers' own tojson: not ASCII-escaped, ", " and ": " separators).
//
// Strings are UTF-8 and shared, not copied (a message's content travels through a template
// many times); lengths, indexes and slices count code points, as Python's do.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace colony::api::jinja {

class Value;
using List = std::vector<Value>;
// A dict in insertion order (Python's); keys are strings, as JSON's and the templates' are.
using Dict = std::vector<std::pair<std::string, Value>>;

// Positional and keyword arguments of a call, a filter or a test.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using Function = std::function<Result<Value>(Args&)>;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kFunction
  };

  Value() = default;  // undefined
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value FromList(List l);
  // A tuple: a list that prints as Python prints a tuple, "(1, 2)".
  static Value FromTuple(List l);
  // What Jinja's select, reject, map, unique, reverse and items filters give: a generator, which
  // loops, joins and filters read like a list but which is always true, has no length, cannot
  // be indexed and prints as "<generator object>" (a template that does any of these with one
  // gets what it gets under Jinja).
  static Value Generator(List l);
  static Value FromDict(Dict d);
  // namespace(): the one mutable value (`{% set ns.x = ... %}`).
  static Value Namespace(Dict d);
  static Value FromFunction(Function f);

  Kind kind() const { return kind_; }
  bool undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_mapping() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }

  bool is_tuple() const { return kind_ == Kind::kList && b_; }
  bool is_generator() const { return kind_ == Kind::kList && generator_; }
  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  // An int or a float as a double.
  double as_number() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : f_; }
  const std::string& as_string() const { return *s_; }
  const List& as_list() const { return *l_; }
  const Dict& as_dict() const { return *d_; }
  Dict& namespace_dict() const { return *d_; }
  const Function& as_function() const { return *fn_; }

  // Python's truth: empty strings, lists and dicts, zero, None and undefined are false.
  bool Truthy() const;
  // The member of a dict (or namespace) named `key`; undefined when there is none or when this
  // is not a mapping.
  Value Member(std::string_view key) const;
  // str(): strings as they are, undefined as "", everything else as Python prints it.
  std::string Str() const;
  // repr(): strings quoted as Python quotes them, undefined as "Undefined" (Jinja in a list).
  std::string Repr() const;
  // json.dumps(ensure_ascii=False, indent=indent, sort_keys=sort_keys); InvalidArgument for
  // undefined and functions. `indent` < 0: on one line.
  Result<std::string> Json(int indent = -1, bool sort_keys = false) const;
  // A short name of the kind, for errors ("string", "list", ...).
  std::string_view TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;  // a boolean's value; a list's "is a tuple"
  bool generator_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<const List> l_;
  std::shared_ptr<Dict> d_;
  std::shared_ptr<const Function> fn_;
};

// Python's ==: 1 == 1.0, lists and dicts element by element, undefined equal only to undefined.
bool Equal(const Value& a, const Value& b);
// Python's <, for numbers, strings and lists; InvalidArgument for other kinds.
Result<bool> Less(const Value& a, const Value& b);

// The code points of UTF-8 text (each byte of a malformed sequence stands for itself, as Python's
// surrogateescape has it, so that text round-trips), and back.
std::u32string DecodeUtf8(std::string_view s);
std::string EncodeUtf8(std::u32string_view s);
// Python's str.isspace() for one code point.
bool IsSpace(char32_t c);

}  // namespace colony::api::jinja
