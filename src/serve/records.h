// What a block server announces in the DHT, one record per served block (torch-free, so the
// parser of these untrusted records can be fuzzed and used by any tool).
//
// Key "<model>.block.<i>", subkey OwnerMarker(server peer id) (so only the server can write it),
// value: the JSON below. Records expire after a short TTL and are refreshed while the server is
// up; a server that shuts down cleanly replaces them with state "offline".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/identity.h"
#include "core/status.h"
#include "dht/validation.h"

namespace colony::serve {

enum class ServerState { kJoining, kOnline, kOffline };
std::string_view StateName(ServerState state);

struct ServerRecord {
  PeerId peer;  // from the record's subkey, not from the value
  ServerState state = ServerState::kJoining;
  int64_t start = 0;  // served blocks [start, end)
  int64_t end = 0;
  // Forward tokens/s through one block (span throughput x span length) and inference steps/s
  // through one block: routing divides by these to estimate compute time.
  double throughput = 0;
  double inference_rps = 0;
  int64_t cache_tokens_left = 0;
  std::vector<std::string> addresses;  // multiaddrs with /p2p/
  std::string version;
  std::string dtype;
};

std::string BlockKey(const std::string& model, int64_t block);
// The block index of a key "<model>.block.<i>", or nullopt for any other key.
std::optional<int64_t> BlockOfKey(std::string_view key);
// The DHT's rule for these keys: each server writes only its own entry (owner-signed subkey),
// and the entry must parse as a server record whose span holds the key's block.
dht::KeyFamily ServerRecordFamily();
std::string EncodeServerRecord(const ServerRecord& record);
// Parses a value read from the DHT (untrusted): ProtocolError on anything malformed, spans
// outside [0, num_blocks), or more than a few addresses.
Result<ServerRecord> ParseServerRecord(const PeerId& peer, std::string_view value,
                                       int64_t num_blocks);

}  // namespace colony::serve
