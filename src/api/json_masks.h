// JSON mode's masks (api/json_mode.h) kept for every request of one token table: which tokens can
// continue an answer depends only on the answer's state (JsonSchemaPrefix::key) and schema (its
// compilation's JsonSchema::id: the service compiles a schema text once, api/json_schema_cache.h),
// whether the token is the answer's first (read as written alone) and the logits' vocabulary, so
// requests that meet a state another request met (every request meets the start) take its mask
// instead of reading the vocabulary again. The
// least recently used masks are dropped to stay within a budget of bytes. Thread-safe; a mask
// handed out stays valid while its holder keeps it, dropped or not.
//
//   auto masks = std::make_shared<JsonMasks>(texts, 32 << 20);   // one per model
//   JsonObjectLogits json(backend, {.texts = texts, .end_tokens = {eos}, .masks = masks});
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace colony::api {

struct TokenTextTable;

class JsonMasks {
 public:
  using Bits = std::vector<uint64_t>;  // a bit per token: whether its text fits
  struct Key {
    std::string state;    // JsonSchemaPrefix::key()
    uint64_t schema = 0;  // JsonSchema::id() of the state's schema; 0: none (any object)
    int64_t vocab = 0;    // of the logits
    bool first = false;   // the answer's first token (its text as written alone)
    bool operator==(const Key&) const = default;
  };
  struct Counts {
    int64_t hits = 0;     // Find()s that found a mask
    int64_t misses = 0;   // Find()s that did not
    int64_t dropped = 0;  // masks dropped to stay within the budget
    size_t masks = 0;     // kept now
    size_t bytes = 0;     // that they take (their bits)
  };

  // The masks of `texts`' tokens, within `budget_bytes` of bits.
  JsonMasks(std::shared_ptr<const TokenTextTable> texts, size_t budget_bytes);

  const std::shared_ptr<const TokenTextTable>& texts() const { return texts_; }
  size_t budget_bytes() const { return budget_; }

  // The mask kept for `key` (now the most recently used), or null.
  std::shared_ptr<const Bits> Find(const Key& key);
  // Keeps `mask` for `key`, dropping the least recently used masks until it fits, and returns the
  // mask kept for `key` (another caller's, when it kept one first). A mask larger than the whole
  // budget is returned without being kept.
  std::shared_ptr<const Bits> Keep(const Key& key, Bits mask);
  Counts counts() const;

 private:
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Entry {
    std::shared_ptr<const Bits> bits;
    std::list<Key>::iterator used;  // its place in used_
  };
  static size_t Bytes(const Bits& b) { return b.size() * sizeof(uint64_t); }

  const std::shared_ptr<const TokenTextTable> texts_;
  const size_t budget_;
  mutable std::mutex mu_;
  std::unordered_map<Key, Entry, KeyHash> masks_;
  std::list<Key> used_;  // the most recently used first
  Counts counts_;
};

}  // namespace colony::api
