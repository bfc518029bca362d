// Hugging Face tokenizer.json (hf_tokenizer.h): parsing every component with its schema, and
// encoding/decoding with the tokenizers library's algorithms (added-token splitting,
// normalization, pre-tokenization, BPE merges by rank, byte-level decoding).
#include "model/hf_tokenizer.h"

#include <fmt/format.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <queue>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/log.h"
#include "model/regex.h"
#include "model/strict_json.h"
#include "model/utf8.h"

namespace colony::model {
namespace {

using nlohmann::json;

constexpr size_t kMaxVocab = 4 << 20;        // ids; Gemma's vocabulary is 256k
constexpr size_t kMaxMerges = 4 << 20;       // Llama 3 has 280k
constexpr size_t kMaxAddedTokens = 1 << 16;  // Llama 3 has 256
constexpr size_t kMaxTokenBytes = 4096;
constexpr size_t kMaxSteps = 64;  // components of one normalizer/pre-tokenizer Sequence
constexpr int kMaxJsonDepth = 16;

// GPT-2's pre-tokenization regex, which ByteLevel applies when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Status Refuse(std::string_view where, const json& value, std::string_view why) {
  std::string shown = value.dump();
  if (shown.size() > 200) shown = shown.substr(0, 200) + "...";
  return InvalidArgument(fmt::format("\"{}\" = {} {}", where, shown, why));
}

Status Malformed(std::string_view where, std::string_view what) {
  return InvalidArgument(fmt::format("\"{}\" {}", where, what));
}

// Refuses keys of `obj` outside `known`, naming the first.
Status OnlyKeys(const json& obj, std::string_view where,
                std::initializer_list<std::string_view> known) {
  for (const auto& [key, value] : obj.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return Refuse(where.empty() ? key : fmt::format("{}.{}", where, key), value,
                    "is not understood by Colony");
    }
  }
  return Status::Ok();
}

Result<bool> GetBool(const json& obj, const char* key, std::string_view where, bool fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Malformed(fmt::format("{}.{}", where, key), "must be a boolean");
  return it->get<bool>();
}

Result<std::string> GetString(const json& obj, const char* key, std::string_view where) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) {
    return Malformed(fmt::format("{}.{}", where, key), "must be a string");
  }
  return it->get<std::string>();
}

// The components of a {"type": "Sequence", `key`: [...]} component.
Result<const json*> SequenceItems(const json& j, std::string_view where, const char* key) {
  COLONY_RETURN_IF_ERROR(OnlyKeys(j, where, {"type", key}));
  auto it = j.find(key);
  if (it == j.end() || !it->is_array() || it->size() > kMaxSteps) {
    return Malformed(fmt::format("{}.{}", where, key),
                     fmt::format("must be an array of at most {} components", kMaxSteps));
  }
  return &*it;
}

// ---- Byte-level alphabet (GPT-2's bytes_to_unicode) -----------------------------------------

struct ByteAlphabet {
  std::array<std::string, 256> byte_to_char;  // UTF-8 of the printable stand-in of each byte
  std::array<int16_t, 324> char_to_byte{};    // code point -> byte, or -1
};

const ByteAlphabet& Bytes() {
  static const ByteAlphabet alphabet = [] {
    ByteAlphabet a;
    a.char_to_byte.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const uint32_t cp = printable ? b : next++;
      AppendUtf8(cp, a.byte_to_char[b]);
      a.char_to_byte[cp] = static_cast<int16_t>(b);
    }
    return a;
  }();
  return alphabet;
}

// ---- Normalizer --------------------------------------------------------------------------------

struct Normalizer {
  std::vector<const icu::Normalizer2*> forms;  // applied in order

  std::string Apply(std::string_view text) const {
    std::string out(text);
    for (const icu::Normalizer2* form : forms) {
      UErrorCode status = U_ZERO_ERROR;
      const icu::UnicodeString in = icu::UnicodeString::fromUTF8(out);
      if (form->isNormalized(in, status) && U_SUCCESS(status)) continue;
      status = U_ZERO_ERROR;
      const icu::UnicodeString normalized = form->normalize(in, status);
      if (U_FAILURE(status)) continue;  // only on allocation failure: keep the text as it is
      out.clear();
      normalized.toUTF8String(out);
    }
    return out;
  }
};

Status ParseNormalizer(const json& j, Normalizer& n, std::string_view where, int depth) {
  if (j.is_null()) return Status::Ok();
  if (!j.is_object()) return Malformed(where, "must be an object or null");
  COLONY_ASSIGN_OR_RETURN(std::string type, GetString(j, "type", where));
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* form = nullptr;
  if (type == "Sequence" && depth < 2) {
    COLONY_ASSIGN_OR_RETURN(const json* items, SequenceItems(j, where, "normalizers"));
    for (const json& step : *items) {
      COLONY_RETURN_IF_ERROR(
          ParseNormalizer(step, n, std::string(where) + ".normalizers[]", depth + 1));
    }
    return Status::Ok();
  }
  if (type == "NFC") {
    form = icu::Normalizer2::getNFCInstance(status);
  } else if (type == "NFD") {
    form = icu::Normalizer2::getNFDInstance(status);
  } else if (type == "NFKC") {
    form = icu::Normalizer2::getNFKCInstance(status);
  } else if (type == "NFKD") {
    form = icu::Normalizer2::getNFKDInstance(status);
  } else {
    return Refuse(std::string(where) + ".type", type,
                  "is not supported (supported: NFC, NFD, NFKC, NFKD, Sequence)");
  }
  if (U_FAILURE(status) || form == nullptr) {
    return Internal(fmt::format("ICU has no {} normalizer: {}", type, u_errorName(status)));
  }
  COLONY_RETURN_IF_ERROR(OnlyKeys(j, where, {"type"}));
  n.forms.push_back(form);
  return Status::Ok();
}

// ---- Pre-tokenizer -------------------------------------------------------------------------

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct SplitStep {
  std::shared_ptr<const Regex> regex;  // or, when null, the literal
  std::string literal;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
};

struct ByteLevelStep {
  bool add_prefix_space = false;
  bool use_regex = true;
};

using PreStep = std::variant<SplitStep, ByteLevelStep>;

std::shared_ptr<const Regex> Gpt2Regex() {
  static const std::shared_ptr<const Regex> re = [] {
    auto compiled = Regex::Compile(kGpt2Pattern);
    return compiled.ok() ? std::shared_ptr<const Regex>(std::move(*compiled)) : nullptr;
  }();
  return re;
}

Status ParsePreTokenizer(const json& j, std::vector<PreStep>& steps, std::string_view where,
                         int depth) {
  if (j.is_null()) return Status::Ok();
  if (!j.is_object()) return Malformed(where, "must be an object or null");
  if (steps.size() >= kMaxSteps) return Malformed(where, "has too many steps");
  COLONY_ASSIGN_OR_RETURN(std::string type, GetString(j, "type", where));
  if (type == "Sequence" && depth < 2) {
    COLONY_ASSIGN_OR_RETURN(const json* items, SequenceItems(j, where, "pretokenizers"));
    for (const json& step : *items) {
      COLONY_RETURN_IF_ERROR(
          ParsePreTokenizer(step, steps, std::string(where) + ".pretokenizers[]", depth + 1));
    }
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    COLONY_RETURN_IF_ERROR(
        OnlyKeys(j, where, {"type", "add_prefix_space", "trim_offsets", "use_regex"}));
    ByteLevelStep step;
    COLONY_ASSIGN_OR_RETURN(step.add_prefix_space, GetBool(j, "add_prefix_space", where, true));
    COLONY_ASSIGN_OR_RETURN(step.use_regex, GetBool(j, "use_regex", where, true));
    COLONY_RETURN_IF_ERROR(GetBool(j, "trim_offsets", where, true).status());  // offsets only
    if (step.use_regex && !Gpt2Regex()) return Internal("cannot compile GPT-2's regex");
    steps.emplace_back(step);
    return Status::Ok();
  }
  if (type == "Split") {
    COLONY_RETURN_IF_ERROR(OnlyKeys(j, where, {"type", "pattern", "behavior", "invert"}));
    SplitStep step;
    auto pattern = j.find("pattern");
    if (pattern == j.end() || !pattern->is_object() || pattern->size() != 1) {
      return Malformed(std::string(where) + ".pattern",
                       "must be {\"Regex\": ...} or {\"String\": ...}");
    }
    const std::string pwhere = std::string(where) + ".pattern";
    if (pattern->contains("Regex")) {
      COLONY_ASSIGN_OR_RETURN(std::string text, GetString(*pattern, "Regex", pwhere));
      auto re = Regex::Compile(text);
      if (!re.ok()) return Malformed(pwhere + ".Regex", re.status().message());
      step.regex = std::move(*re);
    } else if (pattern->contains("String")) {
      COLONY_ASSIGN_OR_RETURN(step.literal, GetString(*pattern, "String", pwhere));
      if (step.literal.size() > Regex::kMaxPatternBytes) return Malformed(pwhere, "is too long");
    } else {
      return Refuse(pwhere, *pattern, "is not understood (expected Regex or String)");
    }
    COLONY_ASSIGN_OR_RETURN(std::string behavior, GetString(j, "behavior", where));
    static const std::pair<std::string_view, SplitBehavior> kBehaviors[] = {
        {"Removed", SplitBehavior::kRemoved},
        {"Isolated", SplitBehavior::kIsolated},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    bool known = false;
    for (const auto& [name, value] : kBehaviors) {
      if (behavior == name) {
        step.behavior = value;
        known = true;
      }
    }
    if (!known) return Refuse(std::string(where) + ".behavior", behavior, "is not understood");
    COLONY_ASSIGN_OR_RETURN(step.invert, GetBool(j, "invert", where, false));
    steps.emplace_back(std::move(step));
    return Status::Ok();
  }
  return Refuse(std::string(where) + ".type", type,
                "is not supported (supported: ByteLevel, Split, Sequence)");
}

// The pieces of `piece` that a Split step keeps (tokenizers' NormalizedString::split).
void ApplySplit(const SplitStep& step, std::string_view piece, std::vector<std::string>& out) {
  if (piece.empty()) return;
  std::vector<Regex::Match> matches;
  if (step.regex) {
    if (Status st = step.regex->FindAll(piece, matches); !st.ok()) {
      static std::atomic<bool> warned{false};
      if (!warned.exchange(true)) {
        COLONY_LOG_WARN("tokenizer: a Split regex gave up ({}); the rest of the text stays whole",
                        st.message());
      }
    }
  } else if (!step.literal.empty()) {
    for (size_t pos = piece.find(step.literal); pos != std::string_view::npos;
         pos = piece.find(step.literal, pos + step.literal.size())) {
      matches.push_back({pos, pos + step.literal.size()});
    }
  }
  struct Segment {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Segment> segments;
  size_t prev = 0;
  for (const Regex::Match& m : matches) {
    if (prev != m.begin) segments.push_back({prev, m.begin, false});
    segments.push_back({m.begin, m.end, true});
    prev = m.end;
  }
  if (prev != piece.size()) segments.push_back({prev, piece.size(), false});
  if (step.invert) {
    for (Segment& s : segments) s.is_match = !s.is_match;
  }

  std::vector<std::pair<size_t, size_t>> kept;
  bool previous_match = false;
  switch (step.behavior) {
    case SplitBehavior::kRemoved:
      for (const Segment& s : segments) {
        if (!s.is_match) kept.emplace_back(s.begin, s.end);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const Segment& s : segments) kept.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Segment& s : segments) {
        if (s.is_match && !previous_match && !kept.empty()) {
          kept.back().second = s.end;
        } else {
          kept.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !previous_match && !kept.empty()) {
          kept.back().first = it->begin;
        } else {
          kept.emplace_back(it->begin, it->end);
        }
        previous_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    case SplitBehavior::kContiguous:
      for (const Segment& s : segments) {
        if (s.is_match == previous_match && !kept.empty()) {
          kept.back().second = s.end;
        } else {
          kept.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
  }
  for (const auto& [b, e] : kept) {
    if (e > b) out.emplace_back(piece.substr(b, e - b));
  }
}

void ApplyByteLevel(const ByteLevelStep& step, std::string_view piece,
                    std::vector<std::string>& out) {
  std::string text;
  if (step.add_prefix_space && !piece.starts_with(' ')) text = " ";
  text += piece;
  const size_t first = out.size();
  if (step.use_regex) {
    static const SplitStep gpt2{Gpt2Regex(), {}, SplitBehavior::kIsolated, false};
    ApplySplit(gpt2, text, out);
  } else if (!text.empty()) {
    out.push_back(std::move(text));
  }
  const ByteAlphabet& bytes = Bytes();
  for (size_t i = first; i < out.size(); ++i) {
    std::string mapped;
    mapped.reserve(out[i].size() * 2);
    for (char c : out[i]) mapped += bytes.byte_to_char[static_cast<unsigned char>(c)];
    out[i] = std::move(mapped);
  }
}

// ---- The model ---------------------------------------------------------------------------------

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct AddedToken {
  std::string content;
  std::string match;  // what is searched for: the content, normalized when `normalized`
  int32_t id = -1;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
};

// Leftmost-longest matching of a set of added tokens.
struct TokenMatcher {
  std::array<std::vector<const AddedToken*>, 256> by_first_byte;  // longest first

  void Build(const std::vector<AddedToken>& tokens, bool normalized) {
    for (const AddedToken& t : tokens) {
      if (t.normalized == normalized && !t.match.empty()) {
        by_first_byte[static_cast<unsigned char>(t.match[0])].push_back(&t);
      }
    }
    for (auto& list : by_first_byte) {
      std::stable_sort(list.begin(), list.end(), [](const AddedToken* a, const AddedToken* b) {
        return a->match.size() > b->match.size();
      });
    }
  }

  // The first token occurring in `text` at or after `from`, and where.
  const AddedToken* Find(std::string_view text, size_t from, size_t& at) const {
    for (size_t i = from; i < text.size(); ++i) {
      for (const AddedToken* t : by_first_byte[static_cast<unsigned char>(text[i])]) {
        if (text.substr(i).starts_with(t->match)) {
          at = i;
          return t;
        }
      }
    }
    return nullptr;
  }
};

bool IsWhitespaceAt(std::string_view text, size_t pos, size_t len) {
  return u_isUWhiteSpace(static_cast<UChar32>(Utf8Decode(text.substr(pos), len))) != 0;
}

class HfTokenizer final : public TokenizerModel {
 public:
  // Matchers and the id map point into added_: built in place, never copied.
  HfTokenizer() = default;
  HfTokenizer(const HfTokenizer&) = delete;
  HfTokenizer& operator=(const HfTokenizer&) = delete;

  Status Parse(std::string_view tokenizer_json, std::string_view config_json);

  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string Decode(std::span<const int32_t> ids) const override;
  int vocab_size() const override { return static_cast<int>(id_to_token_.size()); }
  SpecialTokens special() const override { return special_; }
  const std::string& serialized() const override { return bytes_; }
  std::string_view file_name() const override { return "tokenizer.json"; }

 private:
  Status ParseModel(const json& j);
  Status ParseAddedTokens(const json& j);
  Status ParsePostProcessor(const json& j, std::string_view where, int depth);
  Status ParseDecoder(const json& j);
  Status ParseConfig(std::string_view config_json);
  Result<int32_t> TokenId(const json& value, std::string_view where) const;

  // Calls `on_text(segment)` and `on_token(id)` for the parts of `text` between and at the
  // tokens of `matcher`.
  template <typename OnText>
  void SplitOnAddedTokens(const TokenMatcher& matcher, std::string_view text, OnText on_text,
                          std::vector<int32_t>& ids) const;
  void EncodeSegment(std::string_view normalized, std::vector<int32_t>& ids) const;
  void EncodeWord(std::string_view word, std::vector<int32_t>& ids) const;

  std::string bytes_;
  Normalizer normalizer_;
  std::vector<PreStep> pre_steps_;
  // BPE
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;
  std::unordered_map<uint64_t, std::pair<uint32_t, int32_t>> merges_;  // pair -> (rank, id)
  std::array<int32_t, 256> byte_tokens_{};                             // "<0xAB>" ids or -1
  int32_t unk_ = -1;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  // Added tokens
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, const AddedToken*> added_by_id_;
  TokenMatcher raw_matcher_, normalized_matcher_;
  // Decoding
  std::vector<std::string> id_to_token_;  // "" for ids that name nothing
  bool byte_level_decoder_ = false;
  bool clean_up_spaces_ = false;
  int32_t template_bos_ = -1;
  bool has_template_ = false;
  SpecialTokens special_;
};

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

Status HfTokenizer::ParseModel(const json& j) {
  constexpr std::string_view where = "model";
  if (!j.is_object()) return Malformed(where, "must be an object");
  COLONY_ASSIGN_OR_RETURN(std::string type, GetString(j, "type", where));
  if (type != "BPE") {
    return Refuse("model.type", type, "is not supported (only BPE)");
  }
  COLONY_RETURN_IF_ERROR(
      OnlyKeys(j, where,
               {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"}));
  if (auto it = j.find("dropout"); it != j.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 0.0) {
      return Refuse("model.dropout", *it, "is not supported (BPE dropout samples encodings)");
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (auto it = j.find(key); it != j.end() && !it->is_null() && *it != "") {
      return Refuse(fmt::format("model.{}", key), *it, "is not supported");
    }
  }
  COLONY_ASSIGN_OR_RETURN(fuse_unk_, GetBool(j, "fuse_unk", where, false));
  COLONY_ASSIGN_OR_RETURN(byte_fallback_, GetBool(j, "byte_fallback", where, false));
  COLONY_ASSIGN_OR_RETURN(ignore_merges_, GetBool(j, "ignore_merges", where, false));

  auto vocab = j.find("vocab");
  if (vocab == j.end() || !vocab->is_object()) return Malformed("model.vocab", "must be an object");
  if (vocab->size() > kMaxVocab) return Malformed("model.vocab", "has too many entries");
  vocab_.reserve(vocab->size());
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= static_cast<int64_t>(kMaxVocab)) {
      return Refuse(fmt::format("model.vocab.{}", token.substr(0, 100)), id,
                    "is not a token id in [0, 4194304)");
    }
    if (token.empty() || token.size() > kMaxTokenBytes || !IsValidUtf8(token)) {
      return Malformed("model.vocab", "has an empty, oversized or non-UTF-8 token");
    }
    const auto index = static_cast<size_t>(id.get<int64_t>());
    if (index >= id_to_token_.size()) id_to_token_.resize(index + 1);
    if (!id_to_token_[index].empty()) {
      return Malformed("model.vocab", fmt::format("gives id {} to two tokens", index));
    }
    id_to_token_[index] = token;
    vocab_.emplace(token, static_cast<int32_t>(index));
  }

  if (auto it = j.find("unk_token"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return Malformed("model.unk_token", "must be a string or null");
    auto unk = vocab_.find(it->get<std::string>());
    if (unk == vocab_.end()) return Refuse("model.unk_token", *it, "is not in the vocabulary");
    unk_ = unk->second;
  }
  byte_tokens_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    if (auto it = vocab_.find(fmt::format("<0x{:02X}>", b)); it != vocab_.end()) {
      byte_tokens_[static_cast<size_t>(b)] = it->second;
    }
  }

  auto merges = j.find("merges");
  if (merges == j.end() || !merges->is_array()) {
    return Malformed("model.merges", "must be an array");
  }
  if (merges->size() > kMaxMerges) return Malformed("model.merges", "has too many entries");
  merges_.reserve(merges->size());
  uint32_t rank = 0;
  for (const json& m : *merges) {
    std::string left, right;
    if (m.is_string()) {  // "a b" (tokenizers before 0.20)
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return Refuse("model.merges[]", m, "is not two tokens separated by one space");
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return Refuse("model.merges[]", m, "is not a pair of tokens");
    }
    auto l = vocab_.find(left);
    auto r = vocab_.find(right);
    auto merged = vocab_.find(left + right);
    if (l == vocab_.end() || r == vocab_.end() || merged == vocab_.end()) {
      return Refuse("model.merges[]", m, "names a token that is not in the vocabulary");
    }
    // The first occurrence of a pair wins, as in tokenizers.
    merges_.emplace(PairKey(l->second, r->second), std::make_pair(rank++, merged->second));
  }
  return Status::Ok();
}

Status HfTokenizer::ParseAddedTokens(const json& j) {
  if (j.is_null()) return Status::Ok();
  if (!j.is_array()) return Malformed("added_tokens", "must be an array");
  if (j.size() > kMaxAddedTokens) return Malformed("added_tokens", "has too many entries");
  added_.reserve(j.size());
  for (const json& t : j) {
    constexpr std::string_view where = "added_tokens[]";
    if (!t.is_object()) return Malformed(where, "must be objects");
    COLONY_RETURN_IF_ERROR(OnlyKeys(
        t, where, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"}));
    AddedToken a;
    COLONY_ASSIGN_OR_RETURN(a.content, GetString(t, "content", where));
    auto id = t.find("id");
    if (id == t.end() || !id->is_number_integer() || id->get<int64_t>() < 0 ||
        id->get<int64_t>() >= static_cast<int64_t>(kMaxVocab)) {
      return Malformed(where, "needs an \"id\" in [0, 4194304)");
    }
    a.id = static_cast<int32_t>(id->get<int64_t>());
    if (a.content.empty() || a.content.size() > kMaxTokenBytes || !IsValidUtf8(a.content)) {
      return Malformed(where, "has an empty, oversized or non-UTF-8 content");
    }
    COLONY_ASSIGN_OR_RETURN(a.special, GetBool(t, "special", where, false));
    COLONY_ASSIGN_OR_RETURN(a.normalized, GetBool(t, "normalized", where, !a.special));
    COLONY_ASSIGN_OR_RETURN(a.lstrip, GetBool(t, "lstrip", where, false));
    COLONY_ASSIGN_OR_RETURN(a.rstrip, GetBool(t, "rstrip", where, false));
    COLONY_ASSIGN_OR_RETURN(bool single_word, GetBool(t, "single_word", where, false));
    if (single_word) {
      return Refuse(fmt::format("added_tokens[{}].single_word", a.id), true, "is not supported");
    }
    a.match = a.normalized ? normalizer_.Apply(a.content) : a.content;
    const auto index = static_cast<size_t>(a.id);
    if (index >= id_to_token_.size()) id_to_token_.resize(index + 1);
    if (!id_to_token_[index].empty() && id_to_token_[index] != a.content) {
      // tokenizers lets the added token win; a file that does this is most likely broken.
      return Malformed(
          where, fmt::format("gives id {} to \"{}\", which the vocabulary gives to "
                             "\"{}\"",
                             a.id, a.content.substr(0, 100), id_to_token_[index].substr(0, 100)));
    }
    id_to_token_[index] = a.content;
    added_.push_back(std::move(a));
  }
  for (const AddedToken& a : added_) {
    if (!added_by_id_.emplace(a.id, &a).second) {
      return Malformed("added_tokens", fmt::format("has id {} twice", a.id));
    }
  }
  raw_matcher_.Build(added_, /*normalized=*/false);
  normalized_matcher_.Build(added_, /*normalized=*/true);
  return Status::Ok();
}

Status HfTokenizer::ParsePostProcessor(const json& j, std::string_view where, int depth) {
  if (j.is_null()) return Status::Ok();
  if (!j.is_object()) return Malformed(where, "must be an object or null");
  COLONY_ASSIGN_OR_RETURN(std::string type, GetString(j, "type", where));
  if (type == "Sequence" && depth < 2) {
    COLONY_ASSIGN_OR_RETURN(const json* items, SequenceItems(j, where, "processors"));
    for (const json& p : *items) {
      COLONY_RETURN_IF_ERROR(
          ParsePostProcessor(p, std::string(where) + ".processors[]", depth + 1));
    }
    return Status::Ok();
  }
  if (type == "ByteLevel") {  // adjusts offsets only
    return OnlyKeys(j, where, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
  }
  if (type != "TemplateProcessing") {
    return Refuse(std::string(where) + ".type", type,
                  "is not supported (supported: TemplateProcessing, ByteLevel, Sequence)");
  }
  COLONY_RETURN_IF_ERROR(OnlyKeys(j, where, {"type", "single", "pair", "special_tokens"}));
  if (has_template_) return Malformed(where, "has two TemplateProcessing steps");
  has_template_ = true;
  auto single = j.find("single");
  if (single == j.end() || !single->is_array()) {
    return Malformed(std::string(where) + ".single", "must be an array");
  }
  // Colony encodes a prompt and prepends bos itself: only [bos?, A] can be honoured.
  const json& s = *single;
  const bool leading = s.size() == 2 && s[0].is_object() && s[0].contains("SpecialToken");
  const json& sequence = s.empty() ? s : s[s.size() - 1];
  if (s.size() > 2 || s.empty() || (s.size() == 2 && !leading) || !sequence.is_object() ||
      !sequence.contains("Sequence")) {
    return Refuse(std::string(where) + ".single", s,
                  "is not supported (only an optional leading special token before the text)");
  }
  if (leading) {
    const json& special = s[0]["SpecialToken"];
    if (!special.is_object() || !special.contains("id") || !special["id"].is_string()) {
      return Malformed(std::string(where) + ".single", "has a SpecialToken without an id");
    }
    const std::string name = special["id"].get<std::string>();
    auto tokens = j.find("special_tokens");
    const json* entry = nullptr;
    if (tokens != j.end() && tokens->is_object() && tokens->contains(name)) {
      entry = &(*tokens)[name];
    }
    if (!entry || !entry->is_object() || !entry->contains("ids") || !(*entry)["ids"].is_array() ||
        (*entry)["ids"].size() != 1 || !(*entry)["ids"][0].is_number_integer()) {
      return Refuse(std::string(where) + ".special_tokens", name,
                    "must map the template's special token to exactly one id");
    }
    const int64_t id = (*entry)["ids"][0].get<int64_t>();
    if (id < 0 || id >= static_cast<int64_t>(id_to_token_.size())) {
      return Refuse(std::string(where) + ".special_tokens", name, "has an id out of range");
    }
    template_bos_ = static_cast<int32_t>(id);
  }
  return Status::Ok();
}

Status HfTokenizer::ParseDecoder(const json& j) {
  if (j.is_null()) return Status::Ok();
  if (!j.is_object()) return Malformed("decoder", "must be an object or null");
  COLONY_ASSIGN_OR_RETURN(std::string type, GetString(j, "type", "decoder"));
  if (type != "ByteLevel") {
    return Refuse("decoder.type", type, "is not supported (only ByteLevel)");
  }
  COLONY_RETURN_IF_ERROR(
      OnlyKeys(j, "decoder", {"type", "add_prefix_space", "trim_offsets", "use_regex"}));
  byte_level_decoder_ = true;
  return Status::Ok();
}

// A token named in tokenizer_config.json: "text", {"content": "text", ...} or null.
Result<int32_t> HfTokenizer::TokenId(const json& value, std::string_view where) const {
  if (value.is_null()) return -1;
  const json* content = &value;
  if (value.is_object()) {
    auto it = value.find("content");
    if (it == value.end()) return Malformed(where, "has no \"content\"");
    content = &*it;
  }
  if (!content->is_string()) return Malformed(where, "must be a string, an object or null");
  const std::string& text = content->get_ref<const std::string&>();
  for (const AddedToken& a : added_) {
    if (a.content == text) return a.id;
  }
  if (auto it = vocab_.find(text); it != vocab_.end()) return it->second;
  return Refuse(where, text, "is not a token of tokenizer.json");
}

Status HfTokenizer::ParseConfig(std::string_view config_json) {
  special_.bos = template_bos_;
  special_.unk = unk_;
  if (config_json.empty()) return Status::Ok();
  COLONY_ASSIGN_OR_RETURN(
      json c, ParseStrictJsonObject(config_json, "tokenizer_config.json", kMaxJsonDepth));
  constexpr std::string_view kFile = "tokenizer_config.json";
  auto where = [&](const char* key) { return fmt::format("{}.{}", kFile, key); };
  if (auto it = c.find("eos_token"); it != c.end()) {
    COLONY_ASSIGN_OR_RETURN(special_.eos, TokenId(*it, where("eos_token")));
  }
  if (auto it = c.find("pad_token"); it != c.end()) {
    COLONY_ASSIGN_OR_RETURN(special_.pad, TokenId(*it, where("pad_token")));
  }
  if (auto it = c.find("unk_token"); it != c.end()) {
    COLONY_ASSIGN_OR_RETURN(int32_t unk, TokenId(*it, where("unk_token")));
    if (unk >= 0) special_.unk = unk;
  }
  if (auto it = c.find("bos_token"); it != c.end()) {
    COLONY_ASSIGN_OR_RETURN(int32_t bos, TokenId(*it, where("bos_token")));
    if (template_bos_ >= 0 && bos >= 0 && bos != template_bos_) {
      return Refuse(where("bos_token"), *it,
                    "differs from the token tokenizer.json's post_processor prepends");
    }
  }
  COLONY_ASSIGN_OR_RETURN(clean_up_spaces_,
                          GetBool(c, "clean_up_tokenization_spaces", kFile, false));
  // Options that would change encodings, honoured where they agree with tokenizer.json.
  COLONY_ASSIGN_OR_RETURN(bool add_bos, GetBool(c, "add_bos_token", kFile, template_bos_ >= 0));
  if (add_bos != (template_bos_ >= 0)) {
    return Refuse(where("add_bos_token"), add_bos,
                  "disagrees with tokenizer.json's post_processor, which Colony follows");
  }
  for (const char* key :
       {"add_eos_token", "add_prefix_space", "do_lower_case", "split_special_tokens"}) {
    COLONY_ASSIGN_OR_RETURN(bool on, GetBool(c, key, kFile, false));
    if (on) return Refuse(where(key), true, "is not supported");
  }
  return Status::Ok();
}

Status HfTokenizer::Parse(std::string_view tokenizer_json, std::string_view config_json) {
  if (tokenizer_json.size() > kMaxHfTokenizerBytes) {
    return ResourceExhausted(fmt::format("tokenizer.json of {} bytes is over the limit of {}",
                                         tokenizer_json.size(), kMaxHfTokenizerBytes));
  }
  if (config_json.size() > kMaxHfTokenizerConfigBytes) {
    return ResourceExhausted(
        fmt::format("tokenizer_config.json of {} bytes is over the limit of {}", config_json.size(),
                    kMaxHfTokenizerConfigBytes));
  }
  bytes_.assign(tokenizer_json);
  COLONY_ASSIGN_OR_RETURN(json j,
                          ParseStrictJsonObject(tokenizer_json, "tokenizer.json", kMaxJsonDepth));
  COLONY_RETURN_IF_ERROR(OnlyKeys(j, "",
                                  {"version", "truncation", "padding", "added_tokens", "normalizer",
                                   "pre_tokenizer", "post_processor", "decoder", "model"}));
  if (auto it = j.find("version"); it != j.end() && *it != "1.0") {
    return Refuse("version", *it, "is not understood (only \"1.0\")");
  }
  for (const char* key : {"truncation", "padding"}) {
    if (auto it = j.find(key); it != j.end() && !it->is_null()) {
      return Refuse(key, *it, "is not supported (Colony does not truncate or pad encodings)");
    }
  }
  auto field = [&](const char* key) -> const json& {
    static const json kNull;
    auto it = j.find(key);
    return it == j.end() ? kNull : *it;
  };
  if (!j.contains("model")) return Malformed("model", "is missing");
  COLONY_RETURN_IF_ERROR(ParseNormalizer(field("normalizer"), normalizer_, "normalizer", 0));
  COLONY_RETURN_IF_ERROR(ParsePreTokenizer(field("pre_tokenizer"), pre_steps_, "pre_tokenizer", 0));
  COLONY_RETURN_IF_ERROR(ParseModel(j["model"]));
  COLONY_RETURN_IF_ERROR(ParseAddedTokens(field("added_tokens")));
  COLONY_RETURN_IF_ERROR(ParsePostProcessor(field("post_processor"), "post_processor", 0));
  COLONY_RETURN_IF_ERROR(ParseDecoder(field("decoder")));
  if (id_to_token_.empty()) return Malformed("model.vocab", "is empty");
  return ParseConfig(config_json);
}

// ---- Encoding ----------------------------------------------------------------------------------

template <typename OnText>
void HfTokenizer::SplitOnAddedTokens(const TokenMatcher& matcher, std::string_view text,
                                     OnText on_text, std::vector<int32_t>& ids) const {
  size_t start = 0;  // the end of the last token
  size_t from = 0;
  size_t at = 0;
  while (const AddedToken* t = matcher.Find(text, from, at)) {
    size_t begin = at;
    size_t end = at + t->match.size();
    if (t->lstrip) {
      while (begin > start) {
        size_t prev = begin - 1;
        while (prev > start && (static_cast<unsigned char>(text[prev]) & 0xC0) == 0x80) --prev;
        if (!IsWhitespaceAt(text, prev, begin - prev)) break;
        begin = prev;
      }
    }
    if (t->rstrip) {
      while (end < text.size()) {
        const size_t len = Utf8CharLen(text.substr(end));
        if (len == 0 || !IsWhitespaceAt(text, end, len)) break;
        end += len;
      }
    }
    if (begin > start) on_text(text.substr(start, begin - start));
    ids.push_back(t->id);
    start = from = end;
  }
  if (start < text.size()) on_text(text.substr(start));
}

std::vector<int32_t> HfTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  std::string valid;
  if (!IsValidUtf8(text)) {
    valid = Utf8Lossy(text);
    text = valid;
  }
  SplitOnAddedTokens(
      raw_matcher_, text,
      [&](std::string_view raw) {
        const std::string normalized = normalizer_.Apply(raw);
        SplitOnAddedTokens(
            normalized_matcher_, normalized,
            [&](std::string_view segment) { EncodeSegment(segment, ids); }, ids);
      },
      ids);
  return ids;
}

void HfTokenizer::EncodeSegment(std::string_view normalized, std::vector<int32_t>& ids) const {
  std::vector<std::string> pieces{std::string(normalized)};
  std::vector<std::string> next;
  for (const PreStep& step : pre_steps_) {
    next.clear();
    for (const std::string& piece : pieces) {
      if (const auto* split = std::get_if<SplitStep>(&step)) {
        ApplySplit(*split, piece, next);
      } else {
        ApplyByteLevel(std::get<ByteLevelStep>(step), piece, next);
      }
    }
    pieces.swap(next);
  }
  for (const std::string& piece : pieces) EncodeWord(piece, ids);
}

// tokenizers' BPE::merge_word and Word::merge_all: characters (or their byte tokens, or unk)
// in a linked list; a min-heap of (rank, position) holds the pairs that have a merge; stale
// entries are recognised because the pair at their position no longer merges into their id.
void HfTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int prev;
    int next;
    bool gone;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id) {
    const int index = static_cast<int>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, false});
  };
  int32_t pending_unk = -1;  // unk ids wait: consecutive ones fuse when fuse_unk
  for (size_t pos = 0; pos < word.size();) {
    const size_t len = std::max<size_t>(1, Utf8CharLen(word.substr(pos)));
    const std::string_view ch = word.substr(pos, len);
    pos += len;
    if (auto it = vocab_.find(ch); it != vocab_.end()) {
      if (pending_unk >= 0) add(pending_unk);
      pending_unk = -1;
      add(it->second);
      continue;
    }
    if (byte_fallback_ && std::all_of(ch.begin(), ch.end(), [&](char c) {
          return byte_tokens_[static_cast<unsigned char>(c)] >= 0;
        })) {
      for (char c : ch) add(byte_tokens_[static_cast<unsigned char>(c)]);
      continue;
    }
    if (unk_ >= 0) {
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = unk_;
    }
    // Without an unk token, a character outside the vocabulary is dropped (as tokenizers does).
  }
  if (pending_unk >= 0) add(pending_unk);

  struct Merge {
    uint32_t rank;
    int pos;
    int32_t id;
    bool operator>(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Merge> storage;
  storage.reserve(symbols.size());
  std::priority_queue<Merge, std::vector<Merge>, std::greater<>> queue(std::greater<>{},
                                                                       std::move(storage));
  auto push = [&](int left) {
    const Symbol& l = symbols[static_cast<size_t>(left)];
    if (l.next < 0) return;
    auto it = merges_.find(PairKey(l.id, symbols[static_cast<size_t>(l.next)].id));
    if (it != merges_.end()) queue.push({it->second.first, left, it->second.second});
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) push(static_cast<int>(i));
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& l = symbols[static_cast<size_t>(top.pos)];
    if (l.gone || l.next < 0) continue;
    Symbol& r = symbols[static_cast<size_t>(l.next)];
    auto it = merges_.find(PairKey(l.id, r.id));
    if (it == merges_.end() || it->second.second != top.id) continue;  // stale
    l.id = top.id;
    r.gone = true;
    l.next = r.next;
    if (r.next >= 0) symbols[static_cast<size_t>(r.next)].prev = top.pos;
    if (l.prev >= 0) push(l.prev);
    push(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (!s.gone) ids.push_back(s.id);
  }
}

// ---- Decoding ----------------------------------------------------------------------------------

// transformers' clean_up_tokenization: no space before punctuation and English contractions.
std::string CleanUpSpaces(std::string text) {
  static const std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    std::string out;
    out.reserve(text.size());
    size_t pos = 0;
    for (size_t hit = text.find(from); hit != std::string::npos; hit = text.find(from, pos)) {
      out.append(text, pos, hit - pos);
      out += to;
      pos = hit + from.size();
    }
    out.append(text, pos);
    text = std::move(out);
  }
  return text;
}

std::string HfTokenizer::Decode(std::span<const int32_t> ids) const {
  std::vector<std::string_view> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) continue;
    if (auto it = added_by_id_.find(id); it != added_by_id_.end() && it->second->special) continue;
    const std::string& token = id_to_token_[static_cast<size_t>(id)];
    if (!token.empty()) tokens.push_back(token);
  }
  std::string text;
  if (!byte_level_decoder_) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) text += ' ';
      text += tokens[i];
    }
  } else {
    const ByteAlphabet& alphabet = Bytes();
    std::string bytes;
    for (std::string_view token : tokens) {
      const size_t mark = bytes.size();
      bool all_mapped = true;
      for (size_t pos = 0; pos < token.size() && all_mapped;) {
        const size_t len = Utf8CharLen(token.substr(pos));
        const uint32_t cp = len ? Utf8Decode(token.substr(pos), len) : 0xFFFFFFFFu;
        if (len == 0 || cp >= alphabet.char_to_byte.size() || alphabet.char_to_byte[cp] < 0) {
          all_mapped = false;
          break;
        }
        bytes += static_cast<char>(alphabet.char_to_byte[cp]);
        pos += len;
      }
      if (!all_mapped) {  // a token outside the alphabet stands for itself
        bytes.resize(mark);
        bytes += token;
      }
    }
    text = Utf8Lossy(bytes);
  }
  return clean_up_spaces_ ? CleanUpSpaces(std::move(text)) : text;
}

}  // namespace

Result<std::shared_ptr<const TokenizerModel>> ParseHfTokenizer(
    std::string_view tokenizer_json, std::string_view tokenizer_config_json) {
  auto model = std::make_shared<HfTokenizer>();
  Status st = model->Parse(tokenizer_json, tokenizer_config_json);
  if (!st.ok()) return Status(st.code(), "not a usable tokenizer.json: " + st.message());
  return std::shared_ptr<const TokenizerModel>(std::move(model));
}

}  // namespace colony::model
