// Tokenizer (tokenizer.h): parsing and checking SentencePiece model files, training models with
// spm_train, and BPE encoding and decoding as sentencepiece does them.
#include "model/tokenizer.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <queue>
#include <system_error>
#include <unordered_map>

#include "core/files.h"
#include "core/log.h"
#include "core/subprocess.h"
#include "model/hf_tokenizer.h"
#include "model/spm_model.pb.h"
#include "model/utf8.h"

namespace colony::model {

// ---- The model -------------------------------------------------------------------------------

// A parsed SentencePiece ModelProto, reduced to what encoding and decoding need. String views in
// the maps point into `pieces`, so a model is built in place and never moved.
struct SentencePieceModel final : TokenizerModel {
  // ModelProto.SentencePiece.Type
  enum Type : int {
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6
  };
  struct Piece {
    std::string text;
    float score = 0;
    int type = kNormal;
  };

  std::string file_bytes;  // the serialized ModelProto
  std::vector<Piece> pieces;
  // NORMAL, USER_DEFINED and UNUSED pieces (those BPE merges into), and the others.
  std::unordered_map<std::string_view, int> normal;
  std::unordered_map<std::string_view, int> reserved;
  std::vector<std::string_view> user_defined;  // sorted, for longest-prefix matching
  size_t max_user_defined = 0;                 // longest user-defined piece, bytes
  std::array<int, 256> byte_ids{};             // with byte_fallback
  int unk = -1, bos = -1, eos = -1, pad = -1;

  // TrainerSpec and NormalizerSpec fields (proto2 defaults).
  int model_type = 1;  // UNIGRAM
  bool byte_fallback = false;
  bool treat_whitespace_as_suffix = false;
  std::string unk_surface = " \xE2\x81\x87 ";
  std::string unk_piece = "<unk>", bos_piece = "<s>", eos_piece = "</s>", pad_piece = "<pad>";
  std::string normalizer_name;
  bool has_charsmap = false;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;

  // sentencepiece's ModelInterface::PieceToId: reserved pieces first, unknown strings -> unk.
  int PieceToId(std::string_view piece) const {
    if (auto it = reserved.find(piece); it != reserved.end()) return it->second;
    if (auto it = normal.find(piece); it != normal.end()) return it->second;
    return unk;
  }
  // Length of the longest user-defined piece that `text` starts with, or 0.
  size_t MatchUserDefined(std::string_view text) const;
  std::string Normalize(std::string_view text) const;
  std::vector<int32_t> EncodeBpe(std::string_view normalized) const;

  std::vector<int32_t> Encode(std::string_view text) const override {
    return EncodeBpe(Normalize(text));
  }
  std::string Decode(std::span<const int32_t> ids) const override;
  int vocab_size() const override { return static_cast<int>(pieces.size()); }
  SpecialTokens special() const override { return {bos, eos, pad, unk}; }
  const std::string& serialized() const override { return file_bytes; }
  std::string_view file_name() const override { return "tokenizer.model"; }
};

namespace {

// Seed of SentencePiece's sampling of training sentences: fixed, so that every peer that trains
// on the same corpus gets the same model (they must agree on token ids).
constexpr unsigned kTrainSeed = 20240601;
// Lines sampled from the corpus for training. The kernel docs have ~700k non-empty lines; a
// third of them gives nearly the same merges and keeps BPE training to seconds on one core.
constexpr int kTrainSentences = 250'000;

// Limits on untrusted model files (Llama's tokenizer.model is 500 KB with 32000 pieces).
constexpr size_t kMaxModelBytes = 64 << 20;
constexpr size_t kMaxPieces = 1'000'000;

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // U+2581

// The byte of a "<0xAB>" piece (upper-case hex, as sentencepiece writes them), or -1.
int PieceToByte(std::string_view piece) {
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece[5] != '>') return -1;
  int v = 0;
  for (char c : piece.substr(3, 2)) {
    if (c >= '0' && c <= '9') {
      v = v * 16 + (c - '0');
    } else if (c >= 'A' && c <= 'F') {
      v = v * 16 + (c - 'A' + 10);
    } else {
      return -1;
    }
  }
  return v;
}

// ---- The model file ------------------------------------------------------------------------

// Counts the pieces (top-level field 1) of a serialized ModelProto without building them, so
// that a small file cannot make the parser allocate millions of messages.
Status CheckPieceCount(std::string_view serialized) {
  namespace pb = google::protobuf;
  pb::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(serialized.data()),
                              static_cast<int>(serialized.size()));
  constexpr uint32_t kPieceTag = (1 << 3) | 2;
  size_t pieces = 0;
  // A malformed tag or field ends the scan; ParseFromString then reports it.
  for (uint32_t tag = in.ReadTag(); tag != 0; tag = in.ReadTag()) {
    if (tag == kPieceTag && ++pieces > kMaxPieces) {
      return ResourceExhausted("more than " + std::to_string(kMaxPieces) + " pieces");
    }
    if (!pb::internal::WireFormatLite::SkipField(&in, tag)) break;
  }
  return Status::Ok();
}

// Parses `m.file_bytes` into `m` and checks it the way sentencepiece's loader does.
Status ParseModel(SentencePieceModel& m) {
  using Model = SentencePieceModel;
  if (m.file_bytes.size() > kMaxModelBytes) {
    return ResourceExhausted("model of " + std::to_string(m.file_bytes.size()) +
                             " bytes is over the limit of " + std::to_string(kMaxModelBytes));
  }
  COLONY_RETURN_IF_ERROR(CheckPieceCount(m.file_bytes));
  spm::ModelProto proto;
  if (!proto.ParseFromString(m.file_bytes)) {
    return InvalidArgument("malformed ModelProto (not a SentencePiece model file)");
  }
  m.pieces.reserve(static_cast<size_t>(proto.pieces_size()));
  for (int i = 0; i < proto.pieces_size(); ++i) {
    const auto& p = proto.pieces(i);
    if (p.type() < Model::kNormal || p.type() > Model::kByte) {
      return InvalidArgument("piece " + std::to_string(i) + " has the invalid type " +
                             std::to_string(p.type()));
    }
    m.pieces.push_back({.text = p.piece(), .score = p.score(), .type = p.type()});
  }
  const spm::TrainerSpec& t = proto.trainer_spec();
  m.model_type = t.model_type();
  m.treat_whitespace_as_suffix = t.treat_whitespace_as_suffix();
  m.byte_fallback = t.byte_fallback();
  m.unk_surface = t.unk_surface();
  m.unk_piece = t.unk_piece();
  m.bos_piece = t.bos_piece();
  m.eos_piece = t.eos_piece();
  m.pad_piece = t.pad_piece();
  const spm::NormalizerSpec& n = proto.normalizer_spec();
  m.normalizer_name = n.name();
  m.has_charsmap = !n.precompiled_charsmap().empty();
  m.add_dummy_prefix = n.add_dummy_prefix();
  m.remove_extra_whitespaces = n.remove_extra_whitespaces();
  m.escape_whitespaces = n.escape_whitespaces();

  if (m.pieces.empty()) return InvalidArgument("the model has no pieces");
  if (m.model_type != 2) {
    const std::string type = m.model_type == 1   ? "unigram"
                             : m.model_type == 3 ? "word"
                             : m.model_type == 4 ? "char"
                                                 : "type " + std::to_string(m.model_type);
    return Unimplemented("only BPE SentencePiece models are supported, this one is " + type);
  }
  if (m.has_charsmap) {
    return Unimplemented("SentencePiece normalization \"" + m.normalizer_name +
                         "\" (a precompiled charsmap) is not supported; train with "
                         "normalization_rule_name=identity");
  }
  if (m.treat_whitespace_as_suffix) {
    return Unimplemented("treat_whitespace_as_suffix models are not supported");
  }

  std::array<bool, 256> byte_found{};
  m.normal.reserve(m.pieces.size());
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const Model::Piece& p = m.pieces[i];
    const std::string where = "piece " + std::to_string(i);
    if (p.text.empty()) return InvalidArgument(where + " is empty");
    if (!IsValidUtf8(p.text)) return InvalidArgument(where + " is not valid UTF-8");
    const bool is_normal =
        p.type == Model::kNormal || p.type == Model::kUserDefined || p.type == Model::kUnused;
    if (!(is_normal ? m.normal : m.reserved).emplace(p.text, static_cast<int>(i)).second) {
      return InvalidArgument(where + " \"" + p.text + "\" is defined twice");
    }
    if (p.type == Model::kUserDefined) {
      m.user_defined.push_back(p.text);
      m.max_user_defined = std::max(m.max_user_defined, p.text.size());
    }
    if (p.type == Model::kUnknown) {
      if (m.unk >= 0) return InvalidArgument(where + ": a second unknown piece");
      m.unk = static_cast<int>(i);
    }
    if (p.type == Model::kByte) {
      if (!m.byte_fallback) {
        return InvalidArgument(where + " is a byte piece although byte_fallback is false");
      }
      const int b = PieceToByte(p.text);
      if (b < 0) return InvalidArgument(where + " \"" + p.text + "\" is not a valid byte piece");
      byte_found[static_cast<size_t>(b)] = true;
      m.byte_ids[static_cast<size_t>(b)] = static_cast<int>(i);
    }
  }
  if (m.unk < 0) return InvalidArgument("the model defines no unknown piece");
  if (m.byte_fallback &&
      std::find(byte_found.begin(), byte_found.end(), false) != byte_found.end()) {
    return InvalidArgument("byte_fallback is set but the model lacks some of the 256 byte pieces");
  }
  std::sort(m.user_defined.begin(), m.user_defined.end());

  auto special = [&](const std::string& piece, int type) {
    const int id = m.PieceToId(piece);
    return m.pieces[static_cast<size_t>(id)].type == type ? id : -1;
  };
  m.bos = special(m.bos_piece, Model::kControl);
  m.eos = special(m.eos_piece, Model::kControl);
  m.pad = special(m.pad_piece, Model::kControl);
  return Status::Ok();
}

// The model with the trainer's input and output paths removed from its TrainerSpec, so that
// peers that train on the same corpus from different directories get byte-identical models.
Result<std::string> StripTrainingPaths(const std::string& serialized) {
  spm::TrainedModel model;
  if (!model.ParseFromString(serialized)) {
    return DataLoss("spm_train wrote a malformed model file");
  }
  model.mutable_trainer_spec()->clear_input();
  model.mutable_trainer_spec()->clear_model_prefix();
  return model.SerializeAsString();
}

// ---- Training with spm_train -------------------------------------------------------------

// spm_train takes seconds on the kernel docs; a machine that needs longer than this is stuck.
constexpr auto kTrainTimeout = std::chrono::minutes(30);

std::string FileTail(const std::filesystem::path& file, size_t max_bytes) {
  auto read = ReadFileToString(file, 64 << 20);
  std::string text;
  if (read.ok()) {
    text = std::move(*read);
  } else {
    text = read.status().message();
  }
  if (text.size() > max_bytes) text = "..." + text.substr(text.size() - max_bytes);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

// ---- Loading ---------------------------------------------------------------------------------

Tokenizer::Tokenizer(std::shared_ptr<const TokenizerModel> model)
    : model_(std::move(model)),
      special_(model_->special()),
      hash_(Hex64(Fnv1a64(model_->serialized()))) {}

Result<Tokenizer> Tokenizer::Load(const std::filesystem::path& file) {
  const bool hf = file.extension() == ".json";
  auto read = ReadFileToString(file, hf ? kMaxHfTokenizerBytes : kMaxModelBytes);
  if (!read.ok()) {
    return Status(read.status().code(),
                  "cannot read tokenizer " + file.string() + ": " + read.status().message());
  }
  if (!hf) return FromSerialized(*read, file.string());
  // transformers keeps the special tokens' names and decoding options beside tokenizer.json.
  std::string config;
  const std::filesystem::path config_file = file.parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(config_file, ec)) {
    auto text = ReadFileToString(config_file, kMaxHfTokenizerConfigBytes);
    if (!text.ok()) {
      return Status(text.status().code(),
                    "cannot read " + config_file.string() + ": " + text.status().message());
    }
    config = std::move(*text);
  }
  auto model = ParseHfTokenizer(*read, config);
  if (!model.ok()) {
    return Status(model.status().code(), file.string() + ": " + model.status().message());
  }
  return Tokenizer(std::move(*model));
}

Result<std::filesystem::path> Tokenizer::FindInModelDir(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const char* name : {"tokenizer.model", "tokenizer.json"}) {
    if (std::filesystem::is_regular_file(dir / name, ec)) return dir / name;
  }
  return NotFound(dir.string() + " has neither tokenizer.model nor tokenizer.json");
}

Result<Tokenizer> Tokenizer::FromHfJson(std::string_view tokenizer_json,
                                        std::string_view tokenizer_config_json) {
  COLONY_ASSIGN_OR_RETURN(auto model, ParseHfTokenizer(tokenizer_json, tokenizer_config_json));
  return Tokenizer(std::move(model));
}

Result<Tokenizer> Tokenizer::FromBytes(std::string_view serialized) {
  return FromSerialized(serialized, "<memory>");
}

Result<Tokenizer> Tokenizer::FromSerialized(std::string_view serialized,
                                            const std::string& origin) {
  if (serialized.size() > kMaxModelBytes) {
    return ResourceExhausted("tokenizer model " + origin + " is over the limit of " +
                             std::to_string(kMaxModelBytes) + " bytes");
  }
  // Built in place: its maps point into its pieces.
  auto model = std::make_shared<SentencePieceModel>();
  model->file_bytes.assign(serialized);
  Status st = ParseModel(*model);
  if (!st.ok()) {
    return Status(st.code(), "not a usable SentencePiece model: " + origin + ": " + st.message());
  }
  return Tokenizer(std::move(model));
}

// ---- Training --------------------------------------------------------------------------------

Result<Tokenizer> Tokenizer::TrainOrLoad(const std::filesystem::path& corpus,
                                         const std::filesystem::path& cache_dir, int vocab_size) {
  // 256 byte-fallback pieces, 4 special ids, the newline symbol and some merges.
  if (vocab_size < 300 || vocab_size > 65536) {
    return InvalidArgument("tokenizer vocab_size must be in [300, 65536], got " +
                           std::to_string(vocab_size));
  }
  COLONY_ASSIGN_OR_RETURN(std::string corpus_hash, HashFile(corpus));
  std::error_code ec;
  std::filesystem::create_directories(cache_dir, ec);
  if (ec) {
    return PermissionDenied("cannot create cache directory " + cache_dir.string() + ": " +
                            ec.message());
  }
  const std::filesystem::path model_file =
      cache_dir / ("tokenizer-" + std::to_string(vocab_size) + "-" + corpus_hash + ".model");
  if (std::filesystem::exists(model_file, ec)) return Load(model_file);

  std::filesystem::path lock_path = model_file;
  lock_path += ".lock";
  COLONY_ASSIGN_OR_RETURN(FileLock lock, FileLock::Acquire(lock_path));
  // Another process may have trained it while we waited for the lock.
  if (std::filesystem::exists(model_file, ec)) return Load(model_file);
  RemoveStaleTemps(model_file);

  const std::string spm_train = FindProgram("spm_train");
  if (spm_train.empty()) {
    return FailedPrecondition(
        "spm_train not found in PATH: install the sentencepiece package (scripts/setup)");
  }
  // spm_train writes <prefix>.model and <prefix>.vocab: into a private temporary directory.
  const std::filesystem::path work = UniqueTempPath(model_file);
  std::filesystem::create_directories(work, ec);
  if (ec) return PermissionDenied("cannot create " + work.string() + ": " + ec.message());
  struct RemoveDir {
    std::filesystem::path dir;
    ~RemoveDir() { RemoveTree(dir); }
  } cleanup{work};
  const std::filesystem::path log = work / "spm_train.log";
  const std::vector<std::string> argv = {
      spm_train, "--input=" + std::filesystem::absolute(corpus, ec).string(),
      "--model_prefix=" + (work / "spm").string(), "--model_type=bpe",
      "--vocab_size=" + std::to_string(vocab_size),
      "--input_sentence_size=" + std::to_string(kTrainSentences), "--shuffle_input_sentence=true",
      "--random_seed=" + std::to_string(kTrainSeed), "--num_threads=2",
      "--character_coverage=0.9999", "--byte_fallback=true", "--unk_id=0", "--bos_id=1",
      "--eos_id=2", "--pad_id=3",
      // Lossless: no NFKC, whitespace kept as is, no space invented at the start of a text.
      "--normalization_rule_name=identity", "--remove_extra_whitespaces=false",
      "--add_dummy_prefix=false",
      // Training sentences are lines, so "\n" would otherwise only exist as a fallback byte.
      "--user_defined_symbols=\n",
      // Indentation (code blocks, tables) is common in the docs.
      "--allow_whitespace_only_pieces=true", "--split_digits=true", "--max_sentence_length=8192",
      "--minloglevel=2",  // SentencePiece logs every merge at INFO
  };
  const auto start = std::chrono::steady_clock::now();
  COLONY_ASSIGN_OR_RETURN(int exit_code, Subprocess::Run(argv, log.string(), kTrainTimeout));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (exit_code != 0) {
    return Internal("training the tokenizer on " + corpus.string() + " failed: spm_train exited " +
                    "with status " + std::to_string(exit_code) + ": " + FileTail(log, 2000));
  }
  auto read = ReadFileToString(work / "spm.model", kMaxModelBytes);
  const std::string trained = read.ok() ? std::move(*read) : std::string();
  if (trained.empty()) {
    return Internal("spm_train wrote no model to " + (work / "spm.model").string() + ": " +
                    FileTail(log, 2000));
  }
  COLONY_ASSIGN_OR_RETURN(std::string serialized, StripTrainingPaths(trained));
  COLONY_ASSIGN_OR_RETURN(Tokenizer tok, FromSerialized(serialized, model_file.string()));
  COLONY_LOG_INFO("trained a {}-piece BPE tokenizer on {} in {:.1f} s -> {}", vocab_size,
                  corpus.string(), seconds, model_file.string());
  COLONY_RETURN_IF_ERROR(WriteFileAtomically(model_file, serialized));
  return tok;
}

// ---- Encoding --------------------------------------------------------------------------------

size_t SentencePieceModel::MatchUserDefined(std::string_view text) const {
  if (user_defined.empty()) return 0;
  // Longest match: extend the prefix while some user-defined piece starts with it.
  size_t best = 0;
  auto lo = user_defined.begin();
  const size_t limit = std::min(text.size(), max_user_defined);
  for (size_t len = 1; len <= limit; ++len) {
    const std::string_view prefix = text.substr(0, len);
    lo = std::lower_bound(lo, user_defined.end(), prefix);
    if (lo == user_defined.end() || !lo->starts_with(prefix)) break;
    if (lo->size() == len) best = len;
  }
  return best;
}

// sentencepiece's Normalizer::Normalize without a charsmap.
std::string SentencePieceModel::Normalize(std::string_view input) const {
  std::string out;
  // The next normalized unit of `in` and the number of input bytes it consumes.
  auto next = [this](std::string_view in) -> std::pair<std::string_view, size_t> {
    if (const size_t n = MatchUserDefined(in); n > 0) return {in.substr(0, n), n};
    const size_t n = Utf8CharLen(in);
    if (n == 0) return {kReplacementChar, 1};
    return {in.substr(0, n), n};
  };
  if (remove_extra_whitespaces) {
    while (!input.empty()) {
      const auto [unit, consumed] = next(input);
      if (unit != " ") break;
      input.remove_prefix(consumed);
    }
  }
  if (input.empty()) return out;
  out.reserve(input.size() + input.size() / 2 + 3);
  const std::string_view space = escape_whitespaces ? kSpaceSymbol : " ";
  if (add_dummy_prefix) out += space;
  bool is_prev_space = remove_extra_whitespaces;
  while (!input.empty()) {
    auto [unit, consumed] = next(input);
    while (is_prev_space && unit.starts_with(' ')) unit.remove_prefix(1);
    if (!unit.empty()) {
      for (char c : unit) {
        if (c == ' ' && escape_whitespaces) {
          out += kSpaceSymbol;
        } else {
          out += c;
        }
      }
      is_prev_space = unit.back() == ' ';
    }
    input.remove_prefix(consumed);
    if (!remove_extra_whitespaces) is_prev_space = false;
  }
  if (remove_extra_whitespaces) {
    while (out.ends_with(space)) out.resize(out.size() - space.size());
  }
  return out;
}

// sentencepiece's bpe::Model::Encode plus the id mapping of SentencePieceProcessor::Encode:
// symbols are characters (or user-defined pieces, which never merge) in a linked list; a
// priority queue holds the adjacent pairs whose concatenation is a piece, best score first
// (ties: leftmost); stale entries are recognized by their length and skipped.
std::vector<int32_t> SentencePieceModel::EncodeBpe(std::string_view text) const {
  std::vector<int32_t> ids;
  if (text.empty()) return ids;
  struct Symbol {
    int prev;
    int next;
    bool freeze;
    uint32_t begin;
    uint32_t size;  // 0 once merged into its left neighbour
  };
  struct Pair {
    float score;
    int left;
    int right;
    uint32_t size;
  };
  struct Worse {
    bool operator()(const Pair& a, const Pair& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    size_t len = MatchUserDefined(text.substr(pos));
    const bool freeze = len > 0;
    if (!freeze) {
      len = std::min(text.size() - pos, Utf8LeadLen(static_cast<unsigned char>(text[pos])));
    }
    const int index = static_cast<int>(symbols.size());
    pos += len;
    symbols.push_back({index - 1, pos < text.size() ? index + 1 : -1, freeze,
                       static_cast<uint32_t>(pos - len), static_cast<uint32_t>(len)});
  }

  std::vector<Pair> heap;
  heap.reserve(symbols.size());
  std::priority_queue<Pair, std::vector<Pair>, Worse> agenda(Worse{}, std::move(heap));
  // Merged UNUSED pieces and what they were merged from (split again at the end).
  std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>> rev_merge;
  auto piece_of = [&](const Symbol& s) { return text.substr(s.begin, s.size); };
  auto maybe_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    if (l.freeze || r.freeze) return;
    const std::string_view merged = text.substr(l.begin, l.size + r.size);
    const auto it = normal.find(merged);
    if (it == normal.end()) return;
    const Piece& p = pieces[static_cast<size_t>(it->second)];
    agenda.push({p.score, left, right, static_cast<uint32_t>(merged.size())});
    if (p.type == kUnused) rev_merge[merged] = {piece_of(l), piece_of(r)};
  };
  for (size_t i = 1; i < symbols.size(); ++i)
    maybe_add(static_cast<int>(i - 1), static_cast<int>(i));

  while (!agenda.empty()) {
    const Pair top = agenda.top();
    agenda.pop();
    Symbol& l = symbols[static_cast<size_t>(top.left)];
    Symbol& r = symbols[static_cast<size_t>(top.right)];
    if (l.size == 0 || r.size == 0 || l.size + r.size != top.size) continue;  // stale
    l.size += r.size;
    l.next = r.next;
    if (r.next >= 0) symbols[static_cast<size_t>(r.next)].prev = top.left;
    r.size = 0;
    maybe_add(l.prev, top.left);
    maybe_add(top.left, l.next);
  }

  ids.reserve(symbols.size());
  bool prev_unk = false;
  std::vector<std::string_view> stack;
  for (int index = 0; index != -1; index = symbols[static_cast<size_t>(index)].next) {
    stack.push_back(piece_of(symbols[static_cast<size_t>(index)]));
    while (!stack.empty()) {
      const std::string_view w = stack.back();
      stack.pop_back();
      const int id = PieceToId(w);
      const int type = pieces[static_cast<size_t>(id)].type;
      if (type == kUnused) {
        if (auto it = rev_merge.find(w); it != rev_merge.end()) {
          stack.push_back(it->second.second);
          stack.push_back(it->second.first);
          continue;
        }
      }
      const bool is_unk = type == kUnknown;
      if (is_unk && byte_fallback) {
        for (char c : w) ids.push_back(byte_ids[static_cast<unsigned char>(c)]);
      } else if (!(is_unk && prev_unk)) {  // runs of unknown pieces give one unk id
        ids.push_back(id);
      }
      prev_unk = is_unk;
    }
  }
  return ids;
}

std::string SentencePieceModel::Decode(std::span<const int32_t> ids) const {
  const SentencePieceModel& m = *this;
  std::string text, bytes;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= m.pieces.size()) continue;
    const Piece& p = m.pieces[static_cast<size_t>(id)];
    if (p.type == kByte) {
      bytes += static_cast<char>(PieceToByte(p.text));
      continue;
    }
    AppendBytesAsUtf8(bytes, text);
    bytes.clear();
    if (p.type == kControl) continue;  // <s>, </s>, <pad>: invisible
    if (p.type == kUnknown) {
      text += m.unk_surface;
      continue;
    }
    std::string_view piece = p.text;
    // The space that the normalizer added (or kept) at the start of the text.
    if (text.empty() && (m.add_dummy_prefix || m.remove_extra_whitespaces) &&
        piece.starts_with(kSpaceSymbol)) {
      piece.remove_prefix(kSpaceSymbol.size());
    }
    for (size_t pos = 0; pos < piece.size();) {
      if (piece.substr(pos).starts_with(kSpaceSymbol)) {
        text += ' ';
        pos += kSpaceSymbol.size();
      } else {
        text += piece[pos++];
      }
    }
  }
  AppendBytesAsUtf8(bytes, text);
  return text;
}

// ---- Tokenizer -------------------------------------------------------------------------------

Status Tokenizer::Save(const std::filesystem::path& file) const {
  return WriteFileAtomically(file, model_->serialized());
}

}  // namespace colony::model
