#include "averaging/group_key.h"

#include <cstdint>
#include <numeric>
#include <vector>

namespace colony::averaging {
namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

Status CheckGroupBits(std::string_view bits) {
  if (bits.size() > 32) return InvalidArgument("group bits are limited to 32 characters");
  for (char c : bits) {
    if (c != '0' && c != '1') {
      return InvalidArgument("group bits must be a string of 0 and 1, got '" + std::string(bits) +
                             "'");
    }
  }
  return {};
}

std::string GroupKey(std::string_view prefix, std::string_view bits) {
  return std::string(prefix) + ".0b" + std::string(bits);
}

std::string NextGroupBits(std::string_view bits, std::string_view group_id, size_t index) {
  if (bits.empty()) return {};
  // The seed is a hash (FNV-1a) of the group id, which is random and shared by the group.
  uint64_t seed = 1469598103934665603ull;
  for (unsigned char c : group_id) seed = (seed ^ c) * 1099511628211ull;
  const size_t buckets_bits = std::min<size_t>(bits.size(), 16);  // permute the low 16 bits
  const size_t buckets = size_t{1} << buckets_bits;
  std::vector<uint32_t> perm(buckets);
  std::iota(perm.begin(), perm.end(), 0u);
  for (size_t i = buckets - 1; i > 0; --i) {
    const size_t j = SplitMix64(seed) % (i + 1);
    std::swap(perm[i], perm[j]);
  }
  const uint32_t bucket = perm[index % buckets];
  std::string next(bits);
  // Higher bits (beyond 16) are redrawn from the same stream.
  for (size_t i = 0; i < bits.size(); ++i) {
    const size_t from_end = bits.size() - 1 - i;
    const bool bit =
        from_end < buckets_bits ? ((bucket >> from_end) & 1) != 0 : (SplitMix64(seed) & 1) != 0;
    next[i] = bit ? '1' : '0';
  }
  return next;
}

}  // namespace colony::averaging
