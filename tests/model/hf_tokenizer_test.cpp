// Hugging Face tokenizer.json: the fixture's byte-level BPE against the encodings the tokenizers
// library computed (tests/data/hf/reference.json), Llama 3 and Qwen2 pre-tokenizer sequences
// against splits worked out by hand from their regexes, merge order, added tokens,
// normalizers, tokenizer_config.json, and refusals of what Colony does not understand.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/files.h"
#include "model/tokenizer.h"

namespace colony::model {
namespace {

using nlohmann::json;

const std::filesystem::path kFixtures = COLONY_HF_FIXTURES;

// GPT-2's printable stand-ins for the space and newline bytes (bytes_to_unicode).
const std::string kSpace = "\xC4\xA0";    // U+0120 'Ġ'
const std::string kNewline = "\xC4\x8A";  // U+010A 'Ċ'

// The regexes of Llama 3's and Qwen2's tokenizer.json (they differ in \p{N}{1,3} and \p{N}).
const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A tokenizer.json in the layout of Llama 3's: Split by `regex`, then ByteLevel without its own
// regex; the vocabulary holds whole words (ignore_merges) plus the pieces they split into.
json SplitThenByteLevel(const char* regex, const std::vector<std::string>& vocab) {
  json v = json::object();
  for (const std::string& token : vocab) v[token] = static_cast<int>(v.size());
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", json::array({{{"id", static_cast<int>(vocab.size())},
                                     {"content", "<|begin_of_text|>"},
                                     {"single_word", false},
                                     {"lstrip", false},
                                     {"rstrip", false},
                                     {"normalized", false},
                                     {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "Split"},
                                        {"pattern", {{"Regex", regex}}},
                                        {"behavior", "Isolated"},
                                        {"invert", false}},
                                       {{"type", "ByteLevel"},
                                        {"add_prefix_space", false},
                                        {"trim_offsets", true},
                                        {"use_regex", false}}})}}},
      {"post_processor",
       {{"type", "Sequence"},
        {"processors",
         json::array({{{"type", "ByteLevel"},
                       {"add_prefix_space", true},
                       {"trim_offsets", false},
                       {"use_regex", true}},
                      {{"type", "TemplateProcessing"},
                       {"single", json::array({{{"SpecialToken",
                                                 {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                               {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                       {"pair", json::array()},
                       {"special_tokens",
                        {{"<|begin_of_text|>",
                          {{"id", "<|begin_of_text|>"},
                           {"ids", json::array({static_cast<int>(vocab.size())})},
                           {"tokens", json::array({"<|begin_of_text|>"})}}}}}}})}}},
      {"decoder",
       {{"type", "ByteLevel"},
        {"add_prefix_space", true},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", true},
        {"vocab", v},
        {"merges", json::array()}}}};
}

// A plain BPE over single characters with the given merges (pairs), no pre-tokenizer.
json CharBpe(const std::vector<std::string>& vocab,
             const std::vector<std::pair<std::string, std::string>>& merges) {
  json v = json::object();
  for (const std::string& token : vocab) v[token] = static_cast<int>(v.size());
  json m = json::array();
  for (const auto& [a, b] : merges) m.push_back(json::array({a, b}));
  return {{"version", "1.0"},
          {"model", {{"type", "BPE"}, {"vocab", v}, {"merges", m}}},
          {"decoder", {{"type", "ByteLevel"}}}};
}

Tokenizer Make(const json& j, const json& config = nullptr) {
  auto tok = Tokenizer::FromHfJson(j.dump(), config.is_null() ? "" : config.dump());
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  if (!tok.ok()) std::abort();
  return *tok;
}

std::vector<int32_t> Ids(std::initializer_list<int32_t> ids) { return ids; }

TEST(HfTokenizerTest, FixtureEncodesLikeTheTokenizersLibrary) {
  std::ifstream in(kFixtures / "reference.json");
  const json reference = json::parse(in);
  auto found = Tokenizer::FindInModelDir(kFixtures / "tokenizer-bytelevel-bpe");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->filename(), "tokenizer.json");
  auto tok = Tokenizer::Load(*found);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ(tok->vocab_size(), 2048);
  EXPECT_EQ(tok->file_name(), "tokenizer.json");
  EXPECT_EQ(tok->bos_id(), -1);  // no post-processor, no tokenizer_config.json
  int checked = 0;
  for (const json& sample : reference.at("tokenizer-bytelevel-bpe")) {
    const std::string text = sample.at("text");
    const auto want = sample.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(tok->Encode(text), want) << "text: " << text;
    EXPECT_EQ(tok->Decode(want), sample.at("decoded").get<std::string>()) << "text: " << text;
    ++checked;
  }
  EXPECT_EQ(checked, 6);
}

TEST(HfTokenizerTest, SpecialTokensInTheTextAreRecognisedAndNotDecoded) {
  auto tok = Tokenizer::Load(kFixtures / "tokenizer-bytelevel-bpe" / "tokenizer.json");
  ASSERT_TRUE(tok.ok());
  // Ids 0 and 1 are the fixture's special tokens <|begin_of_text|> and <|end_of_text|>.
  std::vector<int32_t> want = {0};
  for (int32_t id : tok->Encode("Hello")) want.push_back(id);
  want.push_back(1);
  for (int32_t id : tok->Encode(" world")) want.push_back(id);
  EXPECT_EQ(tok->Encode("<|begin_of_text|>Hello<|end_of_text|> world"), want);
  EXPECT_EQ(tok->Decode(want), "Hello world");
}

TEST(HfTokenizerTest, Llama3RegexSplitsAsWorkedOutByHand) {
  // "Hello world's 12345!!\n\n  x" under Llama 3's regex: letters with one leading non-letter,
  // the contraction alone, digits in threes, the space before digits alone (\s+ after the
  // lookahead fails), punctuation with its newlines, and "  x" as " " + " x".
  const std::vector<std::string> words = {"Hello", " world", "'s", " ",  "123",
                                          "45",    "!!\n\n", " ",  " x", "'S"};
  std::vector<std::string> vocab;
  for (std::string w : words) {
    std::string mapped;
    for (char c : w) mapped += c == ' ' ? kSpace : c == '\n' ? kNewline : std::string(1, c);
    vocab.push_back(mapped);
  }
  // "Ġ" appears twice in `words`; the vocabulary keeps its first id (3).
  vocab.erase(vocab.begin() + 7);
  Tokenizer tok = Make(SplitThenByteLevel(kLlama3Regex, vocab));
  EXPECT_EQ(tok.Encode("Hello world's 12345!!\n\n  x"), Ids({0, 1, 2, 3, 4, 5, 6, 3, 7}));
  EXPECT_EQ(tok.Decode(Ids({0, 1, 2, 3, 4, 5, 6, 3, 7})), "Hello world's 12345!!\n\n  x");
  EXPECT_EQ(tok.Encode("'S"), Ids({8}));  // (?i:...) contractions ignore case
  // The post-processor's template makes <|begin_of_text|> the bos token.
  EXPECT_EQ(tok.bos_id(), 9);
  EXPECT_EQ(tok.vocab_size(), 10);
}

TEST(HfTokenizerTest, Qwen2RegexSplitsDigitsOneByOne) {
  Tokenizer tok = Make(SplitThenByteLevel(kQwen2Regex, {"1", "2", "3", kSpace, "x"}));
  EXPECT_EQ(tok.Encode("123 x"), Ids({0, 1, 2, 3, 4}));  // " x" is not in the vocabulary: " ", "x"
}

TEST(HfTokenizerTest, MergesApplyByRankThenLeftmost) {
  // "abc": (b,c) ranks before (a,b), so a + bc, although "ab" is leftmost.
  Tokenizer tok =
      Make(CharBpe({"a", "b", "c", "ab", "bc", "aa"}, {{"b", "c"}, {"a", "b"}, {"a", "a"}}));
  EXPECT_EQ(tok.Encode("abc"), Ids({0, 4}));
  EXPECT_EQ(tok.Encode("abab"), Ids({3, 3}));
  EXPECT_EQ(tok.Encode("aaa"), Ids({5, 0}));  // leftmost first
  EXPECT_EQ(tok.Encode("aaaa"), Ids({5, 5}));
  // A character outside the vocabulary, with no unk token, is dropped (as tokenizers does),
  // and its neighbours merge.
  EXPECT_EQ(tok.Encode("axb"), Ids({3}));
  // The older "a b" string form of merges means the same.
  json old = CharBpe({"a", "b", "c", "ab", "bc", "aa"}, {});
  old["model"]["merges"] = {"b c", "a b", "a a"};
  EXPECT_EQ(Make(old).Encode("abc"), Ids({0, 4}));
}

TEST(HfTokenizerTest, UnknownCharactersBecomeUnkOrBytes) {
  json j = CharBpe({"<unk>", "a", "<0x78>", "<0xC3>", "<0xA9>"}, {});
  j["model"]["unk_token"] = "<unk>";
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(Make(j).Encode("a??a"), Ids({1, 0, 1}));  // fused
  j["model"]["fuse_unk"] = false;
  EXPECT_EQ(Make(j).Encode("a??a"), Ids({1, 0, 0, 1}));
  j["model"]["byte_fallback"] = true;
  EXPECT_EQ(Make(j).Encode("x\xC3\xA9"), Ids({2, 3, 4}));  // "x" and "é" as their bytes
}

TEST(HfTokenizerTest, NfcNormalizerComposesCharacters) {
  json j = CharBpe({"e", "\xC3\xA9", "\xCC\x81"}, {});  // e, é (U+00E9), combining acute
  EXPECT_EQ(Make(j).Encode("e\xCC\x81"), Ids({0, 2}));
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}})}};
  EXPECT_EQ(Make(j).Encode("e\xCC\x81"), Ids({1}));
  j["normalizer"] = {{"type", "NFD"}};
  EXPECT_EQ(Make(j).Encode("\xC3\xA9"), Ids({0, 2}));
}

TEST(HfTokenizerTest, AddedTokensMatchLongestFirstAndStrip) {
  json j = CharBpe({"a", "b", " "}, {});
  j["added_tokens"] = json::array(
      {{{"id", 3}, {"content", "<m>"}, {"special", false}, {"lstrip", true}, {"rstrip", true}},
       {{"id", 4}, {"content", "<m>>"}, {"special", true}},
       {{"id", 5}, {"content", "ab"}, {"special", false}, {"normalized", true}}});
  Tokenizer tok = Make(j);
  EXPECT_EQ(tok.Encode("a <m>  b"), Ids({0, 3, 1}));  // the spaces around <m> are its own
  EXPECT_EQ(tok.Encode("a<m>>b"), Ids({0, 4, 1}));    // longest match
  EXPECT_EQ(tok.Encode("aab"), Ids({0, 5}));
  EXPECT_EQ(tok.Decode(Ids({0, 4, 5, 3})), "aab<m>");  // the special token is skipped
}

TEST(HfTokenizerTest, SplitBehaviours) {
  // Split on "-" with each behaviour; the vocabulary has every piece that can come out.
  const std::vector<std::string> vocab = {"a", "-", "b", "a-", "-b", "--", "a--", "--b"};
  auto encode = [&](const char* behavior, bool invert, const char* text) {
    json j = CharBpe(vocab, {});
    j["model"]["ignore_merges"] = true;
    j["pre_tokenizer"] = {{"type", "Split"},
                          {"pattern", {{"String", "-"}}},
                          {"behavior", behavior},
                          {"invert", invert}};
    return Make(j).Encode(text);
  };
  EXPECT_EQ(encode("Isolated", false, "a-b"), Ids({0, 1, 2}));
  EXPECT_EQ(encode("Removed", false, "a-b"), Ids({0, 2}));
  EXPECT_EQ(encode("MergedWithPrevious", false, "a-b"), Ids({3, 2}));
  EXPECT_EQ(encode("MergedWithNext", false, "a-b"), Ids({0, 4}));
  EXPECT_EQ(encode("Contiguous", false, "a--b"), Ids({0, 5, 2}));
  EXPECT_EQ(encode("Removed", true, "a-b"), Ids({1}));  // inverted: the letters are removed
}

TEST(HfTokenizerTest, TokenizerConfigNamesSpecialTokensAndCleansUpDecoding) {
  json j = SplitThenByteLevel(kLlama3Regex, {"a", kSpace + ".", ".", kSpace});
  j["added_tokens"].push_back({{"id", 5}, {"content", "<|eot_id|>"}, {"special", true}});
  const json config = {{"bos_token", "<|begin_of_text|>"},
                       {"eos_token", {{"content", "<|eot_id|>"}, {"lstrip", false}}},
                       {"pad_token", nullptr},
                       {"clean_up_tokenization_spaces", true},
                       {"chat_template", "{{ messages }}"},
                       {"model_max_length", 131072}};
  Tokenizer tok = Make(j, config);
  EXPECT_EQ(tok.bos_id(), 4);
  EXPECT_EQ(tok.eos_id(), 5);
  EXPECT_EQ(tok.pad_id(), -1);
  EXPECT_EQ(tok.Decode(Ids({0, 1, 5})), "a.");  // " ." cleaned up, as transformers decodes
  EXPECT_EQ(Make(j).Decode(Ids({0, 1})), "a .");
  EXPECT_EQ(Make(j).eos_id(), -1);
}

TEST(HfTokenizerTest, InvalidUtf8IsReplacedNotTrusted) {
  auto tok = Tokenizer::Load(kFixtures / "tokenizer-bytelevel-bpe" / "tokenizer.json");
  ASSERT_TRUE(tok.ok());
  // A cut 3-byte sequence is one U+FFFD, a stray continuation byte another.
  EXPECT_EQ(tok->Encode("a\xE2\x82z\x80"), tok->Encode("a\xEF\xBF\xBDz\xEF\xBF\xBD"));
  // Long runs stay linear enough to finish (a 200 KB word of spaces and of one letter).
  for (char c : {' ', 'x'}) {
    const auto ids = tok->Encode(std::string(200'000, c));
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(tok->Decode(ids), std::string(200'000, c));
  }
}

TEST(HfTokenizerTest, RefusesWhatItDoesNotUnderstandNamingIt) {
  const json base = CharBpe({"a", "b"}, {});
  struct Case {
    const char* what;
    json doc;
    const char* names;
  };
  auto with = [&](const json::json_pointer& at, json value) {
    json j = base;
    j[at] = std::move(value);
    return j;
  };
  const std::vector<Case> cases = {
      {"Metaspace", with("/pre_tokenizer"_json_pointer, {{"type", "Metaspace"}}), "Metaspace"},
      {"WordPiece", with("/model/type"_json_pointer, "WordPiece"), "model.type"},
      {"dropout", with("/model/dropout"_json_pointer, 0.1), "model.dropout"},
      {"unknown key", with("/frobnicate"_json_pointer, true), "frobnicate"},
      {"unknown model key", with("/model/foo"_json_pointer, 1), "model.foo"},
      {"truncation", with("/truncation"_json_pointer, {{"max_length", 8}}), "truncation"},
      {"Lowercase", with("/normalizer"_json_pointer, {{"type", "Lowercase"}}), "Lowercase"},
      {"decoder", with("/decoder"_json_pointer, {{"type", "WordPiece"}}), "decoder.type"},
      {"bad regex",
       with("/pre_tokenizer"_json_pointer,
            {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}}),
       "pattern.Regex"},
      {"behavior",
       with("/pre_tokenizer"_json_pointer,
            {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Sideways"}}),
       "Sideways"},
      {"merge of unknown tokens", with("/model/merges"_json_pointer, R"([["a", "z"]])"_json),
       "merges"},
      {"negative id", with("/model/vocab/c"_json_pointer, -5), "model.vocab.c"},
      {"two tokens one id", with("/model/vocab/c"_json_pointer, 0), "two tokens"},
      {"single_word",
       with("/added_tokens"_json_pointer,
            R"([{"id": 2, "content": "<x>", "single_word": true}])"_json),
       "single_word"},
      {"added token clashes",
       with("/added_tokens"_json_pointer, R"([{"id": 0, "content": "<x>"}])"_json), "id 0"},
      {"template with a trailing token",
       with("/post_processor"_json_pointer, R"({"type": "TemplateProcessing",
             "single": [{"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "b"}}],
             "special_tokens": {"b": {"ids": [1]}}})"_json),
       "post_processor.single"},
      {"RobertaProcessing", with("/post_processor"_json_pointer, {{"type", "RobertaProcessing"}}),
       "RobertaProcessing"},
  };
  for (const Case& c : cases) {
    auto tok = Tokenizer::FromHfJson(c.doc.dump());
    ASSERT_FALSE(tok.ok()) << c.what;
    EXPECT_NE(tok.status().message().find(c.names), std::string::npos)
        << c.what << ": " << tok.status().message();
  }
  // tokenizer_config.json options that would change encodings.
  for (const json& config : {json{{"add_eos_token", true}}, json{{"do_lower_case", true}},
                             json{{"add_bos_token", true}}, json{{"eos_token", "<nope>"}}}) {
    auto tok = Tokenizer::FromHfJson(base.dump(), config.dump());
    ASSERT_FALSE(tok.ok()) << config.dump();
    EXPECT_NE(tok.status().message().find(config.begin().key()), std::string::npos)
        << tok.status().message();
  }
}

TEST(HfTokenizerTest, HostileFilesGiveErrors) {
  const std::string good = CharBpe({"a", "b"}, {}).dump();
  for (const std::string& bad :
       {std::string(), std::string("[1,2]"), std::string("{\"model\":"), good.substr(0, 40),
        std::string(100'000, '[') + std::string(100'000, ']'),
        std::string("{\"version\":\"1.0\",\"version\":\"1.0\",") + good.substr(1)}) {
    auto tok = Tokenizer::FromHfJson(bad);
    EXPECT_FALSE(tok.ok()) << bad.substr(0, 60);
    if (!tok.ok()) {
      EXPECT_FALSE(tok.status().message().empty());
    }
  }
  // A file over the size limit is refused before it is read.
  const auto huge = std::filesystem::temp_directory_path() / "colony_huge_tokenizer.json";
  {
    std::ofstream out(huge);
    out.seekp((64 << 20) + 1);
    out << ' ';
  }
  auto tok = Tokenizer::Load(huge);
  std::filesystem::remove(huge);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("larger than"), std::string::npos)
      << tok.status().message();
}

TEST(HfTokenizerTest, ModelDirPrefersTokenizerModel) {
  const auto dir = std::filesystem::temp_directory_path() / "colony_hf_tokenizer_dir";
  RemoveTree(dir);
  std::filesystem::create_directories(dir);
  EXPECT_EQ(Tokenizer::FindInModelDir(dir).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(WriteFileAtomically(dir / "tokenizer.json", "{}").ok());
  EXPECT_EQ(Tokenizer::FindInModelDir(dir)->filename(), "tokenizer.json");
  ASSERT_TRUE(WriteFileAtomically(dir / "tokenizer.model", "").ok());
  EXPECT_EQ(Tokenizer::FindInModelDir(dir)->filename(), "tokenizer.model");
  RemoveTree(dir);
}

}  // namespace
}  // namespace colony::model
