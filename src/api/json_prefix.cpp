// A byte-at-a-time reader of JSON objects' prefixes: a pushdown automaton whose stack is a bit per
// open container.
#include "api/json_prefix.h"

#include <algorithm>
#include <array>

namespace colony::api {
namespace {

constexpr std::array<std::string_view, 3> kLiterals = {"true", "false", "null"};

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The values a \u escape with `digits` so far and `left` digits to go can still reach.
struct HexRange {
  uint32_t lo, hi;
};
HexRange Reach(uint16_t digits, uint8_t left) {
  const uint32_t lo = static_cast<uint32_t>(digits) << (4U * left);
  return {lo, lo + (1U << (4U * left)) - 1};
}
constexpr uint32_t kHighLo = 0xD800, kHighHi = 0xDBFF, kLowLo = 0xDC00, kLowHi = 0xDFFF;

}  // namespace

bool JsonObjectPrefix::Feed(std::string_view bytes) {
  for (char c : bytes) {
    if (!Feed(c)) return false;
  }
  return !bad_;
}

bool JsonObjectPrefix::Feed(char byte) {
  if (bad_) return false;
  if (mode_ != Mode::kString && IsSpace(byte)) {
    // None before the object, runs of at most kMaxSpaces in it, any after it.
    if (mode_ == Mode::kStart || (!complete() && spaces_ == kMaxSpaces)) {
      bad_ = true;
      return false;
    }
    if (!complete()) ++spaces_;
  } else {
    spaces_ = 0;
  }
  if (!Take(byte)) bad_ = true;
  return !bad_;
}

JsonObjectPrefix::Key JsonObjectPrefix::key() const {
  // Only what the state's mode reads: a field is set on entering the modes that read it, so the
  // leftovers of a closed string, number or literal are not part of the state.
  const bool string = mode_ == Mode::kString;
  const bool number = mode_ == Mode::kNumber;
  const bool literal = mode_ == Mode::kLiteral;
  const bool hex = string && (str_ == Str::kHex || str_ == Str::kLowHex);
  const bool utf8 = string && str_ == Str::kUtf8;
  const bool counted = number && (num_ == Num::kInt || num_ == Num::kExpDigits);
  // (Whitespace is counted outside strings, up to the object's end.)
  const bool spaced = !string && !complete();
  const uint64_t open =
      depth_ >= 64 ? stack_ : stack_ & ((uint64_t{1} << static_cast<unsigned>(depth_)) - 1);
  Key k = {static_cast<uint8_t>(bad_),
           static_cast<uint8_t>(mode_),
           string ? static_cast<uint8_t>(str_) : uint8_t{0},
           number ? static_cast<uint8_t>(num_) : uint8_t{0},
           string ? static_cast<uint8_t>(key_) : uint8_t{0},
           literal ? literal_ : uint8_t{0},
           literal ? literal_at_ : uint8_t{0},
           hex ? hex_left_ : uint8_t{0},
           hex ? static_cast<uint8_t>(hex_ >> 8U) : uint8_t{0},
           hex ? static_cast<uint8_t>(hex_ & 0xFFU) : uint8_t{0},
           utf8 ? utf8_left_ : uint8_t{0},
           utf8 ? utf8_lo_ : uint8_t{0},
           utf8 ? utf8_hi_ : uint8_t{0},
           spaced ? spaces_ : uint8_t{0},
           counted ? digits_ : uint8_t{0},
           static_cast<uint8_t>(depth_)};
  for (size_t b = 0; b < 8; ++b) k[16 + b] = static_cast<uint8_t>(open >> (8 * b));
  return k;
}

size_t JsonObjectPrefix::KeyHash::operator()(const Key& k) const {
  uint64_t h = 14695981039346656037ULL;  // FNV-1a
  for (uint8_t b : k) h = (h ^ b) * 1099511628211ULL;
  return static_cast<size_t>(h);
}

bool JsonObjectPrefix::Push(bool array) {
  if (depth_ == kMaxDepth) return false;
  const uint64_t bit = uint64_t{1} << depth_;
  stack_ = array ? (stack_ | bit) : (stack_ & ~bit);
  ++depth_;
  mode_ = array ? Mode::kValueOrClose : Mode::kKeyOrClose;
  return true;
}

bool JsonObjectPrefix::Value(char c) {
  switch (c) {
    case '{':
      return Push(false);
    case '[':
      return Push(true);
    case '"':
      mode_ = Mode::kString;
      str_ = Str::kChars;
      key_ = false;
      return true;
    case '-':
      mode_ = Mode::kNumber;
      num_ = Num::kMinus;
      return true;
    case 't':
    case 'f':
    case 'n':
      mode_ = Mode::kLiteral;
      literal_ = c == 't' ? 0 : (c == 'f' ? 1 : 2);
      literal_at_ = 1;
      return true;
    default:
      if (!IsDigit(c)) return false;
      mode_ = Mode::kNumber;
      num_ = c == '0' ? Num::kZero : Num::kInt;
      digits_ = 1;
      return true;
  }
}

bool JsonObjectPrefix::StringByte(unsigned char c) {
  switch (str_) {
    case Str::kChars:
      if (c == '"') {
        mode_ = key_ ? Mode::kColon : Mode::kAfterValue;
        return true;
      }
      if (c == '\\') {
        str_ = Str::kEscape;
        return true;
      }
      if (c < 0x20) return false;  // control characters must be escaped
      if (c < 0x80) return true;
      // RFC 3629's well-formed sequences: no overlong forms, no surrogates, nothing past U+10FFFF.
      utf8_lo_ = 0x80;
      utf8_hi_ = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) {
        utf8_left_ = 1;
      } else if (c >= 0xE0 && c <= 0xEF) {
        utf8_left_ = 2;
        if (c == 0xE0) utf8_lo_ = 0xA0;
        if (c == 0xED) utf8_hi_ = 0x9F;
      } else if (c >= 0xF0 && c <= 0xF4) {
        utf8_left_ = 3;
        if (c == 0xF0) utf8_lo_ = 0x90;
        if (c == 0xF4) utf8_hi_ = 0x8F;
      } else {
        return false;
      }
      str_ = Str::kUtf8;
      return true;
    case Str::kUtf8:
      if (c < utf8_lo_ || c > utf8_hi_) return false;
      utf8_lo_ = 0x80;
      utf8_hi_ = 0xBF;
      if (--utf8_left_ == 0) str_ = Str::kChars;
      return true;
    case Str::kEscape:
      if (c == 'u') {
        str_ = Str::kHex;
        hex_left_ = 4;
        hex_ = 0;
        return true;
      }
      if (std::string_view("\"\\/bfnrt").find(static_cast<char>(c)) == std::string_view::npos)
        return false;
      str_ = Str::kChars;
      return true;
    case Str::kHex:
    case Str::kLowHex: {
      const int d = HexDigit(static_cast<char>(c));
      if (d < 0) return false;
      hex_ = static_cast<uint16_t>(hex_ * 16 + d);
      --hex_left_;
      const HexRange r = Reach(hex_, hex_left_);
      if (str_ == Str::kLowHex) {
        if (r.hi < kLowLo || r.lo > kLowHi) return false;  // must be a low surrogate
        if (hex_left_ == 0) str_ = Str::kChars;
        return true;
      }
      if (r.lo >= kLowLo && r.hi <= kLowHi) return false;  // a low surrogate alone
      if (hex_left_ == 0) str_ = hex_ >= kHighLo && hex_ <= kHighHi ? Str::kLowSlash : Str::kChars;
      return true;
    }
    case Str::kLowSlash:
      if (c != '\\') return false;
      str_ = Str::kLowU;
      return true;
    case Str::kLowU:
      if (c != 'u') return false;
      str_ = Str::kLowHex;
      hex_left_ = 4;
      hex_ = 0;
      return true;
  }
  return false;
}

bool JsonObjectPrefix::Take(char c) {
  switch (mode_) {
    case Mode::kStart:
      if (IsSpace(c)) return true;
      return c == '{' && Push(false);
    case Mode::kKeyOrClose:
    case Mode::kKey:
      if (IsSpace(c)) return true;
      if (c == '"') {
        mode_ = Mode::kString;
        str_ = Str::kChars;
        key_ = true;
        return true;
      }
      if (c == '}' && mode_ == Mode::kKeyOrClose) {
        --depth_;
        mode_ = Mode::kAfterValue;
        return true;
      }
      return false;
    case Mode::kColon:
      if (IsSpace(c)) return true;
      if (c != ':') return false;
      mode_ = Mode::kValue;
      return true;
    case Mode::kValueOrClose:
      if (IsSpace(c)) return true;
      if (c == ']') {
        --depth_;
        mode_ = Mode::kAfterValue;
        return true;
      }
      return Value(c);
    case Mode::kValue:
      if (IsSpace(c)) return true;
      return Value(c);
    case Mode::kAfterValue:
      if (IsSpace(c)) return true;
      if (depth_ == 0) return false;  // past the object: whitespace only
      if (c == ',') {
        mode_ = top_is_array() ? Mode::kValue : Mode::kKey;
        return true;
      }
      if (c == (top_is_array() ? ']' : '}')) {
        --depth_;
        return true;
      }
      return false;
    case Mode::kString:
      return StringByte(static_cast<unsigned char>(c));
    case Mode::kLiteral: {
      const std::string_view word = kLiterals[literal_];
      if (c != word[literal_at_]) return false;
      if (++literal_at_ == word.size()) mode_ = Mode::kAfterValue;
      return true;
    }
    case Mode::kNumber: {
      const bool digit = IsDigit(c);
      const bool exp = c == 'e' || c == 'E';
      switch (num_) {
        case Num::kMinus:
          if (!digit) return false;
          num_ = c == '0' ? Num::kZero : Num::kInt;
          digits_ = 1;
          return true;
        case Num::kZero:
        case Num::kInt:
          if (digit && num_ == Num::kInt) return digits_++ < kMaxIntegerDigits;
          if (c == '.') {
            num_ = Num::kDot;
            return true;
          }
          if (exp) {
            num_ = Num::kExp;
            return true;
          }
          break;  // the number has ended (a digit after a leading 0 cannot follow it)
        case Num::kDot:
          if (!digit) return false;
          num_ = Num::kFrac;
          return true;
        case Num::kFrac:
          if (digit) return true;
          if (exp) {
            num_ = Num::kExp;
            return true;
          }
          break;
        case Num::kExp:
          if (c == '+' || c == '-') {
            num_ = Num::kExpSign;
            return true;
          }
          [[fallthrough]];
        case Num::kExpSign:
          if (!digit) return false;
          num_ = Num::kExpDigits;
          digits_ = 1;
          return true;
        case Num::kExpDigits:
          if (digit) return digits_++ < kMaxExponentDigits;
          break;
      }
      mode_ = Mode::kAfterValue;  // a whole number, ended by c
      return Take(c);
    }
  }
  return false;
}

std::string JsonObjectPrefix::Closing(int depth) const {
  if (bad_) return "";
  std::string out;
  auto hex4 = [&out](uint32_t v, uint8_t digits) {
    for (int i = digits - 1; i >= 0; --i) out += "0123456789ABCDEF"[(v >> (4 * i)) & 0xF];
  };
  switch (mode_) {
    case Mode::kStart:
      return "{}";
    case Mode::kKeyOrClose:
    case Mode::kValueOrClose:
    case Mode::kAfterValue:
      break;
    case Mode::kKey:
      out = "\"\":0";
      break;
    case Mode::kColon:
      out = ":0";
      break;
    case Mode::kValue:
      out = "0";
      break;
    case Mode::kLiteral:
      out = kLiterals[literal_].substr(literal_at_);
      break;
    case Mode::kNumber:
      if (num_ == Num::kMinus || num_ == Num::kDot || num_ == Num::kExp || num_ == Num::kExpSign)
        out = "0";
      break;
    case Mode::kString:
      switch (str_) {
        case Str::kChars:
          break;
        case Str::kEscape:
          out = "n";
          break;
        case Str::kHex: {
          const uint32_t v = Reach(hex_, hex_left_).lo;  // zeros: never a low surrogate alone
          hex4(v, hex_left_);
          if (v >= kHighLo && v <= kHighHi) out += "\\uDC00";
          break;
        }
        case Str::kLowSlash:
          out = "\\uDC00";
          break;
        case Str::kLowU:
          out = "uDC00";
          break;
        case Str::kLowHex:
          hex4(std::max(Reach(hex_, hex_left_).lo, kLowLo), hex_left_);
          break;
        case Str::kUtf8:
          out += static_cast<char>(utf8_lo_);
          out.append(utf8_left_ - 1U, static_cast<char>(0x80));
          break;
      }
      out += '"';
      if (key_) out += ":0";
      break;
  }
  for (int d = depth_ - 1; d >= std::max(depth, 0); --d)
    out += ((stack_ >> d) & 1U) != 0 ? ']' : '}';
  return out;
}

}  // namespace colony::api
