#include "dht/vouches.h"

#include <sodium.h>

#include <bit>
#include <stdexcept>

namespace colony::dht {

namespace {
constexpr unsigned kMaxBit = 63;
}  // namespace

SubkeyVouches::SubkeyVouches(size_t per_source) : per_source_(per_source) {
  static_assert(std::tuple_size_v<decltype(hash_key_)> == crypto_shorthash_KEYBYTES);
  if (sodium_init() < 0) throw std::runtime_error("libsodium failed to initialise");
  randombytes_buf(hash_key_.data(), hash_key_.size());
}

uint64_t SubkeyVouches::Hash(std::string_view subkey) const {
  std::array<uint8_t, crypto_shorthash_BYTES> out{};
  crypto_shorthash(out.data(), reinterpret_cast<const unsigned char*>(subkey.data()), subkey.size(),
                   hash_key_.data());
  uint64_t h = 0;
  for (uint8_t b : out) h = (h << 8) | b;
  return h;
}

void SubkeyVouches::Note(const std::string& source, const Record& record) {
  if (!record.is_dict) return;
  unsigned index = kMaxBit;  // shared by every source past the 63rd, which are not remembered
  if (const auto at = bit_of_.find(source); at != bit_of_.end()) {
    index = at->second;
  } else if (bit_of_.size() < kMaxBit) {
    index = static_cast<unsigned>(bit_of_.size());
    bit_of_.emplace(source, index);
  }
  const uint64_t bit = uint64_t{1} << index;
  for (const auto& [subkey, _] : record.subkeys) {
    const uint64_t h = Hash(subkey);
    if (auto it = sources_of_.find(h); it != sources_of_.end()) {
      it->second |= bit;
    } else if (brought_[index] < per_source_) {
      sources_of_.emplace(h, bit);
      ++brought_[index];
    }
  }
}

size_t SubkeyVouches::Count(std::string_view subkey) const {
  const auto it = sources_of_.find(Hash(subkey));
  return it == sources_of_.end() ? 0 : static_cast<size_t>(std::popcount(it->second));
}

}  // namespace colony::dht
