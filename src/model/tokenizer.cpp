#include "model/tokenizer.h"

#include <fcntl.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <system_error>
#include <unordered_map>

#include "core/log.h"

namespace colony::model {

namespace data_internal {

uint64_t Fnv1a64(std::string_view bytes, uint64_t state) {
  for (unsigned char c : bytes) {
    state ^= c;
    state *= 0x100000001b3ULL;
  }
  return state;
}

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Result<std::string> HashFile(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return NotFound("cannot open " + file.string() + ": " + std::strerror(errno));
  uint64_t h = Fnv1a64({});
  std::string buf(1 << 20, '\0');
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h = Fnv1a64(std::string_view(buf.data(), static_cast<size_t>(in.gcount())), h);
  }
  if (in.bad()) return DataLoss("error reading " + file.string());
  return Hex64(h);
}

Result<FileLock> FileLock::Acquire(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return PermissionDenied("cannot create lock file " + path.string() + ": " +
                            std::strerror(errno));
  }
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    int err = errno;
    ::close(fd);
    return Internal("flock " + path.string() + ": " + std::strerror(err));
  }
  return FileLock(fd);
}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

std::filesystem::path UniqueTempPath(const std::filesystem::path& final_path) {
  static std::atomic<uint64_t> counter{0};
  std::filesystem::path p = final_path;
  p += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
  return p;
}

void RemoveStaleTemps(const std::filesystem::path& final_path) {
  const std::string prefix = final_path.filename().string() + ".tmp-";
  std::error_code ec;
  const std::filesystem::path dir =
      final_path.has_parent_path() ? final_path.parent_path() : std::filesystem::path(".");
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (it->path().filename().string().starts_with(prefix)) {
      std::error_code ignored;
      std::filesystem::remove_all(it->path(), ignored);
    }
  }
}

Status WriteFileAtomically(const std::filesystem::path& path, std::string_view data) {
  std::filesystem::path tmp = UniqueTempPath(path);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      return PermissionDenied("cannot create " + tmp.string() + ": " + std::strerror(errno));
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.close();
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      return ResourceExhausted("cannot write " + tmp.string() + " (disk full?)");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return Internal("cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message());
  }
  return Status::Ok();
}

}  // namespace data_internal

namespace {

using data_internal::FileLock;
using data_internal::Fnv1a64;
using data_internal::Hex64;

// Seed of SentencePiece's sampling of training sentences: fixed, so that every peer that trains
// on the same corpus gets the same model (they must agree on token ids).
constexpr unsigned kTrainSeed = 20240601;
// Lines sampled from the corpus for training. The kernel docs have ~700k non-empty lines; a
// third of them gives nearly the same merges and keeps BPE training to seconds on one core.
constexpr int kTrainSentences = 250'000;

}  // namespace

Result<Tokenizer> Tokenizer::Load(const std::filesystem::path& model_file) {
  std::ifstream in(model_file, std::ios::binary);
  if (!in) {
    return NotFound("cannot open tokenizer model " + model_file.string() + ": " +
                    std::strerror(errno));
  }
  std::string serialized{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) return DataLoss("error reading tokenizer model " + model_file.string());
  return FromSerialized(serialized, model_file.string());
}

Result<Tokenizer> Tokenizer::FromSerialized(const std::string& serialized,
                                            const std::string& origin) {
  auto processor = std::make_shared<sentencepiece::SentencePieceProcessor>();
  auto st = processor->LoadFromSerializedProto(serialized);
  if (!st.ok()) {
    return InvalidArgument("not a SentencePiece model: " + origin + ": " + st.ToString());
  }
  if (processor->GetPieceSize() <= 0) {
    return InvalidArgument("SentencePiece model " + origin + " has no pieces");
  }
  return Tokenizer(std::move(processor), Hex64(Fnv1a64(serialized)));
}

Result<Tokenizer> Tokenizer::TrainOrLoad(const std::filesystem::path& corpus,
                                         const std::filesystem::path& cache_dir, int vocab_size) {
  // 256 byte-fallback pieces, 4 special ids, the newline symbol and some merges.
  if (vocab_size < 300 || vocab_size > 65536) {
    return InvalidArgument("tokenizer vocab_size must be in [300, 65536], got " +
                           std::to_string(vocab_size));
  }
  COLONY_ASSIGN_OR_RETURN(std::string corpus_hash, data_internal::HashFile(corpus));
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
  data_internal::RemoveStaleTemps(model_file);

  const std::unordered_map<std::string, std::string> args = {
      {"input", corpus.string()},
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"input_sentence_size", std::to_string(kTrainSentences)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", "2"},
      {"character_coverage", "0.9999"},
      {"byte_fallback", "true"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "3"},
      // Lossless: no NFKC, whitespace kept as is, no space invented at the start of a text.
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      // Training sentences are lines, so "\n" would otherwise only exist as a fallback byte.
      {"user_defined_symbols", "\n"},
      // Indentation (code blocks, tables) is common in the docs.
      {"allow_whitespace_only_pieces", "true"},
      {"split_digits", "true"},
      {"max_sentence_length", "8192"},
      {"minloglevel", "2"},  // SentencePiece logs every merge at INFO
  };
  sentencepiece::SetRandomGeneratorSeed(kTrainSeed);
  std::string serialized;
  const auto start = std::chrono::steady_clock::now();
  auto st = sentencepiece::SentencePieceTrainer::Train(args, nullptr, &serialized);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!st.ok()) {
    return Internal("training the tokenizer on " + corpus.string() + " failed: " + st.ToString());
  }
  COLONY_LOG_INFO("trained a {}-piece BPE tokenizer on {} in {:.1f} s -> {}", vocab_size,
                  corpus.string(), seconds, model_file.string());
  COLONY_RETURN_IF_ERROR(data_internal::WriteFileAtomically(model_file, serialized));
  return FromSerialized(serialized, model_file.string());
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text) const {
  std::vector<int> ids;
  auto st = processor_->Encode(text, &ids);
  if (!st.ok()) {
    // Only happens for an unloaded model, which Load() rules out.
    COLONY_LOG_ERROR("tokenizer encode failed: {}", st.ToString());
    return {};
  }
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string Tokenizer::Decode(std::span<const int32_t> ids) const {
  const int n = processor_->GetPieceSize();
  std::vector<int> valid;
  valid.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < n) valid.push_back(id);
  }
  std::string text;
  auto st = processor_->Decode(valid, &text);
  if (!st.ok()) COLONY_LOG_ERROR("tokenizer decode failed: {}", st.ToString());
  return text;
}

int Tokenizer::vocab_size() const { return processor_->GetPieceSize(); }
int Tokenizer::bos_id() const { return processor_->bos_id(); }
int Tokenizer::eos_id() const { return processor_->eos_id(); }
int Tokenizer::pad_id() const { return processor_->pad_id(); }
int Tokenizer::unk_id() const { return processor_->unk_id(); }

Status Tokenizer::Save(const std::filesystem::path& file) const {
  return data_internal::WriteFileAtomically(file, processor_->serialized_model_proto());
}

}  // namespace colony::model
