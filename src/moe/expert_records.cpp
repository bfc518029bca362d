#include "moe/expert_records.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/multiaddr.h"

namespace colony::moe {

std::string ExpertKey(std::string_view uid_or_prefix) {
  return std::string(kExpertKeyPrefix) + std::string(uid_or_prefix);
}

std::string EncodeExpertEntry(const ExpertEntry& entry) {
  nlohmann::json j = {{"addrs", entry.addrs}};
  if (!entry.next.empty()) j["next"] = entry.next;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<ExpertEntry> ParseExpertEntry(std::string_view value, bool prefix) {
  // 4096 seven-digit successors and 8 addresses fit in 48 KiB.
  if (value.size() > 48 * 1024) return ProtocolError("expert entry longer than 48 KiB");
  nlohmann::json j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return ProtocolError("expert entry is not a JSON object");
  ExpertEntry e;
  for (const auto& [field, v] : j.items()) {
    if (field == "addrs") {
      if (!v.is_array() || v.empty() || v.size() > kMaxEntryAddresses) {
        return ProtocolError(fmt::format(
            "expert entry: addrs must be an array of 1 to {} multiaddrs", kMaxEntryAddresses));
      }
      for (const auto& a : v) {
        if (!a.is_string() || a.get_ref<const std::string&>().size() > 256 ||
            !Multiaddr::Parse(a.get<std::string>()).ok()) {
          return ProtocolError("expert entry: addrs holds something that is not a multiaddr");
        }
        e.addrs.push_back(a.get<std::string>());
      }
    } else if (field == "next") {
      if (!prefix) return ProtocolError("expert entry: an expert's own key has no 'next'");
      if (!v.is_array() || v.empty() || v.size() > kMaxEntrySuccessors) {
        return ProtocolError(fmt::format(
            "expert entry: next must be an array of 1 to {} coordinates", kMaxEntrySuccessors));
      }
      for (const auto& c : v) {
        if (!c.is_number_integer() || c.get<int64_t>() < 0 || c.get<int64_t>() >= kMaxGridSize ||
            (!e.next.empty() && c.get<int64_t>() <= e.next.back())) {
          return ProtocolError(fmt::format(
              "expert entry: next must hold increasing coordinates in [0, {})", kMaxGridSize));
        }
        e.next.push_back(c.get<int64_t>());
      }
    } else {
      return ProtocolError(fmt::format("expert entry: unknown field '{}'", field.substr(0, 32)));
    }
  }
  if (e.addrs.empty()) return ProtocolError("expert entry: addrs is missing");
  if (prefix && e.next.empty()) return ProtocolError("expert entry: a prefix's entry needs next");
  return e;
}

dht::KeyFamily ExpertFamily() {
  return {.name = "expert declarations",
          .matches =
              [](std::string_view key) {
                return key.substr(0, kExpertKeyPrefix.size()) == kExpertKeyPrefix;
              },
          .check = [](std::string_view key, const PeerId&, std::string_view value) -> Status {
            const std::string_view id = key.substr(kExpertKeyPrefix.size());
            const bool prefix = !id.empty() && id.back() == kUidDelimiter;
            const Status named =
                prefix ? ParseExpertPrefix(id).status() : ParseExpertUid(id).status();
            if (!named.ok()) return ProtocolError(named.message());
            return ParseExpertEntry(value, prefix).status();
          }};
}

}  // namespace colony::moe
