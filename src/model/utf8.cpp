// UTF-8 helpers (utf8.h): validation, decoding and lossy conversion of untrusted bytes.
#include "model/utf8.h"

namespace colony::model {
namespace {

inline bool IsTrailByte(unsigned char c) { return (c & 0xC0) == 0x80; }
inline bool IsValidCodepoint(uint32_t c) { return c < 0xD800 || (c >= 0xE000 && c <= 0x10FFFF); }

}  // namespace

size_t Utf8CharLen(std::string_view s) {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  if (n == 0) return 0;
  if (b[0] < 0x80) return 1;
  if (n >= 2 && (b[0] & 0xE0) == 0xC0) {
    const uint32_t cp = ((b[0] & 0x1Fu) << 6) | (b[1] & 0x3Fu);
    if (IsTrailByte(b[1]) && cp >= 0x80 && IsValidCodepoint(cp)) return 2;
  } else if (n >= 3 && (b[0] & 0xF0) == 0xE0) {
    const uint32_t cp = ((b[0] & 0x0Fu) << 12) | ((b[1] & 0x3Fu) << 6) | (b[2] & 0x3Fu);
    if (IsTrailByte(b[1]) && IsTrailByte(b[2]) && cp >= 0x800 && IsValidCodepoint(cp)) return 3;
  } else if (n >= 4 && (b[0] & 0xF8) == 0xF0) {
    const uint32_t cp =
        ((b[0] & 0x07u) << 18) | ((b[1] & 0x3Fu) << 12) | ((b[2] & 0x3Fu) << 6) | (b[3] & 0x3Fu);
    if (IsTrailByte(b[1]) && IsTrailByte(b[2]) && IsTrailByte(b[3]) && cp >= 0x10000 &&
        IsValidCodepoint(cp)) {
      return 4;
    }
  }
  return 0;
}

bool IsValidUtf8(std::string_view s) {
  while (!s.empty()) {
    const size_t len = Utf8CharLen(s);
    if (len == 0) return false;
    s.remove_prefix(len);
  }
  return true;
}

uint32_t Utf8Decode(std::string_view s, size_t len) {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  switch (len) {
    case 1:
      return b[0];
    case 2:
      return ((b[0] & 0x1Fu) << 6) | (b[1] & 0x3Fu);
    case 3:
      return ((b[0] & 0x0Fu) << 12) | ((b[1] & 0x3Fu) << 6) | (b[2] & 0x3Fu);
    default:
      return ((b[0] & 0x07u) << 18) | ((b[1] & 0x3Fu) << 12) | ((b[2] & 0x3Fu) << 6) |
             (b[3] & 0x3Fu);
  }
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

void AppendBytesAsUtf8(std::string_view bytes, std::string& out) {
  while (!bytes.empty()) {
    const size_t len = Utf8CharLen(bytes);
    if (len == 0) {
      out += kReplacementChar;
      bytes.remove_prefix(1);
    } else {
      out += bytes.substr(0, len);
      bytes.remove_prefix(len);
    }
  }
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  for (size_t i = 0; i < n;) {
    if (const size_t len = Utf8CharLen(bytes.substr(i)); len > 0) {
      out += bytes.substr(i, len);
      i += len;
      continue;
    }
    // A maximal subpart: a lead byte followed by the trail bytes that could still have
    // completed a valid character (Unicode 15, table 3-7); at least one byte.
    const unsigned char lead = b[i];
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (lead >= 0xC2 && lead <= 0xDF) {
      need = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      need = 2;
      if (lead == 0xE0) lo = 0xA0;
      if (lead == 0xED) hi = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      need = 3;
      if (lead == 0xF0) lo = 0x90;
      if (lead == 0xF4) hi = 0x8F;
    }
    size_t j = i + 1;
    for (size_t k = 0; k < need && j < n; ++k, ++j) {
      const unsigned char c = b[j];
      const bool ok = k == 0 ? (c >= lo && c <= hi) : IsTrailByte(c);
      if (!ok) break;
    }
    out += kReplacementChar;
    i = j;
  }
  return out;
}

}  // namespace colony::model
