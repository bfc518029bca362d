// JsonObjectPrefix (what response_format json_object keeps answers to) against nlohmann::json,
// an independent reader (fuzz/json_prefix_checks.h): on hand-picked texts, on every prefix of
// random objects and of their random mutations, and on every short text over JSON's own bytes.
#include "api/json_prefix.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "../../fuzz/json_prefix_checks.h"

namespace colony::api {
namespace {

struct Case {
  std::string text;
  bool viable;
  bool complete;
};

TEST(JsonObjectPrefix, HandPickedTexts) {
  const std::vector<Case> cases = {
      {"", true, false},
      {"  \n", false, false},  // the object comes first
      {"{}", true, true},
      {"{ } \n", true, true},
      {"{\n" + std::string(23, ' ') + "}", true, true},
      {"{\n" + std::string(23, ' ') + " ", false, false},  // a run of whitespace too long
      {"{\"a\": \"" + std::string(40, ' ') + "\"}" + std::string(40, ' '), true, true},
      {"[]", false, false},  // an object, not any value
      {"\"a\"", false, false},
      {"{} x", false, false},
      {"{}{", false, false},
      {"{\"a\":01", false, false},  // no leading zeros
      {"{\"a\":-0.5e+3}", true, true},
      {"{\"a\":1e99}", true, true},
      {"{\"a\":1e999}", false, false},  // at most two digits of exponent: a finite double
      {"{\"a\":" + std::string(200, '7') + "}", true, true},
      {"{\"a\":" + std::string(201, '7'), false, false},
      {"{\"a\":1.}", false, false},
      {"{\"a\":1e", true, false},
      {"{\"a\":tr", true, false},
      {"{\"a\":tx", false, false},
      {"{\"a\":[1,]", false, false},
      {"{\"a\" 1", false, false},
      {"{\"a\":\"\x01", false, false},  // a control character
      {"{\"a\":\"\\q", false, false},   // no such escape
      {"{\"a\":\"\\ud83d\\ude00\"}", true, true},
      {"{\"a\":\"\\ud83d", true, false},  // a high surrogate waits for its low one
      {"{\"a\":\"\\ud83dx", false, false},
      {"{\"a\":\"\\ud83d\\u0041", false, false},
      {"{\"a\":\"\\udc", false, false},  // a low surrogate alone
      {"{\"a\":\"\xC3\xA9\"}", true, true},
      {"{\"a\":\"\xC3", true, false},           // half a character
      {"{\"a\":\"\xC0\x80", false, false},      // an overlong form
      {"{\"a\":\"\xED\xA0\x80", false, false},  // a surrogate in UTF-8
      {"{\"a\":\"\xF4\x90", false, false},      // past U+10FFFF
      {"{\"a\":\"\xF0\x9F\x98\x80\"}", true, true},
  };
  for (const Case& c : cases) {
    JsonObjectPrefix p;
    EXPECT_EQ(p.Feed(c.text), c.viable) << c.text;
    if (c.viable) {
      EXPECT_EQ(p.complete(), c.complete) << c.text;
    }
    EXPECT_EQ(ReadWithNlohmann(c.text).complete, c.complete) << c.text;  // the table, apart
    EXPECT_EQ(CheckJsonObjectPrefixes(c.text), "");
  }
}

// Random JSON objects, written with random whitespace, escapes and UTF-8.
class Writer {
 public:
  explicit Writer(uint64_t seed) : rng_(seed) {}

  std::string Object(int depth) {
    std::string out = (depth > 0 ? Space() : "") + "{";
    const int n = Pick(depth > 3 ? 2 : 4);
    for (int i = 0; i < n; ++i) {
      if (i > 0) out += Space() + ",";
      out += Space() + String() + Space() + ":" + Value(depth + 1);
    }
    return out + Space() + "}" + Space();
  }

 private:
  int Pick(int n) { return std::uniform_int_distribution<int>(0, n)(rng_); }
  std::string Space() {
    static const std::vector<std::string> kSpaces = {"", "", "", " ", "\n  ", "\t", "\r\n"};
    return kSpaces[static_cast<size_t>(Pick(static_cast<int>(kSpaces.size()) - 1))];
  }
  std::string Value(int depth) {
    switch (Pick(depth > 4 ? 3 : 5)) {
      case 0:
        return Space() + String() + Space();
      case 1:
        return Space() + Number() + Space();
      case 2: {
        static const std::vector<std::string> kLiterals = {"true", "false", "null"};
        return Space() + kLiterals[static_cast<size_t>(Pick(2))] + Space();
      }
      case 3: {
        std::string out = Space() + "[";
        const int n = Pick(3);
        for (int i = 0; i < n; ++i) out += (i > 0 ? "," : "") + Value(depth + 1);
        return out + Space() + "]" + Space();
      }
      default:
        return Object(depth);
    }
  }
  std::string Number() {
    std::string out = Pick(3) == 0 ? "-" : "";
    out += Pick(3) == 0 ? "0" : std::to_string(1 + Pick(99999));
    if (Pick(2) == 0) out += "." + std::to_string(Pick(999));
    if (Pick(3) == 0) {
      static const std::vector<std::string> kExps = {"e", "E", "e+", "e-", "E-"};
      out += kExps[static_cast<size_t>(Pick(4))] + std::to_string(Pick(30));
    }
    return out;
  }
  std::string String() {
    static const std::vector<std::string> kPieces = {"a",
                                                     "key",
                                                     " ",
                                                     "\\\"",
                                                     "\\\\",
                                                     "\\/",
                                                     "\\n",
                                                     "\\t",
                                                     "\\u00e9",
                                                     "\\u0000",
                                                     "\\uD83D\\uDE00",
                                                     "\xC3\xA9",
                                                     "\xE2\x82\xAC",
                                                     "\xF0\x9F\x98\x80",
                                                     "\xED\x9F\xBF",
                                                     "\xEF\xBF\xBD",
                                                     "}",
                                                     "[",
                                                     ":",
                                                     ","};
    std::string out = "\"";
    const int n = Pick(4);
    for (int i = 0; i < n; ++i)
      out += kPieces[static_cast<size_t>(Pick(static_cast<int>(kPieces.size()) - 1))];
    return out + "\"";
  }

  std::mt19937_64 rng_;
};

TEST(JsonObjectPrefix, EveryPrefixOfRandomObjectsAndTheirMutations) {
  const std::string bytes =
      "{}[]\":,0123456789-+.eEtrufalsn \n\\uDCd\x01\x80\xBF\xC3\xE0\xED\xF4\xFF";
  std::mt19937_64 rng(7);
  int objects = 0, mutants = 0;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const std::string doc = Writer(seed).Object(0);
    ASSERT_TRUE(nlohmann::json::accept(doc)) << doc;  // the writer, checked apart
    JsonObjectPrefix p;
    ASSERT_TRUE(p.Feed(doc)) << doc;
    EXPECT_TRUE(p.complete()) << doc;
    ASSERT_EQ(CheckJsonObjectPrefixes(doc), "");
    ++objects;
    for (int m = 0; m < 8; ++m) {
      std::string mutant = doc;
      const int edits = 1 + static_cast<int>(rng() % 3);
      for (int e = 0; e < edits; ++e) {
        const size_t at = rng() % (mutant.size() + 1);
        const char b = bytes[rng() % bytes.size()];
        switch (rng() % 3) {
          case 0:
            if (at < mutant.size()) mutant[at] = b;
            break;
          case 1:
            mutant.insert(mutant.begin() + static_cast<std::ptrdiff_t>(at), b);
            break;
          default:
            if (at < mutant.size()) mutant.erase(at, 1);
        }
      }
      ASSERT_EQ(CheckJsonObjectPrefixes(mutant), "");
      ++mutants;
    }
  }
  EXPECT_EQ(objects, 300);
  EXPECT_EQ(mutants, 2400);
}

// Every text of up to four bytes over JSON's own bytes, after the start of an object, a value,
// an array and a string.
TEST(JsonObjectPrefix, EveryShortTextAfterEachContext) {
  const std::string alphabet = "{}[]\":,0-e \\u\xC3\xA9t";
  int checked = 0;
  for (const std::string context : {"", "{\"a\":", "{\"a\":[", "{\"a\":\""}) {
    std::vector<std::string> texts = {""};
    for (int length = 1; length <= 4; ++length) {
      std::vector<std::string> longer;
      for (const std::string& t : texts) {
        if (static_cast<int>(t.size()) != length - 1) continue;
        for (char c : alphabet) longer.push_back(t + c);
      }
      texts.insert(texts.end(), longer.begin(), longer.end());
    }
    for (const std::string& t : texts) {  // (each text alone: its prefixes are texts too)
      ASSERT_EQ(CheckJsonObjectPrefixes(context + t, context.size() + t.size()), "");
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4 * (1 + 16 + 16 * 16 + 16 * 16 * 16 + 16 * 16 * 16 * 16));
}

// Prefixes with equal keys (by which api/json_mode.h keeps masks) take and refuse the same
// texts and end with equal keys: every prefix of random objects and their mutations and of every
// byte after a few contexts, each against the first prefix seen with its key, on every byte, runs
// of whitespace and digits to their bounds, the rest of either text and (4 times a key) every two
// bytes over JSON's own. Keys differ where what can follow differs, and the kinds of closed
// containers are not part of them.
TEST(JsonObjectPrefix, PrefixesWithEqualKeysReadAlike) {
  const std::string alphabet = "{}[]\":,0123456789-+.eEtrufalsn \n\\uDCd\x01\x80\xBF\xC3\xE0";
  // Each byte, and runs of whitespace and digits to their bounds; and (at most 4 times for a
  // key: the test's time) every two bytes over JSON's own.
  std::vector<std::string> always, pairs;
  for (int b = 0; b < 256; ++b) always.emplace_back(1, static_cast<char>(b));
  always.emplace_back(JsonObjectPrefix::kMaxSpaces, ' ');
  always.emplace_back(JsonObjectPrefix::kMaxIntegerDigits, '1');
  for (char a : alphabet) {
    for (char b : alphabet) pairs.push_back(std::string{a, b});
  }
  struct Seen {
    JsonObjectPrefix state;
    std::string rest;
    int compared = 0;  // on pairs
  };
  std::unordered_map<JsonObjectPrefix::Key, Seen, JsonObjectPrefix::KeyHash> seen;
  std::mt19937_64 rng(5);
  int64_t shared = 0;
  auto check = [&](const std::string& text) {
    JsonObjectPrefix p;
    for (size_t at = 0; at <= text.size(); ++at) {
      if (at > 0 && !p.Feed(text[at - 1])) return;
      const std::string rest = text.substr(at);
      auto [it, added] = seen.try_emplace(p.key(), Seen{p, rest});
      if (added) continue;
      ++shared;
      auto alike = [&](const std::string& c) {
        JsonObjectPrefix a = p, b = it->second.state;
        ASSERT_EQ(a.Feed(c), b.Feed(c)) << text.substr(0, at) << " + " << c;
        ASSERT_EQ(a.key(), b.key()) << text.substr(0, at) << " + " << c;
        ASSERT_EQ(a.complete(), b.complete());
      };
      for (const std::string& c : always) alike(c);
      if (it->second.compared < 4) {
        ++it->second.compared;
        for (const std::string& c : pairs) alike(c);
      }
      alike(rest);
      alike(it->second.rest);
      if (::testing::Test::HasFatalFailure()) return;
      ASSERT_EQ(p.Closing(), it->second.state.Closing()) << text.substr(0, at);
    }
  };
  for (uint64_t seed = 0; seed < 120; ++seed) {
    const std::string doc = Writer(seed).Object(0);
    check(doc);
    std::string mutant = doc;
    mutant[rng() % mutant.size()] = alphabet[rng() % alphabet.size()];
    check(mutant);
  }
  for (const std::string context : {"{\"", "{\"a\": \"", "{\"a\":", "{\"a\":[1", "{\"a\":tr"}) {
    for (int b = 0; b < 256; ++b) check(context + static_cast<char>(b));  // UTF-8's leads too
  }
  EXPECT_GT(shared, 10000);  // most prefixes share a key with one seen before
  EXPECT_GT(seen.size(), 100u);

  JsonObjectPrefix after_array, after_object, in_array, in_object;
  ASSERT_TRUE(after_array.Feed("{\"a\":[1],\"b\":"));
  ASSERT_TRUE(after_object.Feed("{\"c\":{\"x\":2},\"d\":"));
  EXPECT_EQ(after_array.key(), after_object.key());
  ASSERT_TRUE(in_array.Feed("{\"a\":[1"));
  ASSERT_TRUE(in_object.Feed("{\"a\":{\"x\":1"));
  EXPECT_NE(in_array.key(), in_object.key());
  // What is left of a closed number, literal or string is not part of the state.
  JsonObjectPrefix one, two, literal, string;
  ASSERT_TRUE(one.Feed("{\"a\":1,"));
  ASSERT_TRUE(two.Feed("{\"a\":-12.5e+10,"));
  ASSERT_TRUE(literal.Feed("{\"a\":false,"));
  ASSERT_TRUE(string.Feed("{\"a\":\"\\u00e9\xC3\xA9\","));
  EXPECT_EQ(one.key(), two.key());
  EXPECT_EQ(one.key(), literal.key());
  EXPECT_EQ(one.key(), string.key());
}

TEST(JsonObjectPrefix, NestsAtMostMaxDepthDeep) {
  JsonObjectPrefix p;
  std::string text = "{\"a\":";
  for (int d = 1; d < JsonObjectPrefix::kMaxDepth; ++d) text += "[";
  ASSERT_TRUE(p.Feed(text));
  EXPECT_EQ(p.depth(), JsonObjectPrefix::kMaxDepth);
  JsonObjectPrefix deeper = p;
  EXPECT_FALSE(deeper.Feed('['));
  EXPECT_FALSE(deeper.Feed(']'));  // a false is final
  ASSERT_TRUE(p.Feed("1"));
  const std::string closing = p.Closing();
  EXPECT_TRUE(nlohmann::json::accept(text + "1" + closing)) << closing;
}

}  // namespace
}  // namespace colony::api
