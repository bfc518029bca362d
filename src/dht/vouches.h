// Which answering sources held each subkey of a dictionary that a lookup merges from several
// replicas' copies, so that trimming the union to the storage limits keeps what many vouch for.
//
// Identities and signed entries are free: a hostile replica can answer with a full dictionary
// of its own entries, each signed by an identity of its own and expiring last. Trimmed by
// expiration alone, the union kept those and dropped every honest entry; ranked by how many
// distinct sources (address groups: DhtOptions::max_answers_per_address) held an entry, the
// honest entries that several replicas hold outrank whatever one source alone claims.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>

#include "dht/record.h"

namespace colony::dht {

class SubkeyVouches {
 public:
  // Each source may bring at most `per_source` subkeys nobody had brought before (a dictionary's
  // worth: no honest source holds more), and past it counts only for subkeys already seen; so
  // a lookup remembers at most 64 * per_source subkeys, and sources that answer first cannot
  // fill the table and leave the subkeys later sources hold uncounted.
  explicit SubkeyVouches(size_t per_source);

  // The answer from `source` held every subkey of `record` (a dictionary; else nothing is noted).
  void Note(const std::string& source, const Record& record);
  // How many distinct sources held `subkey` (past the 63rd source, the rest count as one).
  size_t Count(std::string_view subkey) const;
  size_t tracked() const { return sources_of_.size(); }

 private:
  // Keyed (SipHash, a random key per instance), so that nobody can choose subkeys whose hashes
  // collide with an honest subkey's and lend it their sources.
  uint64_t Hash(std::string_view subkey) const;

  size_t per_source_;
  std::array<size_t, 64> brought_{};  // per bit: subkeys its sources brought first
  std::array<uint8_t, 16> hash_key_{};
  std::unordered_map<uint64_t, uint64_t> sources_of_;  // subkey hash -> a bit per source
  std::map<std::string, unsigned> bit_of_;             // source -> its bit
};

}  // namespace colony::dht
