// response_format json_object's mask against the rule applied apart: a small random model over
// a vocabulary of single bytes, its whole forward pass over each sequence so far (no KV cache),
// and at each step only the tokens after which nlohmann::json (fuzz/json_prefix_checks.h) can
// still read the answer as the start of a JSON object, then the token drawn, must give what
// GenerateRows gives through JsonObjectLogits, row by row. (No answer here has a run of
// whitespace long enough for JsonObjectPrefix's bound on them to matter: checked.)
#include "api/json_mode.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../../fuzz/json_prefix_checks.h"
#include "api/logit_adjustments.h"
#include "model/llama.h"
#include "serve/generation.h"
#include "serve/small_model.h"

namespace colony::api {
namespace {

constexpr int64_t kEnd = 0;  // the end token: a byte no JSON text has

bool IsSpace(int64_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }

// The rule, written out over bytes: the end token only once the answer is a whole object and
// min_tokens are generated (and then nothing else); no whitespace before the object; else the
// bytes after which the answer still starts an object; then the biases, then the draw.
std::vector<int64_t> Reference(model::LlamaModel& model, const std::vector<int64_t>& prompt,
                               const model::SamplingOptions& options, int64_t min_tokens,
                               const std::vector<std::pair<int64_t, double>>& bias,
                               const TokenTextTable& table) {
  std::mt19937_64 rng(options.seed);
  std::vector<int64_t> all = prompt, answer;
  std::string text;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    at::Tensor logits = model->forward(at::tensor(all, at::kLong).unsqueeze(0))[0][-1];
    const bool end_now = step >= min_tokens && ReadWithNlohmann(text).complete;
    for (int64_t v = 0; v < logits.size(0); ++v) {
      bool keep = false;
      if (v == kEnd || end_now) {
        keep = v == kEnd && end_now;
      } else {
        const auto token = static_cast<size_t>(v);
        if (token < table.within.size()) {
          const std::string& t = step == 0 ? table.first[token] : table.within[token];
          keep = !t.empty() && (text + t)[0] == '{' && NlohmannStartsAnObject(text + t);
        }
      }
      if (!keep) logits[v] = -std::numeric_limits<float>::infinity();
    }
    at::Tensor wide = logits.to(at::kDouble);
    for (const auto& [token, b] : bias) wide[token] += b;
    const int64_t next = model::SampleNextToken(wide.to(at::kFloat), all, options, rng);
    all.push_back(next);
    answer.push_back(next);
    if (next == kEnd) break;
    text += step == 0 ? table.first[static_cast<size_t>(next)]
                      : table.within[static_cast<size_t>(next)];
  }
  return answer;
}

std::shared_ptr<const TokenTextTable> ByteTexts() {
  std::vector<std::string> texts = {""};  // kEnd
  for (int b = 1; b < 256; ++b) texts.emplace_back(1, static_cast<char>(b));
  return std::make_shared<const TokenTextTable>(TokenTextTable::From(std::move(texts)));
}

// Tokens of one to three pieces of JSON (a sentencepiece-like first token without its leading
// space: within an answer, every token that opens an object has one), 200 of them for the
// model's 256 logits: the rest, as a padded vocabulary's, have no text.
std::shared_ptr<const TokenTextTable> FragmentTexts() {
  const std::vector<std::string> pieces = {
      " {",   "}",  " {\"", "\":", "\": ", "\"",    ",",    ", \"",     "1",
      "23",   "-",  ".5",   "e+",  "0",    "true",  "fal",  "se",       "null",
      "[",    "]",  "[1,",  " ",   "\n  ", "ab",    "key",  "\xC3\xA9", "\xC3",
      "\xA9", "\\", "n",    "u00", "e9",   "\\u",   "D83D", "\\uDE00",  "}}",
      "\"}",  "]}", " x",   "\t",  ":",    "\"a\"", "\x01", "\xF0\x9F", "\x98\x80"};
  std::mt19937_64 rng(3);
  std::vector<std::string> within = {""}, first = {""};  // kEnd
  while (within.size() < 200) {
    std::string t;
    const size_t n = 1 + rng() % 3;
    for (size_t k = 0; k < n; ++k) t += pieces[rng() % pieces.size()];
    within.push_back(t);
    first.push_back(t.starts_with(' ') ? t.substr(1) : t);
  }
  return std::make_shared<const TokenTextTable>(
      TokenTextTable::From(std::move(within), std::move(first)));
}

std::vector<model::SamplingOptions> Rows(int64_t max_new_tokens) {
  std::vector<model::SamplingOptions> rows;
  for (const auto& [temperature, seed] :
       std::vector<std::pair<double, uint64_t>>{{0.0, 0}, {0.8, 5}, {1.3, 9}}) {
    rows.push_back({.max_new_tokens = max_new_tokens,
                    .temperature = temperature,
                    .top_k = 0,
                    .top_p = 1,
                    .repetition_penalty = 1,
                    .seed = seed});
  }
  return rows;
}

std::string Text(const std::vector<int64_t>& answer, const TokenTextTable& table) {
  std::string text;
  for (size_t k = 0; k < answer.size(); ++k) {
    const auto t = static_cast<size_t>(answer[k]);
    if (answer[k] != kEnd) text += k == 0 ? table.first.at(t) : table.within.at(t);
  }
  // (A run of whitespace as long as JsonObjectPrefix's bound would make the reference wrong.)
  int run = 0;
  for (char c : text) {
    run = IsSpace(c) ? run + 1 : 0;
    EXPECT_LT(run, JsonObjectPrefix::kMaxSpaces) << text;
  }
  return text;
}

// A small random model to mask, and steps of one token per row through the mask.
class JsonObjectLogitsTest : public ::testing::Test {
 protected:
  static model::LlamaModel SeededModel() {
    at::manual_seed(11);
    return model::LlamaModel(serve::test::SmallLlamaConfig(/*tie_word_embeddings=*/false));
  }
  // [1, T]: one row's tokens.
  static at::Tensor OneRow(const std::vector<int64_t>& tokens) {
    return at::tensor(tokens, at::kLong).unsqueeze(0);
  }
  // [rows, 1] of one token each.
  static at::Tensor Column(const std::vector<int64_t>& tokens) {
    return at::tensor(tokens, at::kLong).unsqueeze(1);
  }

  // Texts: single bytes (ids 1-255), then `tokens` from id kFirst (the model has 256 logits).
  static constexpr int64_t kFirst = 200;
  using Expected = std::vector<std::pair<std::string, bool>>;  // a text, whether it fits
  static std::shared_ptr<const TokenTextTable> BytesAnd(const Expected& tokens) {
    std::vector<std::string> texts = {""};
    for (int b = 1; b < 256; ++b) texts.emplace_back(1, static_cast<char>(b));
    for (size_t i = 0; i < tokens.size(); ++i) texts[kFirst + i] = tokens[i].first;
    return std::make_shared<const TokenTextTable>(TokenTextTable::From(std::move(texts)));
  }
  // The logits after the prompt, then `answer` given a byte a step from `position`.
  static at::Tensor After(JsonObjectLogits& json, const std::string& answer, int64_t& position) {
    auto out = json.Step(OneRow({3, 17}), 0, {}, serve::StepLogits::kLast);
    position = 2;
    for (const char c : answer) {
      EXPECT_TRUE(out.ok()) << out.status().ToString();
      out = json.Step(Column({c}), position++, {}, serve::StepLogits::kLast);
    }
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? *out : at::Tensor();
  }
  // `tokens` (from kFirst) fit as expected, and every token as the answer's reader takes it fed
  // byte by byte after `answer` (the mask takes tokens that are string content alone without
  // feeding them).
  static void ExpectMask(const at::Tensor& out, const Expected& tokens, const TokenTextTable& table,
                         const JsonSchema* schema, const std::string& answer) {
    ASSERT_TRUE(out.defined());
    for (size_t i = 0; i < tokens.size(); ++i) {
      EXPECT_EQ(at::isfinite(out[0][0][kFirst + static_cast<int64_t>(i)]).item<bool>(),
                tokens[i].second)
          << tokens[i].first;
    }
    JsonSchemaPrefix read(schema);
    ASSERT_TRUE(read.Feed(answer));
    for (int64_t v = 1; v < 256; ++v) {
      JsonSchemaPrefix fed = read;
      EXPECT_EQ(at::isfinite(out[0][0][v]).item<bool>(),
                fed.Feed(table.within[static_cast<size_t>(v)]))
          << v;
    }
  }

  at::NoGradGuard no_grad_;
  model::LlamaModel model_ = SeededModel();
  const std::vector<int64_t> prompt_ = {3, 17, 99, 42, 5};
};

// Over single bytes, and over tokens of several pieces of JSON (which may fail partway, and
// whose first token reads differently), with ids past the texts.
TEST_F(JsonObjectLogitsTest, RowsAreTheModelsAnswersKeptToAJsonObject) {
  const auto rows = Rows(24);
  for (const auto& table : {ByteTexts(), FragmentTexts()}) {
    SCOPED_TRACE(table->within.size());
    std::vector<std::vector<int64_t>> want;
    for (const auto& o : rows) want.push_back(Reference(model_, prompt_, o, 0, {}, *table));
    serve::LocalBackend local(model_);
    JsonObjectLogits json(local, {.texts = table, .end_tokens = {kEnd}, .min_tokens = 0});
    auto got = serve::GenerateRows(json, prompt_, rows, kEnd);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, want);
    EXPECT_GT(json.cached_masks(), 0);  // rows came to states they (or others) had been in
    // Reading the vocabulary at every step gives the same.
    serve::LocalBackend again(model_);
    JsonObjectLogits uncached(
        again, {.texts = table, .end_tokens = {kEnd}, .min_tokens = 0, .cache_masks = false});
    auto read = serve::GenerateRows(uncached, prompt_, rows, kEnd);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_EQ(*read, want);
    EXPECT_EQ(uncached.cached_masks(), 0);
    for (const auto& answer : *got) {
      const std::string text = Text(answer, *table);
      EXPECT_TRUE(NlohmannStartsAnObject(text)) << text;
      EXPECT_EQ(text.front(), '{');  // the random model's own answer is no JSON at all
      const auto texts = static_cast<int64_t>(table->within.size());
      EXPECT_TRUE(std::ranges::all_of(answer, [texts](int64_t t) { return t < texts; }));
    }
    // Unmasked, the model writes something else.
    auto plain = serve::GenerateRows(local, prompt_, rows, kEnd);
    ASSERT_TRUE(plain.ok());
    EXPECT_NE((*plain)[0], want[0]);
  }
}

// Biased toward closing, answers become whole objects: then whitespace until min_tokens, then the
// end token and nothing else.
TEST_F(JsonObjectLogitsTest, AWholeObjectEndsTheAnswerOnceMinTokensAreGenerated) {
  const std::vector<std::pair<int64_t, double>> bias = {{'}', 6}, {'"', 5}, {'1', 4}, {':', 4}};
  const auto rows = Rows(40);
  const auto table = ByteTexts();
  for (const int64_t min_tokens : {0, 16}) {
    std::vector<std::vector<int64_t>> want;
    for (const auto& o : rows)
      want.push_back(Reference(model_, prompt_, o, min_tokens, bias, *table));
    serve::LocalBackend local(model_);
    JsonObjectLogits json(local, {.texts = table, .end_tokens = {kEnd}, .min_tokens = min_tokens});
    AdjustedLogits biased(json, {.presence_penalty = 0,
                                 .frequency_penalty = 0,
                                 .logit_bias = bias,
                                 .min_tokens = 0,
                                 .end_tokens = {}});
    auto got = serve::GenerateRows(biased, prompt_, rows, kEnd);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, want) << "min_tokens " << min_tokens;
    for (const auto& answer : *got) {
      const std::string text = Text(answer, *table);
      ASSERT_EQ(answer.back(), kEnd) << text;
      EXPECT_GE(static_cast<int64_t>(answer.size()), min_tokens + 1);
      EXPECT_TRUE(nlohmann::json::accept(text)) << text;
    }
  }
}

// A row that ended (at a stop string, say) is no longer masked.
TEST_F(JsonObjectLogitsTest, AnEndedRowIsLeftAlone) {
  serve::LocalBackend local(model_);
  JsonObjectLogits json(local, {.texts = ByteTexts(), .end_tokens = {kEnd}, .min_tokens = 0});
  const at::Tensor prompt = at::tensor(std::vector<int64_t>{3, 17}, at::kLong).repeat({2, 1});
  ASSERT_TRUE(json.Step(prompt, 0, {}, serve::StepLogits::kLast).ok());
  EXPECT_FALSE(json.WholeWith(0, '}'));
  ASSERT_TRUE(json.Step(Column({'{', '{'}), 2, {}, serve::StepLogits::kLast).ok());
  EXPECT_TRUE(json.WholeWith(0, '}'));
  json.End(1);
  auto out = json.Step(Column({'"', '"'}), 3, {}, serve::StepLogits::kLast);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const at::Tensor logits = out->select(1, 0);
  EXPECT_TRUE(at::isinf(logits[0][kEnd]).item<bool>());     // row 0: in a key, the end cannot come
  EXPECT_TRUE(at::isfinite(logits[1]).all().item<bool>());  // row 1: ended, its logits as they are
}

// String content alone: no '"' (`":"` closes a key and opens a value, which no value string
// can take), whole escapes and UTF-8 characters, no control bytes.
TEST_F(JsonObjectLogitsTest, PlainTokensAreStringContentAlone) {
  const TokenTextTable t = TokenTextTable::From(
      {"ab", "\":\"", "\\\"", "\": \"", "\":{\"", "\\n", "\xC3", "\xC3\xA9", "\x01", "", " {"});
  EXPECT_EQ(t.plain, (std::vector<bool>{true, false, false, false, false, true, false, true, false,
                                        false, true}));
  EXPECT_EQ(t.chars, (std::vector<uint32_t>{2, 0, 0, 0, 0, 1, 0, 1, 0, 0, 2}));

  // Through the mask: `":"` after a key, not inside a value.
  std::vector<std::string> texts = {""};
  for (int b = 1; b < 256; ++b) texts.emplace_back(1, static_cast<char>(b));
  constexpr int64_t kColonQuote = 200;
  texts[kColonQuote] = "\":\"";
  auto table = std::make_shared<const TokenTextTable>(TokenTextTable::From(std::move(texts)));
  serve::LocalBackend local(model_);
  JsonObjectLogits json(local, {.texts = table, .end_tokens = {kEnd}, .min_tokens = 0});
  auto out = json.Step(OneRow({3, 17}), 0, {}, serve::StepLogits::kLast);
  int64_t position = 2;
  for (const char c : std::string("{\"a")) {
    out = json.Step(Column({c}), position++, {}, serve::StepLogits::kLast);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
  }
  EXPECT_TRUE(at::isfinite((*out)[0][0][kColonQuote]).item<bool>());  // in a key
  for (const char c : std::string("\":\"x")) {
    out = json.Step(Column({c}), position++, {}, serve::StepLogits::kLast);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
  }
  EXPECT_TRUE(at::isinf((*out)[0][0][kColonQuote]).item<bool>());  // in a value
  EXPECT_TRUE(at::isfinite((*out)[0][0]['y']).item<bool>());
}

// In a string of at most 3 characters (maxLength) a plain token fits while its characters do,
// each counted once however many bytes or escapes write it.
TEST_F(JsonObjectLogitsTest, ABoundedStringTakesTokensUpToItsLength) {
  auto schema = JsonSchema::Compile(nlohmann::json::parse(
      R"({"type": "object", "properties": {"s": {"type": "string", "maxLength": 3}}})"));
  ASSERT_TRUE(schema.ok()) << schema.status().ToString();
  const Expected tokens = {// and whether each fits after "a
                           {"ab", true},
                           {"abc", false},
                           {"\xC3\xA9\xF0\x9F\x98\x80", true},
                           {"\\n\\t", true},
                           {"\\n\\t\\r", false},
                           {"\\ud83d\\ude00\\u00e9", true},
                           {"a\xC3\xA9"
                            "b",
                            false},
                           {"b\"", true}};
  serve::LocalBackend local(model_);
  const auto table = BytesAnd(tokens);
  JsonObjectLogits json(local, {.texts = table, .schema = *schema, .end_tokens = {kEnd}});
  int64_t position = 0;
  at::Tensor out = After(json, "{\"s\":\"a", position);
  ExpectMask(out, tokens, *table, schema->get(), "{\"s\":\"a");
  EXPECT_TRUE(at::isfinite(out[0][0]['"']).item<bool>());
  auto next = json.Step(Column({kFirst}), position++, {}, serve::StepLogits::kLast);  // "ab"
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_TRUE(at::isinf((*next)[0][0]['c']).item<bool>());  // then only the string's end
  EXPECT_TRUE(at::isinf((*next)[0][0]['\\']).item<bool>());
  EXPECT_TRUE(at::isinf((*next)[0][0][kFirst + 2]).item<bool>());
  EXPECT_TRUE(at::isfinite((*next)[0][0]['"']).item<bool>());
}

// A map's key takes any string content: tokens that are string content alone are kept without
// being fed (as in a free string), the others as the answer's reader takes them.
TEST_F(JsonObjectLogitsTest, AMapsKeyTakesAnyStringContent) {
  auto schema = JsonSchema::Compile(nlohmann::json::parse(
      R"({"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}})"));
  ASSERT_TRUE(schema.ok()) << schema.status().ToString();
  const Expected tokens = {// and whether each fits after {"a
                           {"bc", true},    {"\\u00e9\\n", true}, {"\xC3\xA9 d", true},
                           {"b\":", true},  {"b\": 12", true},    {"b\":-1", false},
                           {"b\"x", false}, {"\\q", false}};
  serve::LocalBackend local(model_);
  const auto table = BytesAnd(tokens);
  JsonObjectLogits json(local, {.texts = table, .schema = *schema, .end_tokens = {kEnd}});
  int64_t position = 0;
  const at::Tensor out = After(json, "{\"a", position);
  ExpectMask(out, tokens, *table, schema->get(), "{\"a");
  JsonSchemaPrefix answer(schema->get());
  ASSERT_TRUE(answer.Feed("{\"a"));
  EXPECT_TRUE(answer.between_string_characters());  // (the mask takes plain tokens unread)
}

// In a set (uniqueItems of an enum's values) the mask allows no token that writes a value again,
// and the same texts after values written in another order.
TEST_F(JsonObjectLogitsTest, ASetsMaskRefusesAValueWrittenBefore) {
  auto schema = JsonSchema::Compile(nlohmann::json::parse(
      R"({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": true,
        "items": {"enum": ["red", "green", "greenish", "blue"]}}}})"));
  ASSERT_TRUE(schema.ok()) << schema.status().ToString();
  const Expected tokens = {// and whether each fits after {"tags":["green","red",
                           {"\"red\"", false},       {"\"r", false},
                           {"\"green\"", false},     {"\"green", true},
                           {"\"greenish\"]", true},  {"\"blue\"", true},
                           {"\"bl", true},           {"\"blue\",\"green", true},
                           {"\"blue\",\"red", false}};
  const auto table = BytesAnd(tokens);
  for (const std::string answer :
       {"{\"tags\":[\"green\",\"red\",", "{\"tags\":[\"red\",\"green\","}) {
    serve::LocalBackend local(model_);
    JsonObjectLogits json(local, {.texts = table, .schema = *schema, .end_tokens = {kEnd}});
    int64_t position = 0;
    const at::Tensor out = After(json, answer, position);
    ExpectMask(out, tokens, *table, schema->get(), answer);
  }
}

// Inside a long bounded string the counts of characters left past the longest token's bytes are
// one state, whose mask is kept: a 60-character string of single bytes reads masks at its start
// and for its last character alone.
TEST_F(JsonObjectLogitsTest, ALongBoundedStringReadsFewMasks) {
  auto schema = JsonSchema::Compile(nlohmann::json::parse(
      R"({"type": "object", "properties": {"s": {"type": "string", "maxLength": 60}}})"));
  ASSERT_TRUE(schema.ok()) << schema.status().ToString();
  serve::LocalBackend local(model_);
  JsonObjectLogits json(local, {.texts = ByteTexts(), .schema = *schema, .end_tokens = {kEnd}});
  auto out = json.Step(OneRow(prompt_), 0, {}, serve::StepLogits::kLast);
  int64_t position = static_cast<int64_t>(prompt_.size());
  const std::string text = "{\"s\":\"" + std::string(60, 'a');
  for (size_t i = 0; i < text.size(); ++i) {
    out = json.Step(Column({text[i]}), position++, {}, serve::StepLogits::kLast);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    if (i < 5)
      continue;  // (in the string from its quote on: 'a' fits while characters are
                 // left, '"' always: no minLength)
    EXPECT_EQ(at::isfinite((*out)[0][0]['a']).item<bool>(), i + 1 < text.size()) << i;
    EXPECT_TRUE(at::isfinite((*out)[0][0]['"']).item<bool>()) << i;
  }
  // The start and the 6 states to the string's first character (60 left: as 2, past the
  // longest token's byte), then 1 left, 0 left.
  EXPECT_EQ(json.read_masks(), 9);
  EXPECT_EQ(json.cached_masks(), static_cast<int64_t>(text.size()) + 1 - 9);
}

// An answer's first token is read as it is written alone (a sentencepiece word start loses its
// space there), later ones as within the text.
TEST_F(JsonObjectLogitsTest, TheFirstTokenIsReadAsWrittenAlone) {
  std::vector<std::string> within = {"", " {}", "{", "}"};
  std::vector<std::string> first = {"", "{}", "{", "}"};
  within.resize(256, "x");
  first.resize(256, "x");
  auto table = std::make_shared<const TokenTextTable>(
      TokenTextTable::From(std::move(within), std::move(first)));
  serve::LocalBackend local(model_);
  JsonObjectLogits json(local, {.texts = table, .end_tokens = {kEnd}, .min_tokens = 0});
  auto out = json.Step(OneRow({3, 17}), 0, {}, serve::StepLogits::kLast);
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(at::isfinite((*out)[0][0][1]).item<bool>());  // "{}" first, " {}" within
  EXPECT_TRUE(json.WholeWith(0, 1));
  out = json.Step(Column({2}), 2, {}, serve::StepLogits::kLast);
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(at::isinf((*out)[0][0][1]).item<bool>());  // " {}" within: no object after "{"
  EXPECT_FALSE(json.WholeWith(0, 1));
  EXPECT_TRUE(json.WholeWith(0, 3));
}

TEST_F(JsonObjectLogitsTest, AVocabularyThatCannotContinueTheObjectFailsTheStep) {
  auto texts = std::make_shared<const TokenTextTable>(
      TokenTextTable::From(std::vector<std::string>(256, "x")));  // no '{'
  EXPECT_FALSE(texts->begins_object);
  EXPECT_TRUE(ByteTexts()->begins_object);
  serve::LocalBackend local(model_);
  JsonObjectLogits json(local, {.texts = texts, .end_tokens = {kEnd}, .min_tokens = 0});
  auto got = serve::GenerateRows(json, {3, 17}, Rows(4), kEnd);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kFailedPrecondition);
}

// The kept masks take at most mask_cache_bytes (an answer nesting ever deeper is in a new state
// at every step), and the masks are right after the oldest were dropped.
TEST_F(JsonObjectLogitsTest, KeptMasksTakeAtMostTheirBudget) {
  constexpr size_t kMasks = 40;  // of 256 bits each
  serve::LocalBackend local(model_);
  JsonObjectLogits json(local, {.texts = ByteTexts(),
                                .end_tokens = {kEnd},
                                .min_tokens = 0,
                                .cache_masks = true,
                                .mask_cache_bytes = kMasks * 256 / 8});
  ASSERT_TRUE(json.Step(OneRow(prompt_), 0, {}, serve::StepLogits::kLast).ok());
  int64_t position = static_cast<int64_t>(prompt_.size());
  std::string text;
  size_t most = 0;
  for (const char c : "{\"\":" + std::string(JsonObjectPrefix::kMaxDepth - 1, '[')) {
    auto out = json.Step(Column({c}), position++, {}, serve::StepLogits::kLast);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    text += c;
    most = std::max(most, json.masks().counts().masks);
    if (text.size() < 4) continue;
    // In the arrays '[' fits until the bound, and ']' does.
    const bool deepest = text.size() == 3 + JsonObjectPrefix::kMaxDepth;
    EXPECT_EQ(at::isfinite((*out)[0][0]['[']).item<bool>(), !deepest) << text;
    EXPECT_EQ(at::isfinite((*out)[0][0][']']).item<bool>(), text.size() > 4) << text;
  }
  EXPECT_EQ(most, kMasks);
  EXPECT_LE(json.masks().counts().masks, kMasks);
  EXPECT_LE(json.masks().counts().bytes, json.masks().budget_bytes());
  EXPECT_EQ(json.cached_masks(), 0);  // every state was new
}

// Masks kept for every request of a token table: a second request reads none (its first step's
// mask too was kept) and answers as the rule does; masks kept for other texts are not used.
TEST_F(JsonObjectLogitsTest, MasksAreKeptForEveryRequestOfTheirTexts) {
  const auto rows = Rows(24);
  const auto table = FragmentTexts();
  std::vector<std::vector<int64_t>> want;
  for (const auto& o : rows) want.push_back(Reference(model_, prompt_, o, 0, {}, *table));
  auto shared = std::make_shared<JsonMasks>(table, size_t{1} << 20);
  for (int request = 0; request < 2; ++request) {
    const JsonMasks::Counts before = shared->counts();
    serve::LocalBackend local(model_);
    JsonObjectLogits json(local,
                          {.texts = table, .end_tokens = {kEnd}, .min_tokens = 0, .masks = shared});
    auto got = serve::GenerateRows(json, prompt_, rows, kEnd);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, want) << "request " << request;
    EXPECT_EQ(&json.masks(), shared.get());
    const JsonMasks::Counts after = shared->counts();
    if (request == 0) {
      EXPECT_GT(json.read_masks(), 0);
      EXPECT_GT(after.masks, 0U);
    } else {
      EXPECT_EQ(json.read_masks(), 0);  // every mask, the first step's too, was kept
      EXPECT_EQ(after.misses, before.misses);
      EXPECT_GT(after.hits, before.hits);
    }
  }
  serve::LocalBackend local(model_);
  JsonObjectLogits other(local, {.texts = ByteTexts(),
                                 .end_tokens = {kEnd},
                                 .min_tokens = 0,
                                 .cache_masks = true,
                                 .masks = shared});
  EXPECT_NE(&other.masks(), shared.get());
}

// A schema's masks are kept for every request of its compilation (the service compiles a text
// once: api/json_schema_cache.h): a second request reads none. Another schema whose states have
// the same keys (the same nodes, of another kind) does not take them: after {"a": one takes
// digits, the other a string.
TEST_F(JsonObjectLogitsTest, ASchemasMasksAreKeptForEveryRequestOfIt) {
  auto integer = JsonSchema::Compile(nlohmann::json::parse(
      R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})"));
  auto string = JsonSchema::Compile(nlohmann::json::parse(
      R"({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})"));
  ASSERT_TRUE(integer.ok() && string.ok());
  const auto table = ByteTexts();
  auto shared = std::make_shared<JsonMasks>(table, size_t{1} << 20);
  // Steps through `text` with `schema`'s masks; the logits after it.
  auto after = [&](const std::shared_ptr<const JsonSchema>& schema, const std::string& text,
                   int64_t& read) {
    serve::LocalBackend local(model_);
    JsonObjectLogits json(local, {.texts = table,
                                  .schema = schema,
                                  .end_tokens = {kEnd},
                                  .min_tokens = 0,
                                  .cache_masks = true,
                                  .masks = shared});
    EXPECT_EQ(&json.masks(), shared.get());
    auto out = json.Step(OneRow(prompt_), 0, {}, serve::StepLogits::kLast);
    int64_t position = static_cast<int64_t>(prompt_.size());
    for (const char c : text) {
      EXPECT_TRUE(out.ok()) << out.status().ToString();
      out = json.Step(Column({c}), position++, {}, serve::StepLogits::kLast);
    }
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    read = json.read_masks();
    return out.ok() ? (*out)[0][0] : at::Tensor();
  };
  int64_t read = 0;
  at::Tensor logits = after(*integer, "{\"a\": ", read);
  EXPECT_EQ(read, 7);  // (each state a first time)
  EXPECT_TRUE(at::isfinite(logits['7']).item<bool>());
  EXPECT_TRUE(at::isinf(logits['"']).item<bool>());
  logits = after(*integer, "{\"a\": ", read);
  EXPECT_EQ(read, 0);
  EXPECT_TRUE(at::isfinite(logits['7']).item<bool>());
  {
    JsonSchemaPrefix i(integer->get()), s(string->get());
    ASSERT_TRUE(i.Feed("{\"a\": ") && s.Feed("{\"a\": "));
    EXPECT_EQ(i.key(), s.key());  // (what the schema's id in the masks' keys tells apart)
  }
  logits = after(*string, "{\"a\": ", read);
  EXPECT_EQ(read, 7);
  EXPECT_TRUE(at::isinf(logits['7']).item<bool>());
  EXPECT_TRUE(at::isfinite(logits['"']).item<bool>());
}

// The steps it cannot follow (api/answer_steps.h) fail before they reach the model, and leave it
// able to go on.
TEST_F(JsonObjectLogitsTest, RefusesStepsItCannotFollow) {
  serve::LocalBackend local(model_);
  JsonObjectLogits json(local, {.texts = ByteTexts(), .end_tokens = {kEnd}, .min_tokens = 3});
  auto refused = [&](const at::Tensor& tokens, int64_t position, const at::Tensor& hypo_ids,
                     serve::StepLogits logits, const std::string& why) {
    auto r = json.Step(tokens, position, hypo_ids, logits);
    ASSERT_FALSE(r.ok()) << why;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("response_format json_object: " + why), std::string::npos)
        << r.status().ToString();
  };
  refused(OneRow(prompt_), 0, {}, serve::StepLogits::kAll, "a step takes the last position's");
  refused(at::tensor(prompt_, at::kLong), 0, {}, serve::StepLogits::kLast,
          "tokens must be [rows, T]");
  ASSERT_TRUE(json.Step(OneRow(prompt_), 0, {}, serve::StepLogits::kLast).ok());
  refused(Column({'{'}), 5, at::zeros({1}, at::kLong), serve::StepLogits::kLast,
          "a step cannot follow reordered rows");
  refused(Column({'{'}), 2, {}, serve::StepLogits::kLast, "a step at 2 after 5");  // a rollback
  refused(Column({'{', '{'}), 5, {}, serve::StepLogits::kLast, "a step of 2 rows after");
  EXPECT_EQ(local.position(), 5);
  auto next = json.Step(Column({'{'}), 5, {}, serve::StepLogits::kLast);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->sizes(), (std::vector<int64_t>{1, 1, 256}));
  EXPECT_TRUE(json.WholeWith(0, '}'));  // the refused steps' tokens were not read
  // Nor counted: the object is whole after 2 tokens, and min_tokens 3 holds the end back.
  next = json.Step(Column({'}'}), 6, {}, serve::StepLogits::kLast);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_TRUE(at::isinf((*next)[0][0][kEnd]).item<bool>());
  next = json.Step(Column({' '}), 7, {}, serve::StepLogits::kLast);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_TRUE(at::isfinite((*next)[0][0][kEnd]).item<bool>());
}

}  // namespace
}  // namespace colony::api
