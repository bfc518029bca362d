#include "model/corpus.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "core/files.h"
#include "core/log.h"

namespace colony::model {

namespace fs = std::filesystem;

namespace {

// Bump when the cleaning rules change, so that cached corpora are rebuilt.
// v2: documents in a fixed shuffled order, translations left out.
constexpr std::string_view kCorpusFormat = "colony-corpus-v2";
constexpr int kManifestVersion = 1;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// ---- Corpus --------------------------------------------------------------------------------

bool IsSourceFile(const fs::path& p) {
  const std::string name = p.filename().string();
  auto ends_with = [&](std::string_view suffix) {
    return name.size() > suffix.size() &&
           std::string_view(name).substr(name.size() - suffix.size()) == suffix;
  };
  return ends_with(".rst.gz") || ends_with(".txt.gz");
}

// Reads a whole gzip file (or a plain one: gzread passes those through).
Result<std::string> ReadGzipFile(const fs::path& file, size_t max_bytes) {
  gzFile gz = gzopen(file.c_str(), "rb");
  if (gz == nullptr) return NotFound("cannot open " + file.string() + ": " + std::strerror(errno));
  gzbuffer(gz, 128 * 1024);
  std::string out;
  char buf[64 * 1024];
  for (;;) {
    int n = gzread(gz, buf, sizeof(buf));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(gz, &err);
      gzclose(gz);
      return DataLoss("cannot decompress " + file.string() + ": " + msg);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      gzclose(gz);
      return ResourceExhausted(file.string() + " decompresses to more than " +
                               std::to_string(max_bytes) + " bytes");
    }
  }
  // A truncated stream reads as a short file; gzclose_r reports it.
  int err = 0;
  std::string msg = gzerror(gz, &err);
  int close_rc = gzclose(gz);
  if (err != Z_OK || close_rc != Z_OK) {
    return DataLoss("cannot decompress " + file.string() + ": " +
                    (err != Z_OK ? msg : "truncated or corrupt gzip stream"));
  }
  return out;
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and out-of-range code points.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += len;
  }
  return true;
}

// Light, line-based removal of reStructuredText markup that carries no language: section
// underlines and table borders, license tags, directive and link-target lines.
class RstCleaner {
 public:
  // Appends the cleaned `text` of one file to `out`, separated from the previous file by one
  // blank line.
  void AddFile(std::string_view text, std::string& out) {
    if (!out.empty() && !last_blank_) {
      out += '\n';
      last_blank_ = true;
    }
    after_directive_ = false;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string_view::npos) nl = text.size();
      AddLine(text.substr(pos, nl - pos), out);
      pos = nl + 1;
    }
  }

 private:
  static bool IsMarkupPunct(char c) {
    return std::string_view("=-~^*#+`:'\"._|<>").find(c) != std::string_view::npos;
  }

  // True for "=====", "-------", "+----+----+", "=== ====" and the like.
  static bool IsRule(std::string_view s) {
    int punct = 0;
    for (char c : s) {
      if (c == ' ' || c == '\t') continue;
      if (!IsMarkupPunct(c)) return false;
      ++punct;
    }
    return punct >= 3;
  }

  void AddLine(std::string_view line, std::string& out) {
    while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) {
      line.remove_suffix(1);
    }
    std::string_view trimmed = line;
    while (!trimmed.empty() && (trimmed.front() == ' ' || trimmed.front() == '\t')) {
      trimmed.remove_prefix(1);
    }
    if (trimmed.empty()) {
      after_directive_ = false;
      if (!last_blank_ && !out.empty()) {
        out += '\n';
        last_blank_ = true;
      }
      return;
    }
    // Options of a dropped directive (":maxdepth: 2") follow it, indented.
    if (after_directive_ && trimmed.size() < line.size() && trimmed.front() == ':') return;
    after_directive_ = false;
    if (trimmed.find("SPDX-License-Identifier") != std::string_view::npos) return;
    if (trimmed.starts_with(".. ") &&
        (trimmed.find("::") != std::string_view::npos || trimmed.starts_with(".. _"))) {
      after_directive_ = true;
      return;
    }
    if (IsRule(trimmed)) return;
    if (!IsValidUtf8(line)) return;  // a few files are Latin-1; the tokenizer wants UTF-8
    out.append(line);
    out += '\n';
    last_blank_ = false;
  }

  bool last_blank_ = true;  // nothing written yet counts as blank: no leading blank lines
  bool after_directive_ = false;
};

// ---- Token shards --------------------------------------------------------------------------

std::string ShardName(size_t index) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "shard-%05zu.bin", index);
  return buf;
}

Status WriteTokens(const fs::path& file, const uint16_t* tokens, size_t count) {
  std::string bytes(count * 2, '\0');
  for (size_t i = 0; i < count; ++i) {
    bytes[2 * i] = static_cast<char>(tokens[i] & 0xFF);
    bytes[2 * i + 1] = static_cast<char>(tokens[i] >> 8);
  }
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return ResourceExhausted("cannot write " + file.string() + " (disk full?)");
  return Status::Ok();
}

// Encodes `text` in chunks of about 2 KB that end after a newline: "\n" is a piece of its own
// in our tokenizers, so no piece spans a chunk boundary and the result equals encoding the whole
// text; short inputs are also much faster for SentencePiece's BPE than long ones. The chunks
// (hence the tokens) do not depend on the number of threads.
Result<std::vector<uint16_t>> EncodeText(std::string_view text, const Tokenizer& tokenizer) {
  constexpr size_t kChunk = 2048;
  std::vector<size_t> cuts = {0};
  while (cuts.back() < text.size()) {
    const size_t pos = cuts.back();
    size_t end = std::min(text.size(), pos + kChunk);
    if (end < text.size()) {
      const size_t nl = text.substr(pos, end - pos).rfind('\n');
      if (nl != std::string_view::npos) end = pos + nl + 1;
    }
    cuts.push_back(end);
  }
  const size_t chunks = cuts.size() - 1;
  const size_t workers =
      std::clamp<size_t>(std::thread::hardware_concurrency(), 1, std::max<size_t>(1, chunks));
  std::vector<std::vector<uint16_t>> parts(std::min<size_t>(workers, 8));
  std::vector<int> bad_id(parts.size(), -1);
  auto encode = [&](size_t w) {
    const size_t first = chunks * w / parts.size(), last = chunks * (w + 1) / parts.size();
    parts[w].reserve((cuts[last] - cuts[first]) / 3);
    for (size_t c = first; c < last; ++c) {
      for (int32_t id : tokenizer.Encode(text.substr(cuts[c], cuts[c + 1] - cuts[c]))) {
        if (id < 0 || id > 0xFFFF) bad_id[w] = id;
        parts[w].push_back(static_cast<uint16_t>(id));
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t w = 1; w < parts.size(); ++w) threads.emplace_back(encode, w);
  encode(0);
  for (auto& t : threads) t.join();
  for (int id : bad_id) {
    if (id != -1) return Internal("the tokenizer produced id " + std::to_string(id));
  }
  std::vector<uint16_t> tokens = std::move(parts[0]);
  for (size_t w = 1; w < parts.size(); ++w) {
    tokens.insert(tokens.end(), parts[w].begin(), parts[w].end());
  }
  return tokens;
}

Result<std::string> ReadWholeFile(const fs::path& file) {
  std::ifstream in(file, std::ios::binary | std::ios::ate);
  if (!in) return NotFound("cannot open " + file.string() + ": " + std::strerror(errno));
  const std::streamoff size = in.tellg();
  if (size < 0) return DataLoss("cannot size " + file.string());
  std::string data(static_cast<size_t>(size), '\0');
  in.seekg(0);
  in.read(data.data(), size);
  if (in.gcount() != size) return DataLoss("error reading " + file.string());
  return data;
}

// ---- Streams -------------------------------------------------------------------------------

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A seed for (stream seed, purpose, counter); distinct inputs give unrelated sequences.
uint64_t MixSeed(uint64_t seed, uint64_t purpose, uint64_t counter) {
  uint64_t s = seed;
  uint64_t a = SplitMix64(s);
  s = a ^ (purpose * 0xd1b54a32d192ed03ULL);
  uint64_t b = SplitMix64(s);
  s = b ^ counter;
  return SplitMix64(s);
}

// Fisher-Yates with our own generator: the same permutation on every platform.
template <typename T>
void Shuffle(std::vector<T>& v, uint64_t seed) {
  uint64_t state = seed;
  for (size_t i = v.size(); i > 1; --i) {
    size_t j = static_cast<size_t>(SplitMix64(state) % i);
    std::swap(v[i - 1], v[j]);
  }
}

}  // namespace

fs::path DefaultCacheDir() {
  if (const char* dir = std::getenv("COLONY_CACHE_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return fs::path(xdg) / "colony";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return fs::path(home) / ".cache" / "colony";
  }
  return "/tmp/colony-cache";
}

Result<fs::path> PrepareCorpus(const CorpusOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  if (!fs::is_directory(options.source_dir, ec)) {
    return NotFound("corpus source directory " + options.source_dir.string() +
                    " not found: install the Debian package linux-doc-6.1 (scripts/setup) or "
                    "point CorpusOptions::source_dir at a directory of *.rst.gz files");
  }
  struct SourceFile {
    std::string rel;  // sort key, hashed
    fs::path path;
    uint64_t size = 0;
  };
  std::vector<SourceFile> files;
  for (auto it = fs::recursive_directory_iterator(
           options.source_dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code entry_ec;  // an unreadable entry is skipped, not fatal
    if (!IsSourceFile(it->path()) || !it->is_regular_file(entry_ec)) continue;
    SourceFile f;
    f.path = it->path();
    f.rel = it->path().lexically_relative(options.source_dir).generic_string();
    // Chinese, Japanese, Korean, Italian, ... copies of English pages: a small corpus drawn from
    // them would need more characters than a small vocabulary has.
    if (f.rel.starts_with("translations/")) continue;
    f.size = it->file_size(entry_ec);
    if (entry_ec) continue;
    files.push_back(std::move(f));
  }
  if (ec) {
    return Internal("cannot list corpus source directory " + options.source_dir.string() + ": " +
                    ec.message());
  }
  if (files.empty()) {
    return NotFound("no *.rst.gz or *.txt.gz files under " + options.source_dir.string() +
                    ": install the Debian package linux-doc-6.1 (scripts/setup)");
  }
  // Documents in an order that looks random but is the same on every machine (a hash of the
  // path, not a library's shuffle): a shard or the held-out tail is a mix of subsystems rather
  // than one directory, so the training loss does not jump when the stream reaches an easy one.
  auto order = [](const SourceFile& f) { return std::make_pair(Fnv1a64(f.rel), f.rel); };
  std::sort(files.begin(), files.end(),
            [&](const SourceFile& a, const SourceFile& b) { return order(a) < order(b); });

  uint64_t h = Fnv1a64(kCorpusFormat);
  h = Fnv1a64(std::to_string(options.max_bytes) + "\n", h);
  for (const SourceFile& f : files) h = Fnv1a64(f.rel + "\t" + std::to_string(f.size) + "\n", h);

  const fs::path cache_dir = options.cache_dir.empty() ? DefaultCacheDir() : options.cache_dir;
  fs::create_directories(cache_dir, ec);
  if (ec) {
    return PermissionDenied("cannot create cache directory " + cache_dir.string() + ": " +
                            ec.message());
  }
  const fs::path corpus = cache_dir / ("corpus-" + Hex64(h) + ".txt");
  if (fs::exists(corpus, ec)) return corpus;
  fs::path lock_path = corpus;
  lock_path += ".lock";
  COLONY_ASSIGN_OR_RETURN(FileLock lock, FileLock::Acquire(lock_path));
  if (fs::exists(corpus, ec)) return corpus;  // built by another process while we waited
  RemoveStaleTemps(corpus);

  const fs::path tmp = UniqueTempPath(corpus);
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) return PermissionDenied("cannot create " + tmp.string() + ": " + std::strerror(errno));
  auto fail = [&](Status st) {
    out.close();
    std::error_code ignored;
    fs::remove(tmp, ignored);
    return st;
  };
  RstCleaner cleaner;
  std::string text;  // cleaned text not yet written (the previous file's ending state matters)
  uint64_t written = 0;
  size_t used_files = 0;
  const uint64_t limit = options.max_bytes == 0 ? UINT64_MAX : options.max_bytes;
  for (const SourceFile& f : files) {
    // Documentation files are kilobytes; a huge one is not documentation.
    auto raw = ReadGzipFile(f.path, 64 << 20);
    if (!raw.ok()) return fail(raw.status().WithContext("preparing the corpus"));
    cleaner.AddFile(*raw, text);
    ++used_files;
    if (written + text.size() >= limit) {
      // Cut at the last line end within the limit.
      size_t keep = static_cast<size_t>(limit - written);
      size_t nl = std::string_view(text).substr(0, keep).rfind('\n');
      text.resize(nl == std::string::npos ? 0 : nl + 1);
      out.write(text.data(), static_cast<std::streamsize>(text.size()));
      written += text.size();
      text.clear();
      break;
    }
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    written += text.size();
    text.clear();
  }
  out.close();
  if (!out) return fail(ResourceExhausted("cannot write " + tmp.string() + " (disk full?)"));
  fs::rename(tmp, corpus, ec);
  if (ec) return fail(Internal("cannot rename " + tmp.string() + ": " + ec.message()));
  COLONY_LOG_INFO("prepared corpus {} ({:.1f} MB from {} files) in {:.1f} s", corpus.string(),
                  static_cast<double>(written) / 1e6, used_files, SecondsSince(start));
  return corpus;
}

Result<ShardManifest> ReadShardManifest(const fs::path& shard_dir) {
  const fs::path file = shard_dir / "manifest.json";
  COLONY_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(file));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(file.string() + " is not valid JSON");
  ShardManifest m;
  try {
    if (j.at("version").get<int>() != kManifestVersion) {
      return FailedPrecondition(file.string() + " has an unsupported version; delete " +
                                shard_dir.string() + " to rebuild it");
    }
    m.tokenizer_hash = j.at("tokenizer_hash").get<std::string>();
    m.corpus_hash = j.at("corpus_hash").get<std::string>();
    m.vocab_size = j.at("vocab_size").get<int>();
    m.tokens_per_shard = j.at("tokens_per_shard").get<uint64_t>();
    for (const auto& s : j.at("shards")) {
      m.shard_files.push_back(s.at("file").get<std::string>());
      m.shard_tokens.push_back(s.at("tokens").get<uint64_t>());
      m.train_tokens += m.shard_tokens.back();
    }
    m.valid_tokens = j.at("valid_tokens").get<uint64_t>();
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(file.string() + " is malformed: " + e.what());
  }
  for (const std::string& name : m.shard_files) {
    // Names come from a file: keep them inside the directory.
    if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') {
      return DataLoss(file.string() + " names an invalid shard file '" + name + "'");
    }
  }
  return m;
}

Result<fs::path> PrepareTokenShards(const fs::path& corpus, const Tokenizer& tokenizer,
                                    const fs::path& out_dir, uint64_t tokens_per_shard) {
  if (tokens_per_shard == 0) return InvalidArgument("tokens_per_shard must be positive");
  if (tokenizer.vocab_size() > 65536) {
    return InvalidArgument("the tokenizer has " + std::to_string(tokenizer.vocab_size()) +
                           " pieces; token shards store uint16 ids (at most 65536 pieces)");
  }
  COLONY_ASSIGN_OR_RETURN(std::string corpus_hash, HashFile(corpus));
  auto up_to_date = [&]() {
    auto m = ReadShardManifest(out_dir);
    return m.ok() && m->tokenizer_hash == tokenizer.hash() && m->corpus_hash == corpus_hash &&
           m->tokens_per_shard == tokens_per_shard;
  };
  if (up_to_date()) return out_dir;

  std::error_code ec;
  if (out_dir.has_parent_path()) fs::create_directories(out_dir.parent_path(), ec);
  if (ec) {
    return PermissionDenied("cannot create " + out_dir.parent_path().string() + ": " +
                            ec.message());
  }
  fs::path lock_path = out_dir;
  lock_path += ".lock";
  COLONY_ASSIGN_OR_RETURN(FileLock lock, FileLock::Acquire(lock_path));
  if (up_to_date()) return out_dir;  // built by another process while we waited
  RemoveStaleTemps(out_dir);

  const auto start = std::chrono::steady_clock::now();
  COLONY_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(corpus));
  if (Hex64(Fnv1a64(text)) != corpus_hash) {
    return Status(StatusCode::kAborted, corpus.string() + " changed while it was being tokenized");
  }
  COLONY_ASSIGN_OR_RETURN(std::vector<uint16_t> tokens, EncodeText(text, tokenizer));
  text = std::string();
  if (tokens.size() < 100) {
    return FailedPrecondition(corpus.string() + " tokenizes to only " +
                              std::to_string(tokens.size()) + " tokens; use a larger corpus");
  }
  const uint64_t valid_count = std::max<uint64_t>(1, tokens.size() / 50);
  const uint64_t train_count = tokens.size() - valid_count;

  const fs::path tmp = UniqueTempPath(out_dir);
  fs::create_directories(tmp, ec);
  if (ec) return PermissionDenied("cannot create " + tmp.string() + ": " + ec.message());
  auto fail = [&](Status st) {
    RemoveTree(tmp);
    return st;
  };
  nlohmann::json shards = nlohmann::json::array();
  for (uint64_t first = 0, index = 0; first < train_count; first += tokens_per_shard, ++index) {
    const uint64_t count = std::min(tokens_per_shard, train_count - first);
    const std::string name = ShardName(index);
    Status st = WriteTokens(tmp / name, tokens.data() + first, count);
    if (!st.ok()) return fail(st);
    shards.push_back({{"file", name}, {"tokens", count}});
  }
  Status st = WriteTokens(tmp / "valid.bin", tokens.data() + train_count, valid_count);
  if (!st.ok()) return fail(st);
  nlohmann::json manifest = {
      {"version", kManifestVersion},
      {"format", "uint16le"},
      {"tokenizer_hash", tokenizer.hash()},
      {"corpus_hash", corpus_hash},
      {"corpus", corpus.string()},
      {"vocab_size", tokenizer.vocab_size()},
      {"tokens_per_shard", tokens_per_shard},
      {"shards", shards},
      {"train_tokens", train_count},
      {"valid_tokens", valid_count},
  };
  {
    std::ofstream out(tmp / "manifest.json", std::ios::trunc);
    out << manifest.dump(2) << "\n";
    out.close();
    if (!out) return fail(ResourceExhausted("cannot write " + (tmp / "manifest.json").string()));
  }
  // A directory left by another corpus or tokenizer (or a crashed run): replace it. Streams
  // that have its shards mapped keep reading the unlinked files.
  ec = RemoveTree(out_dir);
  fs::rename(tmp, out_dir, ec);
  if (ec) {
    return fail(Internal("cannot rename " + tmp.string() + " to " + out_dir.string() + ": " +
                         ec.message()));
  }
  COLONY_LOG_INFO("tokenized {} into {} shards + validation ({} tokens) in {:.1f} s -> {}",
                  corpus.string(), shards.size(), tokens.size(), SecondsSince(start),
                  out_dir.string());
  return out_dir;
}

// ---- TokenStream ---------------------------------------------------------------------------

struct TokenStream::Shard {
  Shard(const uint8_t* d, uint64_t n, size_t len) : data(d), tokens(n), bytes(len) {}
  ~Shard() { ::munmap(const_cast<uint8_t*>(data), bytes); }
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  uint16_t at(uint64_t i) const {
    return static_cast<uint16_t>(data[2 * i] | (static_cast<uint16_t>(data[2 * i + 1]) << 8));
  }

  const uint8_t* data;
  uint64_t tokens;
  size_t bytes;
};

namespace {

Result<std::shared_ptr<const TokenStream::Shard>> MapShard(const fs::path& file, uint64_t tokens) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound("cannot open shard " + file.string() + ": " + std::strerror(errno));
  struct stat sb {};
  if (::fstat(fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) != tokens * 2) {
    ::close(fd);
    return DataLoss("shard " + file.string() + " does not hold the " + std::to_string(tokens) +
                    " tokens its manifest announces; delete its directory to rebuild it");
  }
  void* addr = ::mmap(nullptr, tokens * 2, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps the file
  if (addr == MAP_FAILED) return Internal("mmap " + file.string() + ": " + std::strerror(err));
  return std::make_shared<const TokenStream::Shard>(static_cast<const uint8_t*>(addr), tokens,
                                                    tokens * 2);
}

enum : uint64_t { kPurposeShardOrder = 1, kPurposeWindows = 2 };

}  // namespace

Result<TokenStream> TokenStream::Open(const fs::path& shard_dir, uint64_t seed, int64_t batch_size,
                                      int64_t seq_len) {
  if (batch_size <= 0 || seq_len <= 0) {
    return InvalidArgument("TokenStream needs a positive batch_size and seq_len, got " +
                           std::to_string(batch_size) + " and " + std::to_string(seq_len));
  }
  COLONY_ASSIGN_OR_RETURN(ShardManifest m, ReadShardManifest(shard_dir));
  TokenStream s;
  s.seed_ = seed;
  s.batch_size_ = batch_size;
  s.seq_len_ = seq_len;
  for (size_t i = 0; i < m.shard_files.size(); ++i) {
    if (m.shard_tokens[i] < static_cast<uint64_t>(seq_len) + 1) continue;  // no whole window
    COLONY_ASSIGN_OR_RETURN(auto shard, MapShard(shard_dir / m.shard_files[i], m.shard_tokens[i]));
    s.shards_.push_back(std::move(shard));
  }
  if (s.shards_.empty()) {
    return FailedPrecondition("no shard in " + shard_dir.string() + " holds a window of " +
                              std::to_string(seq_len + 1) +
                              " tokens; use a shorter seq_len or a larger corpus");
  }
  s.StartPass();
  return s;
}

void TokenStream::StartPass() {
  order_.resize(shards_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<uint32_t>(i);
  Shuffle(order_, MixSeed(seed_, kPurposeShardOrder, static_cast<uint64_t>(pass_)));
  order_pos_ = 0;
}

void TokenStream::NextShard() {
  if (order_pos_ == order_.size()) {
    ++pass_;
    StartPass();
  }
  const Shard& shard = *shards_[order_[order_pos_++]];
  const uint64_t window = static_cast<uint64_t>(seq_len_) + 1;
  const uint64_t stride = static_cast<uint64_t>(seq_len_);
  uint64_t state = MixSeed(seed_, kPurposeWindows, visit_++);
  // A random start offset, so that window boundaries move from pass to pass.
  const uint64_t offset = SplitMix64(state) % std::min(stride, shard.tokens - window + 1);
  const uint64_t count = (shard.tokens - offset - 1) / stride;
  windows_.resize(count);
  for (uint64_t i = 0; i < count; ++i) windows_[i] = offset + i * stride;
  Shuffle(windows_, SplitMix64(state));
  window_pos_ = 0;
}

TokenBatch TokenStream::Next() {
  TokenBatch b;
  b.batch_size = batch_size_;
  b.seq_len = seq_len_;
  const auto window = static_cast<size_t>(seq_len_) + 1;
  b.tokens.resize(static_cast<size_t>(batch_size_) * window);
  for (int64_t row = 0; row < batch_size_; ++row) {
    // The visited shard is the last one whose pointer NextShard consumed.
    while (window_pos_ == windows_.size()) NextShard();
    const Shard& shard = *shards_[order_[order_pos_ - 1]];
    const uint64_t first = windows_[window_pos_++];
    int32_t* dst = b.tokens.data() + static_cast<size_t>(row) * window;
    for (size_t k = 0; k < window; ++k) dst[k] = shard.at(first + k);
  }
  windows_drawn_ += batch_size_;
  return b;
}

void TokenStream::Skip(int64_t batches) {
  auto left =
      static_cast<uint64_t>(std::max<int64_t>(batches, 0)) * static_cast<uint64_t>(batch_size_);
  windows_drawn_ += static_cast<int64_t>(left);
  while (left > 0) {
    while (window_pos_ == windows_.size()) NextShard();
    const uint64_t take = std::min<uint64_t>(left, windows_.size() - window_pos_);
    window_pos_ += take;
    left -= take;
  }
}

TokenStream TokenStream::Reseeded(uint64_t seed, int64_t batch_size) const {
  TokenStream s;
  s.shards_ = shards_;
  s.seed_ = seed;
  s.batch_size_ = batch_size;
  s.seq_len_ = seq_len_;
  s.StartPass();
  return s;
}

Result<TokenBatch> TokenStream::ValidationBatch(const fs::path& shard_dir, int64_t batch_size,
                                                int64_t seq_len) {
  if (batch_size <= 0 || seq_len <= 0) {
    return InvalidArgument("ValidationBatch needs a positive batch_size and seq_len");
  }
  COLONY_ASSIGN_OR_RETURN(ShardManifest m, ReadShardManifest(shard_dir));
  const fs::path file = shard_dir / "valid.bin";
  COLONY_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(file));
  if (bytes.size() != m.valid_tokens * 2) {
    return DataLoss(file.string() + " does not hold the tokens its manifest announces");
  }
  const uint64_t n = bytes.size() / 2;
  const uint64_t window = static_cast<uint64_t>(seq_len) + 1;
  const uint64_t available = n >= window ? (n - 1) / static_cast<uint64_t>(seq_len) : 0;
  if (available < static_cast<uint64_t>(batch_size)) {
    return Status(StatusCode::kOutOfRange,
                  file.string() + " holds " + std::to_string(available) + " windows of " +
                      std::to_string(window) + " tokens, fewer than batch_size " +
                      std::to_string(batch_size) + "; use a smaller batch or a larger corpus");
  }
  TokenBatch b;
  b.batch_size = batch_size;
  b.seq_len = seq_len;
  b.tokens.resize(static_cast<size_t>(batch_size * static_cast<int64_t>(window)));
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  for (int64_t row = 0; row < batch_size; ++row) {
    // Spread evenly over valid.bin.
    const uint64_t w = static_cast<uint64_t>(row) * available / static_cast<uint64_t>(batch_size);
    const uint64_t first = w * static_cast<uint64_t>(seq_len);
    for (uint64_t k = 0; k < window; ++k) {
      const uint64_t i = first + k;
      b.tokens[static_cast<size_t>(static_cast<uint64_t>(row) * window + k)] =
          static_cast<int32_t>(data[2 * i] | (data[2 * i + 1] << 8));
    }
  }
  return b;
}

}  // namespace colony::model
