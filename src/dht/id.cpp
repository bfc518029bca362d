#include "dht/id.h"

#include <sodium.h>

#include <bit>

namespace colony::dht {
namespace {

DhtId Hash(std::string_view domain, ByteSpan data) {
  std::array<uint8_t, kIdBytes> out;
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, out.size());
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(domain.data()), domain.size());
  crypto_generichash_update(&st, data.data(), data.size());
  crypto_generichash_final(&st, out.data(), out.size());
  return DhtId(out);
}

}  // namespace

DhtId DhtId::ForKey(std::string_view key) { return Hash("colony-dht-key\0", AsBytes(key)); }

DhtId DhtId::ForPeer(const PeerId& peer) {
  Bytes b = peer.ToBytes();
  return Hash("colony-dht-node\0", b);
}

Result<DhtId> DhtId::FromBytes(ByteSpan bytes) {
  if (bytes.size() != kIdBytes) {
    return InvalidArgument("DHT id must be " + std::to_string(kIdBytes) + " bytes, got " +
                           std::to_string(bytes.size()));
  }
  std::array<uint8_t, kIdBytes> a;
  std::memcpy(a.data(), bytes.data(), kIdBytes);
  return DhtId(a);
}

DhtId DhtId::Random(std::mt19937_64& rng) {
  std::array<uint8_t, kIdBytes> a;
  for (auto& b : a) b = static_cast<uint8_t>(rng());
  return DhtId(a);
}

DhtId DhtId::RandomInBucket(const DhtId& base, size_t prefix_bits, std::mt19937_64& rng) {
  DhtId r = Random(rng);
  if (prefix_bits >= kIdBits) return base;
  std::array<uint8_t, kIdBytes> a = r.bytes_;
  for (size_t bit = 0; bit <= prefix_bits; ++bit) {
    const size_t byte = bit / 8;
    const uint8_t mask = static_cast<uint8_t>(0x80u >> (bit % 8));
    bool want = (base.bytes_[byte] & mask) != 0;
    if (bit == prefix_bits) want = !want;  // first differing bit
    a[byte] = static_cast<uint8_t>(want ? (a[byte] | mask) : (a[byte] & ~mask));
  }
  return DhtId(a);
}

std::string DhtId::ToHex() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * kIdBytes);
  for (uint8_t b : bytes_) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

DhtId DhtId::operator^(const DhtId& other) const {
  std::array<uint8_t, kIdBytes> a;
  for (size_t i = 0; i < kIdBytes; ++i) a[i] = bytes_[i] ^ other.bytes_[i];
  return DhtId(a);
}

size_t DhtId::CommonPrefixBits(const DhtId& other) const {
  for (size_t i = 0; i < kIdBytes; ++i) {
    const uint8_t x = bytes_[i] ^ other.bytes_[i];
    if (x != 0) return i * 8 + static_cast<size_t>(std::countl_zero(x));
  }
  return kIdBits;
}

}  // namespace colony::dht
