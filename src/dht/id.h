// DHT identifiers: 160-bit points of Kademlia's XOR metric space.
//
// A record's id is BLAKE2b-160 of its key; a node's id is BLAKE2b-160 of its PeerId's binary form,
// so nobody picks where their node sits (they would have to grind key pairs, as in hivemind).
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <string_view>

#include "core/bytes.h"
#include "core/identity.h"
#include "core/status.h"

namespace colony::dht {

inline constexpr size_t kIdBytes = 20;
inline constexpr size_t kIdBits = kIdBytes * 8;

class DhtId {
 public:
  DhtId() = default;  // all zeros
  explicit DhtId(const std::array<uint8_t, kIdBytes>& bytes) : bytes_(bytes) {}

  static DhtId ForKey(std::string_view key);
  static DhtId ForPeer(const PeerId& peer);
  // Exactly kIdBytes bytes, else InvalidArgument.
  static Result<DhtId> FromBytes(ByteSpan bytes);
  // Uniformly random id, or random within the bucket that shares exactly `prefix_bits` leading
  // bits with `base` (the next bit differs).
  static DhtId Random(std::mt19937_64& rng);
  static DhtId RandomInBucket(const DhtId& base, size_t prefix_bits, std::mt19937_64& rng);

  const std::array<uint8_t, kIdBytes>& bytes() const { return bytes_; }
  ByteSpan span() const { return {bytes_.data(), bytes_.size()}; }
  std::string ToHex() const;

  DhtId operator^(const DhtId& other) const;
  // Number of leading bits shared with `other` (kIdBits when equal).
  size_t CommonPrefixBits(const DhtId& other) const;

  friend bool operator==(const DhtId&, const DhtId&) = default;
  friend auto operator<=>(const DhtId&, const DhtId&) = default;

 private:
  std::array<uint8_t, kIdBytes> bytes_{};
};

// True when `a` is strictly closer to `target` than `b` in the XOR metric.
inline bool Closer(const DhtId& target, const DhtId& a, const DhtId& b) {
  return (a ^ target) < (b ^ target);
}

}  // namespace colony::dht

template <>
struct std::hash<colony::dht::DhtId> {
  size_t operator()(const colony::dht::DhtId& id) const noexcept {
    size_t h;
    std::memcpy(&h, id.bytes().data(), sizeof(h));  // ids are hashes: uniformly distributed
    return h;
  }
};
