// JSON mode's masks, kept for every request of one token table within a budget (least recently
// used dropped first).
#include "api/json_masks.h"

#include <utility>

namespace colony::api {

size_t JsonMasks::KeyHash::operator()(const Key& k) const {
  size_t h = std::hash<std::string>{}(k.state);
  for (const uint64_t v : {static_cast<uint64_t>(k.vocab) * 2 + (k.first ? 1 : 0), k.schema}) {
    h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  }
  return h;
}

JsonMasks::JsonMasks(std::shared_ptr<const TokenTextTable> texts, size_t budget_bytes)
    : texts_(std::move(texts)), budget_(budget_bytes) {}

std::shared_ptr<const JsonMasks::Bits> JsonMasks::Find(const Key& key) {
  const std::scoped_lock lock(mu_);
  auto it = masks_.find(key);
  if (it == masks_.end()) {
    ++counts_.misses;
    return nullptr;
  }
  ++counts_.hits;
  used_.splice(used_.begin(), used_, it->second.used);
  return it->second.bits;
}

std::shared_ptr<const JsonMasks::Bits> JsonMasks::Keep(const Key& key, Bits mask) {
  auto bits = std::make_shared<const Bits>(std::move(mask));
  const size_t bytes = Bytes(*bits);
  const std::scoped_lock lock(mu_);
  if (auto it = masks_.find(key); it != masks_.end()) {  // kept meanwhile by another request
    used_.splice(used_.begin(), used_, it->second.used);
    return it->second.bits;
  }
  if (bytes > budget_) return bits;
  while (counts_.bytes + bytes > budget_) {
    auto oldest = masks_.find(used_.back());
    counts_.bytes -= Bytes(*oldest->second.bits);
    masks_.erase(oldest);
    used_.pop_back();
    ++counts_.dropped;
  }
  used_.push_front(key);
  masks_.emplace(key, Entry{.bits = bits, .used = used_.begin()});
  counts_.bytes += bytes;
  return bits;
}

JsonMasks::Counts JsonMasks::counts() const {
  const std::scoped_lock lock(mu_);
  Counts c = counts_;
  c.masks = masks_.size();
  return c;
}

}  // namespace colony::api
