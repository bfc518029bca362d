// Jinja values with Python's printing, equality, ordering and json.dumps.
#include "api/jinja_value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "model/utf8.h"

namespace colony::api::jinja {

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}

Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}

Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

Value Value::FromList(List l) {
  Value v;
  v.kind_ = Kind::kList;
  v.l_ = std::make_shared<const List>(std::move(l));
  return v;
}

Value Value::FromTuple(List l) {
  Value v = FromList(std::move(l));
  v.b_ = true;
  return v;
}

Value Value::Generator(List l) {
  Value v = FromList(std::move(l));
  v.generator_ = true;
  return v;
}

Value Value::FromDict(Dict d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.d_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::Namespace(Dict d) {
  Value v = FromDict(std::move(d));
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::FromFunction(Function f) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.fn_ = std::make_shared<const Function>(std::move(f));
  return v;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !s_->empty();
    case Kind::kList:
      return generator_ || !l_->empty();
    case Kind::kDict:
      return !d_->empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

Value Value::Member(std::string_view key) const {
  if (!is_mapping()) return {};
  for (const auto& [k, v] : *d_) {
    if (k == key) return v;
  }
  return {};
}

namespace {

// Python's repr() of a float: the shortest digits that read back, fixed notation for exponents
// in [-4, 16), scientific otherwise, and ".0" on integral values.
std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, end);  // e.g. "-1.2345e+03"
  const size_t e = sci.find('e');
  const int exponent = std::stoi(sci.substr(e + 1));
  std::string sign;
  std::string mantissa = sci.substr(0, e);
  if (mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  if (exponent >= -4 && exponent < 16) {
    std::string out;
    if (exponent < 0) {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else {
      const auto point = static_cast<size_t>(exponent) + 1;
      if (digits.size() <= point) {
        out = digits + std::string(point - digits.size(), '0') + ".0";
      } else {
        out = digits.substr(0, point) + "." + digits.substr(point);
      }
    }
    return sign + out;
  }
  std::string m = digits.substr(0, 1);
  if (digits.size() > 1) m += "." + digits.substr(1);
  return fmt::format("{}{}e{}{:02d}", sign, m, exponent < 0 ? '-' : '+', std::abs(exponent));
}

// `s` quoted with `quote`, escaped as Python's repr() escapes it, or as json.dumps does.
void AppendQuoted(std::string_view s, char quote, bool json, std::string& out) {
  out += quote;
  for (unsigned char c : s) {
    if (c == static_cast<unsigned char>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (json && (c == '\b' || c == '\f')) {
      out += c == '\b' ? "\\b" : "\\f";
    } else if (c < 0x20 || (!json && c == 0x7f)) {
      out += json ? fmt::format("\\u{:04x}", c) : fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
}

// Python's repr() of a string: single quotes unless the text has some and no double ones.
std::string StringRepr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  std::string out;
  AppendQuoted(s, has_single && !has_double ? '"' : '\'', false, out);
  return out;
}

void JsonString(const std::string& s, std::string& out) { AppendQuoted(s, '"', true, out); }

Status JsonInto(const Value& v, int indent, bool sort_keys, int depth, std::string& out) {
  if (depth > 64) return InvalidArgument("tojson: the value nests deeper than 64");
  const auto newline = [&](int level) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(level), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kFunction:
      return InvalidArgument(fmt::format("tojson: a {} is not JSON", v.TypeName()));
    case Value::Kind::kNone:
      out += "null";
      return Status::Ok();
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return Status::Ok();
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return Status::Ok();
    case Value::Kind::kFloat:
      if (std::isnan(v.as_number())) {
        out += "NaN";
      } else if (std::isinf(v.as_number())) {
        out += v.as_number() < 0 ? "-Infinity" : "Infinity";
      } else {
        out += FloatRepr(v.as_number());
      }
      return Status::Ok();
    case Value::Kind::kString:
      JsonString(v.as_string(), out);
      return Status::Ok();
    case Value::Kind::kList: {
      if (v.is_generator()) return InvalidArgument("tojson: a generator is not JSON");
      if (v.as_list().empty()) {
        out += "[]";
        return Status::Ok();
      }
      out += '[';
      bool first = true;
      for (const Value& item : v.as_list()) {
        if (!first) out += indent < 0 ? ", " : ",";
        first = false;
        newline(depth + 1);
        COLONY_RETURN_IF_ERROR(JsonInto(item, indent, sort_keys, depth + 1, out));
      }
      newline(depth);
      out += ']';
      return Status::Ok();
    }
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      if (v.kind() == Value::Kind::kNamespace) {
        return InvalidArgument("tojson: a namespace is not JSON");
      }
      if (v.as_dict().empty()) {
        out += "{}";
        return Status::Ok();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.as_dict()) items.push_back(&item);
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out += '{';
      bool first = true;
      for (const auto* item : items) {
        if (!first) out += indent < 0 ? ", " : ",";
        first = false;
        newline(depth + 1);
        JsonString(item->first, out);
        out += ": ";
        COLONY_RETURN_IF_ERROR(JsonInto(item->second, indent, sort_keys, depth + 1, out));
      }
      newline(depth);
      out += '}';
      return Status::Ok();
    }
  }
  return Status::Ok();
}

}  // namespace

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return {};
    case Kind::kString:
      return *s_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";  // as Jinja prints one inside a list
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return FloatRepr(f_);
    case Kind::kString:
      return StringRepr(*s_);
    case Kind::kList: {
      if (generator_) return "<generator object>";
      std::string out = b_ ? "(" : "[";
      for (size_t i = 0; i < l_->size(); ++i) {
        if (i > 0) out += ", ";
        out += (*l_)[i].Repr();
      }
      if (b_ && l_->size() == 1) out += ",";
      return out + (b_ ? ")" : "]");
    }
    case Kind::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < d_->size(); ++i) {
        if (i > 0) out += ", ";
        out += StringRepr((*d_)[i].first) + ": " + (*d_)[i].second.Repr();
      }
      return out + "}";
    }
    case Kind::kNamespace:
      return "<Namespace>";
    case Kind::kFunction:
      return "<function>";
  }
  return {};
}

Result<std::string> Value::Json(int indent, bool sort_keys) const {
  std::string out;
  COLONY_RETURN_IF_ERROR(JsonInto(*this, indent, sort_keys, 0, out));
  return out;
}

std::string_view Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined value";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "boolean";
    case Kind::kInt:
      return "integer";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "namespace";
    case Kind::kFunction:
      return "function";
  }
  return "value";
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt) {
      return a.as_int() == b.as_int();
    }
    return a.as_number() == b.as_number();
  }
  // Python's True == 1; booleans are integers there.
  if (a.kind() == Value::Kind::kBool && b.is_number()) {
    return Equal(Value::Int(a.as_bool() ? 1 : 0), b);
  }
  if (b.kind() == Value::Kind::kBool && a.is_number()) {
    return Equal(a, Value::Int(b.as_bool() ? 1 : 0));
  }
  if (a.kind() != b.kind() || a.is_generator() || b.is_generator()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kBool:
      return a.as_bool() == b.as_bool();
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList:
      return a.is_tuple() == b.is_tuple() &&  // Python's (1, 2) != [1, 2]
             std::equal(a.as_list().begin(), a.as_list().end(), b.as_list().begin(),
                        b.as_list().end(), Equal);
    case Value::Kind::kDict: {
      if (a.as_dict().size() != b.as_dict().size()) return false;
      for (const auto& [k, v] : a.as_dict()) {
        bool found = false;
        for (const auto& [k2, v2] : b.as_dict()) {
          if (k2 == k) {
            found = Equal(v, v2);
            break;
          }
        }
        if (!found) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace:
      return &a.namespace_dict() == &b.namespace_dict();
    case Value::Kind::kFunction:
      return &a.as_function() == &b.as_function();
    default:
      return false;
  }
}

Result<bool> Less(const Value& a, const Value& b) {
  const auto number = [](const Value& v) {
    return v.is_number() || v.kind() == Value::Kind::kBool;
  };
  if (number(a) && number(b)) {
    const auto as = [](const Value& v) {
      return v.kind() == Value::Kind::kBool ? (v.as_bool() ? 1.0 : 0.0) : v.as_number();
    };
    if (a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt) {
      return a.as_int() < b.as_int();
    }
    return as(a) < as(b);
  }
  if (a.is_string() && b.is_string()) {
    // Code point order is UTF-8 byte order.
    return a.as_string() < b.as_string();
  }
  if (a.kind() == Value::Kind::kList && b.kind() == Value::Kind::kList &&
      a.is_tuple() == b.is_tuple() && !a.is_generator() && !b.is_generator()) {
    const List& x = a.as_list();
    const List& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equal(x[i], y[i])) continue;
      return Less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return InvalidArgument(
      fmt::format("'<' is not supported between a {} and a {}", a.TypeName(), b.TypeName()));
}

std::u32string DecodeUtf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = model::Utf8CharLen(s.substr(i));
    if (n == 0) {
      // Python's surrogateescape: a byte that is no character stands for itself.
      out += static_cast<char32_t>(0xdc00 + static_cast<unsigned char>(s[i]));
      ++i;
      continue;
    }
    out += static_cast<char32_t>(model::Utf8Decode(s.substr(i), n));
    i += n;
  }
  return out;
}

std::string EncodeUtf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c >= 0xdc80 && c <= 0xdcff) {
      out += static_cast<char>(c - 0xdc00);
    } else {
      model::AppendUtf8(c, out);
    }
  }
  return out;
}

bool IsSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

}  // namespace colony::api::jinja
