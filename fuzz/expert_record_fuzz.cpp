// Fuzz target for what expert servers write in the DHT and clients read back: expert ids,
// prefixes and grid patterns (written by anyone as DHT keys or flags) and the entries under them.
// Parsers never crash, explain every refusal, and what they accept is canonical and bounded: an id
// prints back to the same text, an entry's successors are increasing coordinates of the grid and
// it survives a re-encode unchanged.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "moe/expert_records.h"
#include "moe/expert_uid.h"

using namespace colony;
using namespace colony::moe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto uid = ParseExpertUid(text);
  if (uid.ok()) {
    if (uid->ToString() != text || uid->coords.empty() || uid->coords.size() > kMaxGridDims) {
      __builtin_trap();
    }
    for (int64_t c : uid->coords) {
      if (c < 0 || c >= kMaxGridSize) __builtin_trap();
    }
  } else if (uid.status().message().empty()) {
    __builtin_trap();
  }
  auto prefix = ParseExpertPrefix(text);
  if (prefix.ok() && prefix->Prefix(prefix->coords.size()) != text) __builtin_trap();
  auto pattern = ParseExpertPattern(text);
  if (pattern.ok()) {
    if (pattern->ranges.empty() || pattern->Size() == 0) __builtin_trap();
    for (const auto& [b, e] : pattern->ranges) {
      if (b < 0 || e <= b || e > kMaxGridSize) __builtin_trap();
    }
  }
  for (bool is_prefix : {false, true}) {
    auto entry = ParseExpertEntry(text, is_prefix);
    if (!entry.ok()) {
      if (entry.status().message().empty()) __builtin_trap();
      continue;
    }
    if (entry->addrs.empty() || entry->addrs.size() > kMaxEntryAddresses) __builtin_trap();
    if (is_prefix != !entry->next.empty() || entry->next.size() > kMaxEntrySuccessors) {
      __builtin_trap();
    }
    for (size_t i = 0; i < entry->next.size(); ++i) {
      if (entry->next[i] < 0 || entry->next[i] >= kMaxGridSize ||
          (i > 0 && entry->next[i] <= entry->next[i - 1])) {
        __builtin_trap();
      }
    }
    auto again = ParseExpertEntry(EncodeExpertEntry(*entry), is_prefix);
    if (!again.ok() || again->next != entry->next || again->addrs != entry->addrs) {
      __builtin_trap();
    }
  }
  // The DHT rule on a key made of the input: a verdict, never a crash.
  static const PeerId owner = KeyPair::Generate().peer_id();
  const auto family = ExpertFamily();
  const std::string key = ExpertKey(text);
  if (family.matches(key)) {
    (void)family.check(key, owner, R"({"addrs": ["/ip4/127.0.0.1/tcp/1"]})");
  }
  return 0;
}
