#include "serve/records.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/multiaddr.h"

namespace colony::serve {
namespace {

// Block indices a server record may name when the model's depth is not known (a DHT node checking
// records for every model).
constexpr int64_t kMaxBlocksInRecord = int64_t{1} << 20;

}  // namespace

std::string_view StateName(ServerState state) {
  switch (state) {
    case ServerState::kJoining:
      return "joining";
    case ServerState::kOnline:
      return "online";
    case ServerState::kOffline:
      return "offline";
  }
  return "unknown";
}

std::string BlockKey(const std::string& model, int64_t block) {
  return fmt::format("{}.block.{}", model, block);
}

std::optional<int64_t> BlockOfKey(std::string_view key) {
  constexpr std::string_view kInfix = ".block.";
  const size_t at = key.rfind(kInfix);
  if (at == std::string_view::npos || at == 0) return std::nullopt;
  const std::string_view digits = key.substr(at + kInfix.size());
  if (digits.empty() || digits.size() > 9 || (digits.size() > 1 && digits[0] == '0')) {
    return std::nullopt;
  }
  int64_t block = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    block = block * 10 + (c - '0');
  }
  return block;
}

dht::KeyFamily ServerRecordFamily() {
  return {.name = "server records",
          .matches = [](std::string_view key) { return BlockOfKey(key).has_value(); },
          .check = [](std::string_view key, const PeerId& owner, std::string_view value) -> Status {
            const int64_t block = *BlockOfKey(key);
            COLONY_ASSIGN_OR_RETURN(ServerRecord r,
                                    ParseServerRecord(owner, value, kMaxBlocksInRecord));
            if (block < r.start || block >= r.end) {
              return ProtocolError(fmt::format("the record spans blocks [{}, {}), not block {}",
                                               r.start, r.end, block));
            }
            return Status::Ok();
          }};
}

std::string EncodeServerRecord(const ServerRecord& r) {
  nlohmann::json j = {{"state", StateName(r.state)},
                      {"start", r.start},
                      {"end", r.end},
                      {"throughput", r.throughput},
                      {"inference_rps", r.inference_rps},
                      {"cache_tokens_left", r.cache_tokens_left},
                      {"addresses", r.addresses},
                      {"version", r.version},
                      {"dtype", r.dtype}};
  if (!r.quantization.empty()) j["quantization"] = r.quantization;
  if (!r.next_pings.empty()) {
    nlohmann::json pings = nlohmann::json::object();
    for (const auto& [peer, ms] : r.next_pings) pings[peer.ToString()] = ms;
    j["next_pings"] = std::move(pings);
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<ServerRecord> ParseServerRecord(const PeerId& peer, std::string_view value,
                                       int64_t num_blocks) {
  if (value.size() > 8192) return ProtocolError("server record longer than 8 KiB");
  nlohmann::json j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return ProtocolError("server record is not a JSON object");
  ServerRecord r;
  r.peer = peer;
  try {
    const std::string state = j.at("state").get<std::string>();
    if (state == "joining") {
      r.state = ServerState::kJoining;
    } else if (state == "online") {
      r.state = ServerState::kOnline;
    } else if (state == "offline") {
      r.state = ServerState::kOffline;
    } else {
      return ProtocolError(fmt::format("unknown server state '{}'", state.substr(0, 32)));
    }
    // Integers only: a JSON number such as 1e300 would not fit int64 (undefined behaviour).
    if (!j.at("start").is_number_integer() || !j.at("end").is_number_integer() ||
        (j.contains("cache_tokens_left") && !j.at("cache_tokens_left").is_number_integer())) {
      return ProtocolError("server record: start, end and cache_tokens_left must be integers");
    }
    r.start = j.at("start").get<int64_t>();
    r.end = j.at("end").get<int64_t>();
    r.throughput = j.value("throughput", 0.0);
    r.inference_rps = j.value("inference_rps", 0.0);
    r.cache_tokens_left = j.value("cache_tokens_left", int64_t{0});
    r.version = j.value("version", std::string());
    r.dtype = j.value("dtype", std::string());
    r.quantization = j.value("quantization", std::string());
    if (j.contains("addresses")) {
      const auto& a = j.at("addresses");
      if (!a.is_array() || a.size() > 16) {
        return ProtocolError("server record: addresses must be an array of at most 16");
      }
      for (const auto& s : a) {
        // Only the owner's own addresses: one that names another peer would send the owner's
        // clients there.
        const std::string text = s.get<std::string>();
        auto addr =
            text.size() <= 512 ? Multiaddr::Parse(text) : Result<Multiaddr>(ProtocolError(""));
        if (!addr.ok() || (addr->peer_id() && *addr->peer_id() != peer)) {
          return ProtocolError(
              "server record: addresses must be multiaddrs of the record's own peer");
        }
        r.addresses.push_back(text);
      }
    }
    if (j.contains("next_pings")) {
      const auto& pings = j.at("next_pings");
      if (!pings.is_object() || pings.size() > kMaxNextPings) {
        return ProtocolError(fmt::format(
            "server record: next_pings must be an object of at most {}", kMaxNextPings));
      }
      for (const auto& [id, ms] : pings.items()) {
        auto next = PeerId::Parse(id);
        const double rtt = ms.get<double>();
        if (!next.ok() || !std::isfinite(rtt) || rtt < 0) {
          return ProtocolError("server record: next_pings maps peer ids to round-trip times");
        }
        r.next_pings.emplace_back(*next, rtt);
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return ProtocolError(std::string("malformed server record: ") + e.what());
  }
  if (r.start < 0 || r.end <= r.start || r.end > num_blocks) {
    return ProtocolError(fmt::format("server record spans blocks [{}, {}), outside [0, {})",
                                     r.start, r.end, num_blocks));
  }
  if (!std::isfinite(r.throughput) || r.throughput < 0 || !std::isfinite(r.inference_rps) ||
      r.inference_rps < 0) {
    return ProtocolError("server record has a negative or non-finite throughput");
  }
  if (r.version.size() > 64 || r.dtype.size() > 16 || r.quantization.size() > 16) {
    return ProtocolError("server record has an overlong version, dtype or quantization");
  }
  // What readers print to terminals (colony servers) must not carry escape sequences.
  const auto printable = [](const std::string& s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return c >= ' ' && c <= '~'; });
  };
  if (!printable(r.version) || !printable(r.dtype) || !printable(r.quantization)) {
    return ProtocolError(
        "server record: version, dtype and quantization must be printable ASCII (no control "
        "characters)");
  }
  return r;
}

namespace {

bool IsModelName(std::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return c > ' ' && c < 127; });
}

}  // namespace

std::string EncodeModelAnnouncement(const ModelAnnouncement& a) {
  return nlohmann::json{{"model", a.model}, {"num_blocks", a.num_blocks}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<ModelAnnouncement> ParseModelAnnouncement(std::string_view value) {
  if (value.size() > 512) return ProtocolError("model announcement longer than 512 bytes");
  nlohmann::json j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return ProtocolError("model announcement is not a JSON object");
  for (const auto& [field, v] : j.items()) {
    if (field != "model" && field != "num_blocks") {
      return ProtocolError(
          fmt::format("model announcement: unknown field '{}'", field.substr(0, 32)));
    }
  }
  if (!j.contains("model") || !j["model"].is_string() || !j.contains("num_blocks") ||
      !j["num_blocks"].is_number_integer()) {
    return ProtocolError("model announcement needs a string model and an integer num_blocks");
  }
  ModelAnnouncement a{.model = j["model"].get<std::string>(),
                      .num_blocks = j["num_blocks"].get<int64_t>()};
  if (!IsModelName(a.model)) {
    return ProtocolError("model announcement: the name must be 1-128 printable ASCII characters");
  }
  if (a.num_blocks <= 0 || a.num_blocks > kMaxModelBlocks) {
    return ProtocolError(fmt::format("model announcement: num_blocks {} outside [1, {}]",
                                     a.num_blocks, kMaxModelBlocks));
  }
  return a;
}

dht::KeyFamily ModelsFamily() {
  return {.name = "model announcements",
          .matches = [](std::string_view key) { return key == kModelsKey; },
          .check = [](std::string_view, const PeerId&, std::string_view value) -> Status {
            return ParseModelAnnouncement(value).status();
          }};
}

}  // namespace colony::serve
