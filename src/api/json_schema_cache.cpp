// Compiled schemas kept by their canonical text, the least recently used dropped first.
#include "api/json_schema_cache.h"

#include <utility>

namespace colony::api {

std::shared_ptr<const JsonSchema> JsonSchemaCache::Intern(
    const std::string& text, std::shared_ptr<const JsonSchema> compiled) {
  const std::scoped_lock lock(mu_);
  if (auto it = schemas_.find(text); it != schemas_.end()) {
    ++counts_.hits;
    used_.splice(used_.begin(), used_, it->second.used);
    return it->second.schema;
  }
  ++counts_.misses;
  if (!compiled || text.empty() || max_schemas_ == 0) return compiled;
  const size_t bytes = text.size() + compiled->bytes();
  if (bytes > max_bytes_) return compiled;
  while (schemas_.size() >= max_schemas_ || counts_.bytes + bytes > max_bytes_) {
    const auto oldest = schemas_.find(*used_.back());
    counts_.bytes -= oldest->second.bytes;
    used_.pop_back();
    schemas_.erase(oldest);
    ++counts_.dropped;
  }
  const auto [it, _] =
      schemas_.emplace(text, Entry{.schema = compiled, .bytes = bytes, .used = used_.end()});
  try {
    used_.push_front(&it->first);
  } catch (...) {  // (no entry without its place in used_)
    schemas_.erase(it);
    throw;
  }
  it->second.used = used_.begin();
  counts_.bytes += bytes;
  return compiled;
}

JsonSchemaCache::Counts JsonSchemaCache::counts() const {
  const std::scoped_lock lock(mu_);
  Counts c = counts_;
  c.schemas = schemas_.size();
  return c;
}

}  // namespace colony::api
