// Encoding and decoding of the DHT's RPC messages. Decoders treat their input as hostile: every
// count, size, id and address is checked, and a malformed message is an error naming the
// problem, never a crash. Each decoder has a fuzz target (fuzz/dht_*_fuzz.cpp).
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"
#include "dht/messages.h"

namespace colony::dht {

// Bounds beyond those in messages.h (the serving node applies its own, usually smaller, limits).
inline constexpr size_t kMaxWireKeyBytes = 64u << 10;
inline constexpr size_t kMaxWireValueBytes = 16u << 20;
inline constexpr size_t kMaxWireSubkeys = 65536;

std::string EncodePingRequest(const PingRequest& m);
std::string EncodePingResponse(const PingResponse& m);
std::string EncodeStoreRequest(const StoreRequest& m);
std::string EncodeStoreResponse(const StoreResponse& m);
std::string EncodeFindRequest(const FindRequest& m);
std::string EncodeFindResponse(const FindResponse& m);

Result<PingRequest> DecodePingRequest(std::string_view bytes);
// The responder's PeerId is not in the message; the caller fills it from the connection.
Result<PingResponse> DecodePingResponse(std::string_view bytes);
Result<StoreRequest> DecodeStoreRequest(std::string_view bytes);
// `expected_results`: the number of items sent.
Result<StoreResponse> DecodeStoreResponse(std::string_view bytes, size_t expected_results);
Result<FindRequest> DecodeFindRequest(std::string_view bytes);
Result<FindResponse> DecodeFindResponse(std::string_view bytes, size_t expected_results);

}  // namespace colony::dht
