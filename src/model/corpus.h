// Language-modeling data: a plain-text corpus built from the kernel documentation that Debian
// installs, its tokenization into uint16 shards, and streams of training batches.
//
//   auto corpus = model::PrepareCorpus({});                        // <cache>/corpus-<hash>.txt
//   auto tok = model::Tokenizer::TrainOrLoad(*corpus, model::DefaultCacheDir(), 4096);
//   auto shards = model::PrepareTokenShards(*corpus, *tok, model::DefaultCacheDir() / "shards");
//   auto stream = model::TokenStream::Open(*shards, /*seed=*/peer_index, 8, 256);
//   model::TokenBatch b = stream->Next();  // b.tokens: [8, 257]
//
// Every step is cached on disk under a name derived from its inputs, and is safe when several
// peer processes (or threads) run it at once: one does the work under a lock file while the
// others wait, and results appear atomically (written elsewhere, then renamed into place).
// Peers that start from the same inputs get byte-identical files, hence the same token ids.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/tokenizer.h"

namespace colony::model {

// $COLONY_CACHE_DIR, else $XDG_CACHE_HOME/colony, else ~/.cache/colony (else /tmp/colony-cache
// when HOME is unset).
std::filesystem::path DefaultCacheDir();

struct CorpusOptions {
  // Installed by the Debian package linux-doc-6.1 (scripts/setup); every *.rst.gz and *.txt.gz
  // below it is used.
  std::filesystem::path source_dir = "/usr/share/doc/linux-doc-6.1/Documentation";
  std::filesystem::path cache_dir = {};  // empty: DefaultCacheDir()
  uint64_t max_bytes = 0;                // stop after this much text (cut at a line); 0: all
};

// Concatenates the source files (but translations/) in an order shuffled by a hash of their paths,
// the same on every machine, into `<cache>/corpus-<hash>.txt`, dropping
// reStructuredText markup that is noise for a language model (underlines, table borders, SPDX
// lines, ".. directive::" lines and their options) and collapsing runs of blank lines; files are
// separated by a blank line. The hash covers the options and the source files' names and sizes,
// so a changed package gives a new corpus. Returns the cached file when present.
Result<std::filesystem::path> PrepareCorpus(const CorpusOptions& options);

// What PrepareTokenShards wrote (its manifest.json).
struct ShardManifest {
  std::string tokenizer_hash;  // Tokenizer::hash()
  std::string corpus_hash;     // of the corpus file's contents
  int vocab_size = 0;
  uint64_t tokens_per_shard = 0;
  std::vector<std::string> shard_files;  // "shard-00000.bin", ...
  std::vector<uint64_t> shard_tokens;    // tokens in each shard
  uint64_t train_tokens = 0;             // sum of shard_tokens
  uint64_t valid_tokens = 0;             // in valid.bin
};
Result<ShardManifest> ReadShardManifest(const std::filesystem::path& shard_dir);

// Tokenizes `corpus` into `out_dir`: shard-00000.bin, ... (the first ~98% of the tokens,
// `tokens_per_shard` each, the last one shorter), valid.bin (the last ~2%, held out) and
// manifest.json. Files hold token ids as little-endian uint16, so the vocabulary must have at
// most 65536 pieces. Returns `out_dir` at once when it already holds the shards of this corpus
// and tokenizer; a directory made for another corpus or tokenizer is replaced. The corpus is
// encoded in ~2 KB chunks cut after newlines, on all cores: exact for tokenizers trained by
// TrainOrLoad, while one that adds a dummy prefix (Llama's) sees a space before every chunk. The
// token ids (2 bytes each, ~22 MB for the full kernel docs at vocab 4096) stay in memory while
// sharding.
Result<std::filesystem::path> PrepareTokenShards(const std::filesystem::path& corpus,
                                                 const Tokenizer& tokenizer,
                                                 const std::filesystem::path& out_dir,
                                                 uint64_t tokens_per_shard = 1 << 20);

// A batch of token windows for next-token prediction.
struct TokenBatch {
  // [batch_size, seq_len + 1] row-major: inputs are [:, :-1], targets [:, 1:].
  std::vector<int32_t> tokens;
  int64_t batch_size = 0;
  int64_t seq_len = 0;
};

// An endless stream of training batches over the shards of PrepareTokenShards, without loading
// the corpus: the shards are memory-mapped and visited one at a time, in an order shuffled by
// the seed for each pass; each visited shard is cut into windows of seq_len + 1 tokens
// (consecutive windows overlap by one token, from a seeded random start offset) that are
// served in a shuffled order. Different seeds give different streams (each peer reads its own);
// the same seed replays the same stream. Copyable (copies share the mappings, then advance
// independently); not thread-safe.
class TokenStream {
 public:
  using Batch = TokenBatch;

  static Result<TokenStream> Open(const std::filesystem::path& shard_dir, uint64_t seed,
                                  int64_t batch_size, int64_t seq_len);

  // The next batch; wraps around to a new pass (reshuffled) after the last shard.
  Batch Next();
  // Completed passes over all shards (0 during the first).
  int64_t pass() const { return pass_; }
  // Batches drawn so far (Next() calls and skipped ones).
  int64_t batches() const { return windows_drawn_ / batch_size_; }
  // Skips `batches` batches, as many Next() calls would, without reading their tokens.
  void Skip(int64_t batches);
  // The stream of the same shards with another seed and batch size (positive), from its
  // start, without mapping the shards again: another peer's stream, for audits.
  TokenStream Reseeded(uint64_t seed, int64_t batch_size) const;

  // A deterministic batch from valid.bin: batch_size windows spread evenly over it. Fails when
  // valid.bin holds fewer than batch_size windows of seq_len + 1 tokens.
  static Result<Batch> ValidationBatch(const std::filesystem::path& shard_dir, int64_t batch_size,
                                       int64_t seq_len);

  struct Shard;  // a mapped shard file

 private:
  TokenStream() = default;
  void StartPass();
  void NextShard();

  std::vector<std::shared_ptr<const Shard>> shards_;  // those with at least one window
  uint64_t seed_ = 0;
  int64_t batch_size_ = 0;
  int64_t seq_len_ = 0;
  int64_t pass_ = 0;
  std::vector<uint32_t> order_;  // shard visiting order of this pass
  size_t order_pos_ = 0;
  std::vector<uint64_t> windows_;  // start offsets in the current shard, in serving order
  size_t window_pos_ = 0;
  uint64_t visit_ = 0;  // shards visited so far: seeds each visit's window shuffle
  int64_t windows_drawn_ = 0;
};

}  // namespace colony::model
