// What expert servers declare in the DHT, and the rule every node enforces on it (torch-free, so
// the parser of these untrusted records can be fuzzed and used by any node).
//
// A server hosting "ffn.4.17" writes, as its own owner-signed entry (subkey OwnerMarker(server)):
//   - under key "colony.moe.ffn.4.17" (the expert):      {"addrs": [...]}
//   - under key "colony.moe.ffn.4." (each proper prefix
//     with at least one coordinate):                      {"next": [17, ...], "addrs": [...]}
// "next" lists the coordinates that follow the prefix among the server's own experts. This is
// hivemind's layout (the expert under its id, and each prefix naming its active successors),
// except that each server writes one entry per key under its own name instead of one entry per
// successor coordinate: nobody can overwrite or expire another server's declaration, and a
// server that stops hosting an expert drops it at its next declaration.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/identity.h"
#include "core/status.h"
#include "dht/validation.h"
#include "moe/expert_uid.h"

namespace colony::moe {

inline constexpr std::string_view kExpertKeyPrefix = "colony.moe.";
inline constexpr size_t kMaxEntryAddresses = 8;
inline constexpr size_t kMaxEntrySuccessors = 4096;

// One server's entry under an expert's key (next empty) or a prefix's key (next non-empty,
// strictly increasing).
struct ExpertEntry {
  std::vector<int64_t> next = {};
  std::vector<std::string> addrs = {};  // the server's multiaddrs with /p2p/
};

// The DHT key of an expert id or prefix ("ffn.4.17" -> "colony.moe.ffn.4.17").
std::string ExpertKey(std::string_view uid_or_prefix);
std::string EncodeExpertEntry(const ExpertEntry& entry);
// Parses an entry read from the DHT (untrusted). `prefix`: whether its key is a prefix (then
// "next" is required) or an expert id (then it is refused).
Result<ExpertEntry> ParseExpertEntry(std::string_view value, bool prefix);
// The DHT's rule for keys under kExpertKeyPrefix: the key must be an expert id or prefix, each
// server writes only its own entry, and the entry must parse for its kind of key.
dht::KeyFamily ExpertFamily();

}  // namespace colony::moe
