// api::JsonObjectPrefix against nlohmann::json, an independent reader. nlohmann's streaming
// parser refuses a text before its end exactly when no text after it can mend it, and accepts a
// whole object; a text it refuses only at its end (the input ran out) may still be dead, as
// `{}"` (a string after the object, seen only once it ends), so there a bounded exhaustive
// search for a completion decides. A viable prefix is proven so by its Closing(). Used by the
// fuzz target and the unit tests.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "api/json_prefix.h"

struct NlohmannVerdict {
  bool refused = false;   // refused before its end, or its first byte past whitespace is no '{'
  bool complete = false;  // a whole JSON object
  // Not refused, but the text's end cut a token (a string, number, literal) nlohmann could not
  // yet judge; else, not refused, it waits for the next token.
  bool cut_token = false;
};

inline NlohmannVerdict ReadWithNlohmann(std::string_view text) {
  struct Sax {
    bool failed = false;
    size_t at = 0;
    int id = 0;
    bool waits = false;  // the error is that the input ended between tokens
    bool null() { return true; }
    bool boolean(bool) { return true; }
    bool number_integer(nlohmann::json::number_integer_t) { return true; }
    bool number_unsigned(nlohmann::json::number_unsigned_t) { return true; }
    bool number_float(nlohmann::json::number_float_t, const std::string&) { return true; }
    bool string(std::string&) { return true; }
    bool binary(nlohmann::json::binary_t&) { return true; }
    bool start_object(size_t) { return true; }
    bool key(std::string&) { return true; }
    bool end_object() { return true; }
    bool start_array(size_t) { return true; }
    bool end_array() { return true; }
    bool parse_error(size_t position, const std::string&, const nlohmann::detail::exception& e) {
      failed = true;
      at = position;
      id = e.id;
      waits = std::string_view(e.what()).find("unexpected end of input") != std::string_view::npos;
      return false;
    }
  } sax;
  // nlohmann reads a NUL byte outside a string as the input's end; JSON has it nowhere, as it
  // has no \x01 (which nlohmann refuses everywhere).
  std::string bytes(text);
  std::ranges::replace(bytes, '\0', '\x01');
  nlohmann::json::sax_parse(bytes, &sax);
  const size_t first = text.find_first_not_of(" \t\n\r");
  const bool object = first == std::string_view::npos || text[first] == '{';
  NlohmannVerdict v;
  v.complete = object && !sax.failed;
  // (out_of_range.406, a number that overflows a double, is refused wherever it ends.)
  v.refused = !object || (sax.failed && (sax.at <= text.size() || sax.id == 406));
  v.cut_token = !v.refused && sax.failed && !sax.waits;
  return v;
}

// Whether nlohmann accepts `text` followed by exactly `left` of JSON's bytes: a depth-first
// search that drops every text nlohmann refuses before its end, within `budget` texts.
inline bool NlohmannCompletesIn(std::string& text, int left, int& budget) {
  static constexpr std::string_view kBytes = "\"}]0:,\\nu1.e-trlasDC\x80\xA0\x90";
  for (char c : kBytes) {
    if (--budget < 0) return false;
    text.push_back(c);
    const NlohmannVerdict v = ReadWithNlohmann(text);
    const bool found =
        left == 1 ? v.complete : !v.refused && NlohmannCompletesIn(text, left - 1, budget);
    text.pop_back();
    if (found) return true;
  }
  return false;
}

// Whether nlohmann accepts `text` followed by at most `most` of JSON's bytes: the shortest such
// texts first (iterative deepening), within `budget` texts.
inline bool NlohmannCompletes(const std::string& text, int most, int& budget) {
  std::string mended = text;
  for (int left = 1; left <= most && budget > 0; ++left) {
    if (NlohmannCompletesIn(mended, left, budget)) return true;
  }
  return false;
}

// Whether some text after `text` makes it a JSON object, by nlohmann's streaming parser, which
// refuses a text as soon as a whole token of it cannot follow, but cannot judge a token cut off
// by the text's end (`{-` is dead, as a number cannot be a key; `{}"` too): so each way of
// ending the last token is tried, followed by a space that ends it (a string must have ended).
inline bool NlohmannStartsAnObject(const std::string& text) {
  static const std::vector<std::string> kEndings = {"",
                                                    "\"",
                                                    "n\"",
                                                    "0",
                                                    "0000\"",
                                                    "000\"",
                                                    "00\"",
                                                    "0\"",
                                                    "000\\uDC00\"",
                                                    "00\\uDC00\"",
                                                    "0\\uDC00\"",
                                                    "\\uDC00\"",
                                                    "uDC00\"",
                                                    "DC00\"",
                                                    "C00\"",
                                                    "\x80\"",
                                                    "\x80\x80\"",
                                                    "\xA0\x80\"",
                                                    "\x80\x80\x80\"",
                                                    "\x90\x80\x80\"",
                                                    "rue",
                                                    "ue",
                                                    "e",
                                                    "alse",
                                                    "lse",
                                                    "se",
                                                    "ull",
                                                    "ll",
                                                    "l"};
  return std::ranges::any_of(kEndings, [&text](const std::string& ending) {
    const NlohmannVerdict v = ReadWithNlohmann(text + ending + " ");
    return !v.refused && !v.cut_token;
  });
}

// "" when JsonObjectPrefix agrees with nlohmann on every prefix of `text` (whether it can still
// become an object, whether it is one) and its Closing() makes each viable prefix an object;
// else what differs. Only the prefixes of at least `from` bytes are checked. JsonObjectPrefix's
// own bounds end the check: nesting deeper than kMaxDepth, whitespace before the object, a run
// of more than kMaxSpaces whitespace bytes in it, a number with more digits than it allows.
inline std::string CheckJsonObjectPrefixes(std::string_view text, size_t from = 0) {
  colony::api::JsonObjectPrefix p;
  for (size_t k = 0; k <= text.size(); ++k) {
    using colony::api::JsonObjectPrefix;
    const char next = k > 0 ? text[k - 1] : 'x';
    const bool space = std::string_view(" \t\n\r").find(next) != std::string_view::npos;
    const bool bounded =
        (p.depth() == JsonObjectPrefix::kMaxDepth && (next == '{' || next == '[')) ||
        (space && (!p.started() || p.spaces() == JsonObjectPrefix::kMaxSpaces)) ||
        (p.number_full() && next >= '0' && next <= '9');
    const bool alive = k == 0 || p.Feed(text[k - 1]);
    if (k < from && alive) continue;
    const std::string_view prefix = text.substr(0, k);
    const NlohmannVerdict want = ReadWithNlohmann(prefix);
    if (!alive) {
      if (bounded) return "";  // JsonObjectPrefix's bounds
      int budget = 600;
      if (want.complete || (!want.refused && (NlohmannStartsAnObject(std::string(prefix)) ||
                                              NlohmannCompletes(std::string(prefix), 6, budget)))) {
        return fmt::format("{:?}: JsonObjectPrefix says dead, nlohmann reads it as {}", prefix,
                           want.complete ? "an object" : "the start of one");
      }
      return "";  // (so is every longer prefix)
    }
    if (want.refused)
      return fmt::format("{:?}: JsonObjectPrefix says viable, nlohmann not", prefix);
    if (p.complete() != want.complete) {
      return fmt::format("{:?}: JsonObjectPrefix says {}complete", prefix,
                         p.complete() ? "" : "not ");
    }
    const std::string closed = std::string(prefix) + p.Closing();
    if (!ReadWithNlohmann(closed).complete) {
      return fmt::format("{:?} closed as {:?} is no JSON object", prefix, closed);
    }
  }
  return "";
}
