// The DHT's RPC messages as plain structs. The protocol core produces and consumes these; the
// runner encodes them with dht/wire.h, the simulation passes them as they are.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/identity.h"
#include "core/status.h"
#include "dht/id.h"
#include "dht/record.h"
#include "dht/routing.h"

namespace colony::dht {

// Bounds every decoder enforces (and senders respect).
inline constexpr size_t kMaxStoreItems = 16;
inline constexpr size_t kMaxFindIds = 8;
inline constexpr size_t kMaxContactsPerResult = 64;
inline constexpr size_t kMaxAddrsPerContact = 8;
inline constexpr size_t kMaxAddrBytes = 256;

// About the sender of a request. Its PeerId comes from the authenticated connection, never
// from the message.
struct NodeHeader {
  bool client_mode = false;        // never put client-mode peers in routing tables
  std::vector<std::string> addrs;  // where the sender accepts connections
};

struct PingRequest {
  NodeHeader sender;
  double wall_time = 0;  // the sender's clock, to refuse peers whose clocks are off
};
struct PingResponse {
  PeerId peer;  // filled in by the transport from the authenticated connection
  double wall_time = 0;
  bool client_mode = false;
};

struct StoreRequestItem {
  StoreItem item;         // value as stored (signatures included)
  bool in_cache = false;  // a cached copy, not a replica
};
struct StoreRequest {
  NodeHeader sender;
  std::vector<StoreRequestItem> items;
};
struct StoreResponse {
  std::vector<Status> results;  // one per item, in order
};

struct FindRequest {
  NodeHeader sender;
  std::vector<DhtId> ids;
};
struct FindResult {
  std::optional<Record> record;  // unexpired record held for this id (replica and cache merged)
  // The responder's nearest contacts to the id. Their ids are derived from their PeerIds by
  // the decoder (dht/wire.h), never taken from the wire.
  std::vector<Contact> nearest;
};
struct FindResponse {
  std::vector<FindResult> results;  // one per id, in order
  // Not on the wire: the address group of the connection the answer came on, when the
  // environment knows it (see Environment::AddressGroupOf).
  std::optional<std::string> source_group = std::nullopt;
};

}  // namespace colony::dht
