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
  // Printable ASCII only (a reader prints them to terminals and pages): at most 64, 16 and 16
  // characters. quantization: "none", "int8" or "nf4" (ServerOptions::quantize); "" from servers
  // older than the field.
  std::string version;
  std::string dtype;
  std::string quantization = {};
  // The server's own round-trip times (ms) to servers of the block after its span (at most
  // kMaxNextPings, by peer id): what a client's route through this server to the next costs.
  std::vector<std::pair<PeerId, double>> next_pings = {};
};
inline constexpr size_t kMaxNextPings = 8;

std::string BlockKey(const std::string& model, int64_t block);
// The block index of a key "<model>.block.<i>", or nullopt for any other key.
std::optional<int64_t> BlockOfKey(std::string_view key);
// The DHT's rule for these keys: each server writes only its own entry (owner-signed subkey),
// and the entry must parse as a server record whose span holds the key's block.
dht::KeyFamily ServerRecordFamily();
std::string EncodeServerRecord(const ServerRecord& record);
// Parses a value read from the DHT (untrusted): ProtocolError on anything malformed, spans
// outside [0, num_blocks), or more than a few addresses or pings.
Result<ServerRecord> ParseServerRecord(const PeerId& peer, std::string_view value,
                                       int64_t num_blocks);

// The swarm's list of served models, so that a monitor can find them without knowing their names:
// key kModelsKey, subkey OwnerMarker(server), value {"model": NAME, "num_blocks": N}. Each server
// writes only its own entry, with the same lifetime as its block records.
inline constexpr std::string_view kModelsKey = "colony.models";
inline constexpr int64_t kMaxModelBlocks = 4096;
struct ModelAnnouncement {
  std::string model = {};  // the name in block keys: 1-128 printable ASCII characters
  int64_t num_blocks = 0;
};
std::string EncodeModelAnnouncement(const ModelAnnouncement& a);
Result<ModelAnnouncement> ParseModelAnnouncement(std::string_view value);
dht::KeyFamily ModelsFamily();

}  // namespace colony::serve
