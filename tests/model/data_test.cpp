// Tests of the torch-free data layer: corpus, tokenizer, token shards and streams, Fashion-MNIST.
// Each process works in its own temporary cache directory (COLONY_CACHE_DIR), with a small corpus
// and vocabulary so that the whole binary runs in seconds.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/files.h"
#include "core/subprocess.h"
#include "model/corpus.h"
#include "model/fashion_mnist.h"
#include "model/tokenizer.h"
#include "test_support.h"

namespace colony::model {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kCorpusBytes = 2'500'000;
constexpr int kVocab = 800;
const fs::path kFashionDir = "/usr/share/datasets/fashion-mnist";

class TempCacheEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    dir_ = std::make_unique<colony::test::TempDir>("data-test");
    setenv("COLONY_CACHE_DIR", dir_->path().c_str(), 1);
  }
  void TearDown() override { dir_.reset(); }

 private:
  std::unique_ptr<colony::test::TempDir> dir_;
};
[[maybe_unused]] ::testing::Environment* const kEnv =
    ::testing::AddGlobalTestEnvironment(new TempCacheEnvironment);

std::string ReadAll(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int32_t> ReadTokens(const fs::path& file) {
  std::string bytes = ReadAll(file);
  std::vector<int32_t> out(bytes.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<unsigned char>(bytes[2 * i]) |
             (static_cast<unsigned char>(bytes[2 * i + 1]) << 8);
  }
  return out;
}

// The corpus and tokenizer every test of this process shares (built on first use).
const fs::path& SmallCorpus() {
  static const fs::path path = [] {
    auto r = PrepareCorpus({.max_bytes = kCorpusBytes});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : fs::path();
  }();
  return path;
}

const Tokenizer& SmallTokenizer() {
  static const Tokenizer tok = [] {
    auto r = Tokenizer::TrainOrLoad(SmallCorpus(), DefaultCacheDir(), kVocab);
    if (!r.ok()) {
      ADD_FAILURE() << r.status().ToString();
      std::abort();
    }
    return *r;
  }();
  return tok;
}

const fs::path& SmallShards() {
  static const fs::path dir = [] {
    auto r = PrepareTokenShards(SmallCorpus(), SmallTokenizer(), DefaultCacheDir() / "shards",
                                /*tokens_per_shard=*/100'000);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : fs::path();
  }();
  return dir;
}

// ---- Corpus --------------------------------------------------------------------------------

TEST(CorpusTest, DefaultCacheDirFollowsEnvironment) {
  EXPECT_EQ(DefaultCacheDir(), fs::path(std::getenv("COLONY_CACHE_DIR")));
}

TEST(CorpusTest, PreparedCleanedAndCached) {
  const fs::path& corpus = SmallCorpus();
  ASSERT_FALSE(corpus.empty());
  EXPECT_EQ(corpus.parent_path(), DefaultCacheDir());
  const uint64_t size = fs::file_size(corpus);
  EXPECT_LE(size, kCorpusBytes);
  EXPECT_GT(size, kCorpusBytes - 100'000);

  const std::string text = ReadAll(corpus);
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.find("SPDX-License-Identifier"), std::string::npos);
  EXPECT_EQ(text.find("\n\n\n"), std::string::npos);
  EXPECT_EQ(text.find("\n=====\n"), std::string::npos);
  EXPECT_EQ(text.find("\n-----"), std::string::npos);
  EXPECT_EQ(text.find(".. toctree::"), std::string::npos);
  EXPECT_EQ(text.find(":maxdepth:"), std::string::npos);
  EXPECT_NE(text.find("the kernel"), std::string::npos);

  // A second call reuses the file: same path, not rewritten, no temporaries left.
  const auto mtime = fs::last_write_time(corpus);
  auto again = PrepareCorpus({.max_bytes = kCorpusBytes});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, corpus);
  EXPECT_EQ(fs::last_write_time(corpus), mtime);
  for (const auto& e : fs::directory_iterator(DefaultCacheDir())) {
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

TEST(CorpusTest, OptionsChangeTheFile) {
  auto a = PrepareCorpus({.max_bytes = 200'000});
  auto b = PrepareCorpus({.max_bytes = 300'000});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  // The smaller corpus is a prefix of the larger one: the order is deterministic.
  const std::string ta = ReadAll(*a), tb = ReadAll(*b);
  EXPECT_EQ(tb.substr(0, ta.size()), ta);
}

TEST(CorpusTest, ConcurrentPrepareAgrees) {
  std::vector<Result<fs::path>> results(3);
  std::vector<std::thread> threads;
  for (auto& r : results) {
    threads.emplace_back([&r] { r = PrepareCorpus({.max_bytes = 500'000}); });
  }
  for (auto& t : threads) t.join();
  for (auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, *results[0]);
  }
  EXPECT_GT(fs::file_size(*results[0]), 400'000u);
}

TEST(CorpusTest, MissingSourceDirSaysWhatToInstall) {
  auto r = PrepareCorpus({.source_dir = "/nonexistent/linux-doc"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("linux-doc-6.1"), std::string::npos);
  EXPECT_NE(r.status().message().find("scripts/setup"), std::string::npos);
}

// ---- Tokenizer -----------------------------------------------------------------------------

TEST(TokenizerTest, TrainsWithTheRequestedVocabulary) {
  const Tokenizer& tok = SmallTokenizer();
  EXPECT_EQ(tok.vocab_size(), kVocab);
  EXPECT_EQ(tok.unk_id(), 0);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.pad_id(), 3);
  EXPECT_EQ(tok.hash().size(), 16u);
  EXPECT_TRUE(tok.Encode("").empty());
}

TEST(TokenizerTest, RoundTripsTextExactly) {
  const Tokenizer& tok = SmallTokenizer();
  const std::vector<std::string> texts = {
      "The kernel schedules tasks on every CPU.",
      "  Leading spaces, trailing spaces  ",
      "Two lines\nand a blank one\n\n\tindented with a tab\n",
      "static int foo(struct device *dev) { return -ENODEV; }  /* 0x1f */",
      "Unicode: naïve café – “quotes” 日本語 🐧",
      "multiple   inner    spaces and 1234567890 digits",
  };
  for (const std::string& text : texts) {
    std::vector<int32_t> ids = tok.Encode(text);
    ASSERT_FALSE(ids.empty());
    for (int32_t id : ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, tok.vocab_size());
    }
    EXPECT_EQ(tok.Decode(ids), text);
  }
  // Frequent words compress: fewer tokens than bytes.
  const std::string english =
      "This document describes how the memory management subsystem of the kernel works.";
  EXPECT_LT(tok.Encode(english).size(), english.size() / 2);
}

TEST(TokenizerTest, CachedReloadGivesSameIds) {
  const Tokenizer& tok = SmallTokenizer();
  const auto start = std::chrono::steady_clock::now();
  auto again = Tokenizer::TrainOrLoad(SmallCorpus(), DefaultCacheDir(), kVocab);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));  // no training
  EXPECT_EQ(again->hash(), tok.hash());
  const std::string text = "Device drivers register interrupt handlers with request_irq().";
  EXPECT_EQ(again->Encode(text), tok.Encode(text));

  const fs::path model_file = DefaultCacheDir() / ("tokenizer-" + std::to_string(kVocab) + "-" +
                                                   *HashFile(SmallCorpus()) + ".model");
  auto loaded = Tokenizer::Load(model_file);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->Encode(text), tok.Encode(text));
  // Copies share the processor.
  Tokenizer copy = *loaded;
  EXPECT_EQ(copy.Decode(copy.Encode(text)), text);
}

TEST(TokenizerTest, TrainingIsReproducible) {
  // Peers that train on their own must agree on the token ids.
  auto corpus = PrepareCorpus({.max_bytes = 400'000});
  ASSERT_TRUE(corpus.ok());
  auto a = Tokenizer::TrainOrLoad(*corpus, DefaultCacheDir() / "peer-a", 400);
  // A leftover of a crashed trainer is cleaned up.
  fs::create_directories(DefaultCacheDir() / "peer-b");
  const fs::path stale =
      DefaultCacheDir() / "peer-b" / ("tokenizer-400-" + *HashFile(*corpus) + ".model.tmp-1-0");
  std::ofstream(stale) << "partial";
  auto b = Tokenizer::TrainOrLoad(*corpus, DefaultCacheDir() / "peer-b", 400);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->hash(), b->hash());
  EXPECT_FALSE(fs::exists(stale));
}

TEST(TokenizerTest, LoadRejectsGarbage) {
  const fs::path bad = DefaultCacheDir() / "garbage.model";
  std::ofstream(bad) << "this is not a protobuf";
  auto r = Tokenizer::Load(bad);
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(Tokenizer::Load(DefaultCacheDir() / "missing.model").ok());
  EXPECT_FALSE(Tokenizer::TrainOrLoad(SmallCorpus(), DefaultCacheDir(), 10).ok());
}

// ---- Native tokenizer vs. sentencepiece's own tools ----------------------------------------

// Runs a program to completion (stderr to `log`), returning its stdout lines.
std::vector<std::string> RunLines(const std::vector<std::string>& argv, const fs::path& log) {
  auto p = Subprocess::Spawn(argv, log.string());
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return {};
  std::vector<std::string> lines;
  for (;;) {
    auto line = p->ReadLine(std::chrono::seconds(300));
    if (!line.ok()) {
      EXPECT_EQ(line.status().code(), StatusCode::kNotFound) << line.status().ToString();
      break;
    }
    lines.push_back(*line);
  }
  auto rc = p->Wait(std::chrono::seconds(60));
  EXPECT_TRUE(rc.ok() && *rc == 0) << argv[0] << " failed: " << ReadAll(log);
  return lines;
}

std::string Join(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s;
}

// A few hundred lines of varied text without newlines: corpus lines, code, Unicode, emoji,
// odd whitespace and some invalid UTF-8.
std::vector<std::string> VariedLines() {
  std::vector<std::string> lines = {
      "",
      " ",
      "   ",
      "\t",
      "The kernel schedules tasks on every CPU.",
      "  Leading spaces, trailing spaces  ",
      "multiple   inner    spaces and 1234567890 digits",
      "\tindented with a tab\tand\ttabs  \t ",
      "static int foo(struct device *dev) { return -ENODEV; }  /* 0x1f */",
      "for (i = 0; i < n; i++) x[i] = y[i] << 2 | z->w;",
      "    if (ret < 0)  goto out_unlock;",
      "#define FOO(x) ((x) & ~0xFFFF0000UL)",
      "Unicode: naïve café – “quotes” 日本語 🐧",
      "Ελληνικά, русский текст, עברית, العربية, हिन्दी, 한국어",
      "emoji: 👩‍👩‍👧‍👦 🇫🇷 ✔️ 🚀🚀🚀 😀😃😄",
      "combining: e\xcc\x81 a\xcc\x8a, fullwidth ＡＢＣ１２３, ligature ﬁ",
      "\xe2\x96\x81 already has the space symbol \xe2\x96\x81\xe2\x96\x81 twice",
      "<s> </s> <unk> <pad> <0x41> look like special pieces",
      "invalid \xff\xfe bytes \xc3 and \xe2\x82 truncated \xf0\x9f\x90 sequences \x80",
      "nul-free control chars \x01\x02\x1b[0m and DEL \x7f",
      "a",
      "ab",
      " a",
      "a ",
      "??????????????????????????????????????????????????????",
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
      "             lots of spaces before",
      "URL https://www.kernel.org/doc/html/latest/process/howto.html?x=1&y=2#frag",
      "CONFIG_DEBUG_KERNEL=y CONFIG_LOCKDEP=y # CONFIG_KASAN is not set",
      "0x7fffffff 3.14159 -42 1e-9 007 ８９",
  };
  // Lines of the corpus, spread over it.
  const std::string text = ReadAll(SmallCorpus());
  size_t pos = 0;
  for (int i = 0; i < 300 && pos < text.size(); ++i) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(pos, end - pos));
    pos = text.find('\n', pos + text.size() / 300);
    if (pos == std::string::npos) break;
    ++pos;
  }
  // Some mixes of the above.
  const size_t n = lines.size();
  for (size_t i = 0; i + 1 < n; i += 9) lines.push_back(lines[i] + "  " + lines[n - 1 - i] + " ");
  return lines;
}

bool IsValidUtf8ForTest(const std::string& s) {
  // Round trips are exact only for valid UTF-8 (sentencepiece maps bad bytes to U+FFFD).
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80             ? 1
                 : (c & 0xE0) == 0xC0 ? 2
                 : (c & 0xF0) == 0xE0 ? 3
                 : (c & 0xF8) == 0xF0 ? 4
                                      : 0;
    if (len == 0 || i + len > s.size() || (len == 2 && c < 0xC2)) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

// Spaces collapsed and stripped, as remove_extra_whitespaces does.
std::string CollapseSpaces(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ' ' && (out.empty() || out.back() == ' ')) continue;
    out += c;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// Checks that Encode equals spm_encode and Decode equals spm_decode on VariedLines().
void ExpectSameAsSentencepiece(const Tokenizer& tok, const fs::path& model, bool collapses) {
  const std::vector<std::string> lines = VariedLines();
  ASSERT_GE(lines.size(), 300u);
  const fs::path dir = DefaultCacheDir() / ("spm-compare-" + model.stem().string());
  fs::create_directories(dir);
  {
    std::ofstream out(dir / "input.txt", std::ios::binary);
    for (const std::string& l : lines) out << l << '\n';
  }
  const std::vector<std::string> expected =
      RunLines({"/usr/bin/spm_encode", "--model=" + model.string(), "--output_format=id",
                "--input=" + (dir / "input.txt").string()},
               dir / "encode.log");
  ASSERT_EQ(expected.size(), lines.size());
  std::ofstream ids_file(dir / "ids.txt", std::ios::binary);
  int mismatches = 0;
  std::vector<std::vector<int32_t>> encoded;
  for (size_t i = 0; i < lines.size(); ++i) {
    encoded.push_back(tok.Encode(lines[i]));
    const std::string got = Join(encoded.back());
    if (got != expected[i] && ++mismatches <= 5) {
      ADD_FAILURE() << "line " << i << " \"" << lines[i] << "\"\n ours: " << got
                    << "\n  spm: " << expected[i];
    }
    ids_file << expected[i] << '\n';
    for (int32_t id : encoded.back()) ASSERT_TRUE(id >= 0 && id < tok.vocab_size());
  }
  ids_file.close();
  EXPECT_EQ(mismatches, 0);

  const std::vector<std::string> decoded =
      RunLines({"/usr/bin/spm_decode", "--model=" + model.string(), "--input_format=id",
                "--input=" + (dir / "ids.txt").string()},
               dir / "decode.log");
  ASSERT_EQ(decoded.size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string ours = tok.Decode(encoded[i]);
    EXPECT_EQ(ours, decoded[i]) << "line " << i;
    // Exact for valid UTF-8 without literal U+2581 (which decodes to a space, as in
    // sentencepiece).
    if (IsValidUtf8ForTest(lines[i]) && lines[i].find("\xe2\x96\x81") == std::string::npos) {
      EXPECT_EQ(ours, collapses ? CollapseSpaces(lines[i]) : lines[i]) << "line " << i;
    }
  }
}

fs::path SmallModelFile() {
  return DefaultCacheDir() /
         ("tokenizer-" + std::to_string(kVocab) + "-" + *HashFile(SmallCorpus()) + ".model");
}

TEST(TokenizerTest, EncodesLikeSentencepiece) {
  SmallTokenizer();
  ExpectSameAsSentencepiece(SmallTokenizer(), SmallModelFile(), /*collapses=*/false);
  // "\n" is a user-defined piece of its own.
  const std::vector<int32_t> ids = SmallTokenizer().Encode("a\n\nb\n");
  EXPECT_EQ(ids.size(), 5u);
  EXPECT_EQ(SmallTokenizer().Decode(ids), "a\n\nb\n");
}

// A model with Llama's settings: dummy prefix, whitespace collapsing, byte fallback.
const fs::path& LlamaStyleModel() {
  static const fs::path model = [] {
    const fs::path dir = DefaultCacheDir() / "llama-style";
    fs::create_directories(dir);
    RunLines({"/usr/bin/spm_train", "--input=" + SmallCorpus().string(),
              "--model_prefix=" + (dir / "llama").string(), "--model_type=bpe", "--vocab_size=1000",
              "--byte_fallback=true", "--add_dummy_prefix=true", "--remove_extra_whitespaces=true",
              "--normalization_rule_name=identity", "--input_sentence_size=40000",
              "--shuffle_input_sentence=true", "--character_coverage=0.9995", "--split_digits=true",
              "--num_threads=2", "--minloglevel=2"},
             dir / "train.log");
    return dir / "llama.model";
  }();
  return model;
}

TEST(TokenizerTest, LlamaStyleModelEncodesLikeSentencepiece) {
  auto tok = Tokenizer::Load(LlamaStyleModel());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ(tok->vocab_size(), 1000);
  EXPECT_EQ(tok->unk_id(), 0);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->pad_id(), -1);
  ExpectSameAsSentencepiece(*tok, LlamaStyleModel(), /*collapses=*/true);
  // Control ids are invisible, out-of-range ids dropped; the dummy prefix is removed.
  std::vector<int32_t> ids = tok->Encode("Hello world");
  ids.insert(ids.begin(), {tok->bos_id(), -5, 1'000'000});
  ids.push_back(tok->eos_id());
  EXPECT_EQ(tok->Decode(ids), "Hello world");
  EXPECT_TRUE(tok->Encode("   ").empty());
}

TEST(TokenizerTest, SaveWritesALoadableCopy) {
  const fs::path copy = DefaultCacheDir() / "saved-copy.model";
  ASSERT_TRUE(SmallTokenizer().Save(copy).ok());
  EXPECT_EQ(ReadAll(copy), ReadAll(SmallModelFile()));
  auto again = Tokenizer::Load(copy);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->hash(), SmallTokenizer().hash());
}

// ---- Hostile model files --------------------------------------------------------------------

std::string Varint(uint64_t v) {
  std::string s;
  while (v >= 0x80) {
    s += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  s += static_cast<char>(v);
  return s;
}
std::string LenField(int field, const std::string& bytes) {
  return Varint(static_cast<uint64_t>(field) << 3 | 2) + Varint(bytes.size()) + bytes;
}
std::string VarintField(int field, uint64_t v) {
  return Varint(static_cast<uint64_t>(field) << 3) + Varint(v);
}
std::string Piece(const std::string& text, float score, int type = 1) {
  std::string s = LenField(1, text);
  uint32_t bits;
  std::memcpy(&bits, &score, 4);
  s += static_cast<char>(2 << 3 | 5);
  for (int i = 0; i < 4; ++i) s += static_cast<char>(bits >> (8 * i));
  return LenField(1, s + VarintField(3, static_cast<uint64_t>(type)));
}
// A tiny BPE model: <unk>, a, b, c, ab (best), bc, abc; identity normalization.
std::string TinyModel(int model_type = 2, const std::string& extra_piece = {},
                      const std::string& charsmap = {}) {
  std::string m = Piece("<unk>", 0, 2) + Piece("a", -1) + Piece("b", -2) + Piece("c", -3) +
                  Piece("ab", 5) + Piece("bc", 4) + Piece("abc", 3) + extra_piece;
  m += LenField(2, VarintField(3, static_cast<uint64_t>(model_type)) + VarintField(4, 7));
  m += LenField(3, LenField(1, "identity") + (charsmap.empty() ? "" : LenField(2, charsmap)) +
                       VarintField(3, 0) + VarintField(4, 0));
  return m;
}

TEST(TokenizerTest, ParsesAHandBuiltModel) {
  auto tok = Tokenizer::FromBytes(TinyModel());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ(tok->vocab_size(), 7);
  EXPECT_EQ(tok->bos_id(), -1);
  // "abc": ab (5) beats bc (4), then ab+c = abc.
  EXPECT_EQ(tok->Encode("abc"), (std::vector<int32_t>{6}));
  EXPECT_EQ(tok->Encode("bcab"), (std::vector<int32_t>{5, 4}));
  // No byte fallback: runs of unknown characters give one unk id.
  EXPECT_EQ(tok->Encode("xyza"), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{0, 1}), " \xE2\x81\x87 a");
}

TEST(TokenizerTest, HostileModelsGiveErrors) {
  auto expect_error = [](const std::string& bytes, const std::string& what,
                         StatusCode code = StatusCode::kInvalidArgument) {
    auto r = Tokenizer::FromBytes(bytes);
    EXPECT_FALSE(r.ok()) << what;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), code) << what << ": " << r.status().ToString();
      EXPECT_FALSE(r.status().message().empty());
    }
  };
  expect_error("", "empty");
  expect_error("this is not a protobuf", "garbage");
  expect_error(std::string(100, '\xff'), "endless varint");
  expect_error("\x0a\xff\xff\xff\xff\x0f" + std::string(10, 'x'), "huge length");
  expect_error(TinyModel().substr(0, TinyModel().size() - 3), "truncated");
  expect_error(TinyModel(1), "unigram", StatusCode::kUnimplemented);
  expect_error(TinyModel(3), "word", StatusCode::kUnimplemented);
  expect_error(TinyModel(2, {}, "\x01\x02\x03\x04"), "charsmap", StatusCode::kUnimplemented);
  expect_error(TinyModel(2, Piece("\xff\xfe", 0)), "bad UTF-8 piece");
  expect_error(TinyModel(2, Piece("", 0)), "empty piece");
  expect_error(TinyModel(2, Piece("ab", 0)), "duplicate piece");
  expect_error(TinyModel(2, Piece("<u2>", 0, 2)), "second unk");
  expect_error(TinyModel(2, Piece("<0x41>", 0, 6)), "byte piece without byte_fallback");
  expect_error(TinyModel(2, Piece("x", 0, 99)), "bad type");
  expect_error(TinyModel(2, "\x0b"), "group wire type");
  expect_error(Piece("a", 0) + LenField(2, VarintField(3, 2)), "no unk");
  // A 2 MB file of a million empty pieces is refused before any piece is built.
  std::string many;
  for (int i = 0; i <= 1'000'000; ++i) many += LenField(1, "");
  expect_error(many, "too many pieces", StatusCode::kResourceExhausted);

  // Every prefix of a real model, and bit flips: errors or a usable model, never a crash.
  SmallTokenizer();  // trains the model when this test runs on its own (ctest: one per process)
  const std::string real = ReadAll(SmallModelFile());
  ASSERT_GT(real.size(), 1000u);
  for (size_t len = 0; len < real.size(); len += 1 + len / 50) {
    auto r = Tokenizer::FromBytes(std::string_view(real).substr(0, len));
    if (r.ok()) r->Encode("some text");
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 300; ++i) {
    std::string bad = real;
    for (int k = 0; k < 3; ++k) bad[rng() % bad.size()] ^= static_cast<char>(1 << (rng() % 8));
    auto r = Tokenizer::FromBytes(bad);
    if (r.ok()) {
      for (int32_t id : r->Encode("The kernel, café 🐧")) ASSERT_LT(id, r->vocab_size());
    }
  }
  // An oversized file is refused before parsing.
  const fs::path huge = DefaultCacheDir() / "huge.model";
  {
    std::ofstream out(huge, std::ios::binary);
    out.seekp(65 << 20);
    out << 'x';
  }
  auto r = Tokenizer::Load(huge);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  fs::remove(huge);
}

TEST(TokenizerTest, EncodeSpeed) {
  const std::string text = ReadAll(SmallCorpus());
  const auto start = std::chrono::steady_clock::now();
  size_t tokens = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', std::min(text.size(), pos + 2048));
    end = end == std::string::npos ? text.size() : end + 1;
    tokens += SmallTokenizer().Encode(std::string_view(text).substr(pos, end - pos)).size();
    pos = end;
  }
  const double ours =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto spm_start = std::chrono::steady_clock::now();
  const std::vector<std::string> spm =
      RunLines({"/usr/bin/spm_encode", "--model=" + SmallModelFile().string(), "--output_format=id",
                "--input=" + SmallCorpus().string()},
               DefaultCacheDir() / "speed.log");
  const double theirs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - spm_start).count();
  const double mb = static_cast<double>(text.size()) / 1e6;
  std::printf("encode speed: native %.1f MB/s (%zu tokens), spm_encode %.1f MB/s (%zu lines)\n",
              mb / ours, tokens, mb / theirs, spm.size());
  EXPECT_GT(tokens, text.size() / 8);
}

// ---- Token shards --------------------------------------------------------------------------

TEST(ShardsTest, ShardsHoldTheWholeCorpus) {
  const fs::path& dir = SmallShards();
  ASSERT_FALSE(dir.empty());
  auto m = ReadShardManifest(dir);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->tokenizer_hash, SmallTokenizer().hash());
  EXPECT_EQ(m->vocab_size, kVocab);
  ASSERT_GE(m->shard_files.size(), 3u);

  std::vector<int32_t> all;
  uint64_t sum = 0;
  for (size_t i = 0; i < m->shard_files.size(); ++i) {
    EXPECT_EQ(fs::file_size(dir / m->shard_files[i]), m->shard_tokens[i] * 2);
    if (i + 1 < m->shard_files.size()) {
      EXPECT_EQ(m->shard_tokens[i], 100'000u);
    }
    sum += m->shard_tokens[i];
    std::vector<int32_t> t = ReadTokens(dir / m->shard_files[i]);
    all.insert(all.end(), t.begin(), t.end());
  }
  EXPECT_EQ(sum, m->train_tokens);
  std::vector<int32_t> valid = ReadTokens(dir / "valid.bin");
  EXPECT_EQ(valid.size(), m->valid_tokens);
  const double valid_share = static_cast<double>(valid.size()) / static_cast<double>(sum);
  EXPECT_NEAR(valid_share, 0.02, 0.002);
  all.insert(all.end(), valid.begin(), valid.end());
  for (int32_t id : all) ASSERT_LT(id, kVocab);
  // Decoding every token gives back the corpus exactly.
  EXPECT_EQ(SmallTokenizer().Decode(all), ReadAll(SmallCorpus()));
}

TEST(ShardsTest, CachedAndSafeUnderConcurrency) {
  const fs::path& dir = SmallShards();
  const auto mtime = fs::last_write_time(dir / "manifest.json");
  auto again = PrepareTokenShards(SmallCorpus(), SmallTokenizer(), dir, 100'000);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(fs::last_write_time(dir / "manifest.json"), mtime);

  // Three "peers" build a fresh directory at once; all succeed and agree with the reference.
  const fs::path shared = DefaultCacheDir() / "shared-shards";
  std::vector<Result<fs::path>> results(3);
  std::vector<std::thread> threads;
  for (auto& r : results) {
    threads.emplace_back([&r, &shared] {
      r = PrepareTokenShards(SmallCorpus(), SmallTokenizer(), shared, 100'000);
    });
  }
  for (auto& t : threads) t.join();
  for (auto& r : results) ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto m = ReadShardManifest(shared);
  ASSERT_TRUE(m.ok());
  for (const std::string& f : m->shard_files) EXPECT_EQ(ReadAll(shared / f), ReadAll(dir / f));
  EXPECT_EQ(ReadAll(shared / "valid.bin"), ReadAll(dir / "valid.bin"));
  for (const auto& e : fs::directory_iterator(DefaultCacheDir())) {
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

TEST(ShardsTest, RebuildsForAnotherShardSize) {
  const fs::path dir = DefaultCacheDir() / "resharded";
  ASSERT_TRUE(PrepareTokenShards(SmallCorpus(), SmallTokenizer(), dir, 300'000).ok());
  auto m1 = ReadShardManifest(dir);
  ASSERT_TRUE(PrepareTokenShards(SmallCorpus(), SmallTokenizer(), dir, 200'000).ok());
  auto m2 = ReadShardManifest(dir);
  ASSERT_TRUE(m1.ok() && m2.ok());
  EXPECT_EQ(m2->tokens_per_shard, 200'000u);
  EXPECT_EQ(m1->train_tokens, m2->train_tokens);
  EXPECT_GT(m2->shard_files.size(), m1->shard_files.size());
}

// ---- TokenStream ---------------------------------------------------------------------------

std::vector<std::vector<int32_t>> Rows(const TokenBatch& b) {
  std::vector<std::vector<int32_t>> rows;
  const auto w = static_cast<size_t>(b.seq_len + 1);
  for (int64_t r = 0; r < b.batch_size; ++r) {
    rows.emplace_back(b.tokens.begin() + static_cast<ptrdiff_t>(r * w),
                      b.tokens.begin() + static_cast<ptrdiff_t>((r + 1) * w));
  }
  return rows;
}

TEST(TokenStreamTest, BatchesAreWindowsOfTheShards) {
  const fs::path& dir = SmallShards();
  auto stream = TokenStream::Open(dir, /*seed=*/7, /*batch_size=*/8, /*seq_len=*/64);
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  auto m = ReadShardManifest(dir);
  ASSERT_TRUE(m.ok());
  std::vector<std::vector<int32_t>> shards;
  for (const std::string& f : m->shard_files) shards.push_back(ReadTokens(dir / f));

  for (int i = 0; i < 5; ++i) {
    TokenBatch b = stream->Next();
    EXPECT_EQ(b.batch_size, 8);
    EXPECT_EQ(b.seq_len, 64);
    ASSERT_EQ(b.tokens.size(), 8u * 65u);
    for (int32_t id : b.tokens) ASSERT_TRUE(id >= 0 && id < kVocab);
    // Each row is a contiguous window of one shard, so its targets (row[1:]) are the tokens
    // that follow its inputs (row[:-1]) in the text.
    for (const auto& row : Rows(b)) {
      bool found = false;
      for (const auto& s : shards) {
        if (std::search(s.begin(), s.end(), row.begin(), row.end()) != s.end()) found = true;
      }
      EXPECT_TRUE(found);
    }
  }
}

TEST(TokenStreamTest, SeedsGiveReproducibleDistinctStreams) {
  const fs::path& dir = SmallShards();
  auto a = TokenStream::Open(dir, 1, 4, 32);
  auto b = TokenStream::Open(dir, 1, 4, 32);
  auto c = TokenStream::Open(dir, 2, 4, 32);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  int same_as_other_seed = 0;
  for (int i = 0; i < 20; ++i) {
    TokenBatch x = a->Next(), y = b->Next(), z = c->Next();
    EXPECT_EQ(x.tokens, y.tokens);
    same_as_other_seed += x.tokens == z.tokens;
  }
  EXPECT_EQ(same_as_other_seed, 0);
}

TEST(TokenStreamTest, WrapsAroundWithNewPasses) {
  const fs::path& dir = SmallShards();
  auto m = ReadShardManifest(dir);
  ASSERT_TRUE(m.ok());
  const int64_t seq_len = 256, batch = 64;
  auto s = TokenStream::Open(dir, 3, batch, seq_len);
  ASSERT_TRUE(s.ok());
  // About train_tokens / seq_len windows per pass.
  const auto windows_per_pass = static_cast<int64_t>(m->train_tokens) / seq_len;
  int64_t batches = 0;
  while (s->pass() == 0 && batches < 10 * windows_per_pass) {
    s->Next();
    ++batches;
  }
  EXPECT_EQ(s->pass(), 1);
  EXPECT_NEAR(static_cast<double>(batches * batch), static_cast<double>(windows_per_pass),
              static_cast<double>(batch + static_cast<int64_t>(m->shard_files.size())));
  for (int i = 0; i < 2 * batches; ++i) s->Next();
  EXPECT_GE(s->pass(), 3);
}

// Audits recompute batch i of another peer's stream: a reseeded copy of any stream reads what a
// stream opened with that seed reads, and skipping to a batch reads that batch, across shards
// (batches of 64 windows of 256 tokens: a shard of 100,000 tokens holds ~390 windows).
TEST(TokenStreamTest, AReseededStreamSkippingToABatchReadsWhatTheStreamRead) {
  const fs::path& dir = SmallShards();
  auto opened = TokenStream::Open(dir, 5, 64, 256);
  auto other = TokenStream::Open(dir, 9, 2, 256);
  ASSERT_TRUE(opened.ok() && other.ok());
  std::vector<std::vector<int32_t>> batches;
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(opened->batches(), i);
    batches.push_back(opened->Next().tokens);
  }
  TokenStream copy = other->Reseeded(5, 64);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(copy.Next().tokens, batches[static_cast<size_t>(i)]);
  for (int64_t i : {0, 3, 7, 11}) {
    TokenStream seeker = other->Reseeded(5, 64);
    seeker.Skip(i);
    EXPECT_EQ(seeker.batches(), i);
    EXPECT_EQ(seeker.Next().tokens, batches[static_cast<size_t>(i)]) << "batch " << i;
  }
  TokenStream seeker = other->Reseeded(5, 64);
  seeker.Skip(4);
  seeker.Skip(5);
  EXPECT_EQ(seeker.Next().tokens, batches[9]);
  EXPECT_NE(other->Reseeded(6, 64).Next().tokens, batches[0]);
}

TEST(TokenStreamTest, ValidationBatchIsDeterministic) {
  const fs::path& dir = SmallShards();
  auto a = TokenStream::ValidationBatch(dir, 8, 64);
  auto b = TokenStream::ValidationBatch(dir, 8, 64);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->tokens.size(), 8u * 65u);
  std::vector<int32_t> valid = ReadTokens(dir / "valid.bin");
  EXPECT_TRUE(std::equal(valid.begin(), valid.begin() + 65, a->tokens.begin()));
  auto rows = Rows(*a);
  EXPECT_NE(rows[0], rows[1]);
  EXPECT_FALSE(TokenStream::ValidationBatch(dir, 1'000'000, 64).ok());
}

TEST(TokenStreamTest, OpenChecksItsArguments) {
  EXPECT_FALSE(TokenStream::Open(DefaultCacheDir() / "no-such-shards", 0, 4, 32).ok());
  EXPECT_FALSE(TokenStream::Open(SmallShards(), 0, 0, 32).ok());
  EXPECT_FALSE(TokenStream::Open(SmallShards(), 0, 4, 10'000'000).ok());
}

// ---- Fashion-MNIST -------------------------------------------------------------------------

TEST(FashionMnistTest, LoadsBothSplits) {
  auto train = LoadFashionMnist(true);
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  EXPECT_EQ(train->size, 60000);
  EXPECT_EQ(train->images.size(), 60000u * 784u);
  ASSERT_EQ(train->labels.size(), 60000u);
  std::array<int, 10> histogram{};
  for (int64_t l : train->labels) ++histogram[static_cast<size_t>(l)];
  for (int count : histogram) EXPECT_EQ(count, 6000);
  // Normalized with the training set's statistics.
  double sum = 0, sq = 0;
  for (float v : train->images) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(train->images.size());
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sq / n - (sum / n) * (sum / n)), 1.0, 0.01);
  const auto [lo, hi] = std::minmax_element(train->images.begin(), train->images.end());
  EXPECT_NEAR(*lo, -0.2860f / 0.3530f, 1e-5);
  EXPECT_NEAR(*hi, (1 - 0.2860f) / 0.3530f, 1e-5);

  auto test = LoadFashionMnist(false);
  ASSERT_TRUE(test.ok()) << test.status().ToString();
  EXPECT_EQ(test->size, 10000);
  EXPECT_EQ(test->labels.size(), 10000u);
}

TEST(FashionMnistTest, MissingDirSaysWhatToInstall) {
  auto r = LoadFashionMnist(true, "/nonexistent/fashion");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("dataset-fashion-mnist"), std::string::npos);
  EXPECT_NE(r.status().message().find("scripts/setup"), std::string::npos);
}

void WriteGz(const fs::path& file, const std::string& data) {
  gzFile gz = gzopen(file.c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(gzwrite(gz, data.data(), static_cast<unsigned>(data.size())),
            static_cast<int>(data.size()));
  gzclose(gz);
}

std::string Be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

// Writes an IDX pair of `n` images and labels to dir as the t10k split.
void WriteIdx(const fs::path& dir, uint32_t n, uint32_t n_labels, uint8_t label,
              uint32_t images_magic = 0x803) {
  WriteGz(dir / "t10k-images-idx3-ubyte.gz",
          Be32(images_magic) + Be32(n) + Be32(28) + Be32(28) + std::string(n * 784, '\x80'));
  WriteGz(dir / "t10k-labels-idx1-ubyte.gz",
          Be32(0x801) + Be32(n_labels) + std::string(n_labels, static_cast<char>(label)));
}

TEST(FashionMnistTest, CorruptFilesGiveErrors) {
  const fs::path dir = DefaultCacheDir() / "corrupt-fashion";
  fs::create_directories(dir);

  WriteIdx(dir, 5, 5, 3);  // a valid little dataset first
  auto ok = LoadFashionMnist(false, dir);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->size, 5);
  EXPECT_EQ(ok->labels[4], 3);

  auto expect_error = [&](const std::string& what) {
    auto r = LoadFashionMnist(false, dir);
    EXPECT_FALSE(r.ok()) << what;
    if (!r.ok()) {
      EXPECT_FALSE(r.status().message().empty());
    }
  };
  WriteIdx(dir, 5, 4, 3);
  expect_error("count mismatch");
  WriteIdx(dir, 5, 5, 12);
  expect_error("label out of range");
  WriteIdx(dir, 5, 5, 3, 0x802);
  expect_error("bad magic");
  // A header announcing far more images than present.
  WriteGz(dir / "t10k-images-idx3-ubyte.gz",
          Be32(0x803) + Be32(0xFFFFFFFF) + Be32(28) + Be32(28) + std::string(784, '\0'));
  expect_error("huge count");
  // Garbage that is not gzip at all (zlib reads it as plain bytes: bad magic).
  std::ofstream(dir / "t10k-images-idx3-ubyte.gz", std::ios::binary) << "garbage\x01\x02";
  expect_error("garbage");
  // A real file cut short.
  const std::string real = ReadAll(kFashionDir / "t10k-images-idx3-ubyte.gz");
  ASSERT_GT(real.size(), 10'000u);
  std::ofstream(dir / "t10k-images-idx3-ubyte.gz", std::ios::binary | std::ios::trunc)
      << real.substr(0, real.size() / 2);
  expect_error("truncated gzip");
  // A gzip stream with corrupted deflate data.
  std::string flipped = real;
  for (size_t i = 100; i < 2'000; i += 7) flipped[i] = static_cast<char>(flipped[i] ^ 0x5a);
  std::ofstream(dir / "t10k-images-idx3-ubyte.gz", std::ios::binary | std::ios::trunc) << flipped;
  expect_error("corrupt deflate");
  // An empty file.
  std::ofstream(dir / "t10k-images-idx3-ubyte.gz", std::ios::binary | std::ios::trunc);
  expect_error("empty");
}

// Ten images whose pixels and label are their index.
std::shared_ptr<ImageDataset> TenImages() {
  auto data = std::make_shared<ImageDataset>();
  data->size = 10;
  data->labels.resize(10);
  data->images.resize(10 * 784);
  for (int i = 0; i < 10; ++i) {
    data->labels[static_cast<size_t>(i)] = i;
    std::fill_n(data->images.begin() + i * 784, 784, static_cast<float>(i));
  }
  return data;
}

TEST(ImageBatchStreamTest, EachPassIsAPermutation) {
  auto data = TenImages();
  ImageBatchStream s(data, 5, 3);
  std::vector<int64_t> seen;
  while (seen.size() < 30) {
    auto b = s.Next();
    ASSERT_EQ(b.batch_size, 3);
    ASSERT_EQ(b.images.size(), 3u * 784u);
    for (int64_t r = 0; r < 3; ++r) {
      EXPECT_EQ(b.images[static_cast<size_t>(r * 784 + 500)], static_cast<float>(b.labels[r]));
      seen.push_back(b.labels[static_cast<size_t>(r)]);
    }
  }
  EXPECT_EQ(s.pass(), 2);
  std::vector<std::vector<int64_t>> passes;
  for (int p = 0; p < 3; ++p) {
    std::vector<int64_t> pass(seen.begin() + p * 10, seen.begin() + (p + 1) * 10);
    std::vector<int64_t> sorted = pass;
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < 10; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
    passes.push_back(pass);
  }
  EXPECT_TRUE(passes[0] != passes[1] || passes[1] != passes[2]);  // reshuffled

  ImageBatchStream same(data, 5, 3), other(data, 6, 3);
  std::vector<int64_t> a, b;
  for (int i = 0; i < 4; ++i) {
    auto x = same.Next().labels, y = other.Next().labels;
    a.insert(a.end(), x.begin(), x.end());
    b.insert(b.end(), y.begin(), y.end());
  }
  EXPECT_TRUE(std::equal(a.begin(), a.end(), seen.begin()));
  EXPECT_NE(a, b);
}

// Audits recompute another peer's batch i: a stream that seeks to it must read what the
// peer's stream read, across pass boundaries (10 images, batches of 3: batch 3 spans passes).
TEST(ImageBatchStreamTest, SeekingToABatchReadsWhatTheStreamRead) {
  auto data = TenImages();
  ImageBatchStream s(data, 9, 3);
  std::vector<std::vector<int64_t>> batches;
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(s.position(), 3 * i);
    batches.push_back(s.Next().labels);
  }
  ImageBatchStream seeker(data, 9, 3);
  for (int i : {7, 3, 0, 11, 3, 10}) {
    seeker.Seek(3 * i);
    EXPECT_EQ(seeker.position(), 3 * i);
    EXPECT_EQ(seeker.Next().labels, batches[static_cast<size_t>(i)]) << "batch " << i;
  }
}

TEST(ImageBatchStreamTest, StreamsFashionMnist) {
  auto test = LoadFashionMnist(false);
  ASSERT_TRUE(test.ok()) << test.status().ToString();
  auto data = std::make_shared<const ImageDataset>(std::move(*test));
  ImageBatchStream s(data, 1, 64);
  for (int i = 0; i < 157; ++i) {
    auto b = s.Next();
    ASSERT_EQ(b.labels.size(), 64u);
    ASSERT_EQ(b.images.size(), 64u * 784u);
  }
  EXPECT_EQ(s.pass(), 1);  // 157 * 64 > 10000
}

}  // namespace
}  // namespace colony::model
