// Jinja's filters, tests and globals and Python's string and dict methods, with Python's
// results (checked against Jinja itself by tests/api/jinja_test.cpp's reference renderings).
#include "api/jinja_builtins.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>
#include <optional>

namespace colony::api::jinja {

namespace {

constexpr std::array<std::string_view, 38> kFilters = {
    "abs",     "attr",    "capitalize", "count",  "d",      "default",    "dictsort", "e",
    "escape",  "first",   "float",      "indent", "int",    "items",      "join",     "last",
    "length",  "list",    "lower",      "map",    "max",    "min",        "reject",   "rejectattr",
    "replace", "reverse", "round",      "safe",   "select", "selectattr", "sort",     "string",
    "sum",     "title",   "tojson",     "trim",   "unique", "upper"};

constexpr std::array<std::string_view, 34> kTests = {
    "defined", "undefined", "none",        "boolean", "true",     "false",    "integer",
    "float",   "number",    "string",      "mapping", "iterable", "sequence", "callable",
    "odd",     "even",      "divisibleby", "eq",      "equalto",  "==",       "ne",
    "!=",      "lt",        "<",           "le",      "<=",       "gt",       ">",
    "ge",      ">=",        "in",          "sameas",  "lower",    "upper"};

Status ArgError(std::string_view what, std::string_view why) {
  return InvalidArgument(fmt::format("{}: {}", what, why));
}

// The argument at `index` or named `name`; undefined when neither was given.
Value Arg(const Args& args, size_t index, std::string_view name) {
  if (index < args.positional.size()) return args.positional[index];
  for (const auto& [k, v] : args.keyword) {
    if (k == name) return v;
  }
  return {};
}

Status CheckArgs(const Args& args, std::string_view what, size_t max_positional,
                 std::initializer_list<std::string_view> names) {
  if (args.positional.size() > max_positional) {
    return ArgError(what, fmt::format("takes at most {} arguments, {} given", max_positional,
                                      args.positional.size()));
  }
  for (const auto& [k, v] : args.keyword) {
    if (std::find(names.begin(), names.end(), k) == names.end()) {
      return ArgError(what, fmt::format("has no argument '{}'", k));
    }
  }
  return Status::Ok();
}

Result<std::string> StringArg(const Args& args, size_t index, std::string_view name,
                              std::string_view what, std::string fallback) {
  const Value v = Arg(args, index, name);
  if (v.undefined() || v.is_none()) return fallback;
  if (!v.is_string()) {
    return ArgError(what, fmt::format("'{}' must be a string, not a {}", name, v.TypeName()));
  }
  return v.as_string();
}

Status CheckString(const std::string& s, const Budget& budget, std::string_view what) {
  if (s.size() > budget.max_string_bytes) {
    return ResourceExhausted(
        fmt::format("{}: a string of {} bytes is over the template's limit "
                    "({} bytes)",
                    what, s.size(), budget.max_string_bytes));
  }
  return Status::Ok();
}

Status CheckList(size_t n, const Budget& budget, std::string_view what) {
  if (n > budget.max_list_items) {
    return ResourceExhausted(fmt::format("{}: a list of {} items is over the template's limit ({})",
                                         what, n, budget.max_list_items));
  }
  return Status::Ok();
}

// Python's strip() family: `chars` none strips whitespace.
std::string StripChars(const std::string& s, const Value& chars, bool left, bool right) {
  const std::u32string u = DecodeUtf8(s);
  const std::u32string set = chars.is_string() ? DecodeUtf8(chars.as_string()) : U"";
  const auto strip = [&](char32_t c) {
    return chars.is_string() ? set.find(c) != std::u32string::npos : IsSpace(c);
  };
  size_t b = 0;
  size_t e = u.size();
  while (left && b < e && strip(u[b])) ++b;
  while (right && e > b && strip(u[e - 1])) --e;
  return EncodeUtf8(std::u32string_view(u).substr(b, e - b));
}

// Python's case mapping for the scripts with case that chat text mostly meets: ASCII, Latin-1,
// Latin Extended-A, Greek and Cyrillic (including the mappings that change length: "ß" is "SS"
// in upper case). Other scripts' letters are left as they are (most have no case).
void AppendUpper(char32_t c, std::u32string& out) {
  const auto pair_upper = [](char32_t x, bool even_upper) {
    return ((x % 2 == 0) == even_upper) ? x : x - 1;
  };
  if (c >= 'a' && c <= 'z') {
    c -= 32;
  } else if (c == 0xdf) {
    out += U"SS";
    return;
  } else if (c == 0xb5) {
    c = 0x39c;
  } else if (c >= 0xe0 && c <= 0xfe && c != 0xf7) {
    c -= 32;
  } else if (c == 0xff) {
    c = 0x178;
  } else if ((c >= 0x100 && c <= 0x12f) || (c >= 0x132 && c <= 0x137) ||
             (c >= 0x14a && c <= 0x177)) {
    c = pair_upper(c, true);
  } else if (c == 0x131) {
    c = 'I';
  } else if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) {
    c = pair_upper(c, false);
  } else if (c == 0x149) {
    out += U"\u02bcN";
    return;
  } else if (c == 0x17f) {
    c = 'S';
  } else if (c >= 0x3b1 && c <= 0x3cb && c != 0x3c2) {
    c -= 32;
  } else if (c == 0x3c2) {
    c = 0x3a3;
  } else if (c == 0x3ac) {
    c = 0x386;
  } else if (c >= 0x3ad && c <= 0x3af) {
    c -= 37;
  } else if (c == 0x3cc) {
    c = 0x38c;
  } else if (c == 0x3cd || c == 0x3ce) {
    c -= 63;
  } else if (c >= 0x430 && c <= 0x44f) {
    c -= 32;
  } else if (c >= 0x450 && c <= 0x45f) {
    c -= 80;
  } else if ((c >= 0x460 && c <= 0x481) || (c >= 0x48a && c <= 0x4bf)) {
    c = pair_upper(c, true);
  }
  out += c;
}

void AppendLower(char32_t c, std::u32string& out) {
  const auto pair_lower = [](char32_t x, bool even_upper) {
    return ((x % 2 == 0) == even_upper) ? x + 1 : x;
  };
  if (c >= 'A' && c <= 'Z') {
    c += 32;
  } else if (c >= 0xc0 && c <= 0xde && c != 0xd7) {
    c += 32;
  } else if (c == 0x130) {
    out += U"i\u0307";
    return;
  } else if ((c >= 0x100 && c <= 0x12f) || (c >= 0x132 && c <= 0x137) ||
             (c >= 0x14a && c <= 0x177)) {
    c = pair_lower(c, true);
  } else if (c == 0x178) {
    c = 0xff;
  } else if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) {
    c = pair_lower(c, false);
  } else if ((c >= 0x391 && c <= 0x3ab && c != 0x3a2)) {
    c += 32;
  } else if (c == 0x386) {
    c = 0x3ac;
  } else if (c >= 0x388 && c <= 0x38a) {
    c += 37;
  } else if (c == 0x38c) {
    c = 0x3cc;
  } else if (c == 0x38e || c == 0x38f) {
    c += 63;
  } else if (c >= 0x410 && c <= 0x42f) {
    c += 32;
  } else if (c >= 0x400 && c <= 0x40f) {
    c += 80;
  } else if ((c >= 0x460 && c <= 0x481) || (c >= 0x48a && c <= 0x4bf)) {
    c = pair_lower(c, true);
  }
  out += c;
}

std::u32string Upper(std::u32string_view s) {
  std::u32string out;
  for (char32_t c : s) AppendUpper(c, out);
  return out;
}

// A lower-case letter (its upper case differs), an upper-case one, either (Python's "cased").
bool IsLowerCase(char32_t c) {
  std::u32string up;
  AppendUpper(c, up);
  return up.size() != 1 || up[0] != c;
}
bool IsUpperCase(char32_t c) {
  std::u32string low;
  AppendLower(c, low);
  return low.size() != 1 || low[0] != c;
}
bool IsCased(char32_t c) { return IsLowerCase(c) || IsUpperCase(c); }

std::u32string Lower(std::u32string_view s) {
  std::u32string out;
  for (size_t i = 0; i < s.size(); ++i) {
    // Python's Final_Sigma: a capital sigma after a letter and not before one is final.
    if (s[i] == 0x3a3 && i > 0 && IsCased(s[i - 1]) && (i + 1 == s.size() || !IsCased(s[i + 1]))) {
      out += static_cast<char32_t>(0x3c2);
      continue;
    }
    AppendLower(s[i], out);
  }
  return out;
}

std::string MapCase(const std::string& s, std::u32string (*f)(std::u32string_view)) {
  return EncodeUtf8(f(DecodeUtf8(s)));
}

// The first character upper, the rest lower.
std::string Capitalize(const std::string& s) {
  const std::u32string u = DecodeUtf8(s);
  if (u.empty()) return {};
  return EncodeUtf8(Upper(std::u32string_view(u).substr(0, 1)) +
                    Lower(std::u32string_view(u).substr(1)));
}

// Jinja's title: each word's first letter upper, the rest lower (words split at spaces,
// hyphens and brackets).
std::string Title(const std::string& s) {
  const std::u32string u = DecodeUtf8(s);
  std::u32string out;
  bool start = true;
  for (char32_t c : u) {
    if (IsSpace(c) || c == '-' || c == '(' || c == '[' || c == '{' || c == '<') {
      start = true;
      out += c;
      continue;
    }
    if (start) {
      AppendUpper(c, out);
    } else {
      AppendLower(c, out);
    }
    start = false;
  }
  return EncodeUtf8(out);
}

// Python's str.title(): a cased letter after an uncased character upper, other letters lower
// ("a-b_c d" is "A-B_C D"; Jinja's title filter splits at spaces and hyphens only).
std::string PyTitle(const std::string& s) {
  std::u32string out;
  bool after_cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    const bool cased = IsCased(c);
    if (!cased) {
      out += c;
    } else if (after_cased) {
      AppendLower(c, out);
    } else {
      AppendUpper(c, out);
    }
    after_cased = cased;
  }
  return EncodeUtf8(out);
}

Result<std::string> Replace(const std::string& s, const std::string& from, const std::string& to,
                            int64_t count, const Budget& budget) {
  std::string out;
  size_t pos = 0;
  int64_t done = 0;
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    const std::u32string u = DecodeUtf8(s);
    for (char32_t c : u) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out += EncodeUtf8(std::u32string(1, c));
      if (out.size() > budget.max_string_bytes) break;
    }
    if (count < 0 || done < count) out += to;
  } else {
    while (count < 0 || done < count) {
      const size_t at = s.find(from, pos);
      if (at == std::string::npos) break;
      out.append(s, pos, at - pos);
      out += to;
      pos = at + from.size();
      ++done;
      if (out.size() > budget.max_string_bytes) break;
    }
    out.append(s, pos);
  }
  COLONY_RETURN_IF_ERROR(CheckString(out, budget, "replace"));
  return out;
}

Result<Value> Split(const std::string& s, const Value& sep, const Value& maxsplit_v,
                    const Budget& budget) {
  const int64_t maxsplit = maxsplit_v.kind() == Value::Kind::kInt ? maxsplit_v.as_int() : -1;
  List out;
  if (sep.is_string()) {
    if (sep.as_string().empty()) return InvalidArgument("split: empty separator");
    size_t pos = 0;
    int64_t n = 0;
    while (maxsplit < 0 || n < maxsplit) {
      const size_t at = s.find(sep.as_string(), pos);
      if (at == std::string::npos) break;
      out.push_back(Value::String(s.substr(pos, at - pos)));
      pos = at + sep.as_string().size();
      ++n;
      COLONY_RETURN_IF_ERROR(CheckList(out.size(), budget, "split"));
    }
    out.push_back(Value::String(s.substr(pos)));
    return Value::FromList(std::move(out));
  }
  const std::u32string u = DecodeUtf8(s);
  size_t i = 0;
  int64_t n = 0;
  while (true) {
    while (i < u.size() && IsSpace(u[i])) ++i;
    if (i >= u.size()) break;
    if (maxsplit >= 0 && n >= maxsplit) {
      // Python keeps the rest as it is, trailing whitespace included.
      out.push_back(Value::String(EncodeUtf8(std::u32string_view(u).substr(i))));
      break;
    }
    size_t e = i;
    while (e < u.size() && !IsSpace(u[e])) ++e;
    out.push_back(Value::String(EncodeUtf8(std::u32string_view(u).substr(i, e - i))));
    ++n;
    COLONY_RETURN_IF_ERROR(CheckList(out.size(), budget, "split"));
    i = e;
  }
  return Value::FromList(std::move(out));
}

bool AffixMatch(const std::string& s, const Value& affix, bool prefix) {
  const auto one = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0
                  : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_string()) return one(affix.as_string());
  if (affix.kind() == Value::Kind::kList) {
    for (const Value& a : affix.as_list()) {
      if (a.is_string() && one(a.as_string())) return true;
    }
  }
  return false;
}

Value Bound(Function f) { return Value::FromFunction(std::move(f)); }

Value StringMethod(const Value& self, std::string_view name, const Budget& budget) {
  const std::string s = self.as_string();
  const std::string what(name);
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip";
    const bool right = name != "lstrip";
    return Bound([s, left, right, what](Args& a) -> Result<Value> {
      COLONY_RETURN_IF_ERROR(CheckArgs(a, what, 1, {}));
      return Value::String(StripChars(s, Arg(a, 0, "chars"), left, right));
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    return Bound([s, what](Args& a) -> Result<Value> {
      COLONY_RETURN_IF_ERROR(CheckArgs(a, what, 0, {}));
      if (what == "upper") return Value::String(MapCase(s, Upper));
      if (what == "lower") return Value::String(MapCase(s, Lower));
      if (what == "title") return Value::String(PyTitle(s));
      return Value::String(Capitalize(s));
    });
  }
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    return Bound([s, prefix, what](Args& a) -> Result<Value> {
      COLONY_RETURN_IF_ERROR(CheckArgs(a, what, 1, {}));
      return Value::Bool(AffixMatch(s, Arg(a, 0, ""), prefix));
    });
  }
  if (name == "split") {
    return Bound([s, budget](Args& a) -> Result<Value> {
      COLONY_RETURN_IF_ERROR(CheckArgs(a, "split", 2, {"sep", "maxsplit"}));
      return Split(s, Arg(a, 0, "sep"), Arg(a, 1, "maxsplit"), budget);
    });
  }
  if (name == "replace") {
    return Bound([s, budget](Args& a) -> Result<Value> {
      COLONY_RETURN_IF_ERROR(CheckArgs(a, "replace", 3, {}));
      const Value from = Arg(a, 0, "");
      const Value to = Arg(a, 1, "");
      const Value count = Arg(a, 2, "");
      if (!from.is_string() || !to.is_string()) {
        return InvalidArgument("replace: takes two strings");
      }
      COLONY_ASSIGN_OR_RETURN(
          std::string out,
          Replace(s, from.as_string(), to.as_string(),
                  count.kind() == Value::Kind::kInt ? count.as_int() : -1, budget));
      return Value::String(std::move(out));
    });
  }
  if (name == "find" || name == "count") {
    const bool find = name == "find";
    return Bound([s, find, what](Args& a) -> Result<Value> {
      COLONY_RETURN_IF_ERROR(CheckArgs(a, what, 1, {}));
      const Value sub = Arg(a, 0, "");
      if (!sub.is_string()) return InvalidArgument(what + ": takes a string");
      if (find) {
        const size_t at = s.find(sub.as_string());
        if (at == std::string::npos) return Value::Int(-1);
        return Value::Int(
            static_cast<int64_t>(DecodeUtf8(std::string_view(s).substr(0, at)).size()));
      }
      if (sub.as_string().empty()) {
        return Value::Int(static_cast<int64_t>(DecodeUtf8(s).size()) + 1);
      }
      int64_t n = 0;
      for (size_t at = s.find(sub.as_string()); at != std::string::npos;
           at = s.find(sub.as_string(), at + sub.as_string().size())) {
        ++n;
      }
      return Value::Int(n);
    });
  }
  if (name == "join") {
    return Bound([s, budget](Args& a) -> Result<Value> {
      COLONY_RETURN_IF_ERROR(CheckArgs(a, "join", 1, {}));
      COLONY_ASSIGN_OR_RETURN(List items, Iterate(Arg(a, 0, "")));
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].is_string()) {
          return InvalidArgument(
              fmt::format("join: item {} is a {}, not a string", i, items[i].TypeName()));
        }
        if (i > 0) out += s;
        out += items[i].as_string();
        COLONY_RETURN_IF_ERROR(CheckString(out, budget, "join"));
      }
      return Value::String(std::move(out));
    });
  }
  return {};
}

Value DictMethod(const Value& self, std::string_view name) {
  if (name == "items" || name == "keys" || name == "values") {
    const std::string what(name);
    return Bound([self, what](Args& a) -> Result<Value> {
      COLONY_RETURN_IF_ERROR(CheckArgs(a, what, 0, {}));
      List out;
      for (const auto& [k, v] : self.as_dict()) {
        if (what == "items") {
          out.push_back(Value::FromTuple({Value::String(k), v}));
        } else {
          out.push_back(what == "keys" ? Value::String(k) : v);
        }
      }
      return Value::FromList(std::move(out));
    });
  }
  if (name == "get") {
    return Bound([self](Args& a) -> Result<Value> {
      COLONY_RETURN_IF_ERROR(CheckArgs(a, "get", 2, {}));
      const Value key = Arg(a, 0, "");
      if (key.is_string()) {
        for (const auto& [k, v] : self.as_dict()) {
          if (k == key.as_string()) return v;
        }
      }
      const Value fallback = Arg(a, 1, "");
      return fallback.undefined() ? Value::None() : fallback;
    });
  }
  return {};
}

Result<int64_t> ToInt(const Value& v, std::string_view what) {
  if (v.kind() == Value::Kind::kInt) return v.as_int();
  if (v.kind() == Value::Kind::kBool) return v.as_bool() ? 1 : 0;
  return InvalidArgument(fmt::format("{}: expected an integer, not a {}", what, v.TypeName()));
}

// Python's // and % on integers: rounding toward negative infinity.
int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Status Overflow(std::string_view op) {
  return InvalidArgument(fmt::format("'{}' overflows 64-bit integers", op));
}

Result<Value> IntPower(int64_t x, int64_t y) {
  if (x == 0 || x == 1) return Value::Int(y == 0 ? 1 : x);
  if (x == -1) return Value::Int(y % 2 == 0 ? 1 : -1);
  int64_t r = 1;
  for (int64_t i = 0; i < y; ++i) {  // |x| >= 2: at most 63 rounds before overflowing
    if (__builtin_mul_overflow(r, x, &r)) return Overflow("**");
  }
  return Value::Int(r);
}

Result<Value> Repeat(const Value& seq, int64_t n, const Budget& budget) {
  const auto list = [&](List l) {
    return seq.is_tuple() ? Value::FromTuple(std::move(l)) : Value::FromList(std::move(l));
  };
  if (n <= 0) return seq.is_string() ? Value::String("") : list({});
  if (seq.is_string()) {
    const size_t total =
        seq.as_string().size() * static_cast<size_t>(std::min<int64_t>(n, 1 << 30));
    if (total > budget.max_string_bytes || n >= (1 << 30)) {
      return ResourceExhausted(
          fmt::format("'*': a string of {} x {} bytes is over the template's "
                      "limit ({} bytes)",
                      n, seq.as_string().size(), budget.max_string_bytes));
    }
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value::String(std::move(out));
  }
  const size_t total = seq.as_list().size() * static_cast<size_t>(std::min<int64_t>(n, 1 << 30));
  COLONY_RETURN_IF_ERROR(
      CheckList(n >= (1 << 30) ? budget.max_list_items + 1 : total, budget, "'*'"));
  List out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
  return list(std::move(out));
}

// Jinja's attribute argument of map, sort, sum...: "a.b.0" is item a, its item b, its item 0.
Value AttributePath(const Value& v, const Value& path) {
  if (!path.is_string()) return path.kind() == Value::Kind::kInt ? Item(v, path) : v;
  Value out = v;
  size_t pos = 0;
  const std::string& p = path.as_string();
  while (true) {
    const size_t dot = p.find('.', pos);
    const std::string part =
        p.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    int64_t index = 0;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), index);
    out = (ec == std::errc() && end == part.data() + part.size()) ? Item(out, Value::Int(index))
                                                                  : Item(out, Value::String(part));
    if (dot == std::string::npos) return out;
    pos = dot + 1;
  }
}

// Python's hashable: lists and dicts are not, nor tuples holding one.
bool Hashable(const Value& v) {
  if (v.is_mapping()) return false;
  if (v.kind() != Value::Kind::kList || v.is_generator()) return true;
  if (!v.is_tuple()) return false;
  return std::all_of(v.as_list().begin(), v.as_list().end(), Hashable);
}

// An attribute of an undefined item fails, as in Jinja.
Status CheckDefined(const List& items, const Value& attribute, std::string_view what) {
  if (attribute.undefined() || attribute.is_none()) return Status::Ok();
  for (const Value& item : items) {
    if (item.undefined()) {
      return InvalidArgument(
          fmt::format("{}: an undefined item has no attribute {}", what, attribute.Repr()));
    }
  }
  return Status::Ok();
}

// What sort, unique, min and max compare: the attribute's value, a string in lower case unless
// `case_sensitive` (Jinja's default is not).
Value SortKey(const Value& v, const Value& attribute, bool case_sensitive) {
  Value key = attribute.undefined() || attribute.is_none() ? v : AttributePath(v, attribute);
  if (key.is_string() && !case_sensitive) return Value::String(MapCase(key.as_string(), Lower));
  return key;
}

Result<Value> Aggregate(std::string_view name, const Value& operand, Args& args,
                        const Budget& budget) {
  COLONY_RETURN_IF_ERROR(CheckArgs(args, name, 2, {"attribute", "start", "case_sensitive"}));
  COLONY_ASSIGN_OR_RETURN(List items, Iterate(operand));
  if (name == "sum") {  // sum(attribute=None, start=0)
    const Value attribute = Arg(args, 0, "attribute");
    COLONY_RETURN_IF_ERROR(CheckDefined(items, attribute, name));
    Value total = Arg(args, 1, "start");
    if (total.undefined()) total = Value::Int(0);
    for (const Value& v : items) {
      COLONY_ASSIGN_OR_RETURN(total, Arithmetic("+", total, SortKey(v, attribute, true), budget));
    }
    return total;
  }
  // min / max (case_sensitive=False, attribute=None): the first of the smallest or largest.
  const bool case_sensitive = Arg(args, 0, "case_sensitive").Truthy();
  const Value attribute = Arg(args, 1, "attribute");
  COLONY_RETURN_IF_ERROR(CheckDefined(items, attribute, name));
  if (items.empty()) return Value();
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const Value a = SortKey(items[i], attribute, case_sensitive);
    const Value b = SortKey(items[best], attribute, case_sensitive);
    COLONY_ASSIGN_OR_RETURN(bool better, name == "min" ? Less(a, b) : Less(b, a));
    if (better) best = i;
  }
  return items[best];
}

// Jinja's indent: every line but the first gets `pad`, blank lines only with `blank`; the first
// line too with `first` (blank or not); line breaks become "\n".
std::string Indent(const std::string& s, const std::string& pad, bool first, bool blank) {
  // Python's (s + "\n").splitlines(): lines end at \n, \r, \r\n and the other line breaks.
  const std::u32string u = DecodeUtf8(s) + U"\n";
  std::vector<std::string> lines;
  std::u32string line;
  for (size_t i = 0; i < u.size(); ++i) {
    const char32_t c = u[i];
    if (c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || (c >= 0x1c && c <= 0x1e) || c == 0x85 ||
        c == 0x2028 || c == 0x2029) {
      if (c == '\r' && i + 1 < u.size() && u[i + 1] == '\n') ++i;
      lines.push_back(EncodeUtf8(line));
      line.clear();
    } else {
      line += c;
    }
  }
  std::string out = lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    out += '\n';
    if (blank || !lines[i].empty()) out += pad;
    out += lines[i];
  }
  return first ? pad + out : out;
}

Result<Value> SortItems(List items, Args& args, std::string_view what) {
  const bool reverse = Arg(args, 0, "reverse").Truthy();
  const bool case_sensitive = Arg(args, 1, "case_sensitive").Truthy();
  const Value attribute = Arg(args, 2, "attribute");
  COLONY_RETURN_IF_ERROR(CheckDefined(items, attribute, what));
  Status error = Status::Ok();
  const auto key = [&](const Value& v) { return SortKey(v, attribute, case_sensitive); };
  // With an attribute Jinja compares lists of keys, which are equal before they are compared
  // (two undefined keys too).
  const bool by_attribute = !attribute.undefined() && !attribute.is_none();
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    if (by_attribute && Equal(key(a), key(b))) return false;
    Result<bool> less = reverse ? Less(key(b), key(a)) : Less(key(a), key(b));
    if (!less.ok()) {
      error = less.status().WithContext(what);
      return false;
    }
    return *less;
  });
  COLONY_RETURN_IF_ERROR(error);
  return Value::FromList(std::move(items));
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

bool IsFilter(std::string_view name) {
  return std::find(kFilters.begin(), kFilters.end(), name) != kFilters.end();
}

bool IsTest(std::string_view name) {
  return std::find(kTests.begin(), kTests.end(), name) != kTests.end();
}

Result<List> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return List{};
    case Value::Kind::kList:
      return v.as_list();
    case Value::Kind::kDict: {
      List keys;
      for (const auto& [k, item] : v.as_dict()) keys.push_back(Value::String(k));
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      for (char32_t c : DecodeUtf8(v.as_string())) {
        chars.push_back(Value::String(EncodeUtf8(std::u32string(1, c))));
      }
      return chars;
    }
    default:
      return InvalidArgument(fmt::format("a {} cannot be iterated", v.TypeName()));
  }
}

Value Attribute(const Value& obj, std::string_view name, const Budget& budget) {
  if (obj.is_string()) return StringMethod(obj, name, budget);
  if (obj.kind() == Value::Kind::kList && (name == "count" || name == "index")) {
    const bool count = name == "count";
    return Bound([obj, count](Args& a) -> Result<Value> {
      COLONY_RETURN_IF_ERROR(CheckArgs(a, count ? "count" : "index", 1, {}));
      const Value x = Arg(a, 0, "");
      int64_t n = 0;
      for (size_t i = 0; i < obj.as_list().size(); ++i) {
        if (!Equal(obj.as_list()[i], x)) continue;
        if (!count) return Value::Int(static_cast<int64_t>(i));
        ++n;
      }
      if (!count) return InvalidArgument(fmt::format("index: {} is not in the list", x.Repr()));
      return Value::Int(n);
    });
  }
  if (obj.kind() == Value::Kind::kDict) {
    Value method = DictMethod(obj, name);
    if (!method.undefined()) return method;
  }
  return obj.Member(name);
}

Value Item(const Value& obj, const Value& key) {
  if (obj.is_mapping()) return key.is_string() ? obj.Member(key.as_string()) : Value();
  if (key.kind() != Value::Kind::kInt || obj.is_generator()) return {};
  int64_t i = key.as_int();
  if (obj.kind() == Value::Kind::kList) {
    const auto n = static_cast<int64_t>(obj.as_list().size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return {};
    return obj.as_list()[static_cast<size_t>(i)];
  }
  if (obj.is_string()) {
    const std::u32string u = DecodeUtf8(obj.as_string());
    const auto n = static_cast<int64_t>(u.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return {};
    return Value::String(EncodeUtf8(std::u32string(1, u[static_cast<size_t>(i)])));
  }
  return {};
}

Result<Value> Slice(const Value& obj, const Value& start_v, const Value& stop_v,
                    const Value& step_v) {
  const auto bound = [](const Value& v) -> Result<std::optional<int64_t>> {
    if (v.undefined() || v.is_none()) return std::optional<int64_t>();
    if (v.kind() != Value::Kind::kInt) {
      return InvalidArgument(fmt::format("slice indices must be integers, not a {}", v.TypeName()));
    }
    return std::optional<int64_t>(v.as_int());
  };
  COLONY_ASSIGN_OR_RETURN(auto start, bound(start_v));
  COLONY_ASSIGN_OR_RETURN(auto stop, bound(stop_v));
  COLONY_ASSIGN_OR_RETURN(auto step_opt, bound(step_v));
  const int64_t step = step_opt.value_or(1);
  if (step == 0) return InvalidArgument("slice step cannot be zero");
  std::u32string chars;
  int64_t n = 0;
  if (obj.is_string()) {
    chars = DecodeUtf8(obj.as_string());
    n = static_cast<int64_t>(chars.size());
  } else if (obj.kind() == Value::Kind::kList && !obj.is_generator()) {
    n = static_cast<int64_t>(obj.as_list().size());
  } else if (obj.undefined() || obj.is_generator()) {
    return Value();
  } else {
    return InvalidArgument(fmt::format("a {} cannot be sliced", obj.TypeName()));
  }
  // Python's slice.indices().
  const auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t x = *v;
    if (x < 0) x += n;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(start, step > 0 ? 0 : n - 1);
  const int64_t e = clamp(stop, step > 0 ? n : -1);
  std::vector<size_t> picked;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) picked.push_back(static_cast<size_t>(i));
  if (obj.is_string()) {
    std::u32string out;
    for (size_t i : picked) out += chars[i];
    return Value::String(EncodeUtf8(out));
  }
  List out;
  for (size_t i : picked) out.push_back(obj.as_list()[i]);
  return Value::FromList(std::move(out));
}

Result<Value> Concat(const Value& a, const Value& b, const Budget& budget) {
  std::string out = a.Str() + b.Str();
  COLONY_RETURN_IF_ERROR(CheckString(out, budget, "'~'"));
  return Value::String(std::move(out));
}

Result<Value> Arithmetic(std::string_view op, const Value& a_in, const Value& b_in,
                         const Budget& budget) {
  // Python's booleans are integers.
  const auto num = [](const Value& v) {
    return v.kind() == Value::Kind::kBool ? Value::Int(v.as_bool() ? 1 : 0) : v;
  };
  const Value a = num(a_in);
  const Value b = num(b_in);
  const auto unsupported = [&]() {
    return InvalidArgument(fmt::format("unsupported operand types for {}: a {} and a {}", op,
                                       a_in.TypeName(), b_in.TypeName()));
  };
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Concat(a, b, budget);
    // A list and a list, or a tuple and a tuple (Python adds no list to a tuple).
    if (a.kind() == Value::Kind::kList && b.kind() == Value::Kind::kList &&
        a.is_tuple() == b.is_tuple() && !a.is_generator() && !b.is_generator()) {
      COLONY_RETURN_IF_ERROR(CheckList(a.as_list().size() + b.as_list().size(), budget, "'+'"));
      List out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      return a.is_tuple() ? Value::FromTuple(std::move(out)) : Value::FromList(std::move(out));
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.kind() == Value::Kind::kList) && b.kind() == Value::Kind::kInt) {
      return Repeat(a, b.as_int(), budget);
    }
    if ((b.is_string() || b.kind() == Value::Kind::kList) && a.kind() == Value::Kind::kInt) {
      return Repeat(b, a.as_int(), budget);
    }
  }
  if (op == "%" && a.is_string()) return PercentFormat(a.as_string(), b, budget);
  if (!a.is_number() || !b.is_number()) return unsupported();
  if (a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt && op != "/") {
    const int64_t x = a.as_int();
    const int64_t y = b.as_int();
    int64_t r = 0;
    if (op == "+")
      return __builtin_add_overflow(x, y, &r) ? Overflow(op) : Result<Value>(Value::Int(r));
    if (op == "-")
      return __builtin_sub_overflow(x, y, &r) ? Overflow(op) : Result<Value>(Value::Int(r));
    if (op == "*")
      return __builtin_mul_overflow(x, y, &r) ? Overflow(op) : Result<Value>(Value::Int(r));
    if (op == "//" || op == "%") {
      if (y == 0) return InvalidArgument("integer division or modulo by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) return Overflow(op);
      if (op == "//") return Value::Int(FloorDiv(x, y));
      int64_t m = x % y;  // Python's sign: the divisor's
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::Int(m);
    }
    if (op == "**") {
      if (y < 0) {
        if (x == 0) return InvalidArgument("0.0 cannot be raised to a negative power");
        return Value::Float(std::pow(static_cast<double>(x), static_cast<double>(y)));
      }
      return IntPower(x, y);
    }
  }
  const double x = a.as_number();
  const double y = b.as_number();
  if (op == "+") return Value::Float(x + y);
  if (op == "-") return Value::Float(x - y);
  if (op == "*") return Value::Float(x * y);
  if (op == "/") {
    if (y == 0) return InvalidArgument("division by zero");
    return Value::Float(x / y);
  }
  if (op == "//" || op == "%") {
    if (y == 0) return InvalidArgument("float division or modulo by zero");
    if (op == "//") return Value::Float(std::floor(x / y));
    // Python's float %: the divisor's sign, and a zero signed like it.
    double m = std::fmod(x, y);
    if (m != 0) {
      if ((y < 0) != (m < 0)) m += y;
    } else {
      m = std::copysign(0.0, y);
    }
    return Value::Float(m);
  }
  if (op == "**") {
    if (x == 0 && y < 0) return InvalidArgument("0.0 cannot be raised to a negative power");
    // Python gives a complex number for a negative base and a fractional power.
    if (x < 0 && y != std::floor(y)) return InvalidArgument("'**' would give a complex number");
    const double r = std::pow(x, y);
    if (std::isinf(r) && std::isfinite(x) && std::isfinite(y)) {
      return InvalidArgument("'**': numerical result out of range");
    }
    return Value::Float(r);
  }
  return unsupported();
}

namespace {

// An integer as Python's %d, %x, %X or %o writes it: the sign before the "0x" of '#' (Python's
// octal prefix is "0o"), precision as a least number of digits, '0' padding after the sign.
std::string FormatInt(char conversion, const std::string& flags, int width, int precision,
                      int64_t i) {
  const auto has = [&](char f) { return flags.find(f) != std::string::npos; };
  const uint64_t magnitude = i < 0 ? 0 - static_cast<uint64_t>(i) : static_cast<uint64_t>(i);
  std::string digits = conversion == 'x'   ? fmt::format("{:x}", magnitude)
                       : conversion == 'X' ? fmt::format("{:X}", magnitude)
                       : conversion == 'o' ? fmt::format("{:o}", magnitude)
                                           : std::to_string(magnitude);
  if (precision > static_cast<int>(digits.size())) {
    digits.insert(0, static_cast<size_t>(precision) - digits.size(), '0');
  }
  std::string head = i < 0 ? "-" : has('+') ? "+" : has(' ') ? " " : "";
  if (has('#') && conversion != 'd' && conversion != 'i') {
    head += conversion == 'x' ? "0x" : conversion == 'X' ? "0X" : "0o";
  }
  const size_t length = head.size() + digits.size();
  if (width <= static_cast<int>(length)) return head + digits;
  const size_t pad = static_cast<size_t>(width) - length;
  if (has('-')) return head + digits + std::string(pad, ' ');
  if (has('0')) return head + std::string(pad, '0') + digits;
  return std::string(pad, ' ') + head + digits;
}

// One conversion of Python's printf-style formatting, with its flags, width and precision.
Result<std::string> FormatOne(char conversion, const std::string& flags, int width, int precision,
                              const Value& v) {
  std::string body;
  const bool is_number = v.is_number() || v.kind() == Value::Kind::kBool;
  const auto number = [&]() {
    return v.kind() == Value::Kind::kBool ? (v.as_bool() ? 1.0 : 0.0) : v.as_number();
  };
  switch (conversion) {
    case 's':
    case 'r': {
      std::u32string text = DecodeUtf8(conversion == 's' ? v.Str() : v.Repr());
      if (precision >= 0 && text.size() > static_cast<size_t>(precision)) {
        text.resize(static_cast<size_t>(precision));
      }
      if (width > static_cast<int>(text.size())) {
        const std::u32string pad(static_cast<size_t>(width) - text.size(), U' ');
        text = flags.find('-') != std::string::npos ? text + pad : pad + text;
      }
      return EncodeUtf8(text);
    }
    case 'd':
    case 'i':
    case 'x':
    case 'X':
    case 'o':
    case 'c': {
      if (conversion == 'c' && v.is_string() && DecodeUtf8(v.as_string()).size() == 1) {
        return FormatOne('s', flags, width, -1, v);
      }
      if (!is_number) {
        return InvalidArgument(
            fmt::format("%{} format: a real number is required, not {}", conversion, v.TypeName()));
      }
      if (conversion != 'd' && conversion != 'i' && v.kind() == Value::Kind::kFloat) {
        return InvalidArgument(
            fmt::format("%{} format: an integer is required, not float", conversion));
      }
      const double d = number();
      if (!std::isfinite(d) || std::fabs(d) > 9.2e18) {
        return InvalidArgument("%d format: the number is out of range");
      }
      const auto i = v.kind() == Value::Kind::kInt ? v.as_int() : static_cast<int64_t>(d);
      if (conversion == 'c') {
        if (i < 0 || i > 0x10ffff) return InvalidArgument("%c arg not in range(0x110000)");
        return FormatOne('s', flags, width, -1,
                         Value::String(EncodeUtf8(std::u32string(1, static_cast<char32_t>(i)))));
      }
      return FormatInt(conversion, flags, width, precision, i);
    }
    case 'f':
    case 'F':
    case 'e':
    case 'E':
    case 'g':
    case 'G': {
      if (!is_number) {
        return InvalidArgument(
            fmt::format("%{} format: a real number is required, not {}", conversion, v.TypeName()));
      }
      std::string spec = "%" + flags;
      if (width >= 0) spec += std::to_string(width);
      if (precision >= 0) spec += "." + std::to_string(precision);
      spec += conversion;
      const double d = number();
      const int n = std::snprintf(nullptr, 0, spec.c_str(), d);  // a 1e308 has 309 digits
      std::string out(static_cast<size_t>(std::max(n, 0)) + 1, '\0');
      std::snprintf(out.data(), out.size(), spec.c_str(), d);
      out.resize(static_cast<size_t>(std::max(n, 0)));
      return out;
    }
    default:
      return InvalidArgument(fmt::format("unsupported format character '{}'", conversion));
  }
}

}  // namespace

Result<Value> PercentFormat(const std::string& format, const Value& args, const Budget& budget) {
  // A tuple gives the arguments in order; anything else is the one argument, and a dict (or a
  // list, which Python also takes for a mapping) may be named by %(key)s.
  List positional;
  if (args.is_tuple()) {
    positional = args.as_list();
  } else {
    positional.push_back(args);
  }
  const bool mapping =
      !args.is_tuple() && (args.is_mapping() || args.kind() == Value::Kind::kList ||
                           args.undefined());  // Jinja's undefined has items
  size_t next = 0;
  bool used_key = false;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    if (++i >= format.size()) return InvalidArgument("incomplete format");
    Value value;
    bool have_value = false;
    if (format[i] == '(') {
      const size_t close = format.find(')', i);
      if (close == std::string::npos) return InvalidArgument("incomplete format key");
      if (!args.is_mapping()) return InvalidArgument("format requires a mapping");
      value = args.Member(format.substr(i + 1, close - i - 1));
      if (value.undefined()) {
        return InvalidArgument(
            fmt::format("format key '{}' is missing", format.substr(i + 1, close - i - 1)));
      }
      have_value = true;
      used_key = true;
      i = close + 1;
    }
    std::string flags;
    while (i < format.size() &&
           std::string_view("-+ #0").find(format[i]) != std::string_view::npos) {
      flags += format[i++];
    }
    const auto read_number = [&](int& n) -> Status {
      if (i < format.size() && format[i] == '*')
        return InvalidArgument("'*' widths are not supported");
      while (i < format.size() && format[i] >= '0' && format[i] <= '9') {
        n = (n < 0 ? 0 : n) * 10 + (format[i++] - '0');
        if (n > 256) return InvalidArgument("a format's width or precision is over 256");
      }
      return Status::Ok();
    };
    int width = -1;
    int precision = -1;
    COLONY_RETURN_IF_ERROR(read_number(width));
    if (i < format.size() && format[i] == '.') {
      ++i;
      precision = 0;
      COLONY_RETURN_IF_ERROR(read_number(precision));
    }
    if (i >= format.size()) return InvalidArgument("incomplete format");
    const char conversion = format[i];
    if (conversion == '%') {
      out += '%';
      continue;
    }
    if (!have_value) {
      if (next >= positional.size())
        return InvalidArgument("not enough arguments for format string");
      value = positional[next++];
    }
    COLONY_ASSIGN_OR_RETURN(std::string piece,
                            FormatOne(conversion, flags, width, precision, value));
    out += piece;
    COLONY_RETURN_IF_ERROR(CheckString(out, budget, "'%'"));
  }
  if (next < positional.size() && !mapping && !used_key) {
    return InvalidArgument("not all arguments converted during string formatting");
  }
  return Value::String(std::move(out));
}

Result<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        return InvalidArgument(
            fmt::format("'in <string>' needs a string, not a {}", item.TypeName()));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      return std::any_of(container.as_list().begin(), container.as_list().end(),
                         [&](const Value& v) { return Equal(v, item); });
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      if (!Hashable(item)) {
        return InvalidArgument(fmt::format("'in <dict>': a {} is unhashable", item.TypeName()));
      }
      return item.is_string() && !container.Member(item.as_string()).undefined();
    default:
      return InvalidArgument(fmt::format("'in': a {} is not a container", container.TypeName()));
  }
}

Result<bool> ApplyTest(std::string_view name, const Value& v, Args& args) {
  const Value arg = Arg(args, 0, "");
  if (name == "defined") return !v.undefined();
  if (name == "undefined") return v.undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == Value::Kind::kBool;
  if (name == "true") return v.kind() == Value::Kind::kBool && v.as_bool();
  if (name == "false") return v.kind() == Value::Kind::kBool && !v.as_bool();
  if (name == "integer") return v.kind() == Value::Kind::kInt;
  if (name == "float") return v.kind() == Value::Kind::kFloat;
  if (name == "number") return v.is_number() || v.kind() == Value::Kind::kBool;
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.kind() == Value::Kind::kDict;
  if (name == "iterable") {
    return v.is_string() || v.kind() == Value::Kind::kList || v.kind() == Value::Kind::kDict ||
           v.undefined();
  }
  if (name == "sequence") {  // what has a length and items (Jinja's undefined has both)
    return v.is_string() || (v.kind() == Value::Kind::kList && !v.is_generator()) ||
           v.kind() == Value::Kind::kDict || v.undefined();
  }
  // Jinja's undefined is callable (calling it fails).
  if (name == "callable") return v.kind() == Value::Kind::kFunction || v.undefined();
  if (name == "odd" || name == "even" || name == "divisibleby") {
    // Python's value % 2 == 1, value % 2 == 0, value % num == 0 (floats too).
    const Value divisor = name == "divisibleby" ? arg : Value::Int(2);
    COLONY_ASSIGN_OR_RETURN(Value rest, Arithmetic("%", v, divisor, Budget{1 << 20, 1 << 20}));
    return Equal(rest, Value::Int(name == "odd" ? 1 : 0));
  }
  if (name == "eq" || name == "equalto" || name == "==") return Equal(v, arg);
  if (name == "ne" || name == "!=") return !Equal(v, arg);
  if (name == "lt" || name == "<") return Less(v, arg);
  if (name == "gt" || name == ">") return Less(arg, v);
  if (name == "le" || name == "<=") {
    COLONY_ASSIGN_OR_RETURN(bool greater, Less(arg, v));
    return !greater;
  }
  if (name == "ge" || name == ">=") {
    COLONY_ASSIGN_OR_RETURN(bool less, Less(v, arg));
    return !less;
  }
  if (name == "in") return Contains(arg, v);
  if (name == "sameas") {
    return v.kind() == arg.kind() &&
           (v.kind() == Value::Kind::kNone || v.kind() == Value::Kind::kUndefined ||
            (v.kind() == Value::Kind::kBool && Equal(v, arg)));
  }
  if (name == "lower" || name == "upper") {
    // Python's str(value).islower()/isupper(): some cased letter, and none of the other case.
    bool cased = false;
    for (char32_t c : DecodeUtf8(v.Str())) {
      const bool is_upper = IsUpperCase(c);
      const bool is_lower = IsLowerCase(c);
      if (name == "lower" ? is_upper : is_lower) return false;
      cased = cased || is_upper || is_lower;
    }
    return cased;
  }
  return InvalidArgument(fmt::format("no test named '{}'", name));
}

Result<Value> ApplyFilter(std::string_view name, const Value& v, Args& args, const Budget& budget) {
  const std::string what = fmt::format("filter '{}'", name);
  // Jinja's undefined reads as "" or as empty, but fails where it would be a number or JSON.
  if (v.undefined() && (name == "int" || name == "float" || name == "abs" || name == "round" ||
                        name == "indent" || name == "tojson")) {
    return ArgError(what, "its value is undefined");
  }
  if (name == "safe") return Value::String(v.Str());  // Markup: a string
  if (name == "tojson") {
    COLONY_RETURN_IF_ERROR(
        CheckArgs(args, what, 1, {"indent", "ensure_ascii", "separators", "sort_keys"}));
    const Value indent = Arg(args, 0, "indent");
    if (!indent.undefined() && !indent.is_none() && indent.kind() != Value::Kind::kInt) {
      return ArgError(what, "'indent' must be an integer");
    }
    if (Arg(args, 99, "ensure_ascii").Truthy())
      return ArgError(what, "ensure_ascii is not supported");
    if (!Arg(args, 99, "separators").undefined() && !Arg(args, 99, "separators").is_none()) {
      return ArgError(what, "separators are not supported");
    }
    COLONY_ASSIGN_OR_RETURN(
        std::string out, v.Json(indent.kind() == Value::Kind::kInt
                                    ? static_cast<int>(std::clamp<int64_t>(indent.as_int(), 0, 64))
                                    : -1,
                                Arg(args, 99, "sort_keys").Truthy()));
    COLONY_RETURN_IF_ERROR(CheckString(out, budget, what));
    return Value::String(std::move(out));
  }
  if (name == "default" || name == "d") {
    COLONY_RETURN_IF_ERROR(CheckArgs(args, what, 2, {"default_value", "boolean"}));
    const bool boolean = Arg(args, 1, "boolean").Truthy();
    if (v.undefined() || (boolean && !v.Truthy())) {
      const Value fallback = Arg(args, 0, "default_value");
      return fallback.undefined() ? Value::String("") : fallback;
    }
    return v;
  }
  if (name == "length" || name == "count") {
    COLONY_RETURN_IF_ERROR(CheckArgs(args, what, 0, {}));
    switch (v.kind()) {
      case Value::Kind::kUndefined:
        return Value::Int(0);
      case Value::Kind::kString:
        return Value::Int(static_cast<int64_t>(DecodeUtf8(v.as_string()).size()));
      case Value::Kind::kList:
        if (v.is_generator()) return ArgError(what, "a generator has no length (add |list)");
        return Value::Int(static_cast<int64_t>(v.as_list().size()));
      case Value::Kind::kDict:
        return Value::Int(static_cast<int64_t>(v.as_dict().size()));
      default:
        return ArgError(what, fmt::format("a {} has no length", v.TypeName()));
    }
  }
  if (name == "string") return Value::String(v.Str());
  if (name == "trim") {
    COLONY_RETURN_IF_ERROR(CheckArgs(args, what, 1, {"chars"}));
    return Value::String(StripChars(v.Str(), Arg(args, 0, "chars"), true, true));
  }
  if (name == "upper") return Value::String(MapCase(v.Str(), Upper));
  if (name == "lower") return Value::String(MapCase(v.Str(), Lower));
  if (name == "capitalize") return Value::String(Capitalize(v.Str()));
  if (name == "title") return Value::String(Title(v.Str()));
  if (name == "e" || name == "escape") return Value::String(HtmlEscape(v.Str()));
  if (name == "replace") {
    COLONY_RETURN_IF_ERROR(CheckArgs(args, what, 3, {"old", "new", "count"}));
    COLONY_ASSIGN_OR_RETURN(std::string from, StringArg(args, 0, "old", what, ""));
    COLONY_ASSIGN_OR_RETURN(std::string to, StringArg(args, 1, "new", what, ""));
    const Value count = Arg(args, 2, "count");
    COLONY_ASSIGN_OR_RETURN(
        std::string out, Replace(v.Str(), from, to,
                                 count.kind() == Value::Kind::kInt ? count.as_int() : -1, budget));
    return Value::String(std::move(out));
  }
  if (name == "indent") {
    COLONY_RETURN_IF_ERROR(CheckArgs(args, what, 3, {"width", "first", "blank"}));
    if (!v.is_string() && !v.undefined()) {
      return ArgError(what, fmt::format("takes a string, not a {}", v.TypeName()));
    }
    const Value width = Arg(args, 0, "width");
    std::string pad(4, ' ');
    if (width.kind() == Value::Kind::kInt) {
      pad = std::string(static_cast<size_t>(std::clamp<int64_t>(width.as_int(), 0, 256)), ' ');
    } else if (width.is_string()) {
      pad = width.as_string();
    }
    std::string out =
        Indent(v.Str(), pad, Arg(args, 1, "first").Truthy(), Arg(args, 2, "blank").Truthy());
    COLONY_RETURN_IF_ERROR(CheckString(out, budget, what));
    return Value::String(std::move(out));
  }
  if (name == "int") {
    COLONY_RETURN_IF_ERROR(CheckArgs(args, what, 2, {"default", "base"}));
    const Value fallback = Arg(args, 0, "default");
    const Value def = fallback.undefined() ? Value::Int(0) : fallback;
    if (v.kind() == Value::Kind::kInt) return v;
    if (v.kind() == Value::Kind::kBool) return Value::Int(v.as_bool() ? 1 : 0);
    if (v.kind() == Value::Kind::kFloat) {
      if (!std::isfinite(v.as_number()) || std::fabs(v.as_number()) > 9e18) return def;
      return Value::Int(static_cast<int64_t>(v.as_number()));
    }
    if (v.is_string()) {
      const std::string s = StripChars(v.as_string(), Value(), true, true);
      int64_t i = 0;
      auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), i);
      if (ec == std::errc() && p == s.data() + s.size() && !s.empty()) return Value::Int(i);
      char* end = nullptr;
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(d) && std::fabs(d) < 9e18) {
        return Value::Int(static_cast<int64_t>(d));
      }
    }
    return def;
  }
  if (name == "float") {
    COLONY_RETURN_IF_ERROR(CheckArgs(args, what, 1, {"default"}));
    const Value fallback = Arg(args, 0, "default");
    if (v.is_number()) return Value::Float(v.as_number());
    if (v.kind() == Value::Kind::kBool) return Value::Float(v.as_bool() ? 1 : 0);
    if (v.is_string()) {
      const std::string s = StripChars(v.as_string(), Value(), true, true);
      char* end = nullptr;
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size()) return Value::Float(d);
    }
    return fallback.undefined() ? Value::Float(0) : fallback;
  }
  if (name == "abs") {
    if (v.kind() == Value::Kind::kBool) return Value::Int(v.as_bool() ? 1 : 0);
    if (v.kind() == Value::Kind::kInt) {
      if (v.as_int() == std::numeric_limits<int64_t>::min()) return ArgError(what, "overflow");
      return Value::Int(std::abs(v.as_int()));
    }
    if (v.kind() == Value::Kind::kFloat) return Value::Float(std::fabs(v.as_number()));
    return ArgError(what, fmt::format("a {} has no absolute value", v.TypeName()));
  }
  if (name == "round") {
    COLONY_RETURN_IF_ERROR(CheckArgs(args, what, 2, {"precision", "method"}));
    // Python's round() of an integer (a boolean is one) is that integer.
    if (v.kind() == Value::Kind::kBool) return Value::Int(v.as_bool() ? 1 : 0);
    if (v.kind() == Value::Kind::kInt) return v;
    if (!v.is_number()) return ArgError(what, "takes a number");
    const Value precision = Arg(args, 0, "precision");
    const int64_t p =
        precision.kind() == Value::Kind::kInt ? std::clamp<int64_t>(precision.as_int(), 0, 15) : 0;
    const std::string method =
        Arg(args, 1, "method").is_string() ? Arg(args, 1, "method").as_string() : "common";
    const double scale = std::pow(10.0, static_cast<double>(p));
    const double x = v.as_number() * scale;
    double r = 0;
    if (method == "common") {
      r = std::nearbyint(x);  // Python's round(): halves to even
    } else if (method == "floor") {
      r = std::floor(x);
    } else if (method == "ceil") {
      r = std::ceil(x);
    } else {
      return ArgError(what, "method must be common, floor or ceil");
    }
    return Value::Float(r / scale);
  }
  if (name == "attr") {
    const Value attribute = Arg(args, 0, "name");
    return attribute.is_string() ? Attribute(v, attribute.as_string(), budget) : Value();
  }
  if (name == "items") {
    if (v.undefined()) return Value::Generator({});
    if (v.kind() != Value::Kind::kDict) return ArgError(what, "takes a dict");
    List out;
    for (const auto& [k, item] : v.as_dict())
      out.push_back(Value::FromTuple({Value::String(k), item}));
    return Value::Generator(std::move(out));
  }
  if (name == "dictsort") {
    if (v.kind() != Value::Kind::kDict) return ArgError(what, "takes a dict");
    List out;
    for (const auto& [k, item] : v.as_dict())
      out.push_back(Value::FromTuple({Value::String(k), item}));
    std::stable_sort(out.begin(), out.end(), [](const Value& a, const Value& b) {
      return a.as_list()[0].as_string() < b.as_list()[0].as_string();
    });
    return Value::FromList(std::move(out));
  }
  // The filters of sequences.
  if (name == "join" || name == "first" || name == "last" || name == "list" || name == "reverse" ||
      name == "map" || name == "select" || name == "reject" || name == "selectattr" ||
      name == "rejectattr" || name == "sort" || name == "unique" || name == "min" ||
      name == "max" || name == "sum") {
    if (name == "reverse" && v.is_string()) {
      std::u32string u = DecodeUtf8(v.as_string());
      std::reverse(u.begin(), u.end());
      return Value::String(EncodeUtf8(u));
    }
    if (name == "min" || name == "max" || name == "sum") return Aggregate(name, v, args, budget);
    // map, select and the like go through nothing when given a false value (none, 0, false).
    const bool lazy = name == "map" || name == "select" || name == "reject" ||
                      name == "selectattr" || name == "rejectattr";
    if (lazy && !v.Truthy()) return Value::Generator({});
    COLONY_ASSIGN_OR_RETURN(List items, Iterate(v));
    if (name == "list") return Value::FromList(std::move(items));
    if (name == "first") return items.empty() ? Value() : items.front();
    if (name == "last") return items.empty() ? Value() : items.back();
    if (name == "reverse") {
      std::reverse(items.begin(), items.end());
      // reversed(): an iterator, except of a generator (a list)
      return v.is_generator() ? Value::FromList(std::move(items))
                              : Value::Generator(std::move(items));
    }
    if (name == "sort") {
      COLONY_RETURN_IF_ERROR(CheckArgs(args, what, 3, {"reverse", "case_sensitive", "attribute"}));
      return SortItems(std::move(items), args, what);
    }
    if (name == "unique") {  // unique(case_sensitive=False, attribute=None): first ones kept
      COLONY_RETURN_IF_ERROR(CheckArgs(args, what, 2, {"case_sensitive", "attribute"}));
      const bool case_sensitive = Arg(args, 0, "case_sensitive").Truthy();
      const Value attribute = Arg(args, 1, "attribute");
      COLONY_RETURN_IF_ERROR(CheckDefined(items, attribute, what));
      List out;
      List seen;
      for (const Value& item : items) {
        Value key = SortKey(item, attribute, case_sensitive);
        if (!Hashable(key))
          return ArgError(what, fmt::format("a {} is unhashable", key.TypeName()));
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& o) { return Equal(o, key); })) {
          seen.push_back(std::move(key));
          out.push_back(item);
        }
      }
      return Value::Generator(std::move(out));
    }
    if (name == "join") {
      COLONY_RETURN_IF_ERROR(CheckArgs(args, what, 2, {"d", "attribute"}));
      COLONY_ASSIGN_OR_RETURN(std::string sep, StringArg(args, 0, "d", what, ""));
      const Value attribute = Arg(args, 1, "attribute");
      COLONY_RETURN_IF_ERROR(CheckDefined(items, attribute, what));
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += sep;
        out += (attribute.undefined() ? items[i] : AttributePath(items[i], attribute)).Str();
        COLONY_RETURN_IF_ERROR(CheckString(out, budget, what));
      }
      return Value::String(std::move(out));
    }
    if (name == "map") {
      List out;
      const Value attribute = Arg(args, 99, "attribute");
      if (attribute.is_string()) {
        COLONY_RETURN_IF_ERROR(CheckDefined(items, attribute, what));
        const Value fallback = Arg(args, 99, "default");
        for (const Value& item : items) {
          Value m = AttributePath(item, attribute);
          out.push_back(m.undefined() && !fallback.undefined() ? fallback : m);
        }
        return Value::Generator(std::move(out));
      }
      if (args.positional.empty() || !args.positional[0].is_string()) {
        return ArgError(what, "needs a filter's name or attribute=");
      }
      const std::string filter = args.positional[0].as_string();
      if (!IsFilter(filter) || filter == "map")
        return ArgError(what, fmt::format("no filter named '{}'", filter));
      Args rest;
      rest.positional.assign(args.positional.begin() + 1, args.positional.end());
      rest.keyword = args.keyword;
      for (const Value& item : items) {
        COLONY_ASSIGN_OR_RETURN(Value m, ApplyFilter(filter, item, rest, budget));
        out.push_back(std::move(m));
      }
      return Value::Generator(std::move(out));
    }
    // select / reject / selectattr / rejectattr
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep = name == "select" || name == "selectattr";
    size_t next = 0;
    std::string attribute;
    if (by_attr) {
      if (args.positional.empty() || !args.positional[0].is_string()) {
        return ArgError(what, "needs an attribute's name");
      }
      attribute = args.positional[next++].as_string();
    }
    std::string test;
    if (next < args.positional.size()) {
      if (!args.positional[next].is_string())
        return ArgError(what, "the test must be named by a string");
      test = args.positional[next++].as_string();
      if (!IsTest(test)) return ArgError(what, fmt::format("no test named '{}'", test));
    }
    Args rest;
    rest.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(next),
                           args.positional.end());
    if (by_attr) COLONY_RETURN_IF_ERROR(CheckDefined(items, Value::String(attribute), what));
    List out;
    for (const Value& item : items) {
      const Value subject = by_attr ? AttributePath(item, Value::String(attribute)) : item;
      bool pass = false;
      if (test.empty()) {
        pass = subject.Truthy();
      } else {
        COLONY_ASSIGN_OR_RETURN(pass, ApplyTest(test, subject, rest));
      }
      if (pass == keep) out.push_back(item);
    }
    return Value::Generator(std::move(out));
  }
  return InvalidArgument(fmt::format("no filter named '{}'", name));
}

Value Global(std::string_view name) {
  if (name == "range") {
    return Value::FromFunction([](Args& a) -> Result<Value> {
      COLONY_RETURN_IF_ERROR(CheckArgs(a, "range", 3, {}));
      std::array<int64_t, 3> p = {0, 0, 1};
      for (size_t i = 0; i < a.positional.size(); ++i) {
        COLONY_ASSIGN_OR_RETURN(p[i], ToInt(a.positional[i], "range"));
      }
      if (a.positional.empty()) return InvalidArgument("range: expected at least 1 argument");
      if (a.positional.size() == 1) p = {0, p[0], 1};
      if (p[2] == 0) return InvalidArgument("range: the step must not be zero");
      // Jinja's sandbox refuses ranges over 100,000 items.
      const bool up = p[2] > 0;
      const uint64_t span =
          up ? (p[1] > p[0] ? static_cast<uint64_t>(p[1]) - static_cast<uint64_t>(p[0]) : 0)
             : (p[0] > p[1] ? static_cast<uint64_t>(p[0]) - static_cast<uint64_t>(p[1]) : 0);
      const uint64_t step = up ? static_cast<uint64_t>(p[2]) : 0 - static_cast<uint64_t>(p[2]);
      if (span / step > 100000) return InvalidArgument("range: more than 100,000 items");
      List out;
      for (uint64_t k = 0; k * step < span; ++k) {
        out.push_back(Value::Int(
            static_cast<int64_t>(static_cast<uint64_t>(p[0]) + (up ? k * step : 0 - k * step))));
      }
      return Value::FromList(std::move(out));
    });
  }
  if (name == "namespace" || name == "dict") {
    const bool ns = name == "namespace";
    return Value::FromFunction([ns](Args& a) -> Result<Value> {
      Dict d;
      for (const Value& p : a.positional) {
        if (p.kind() != Value::Kind::kDict) {
          return InvalidArgument(ns ? "namespace: positional arguments must be dicts"
                                    : "dict: positional arguments must be dicts");
        }
        d.insert(d.end(), p.as_dict().begin(), p.as_dict().end());
      }
      for (const auto& kv : a.keyword) {
        const std::string& key = kv.first;
        auto it = std::find_if(d.begin(), d.end(), [&](const auto& e) { return e.first == key; });
        if (it != d.end()) {
          it->second = kv.second;
        } else {
          d.push_back(kv);
        }
      }
      return ns ? Value::Namespace(std::move(d)) : Value::FromDict(std::move(d));
    });
  }
  if (name == "raise_exception") {
    return Value::FromFunction([](Args& a) -> Result<Value> {
      const Value message = Arg(a, 0, "message");
      return FailedPrecondition(message.Str());  // the template's refusal (jinja_template.h)
    });
  }
  if (name == "strftime_now") {
    return Value::FromFunction([](Args& a) -> Result<Value> {
      const Value format = Arg(a, 0, "format");
      if (!format.is_string()) return InvalidArgument("strftime_now: takes a format string");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof(buf), format.as_string().c_str(), &tm);
      return Value::String(std::string(buf, n));
    });
  }
  return {};
}

}  // namespace colony::api::jinja
