// The schemas of response_format json_schema compiled for every request: one compilation of each
// schema text, so that requests with the same schema (an application sends its pydantic model's
// every time) share its states' masks (api/json_masks.h keeps them by JsonSchema::id), which
// reading the vocabulary for each state of each request would cost again. The least recently
// used are dropped past a count or bytes (of their texts and compiled nodes). Thread-safe.
// Torch-free.
//
//   JsonSchemaCache schemas;
//   request.json_schema = schemas.Intern(request.json_schema_text, request.json_schema);
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "api/json_schema.h"

namespace colony::api {

class JsonSchemaCache {
 public:
  static constexpr size_t kDefaultSchemas = 256;
  static constexpr size_t kDefaultBytes = size_t{16} << 20;  // of their texts and nodes

  struct Counts {
    int64_t hits = 0;     // Intern()s that found the text kept
    int64_t misses = 0;   // that did not
    int64_t dropped = 0;  // schemas dropped to stay within the bounds
    size_t schemas = 0;   // kept now
    size_t bytes = 0;     // of their texts and nodes (JsonSchema::bytes)
  };

  explicit JsonSchemaCache(size_t max_schemas = kDefaultSchemas, size_t max_bytes = kDefaultBytes)
      : max_schemas_(max_schemas), max_bytes_(max_bytes) {}

  // The schema kept for `text` (a schema's canonical JSON: nlohmann::json's dump, keys sorted),
  // now the most recently used; else `compiled` (compiled from that text), kept for it. Null
  // `compiled`, an empty text, or one larger (with its nodes) than the bytes allowed, is handed
  // back unkept.
  std::shared_ptr<const JsonSchema> Intern(const std::string& text,
                                           std::shared_ptr<const JsonSchema> compiled);
  Counts counts() const;

 private:
  struct Entry {
    std::shared_ptr<const JsonSchema> schema;
    size_t bytes;                                  // its text's and nodes'
    std::list<const std::string*>::iterator used;  // its place in used_
  };

  const size_t max_schemas_, max_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> schemas_;
  std::list<const std::string*> used_;  // the texts (schemas_' keys), most recently used first
  Counts counts_;
};

}  // namespace colony::api
