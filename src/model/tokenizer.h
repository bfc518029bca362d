// Tokenizer: a SentencePiece model (BPE trained on the local corpus, or a Llama tokenizer.model).
// Native: models are trained by running Debian's `spm_train` program and parsed and applied by
// this code (libsentencepiece bundles its own protobuf, which clashes with ours). Encodings equal
// sentencepiece's for BPE models with no precompiled normalization charsmap (identity
// normalization, as ours and Llama's use); other models are refused at load time.
//
//   auto tok = model::Tokenizer::TrainOrLoad(*corpus, model::DefaultCacheDir(), 4096);
//   std::vector<int32_t> ids = tok->Encode("Hello, kernel.");
//   std::string text = tok->Decode(ids);  // == "Hello, kernel."
//
// Models trained here use identity normalization, no dummy prefix and byte fallback, so that
// Decode(Encode(s)) == s for any valid UTF-8 string (newlines and indentation included) and the
// encodings of consecutive chunks of a text concatenate to the encoding of a valid split of it.
//
// Threading: a Tokenizer is cheap to copy (copies share one immutable parsed model); Encode and
// Decode are const and safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace colony::model {

class Tokenizer {
 public:
  // Loads a SentencePiece model file (ours, or e.g. a Llama `tokenizer.model`).
  static Result<Tokenizer> Load(const std::filesystem::path& model_file);
  // Parses a serialized SentencePiece ModelProto (the contents of a model file). The bytes are
  // untrusted: anything malformed, oversized or unsupported gives an error.
  static Result<Tokenizer> FromBytes(std::string_view serialized);

  // Returns the cached model `<cache_dir>/tokenizer-<vocab_size>-<corpus hash>.model`, training
  // it first (BPE on a sample of the corpus lines, seeded so that the result is reproducible)
  // when it is missing. Safe when several processes or threads call it at once: one trains while
  // the others wait on a lock file, then load its result.
  static Result<Tokenizer> TrainOrLoad(const std::filesystem::path& corpus,
                                       const std::filesystem::path& cache_dir,
                                       int vocab_size = 4096);

  // Ids are in [0, vocab_size()). An empty string encodes to no ids.
  std::vector<int32_t> Encode(std::string_view text) const;
  // Ids out of range are dropped rather than failing (the text is for humans).
  std::string Decode(std::span<const int32_t> ids) const;

  int vocab_size() const;
  int bos_id() const;  // -1 when the model defines none
  int eos_id() const;
  int pad_id() const;
  int unk_id() const;
  // 16 hex digits identifying the model's contents (a hash of the serialized model).
  const std::string& hash() const { return hash_; }
  // Writes the sentencepiece model (loadable with Load()), atomically.
  Status Save(const std::filesystem::path& file) const;

  struct Model;  // the parsed model (tokenizer.cpp)

 private:
  // `origin` names the model's source in error messages.
  static Result<Tokenizer> FromSerialized(std::string_view serialized, const std::string& origin);
  Tokenizer(std::shared_ptr<const Model> model, std::string hash)
      : model_(std::move(model)), hash_(std::move(hash)) {}

  std::shared_ptr<const Model> model_;
  std::string hash_;
};

}  // namespace colony::model
