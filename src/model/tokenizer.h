// Tokenizer: text <-> token ids, from either of the two files checkpoints carry.
//  - A SentencePiece model (BPE trained on the local corpus, or a Llama/Mistral tokenizer.model).
//    Native: models are trained by running Debian's `spm_train` program and parsed and applied by
//    this code (libsentencepiece bundles its own protobuf, which clashes with ours). Encodings
//    equal sentencepiece's for BPE models with no precompiled normalization charsmap (identity
//    normalization, as ours and Llama's use); other models are refused at load time.
//  - A Hugging Face tokenizer.json with a BPE model (Llama 3, Qwen2, GPT-2 style byte-level BPE;
//    hf_tokenizer.h says which components), whose encodings equal the tokenizers library's.
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

struct SpecialTokens {
  int bos = -1;  // -1 where the tokenizer defines none
  int eos = -1;
  int pad = -1;
  int unk = -1;
};

// What each tokenizer format implements (tokenizer.cpp: SentencePiece; hf_tokenizer.cpp:
// tokenizer.json). Implementations are immutable and thread-safe.
class TokenizerModel {
 public:
  virtual ~TokenizerModel() = default;
  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;
  virtual std::string Decode(std::span<const int32_t> ids) const = 0;
  virtual int vocab_size() const = 0;
  virtual SpecialTokens special() const = 0;
  // The bytes of the file it was loaded from, and that file's name in a model directory.
  virtual const std::string& serialized() const = 0;
  virtual std::string_view file_name() const = 0;
};

class Tokenizer {
 public:
  explicit Tokenizer(std::shared_ptr<const TokenizerModel> model);

  // Loads a tokenizer file: `*.json` is a Hugging Face tokenizer.json (with the
  // tokenizer_config.json beside it, when there is one); anything else is a SentencePiece model
  // file (ours, or e.g. a Llama `tokenizer.model`).
  static Result<Tokenizer> Load(const std::filesystem::path& file);
  // The tokenizer file of a model directory: tokenizer.model where there is one (the format of
  // Colony's own checkpoints, Llama 2 and Mistral), otherwise tokenizer.json (Llama 3, Qwen2).
  // NotFound when there is neither.
  static Result<std::filesystem::path> FindInModelDir(const std::filesystem::path& dir);
  // Parses a tokenizer.json (and optionally the text of its tokenizer_config.json). The bytes
  // are untrusted: anything malformed, oversized or unsupported gives an error naming it.
  static Result<Tokenizer> FromHfJson(std::string_view tokenizer_json,
                                      std::string_view tokenizer_config_json = {});
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

  // Ids are in [0, vocab_size()). An empty string encodes to no ids. No special tokens are
  // added (callers prepend bos_id() where a model expects it); special tokens written in the
  // text of a tokenizer.json tokenizer are recognised, as transformers does.
  std::vector<int32_t> Encode(std::string_view text) const { return model_->Encode(text); }
  // Ids out of range and special tokens are dropped rather than failing (the text is for humans).
  std::string Decode(std::span<const int32_t> ids) const { return model_->Decode(ids); }

  int vocab_size() const { return model_->vocab_size(); }
  int bos_id() const { return special_.bos; }  // -1 when the model defines none
  int eos_id() const { return special_.eos; }
  int pad_id() const { return special_.pad; }
  int unk_id() const { return special_.unk; }
  // 16 hex digits identifying the model's contents (a hash of the serialized model).
  const std::string& hash() const { return hash_; }
  // "tokenizer.model" or "tokenizer.json": the name Load() and FindInModelDir() expect.
  std::string_view file_name() const { return model_->file_name(); }
  // Writes the tokenizer file it was loaded from (loadable with Load()), atomically.
  Status Save(const std::filesystem::path& file) const;

 private:
  // `origin` names the model's source in error messages.
  static Result<Tokenizer> FromSerialized(std::string_view serialized, const std::string& origin);

  std::shared_ptr<const TokenizerModel> model_;
  SpecialTokens special_;
  std::string hash_;
};

}  // namespace colony::model
