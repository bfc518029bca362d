// SourceAddressKey: the address parsed with inet_pton, an IPv6 one cut to its /64 and written
// back with inet_ntop.
#include "core/address_key.h"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cstdint>

namespace colony {

std::string SourceAddressKey(std::string_view ip) {
  const size_t percent = ip.find('%');
  const std::string address(ip.substr(0, percent));
  std::array<uint8_t, 16> bytes{};
  char text[INET6_ADDRSTRLEN] = {};
  if (inet_pton(AF_INET, address.c_str(), bytes.data()) == 1) {
    if (percent != std::string_view::npos) return {};
    return inet_ntop(AF_INET, bytes.data(), text, sizeof text) ? std::string(text) : std::string();
  }
  if (inet_pton(AF_INET6, address.c_str(), bytes.data()) != 1) return {};
  const bool v4_mapped =
      std::all_of(bytes.begin(), bytes.begin() + 10, [](uint8_t b) { return b == 0; }) &&
      bytes[10] == 0xff && bytes[11] == 0xff;
  if (v4_mapped) {
    if (percent != std::string_view::npos) return {};
    return inet_ntop(AF_INET, bytes.data() + 12, text, sizeof text) ? std::string(text)
                                                                    : std::string();
  }
  const bool loopback =
      std::all_of(bytes.begin(), bytes.begin() + 15, [](uint8_t b) { return b == 0; }) &&
      bytes[15] == 1;
  const bool link_local = bytes[0] == 0xfe && (bytes[1] & 0xc0) == 0x80;
  if (!loopback && !link_local) std::fill(bytes.begin() + 8, bytes.end(), uint8_t{0});
  if (!inet_ntop(AF_INET6, bytes.data(), text, sizeof text)) return {};
  if (loopback || link_local) {
    return std::string(text) +
           (percent == std::string_view::npos ? "" : std::string(ip.substr(percent)));
  }
  return std::string(text) + "/64";
}

}  // namespace colony
