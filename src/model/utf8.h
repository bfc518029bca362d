// UTF-8 helpers shared by the tokenizers: validating characters, decoding code points, and the
// two ways of turning arbitrary bytes into valid text (sentencepiece replaces every bad byte;
// Hugging Face tokenizers, like Rust's String::from_utf8_lossy, replace each maximal bad subpart).
//
//   size_t n = Utf8CharLen("\xC3\xA9x");        // 2 (a valid "é"); 0 for a malformed start
//   std::string t = Utf8Lossy("a\xE2\x82z");    // "a\uFFFDz": one U+FFFD for the cut sequence
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace colony::model {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the UTF-8 character that starts with byte `c`, from its lead byte alone.
inline size_t Utf8LeadLen(unsigned char c) {
  static constexpr unsigned char kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[c >> 4];
}

// Length of the valid UTF-8 character at the start of `s` (non-empty), or 0 when it is
// malformed (overlong, a surrogate, beyond U+10FFFF or cut short).
size_t Utf8CharLen(std::string_view s);
bool IsValidUtf8(std::string_view s);
// The code point of the valid character of `len` bytes (from Utf8CharLen) at the start of `s`.
uint32_t Utf8Decode(std::string_view s, size_t len);
void AppendUtf8(uint32_t codepoint, std::string& out);

// Appends `bytes` as UTF-8, each byte of a malformed sequence becoming U+FFFD (sentencepiece).
void AppendBytesAsUtf8(std::string_view bytes, std::string& out);
// `bytes` as UTF-8, each maximal subpart of a malformed sequence becoming one U+FFFD (the
// Unicode/WHATWG practice that Rust's from_utf8_lossy and Hugging Face tokenizers follow).
std::string Utf8Lossy(std::string_view bytes);

}  // namespace colony::model
