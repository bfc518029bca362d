// The texts that can still become a JSON object, read a byte at a time: what response_format
// {"type": "json_object"} keeps an answer to (api/json_mode.h). JSON is RFC 8259's, as
// nlohmann::json reads it: whitespace around and between tokens, strict UTF-8 in strings (no
// overlong forms, no surrogates), \u escapes of four hex digits whose high surrogates are followed
// by low ones, numbers without leading zeros. Two bounds keep a model from filling its answer
// with whitespace: the object comes first (no whitespace before it), and whitespace inside it
// comes in runs of at most kMaxSpaces bytes (llama.cpp's JSON grammar bounds it too); after it
// any whitespace may follow. A number has at most kMaxIntegerDigits digits before its fraction and
// kMaxExponentDigits in its exponent, so that it is a finite double (nlohmann, Go and Rust refuse
// 1e999). Objects and arrays nest at most kMaxDepth deep (a bound on the state, which is a few
// bytes and cheap to copy). Torch-free.
//
//   JsonObjectPrefix p;
//   p.Feed("{\"a\": [1, tr");  // true: it can still become an object
//   p.complete();              // false; p.Closing() is "ue]}", one text that completes it
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace colony::api {

class JsonObjectPrefix {
 public:
  static constexpr int kMaxDepth = 64;
  static constexpr int kMaxSpaces = 24;
  static constexpr int kMaxIntegerDigits = 200;  // at most 1e200 * 1e99: finite
  static constexpr int kMaxExponentDigits = 2;

  // Whether the text read so far followed by `bytes` can still become a JSON object (whitespace
  // after it included). A false is final: no byte is taken after it (copy the state first to
  // try a text).
  bool Feed(std::string_view bytes);
  bool Feed(char byte);

  // Whether what was read is a whole JSON object (possibly with whitespace around it).
  bool complete() const { return mode_ == Mode::kAfterValue && depth_ == 0; }
  int depth() const { return depth_; }
  bool started() const { return mode_ != Mode::kStart; }  // the object's '{' was read
  int spaces() const { return spaces_; }  // whitespace bytes just read, outside strings
  // Whether a number's integer part or exponent has all the digits it may have.
  bool number_full() const {
    return mode_ == Mode::kNumber && ((num_ == Num::kInt && digits_ == kMaxIntegerDigits) ||
                                      (num_ == Num::kExpDigits && digits_ == kMaxExponentDigits));
  }
  // Whether it is inside a string, between characters: where any text without '"', '\\',
  // control characters or an incomplete UTF-8 character can follow (and leave it there).
  bool between_string_characters() const { return mode_ == Mode::kString && str_ == Str::kChars; }

  // The state as bytes: what its mode reads (not the kinds of closed containers, nor what is
  // left of a closed string, number or literal). Prefixes with equal keys take and refuse the
  // same texts, and end in states with equal keys (masks are kept by it: api/json_mode.h).
  using Key = std::array<uint8_t, 24>;
  Key key() const;
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };

  // A short text that makes what was read a whole object (empty when it is one): a string is
  // closed, a key given a value, an open number, literal or escape finished, and every open
  // object and array closed (those deeper than `depth`: a value's, api/json_schema.h). Tests
  // check the prefixes with it.
  std::string Closing(int depth = 0) const;

 private:
  enum class Mode : uint8_t {
    kStart,         // before the object: whitespace or '{'
    kKeyOrClose,    // after '{': a key or '}'
    kKey,           // after ',' in an object: a key
    kColon,         // after a key
    kValueOrClose,  // after '[': a value or ']'
    kValue,         // after ':' or ',' in an array: a value
    kAfterValue,    // after a value: ',' or the container's end (at depth 0: whitespace)
    kString,
    kNumber,
    kLiteral,
  };
  enum class Str : uint8_t {
    kChars,
    kEscape,    // after '\'
    kHex,       // in \uXXXX: hex_left digits to go
    kLowSlash,  // after a high surrogate: '\' of its low one
    kLowU,      // its 'u'
    kLowHex,    // its digits
    kUtf8,      // utf8_left continuation bytes to go, the next in [utf8_lo, utf8_hi]
  };
  enum class Num : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigits };

  bool Take(char c);
  bool Value(char c);  // the first byte of a value
  bool StringByte(unsigned char c);
  bool Push(bool array);
  bool top_is_array() const { return ((stack_ >> (depth_ - 1)) & 1U) != 0; }

  bool bad_ = false;  // a byte could not follow
  Mode mode_ = Mode::kStart;
  Str str_ = Str::kChars;
  Num num_ = Num::kZero;
  bool key_ = false;        // the string is an object's key
  uint8_t literal_ = 0;     // which of true, false, null
  uint8_t literal_at_ = 0;  // its bytes read
  uint8_t hex_left_ = 0;
  uint16_t hex_ = 0;  // the \u escape's digits so far
  uint8_t utf8_left_ = 0;
  uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xBF;
  uint8_t spaces_ = 0;
  uint8_t digits_ = 0;  // of the number's integer part, or of its exponent
  int depth_ = 0;
  uint64_t stack_ = 0;  // bit i: whether the container at depth i + 1 is an array
};

}  // namespace colony::api
