// Fuzz target for the circuit relay's preamble lines (net/relay_wire.h), which a relay reads from
// anyone who connects to its circuit port and a dialer reads back from the relay. Checks that
// parsing never crashes, that every error says what is wrong, that accepted requests print back
// to the same line, and that tokens are exactly lowercase hex of the fixed length; and the
// dial-back request's port list (Host::CheckReachability), read by every host; and the hole
// punching messages, read by every host from peers on relayed connections.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "net/relay_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using colony::net::RelayRequest;
  std::string_view line(reinterpret_cast<const char*>(data), size);
  auto request = colony::net::ParseRelayRequest(line);
  if (!request.ok()) {
    if (request.status().message().empty()) __builtin_trap();
  } else {
    std::string printed = colony::net::FormatRelayRequest(*request);
    if (printed.empty() || printed.back() != '\n') __builtin_trap();
    printed.pop_back();
    if (printed != line) __builtin_trap();  // one canonical form
    if (request->kind == RelayRequest::Kind::kAccept &&
        request->token.size() != colony::net::kRelayTokenHexLength) {
      __builtin_trap();
    }
  }
  const colony::Status reply = colony::net::ParseRelayReply(line);
  if (!reply.ok() && reply.message().empty()) __builtin_trap();
  if (reply.ok() && line != "OK") __builtin_trap();
  // What a relay sends back stays one line of printable text, whatever the error said.
  const std::string echoed = colony::net::FormatRelayReply(colony::Unavailable(std::string(line)));
  if (echoed.size() > colony::net::kMaxRelayLine || echoed.back() != '\n') __builtin_trap();
  for (size_t i = 0; i + 1 < echoed.size(); ++i) {
    if (echoed[i] < 0x20 || echoed[i] == 0x7f) __builtin_trap();
  }
  // The dial-back request's port list: accepted lists print back identically.
  auto ports = colony::net::ParseDialbackPorts(line);
  if (ports.ok()) {
    if (ports->empty() || ports->size() > colony::net::kMaxDialbackPorts) __builtin_trap();
    if (colony::net::FormatDialbackPorts(*ports) != line) __builtin_trap();
  } else if (ports.status().message().empty()) {
    __builtin_trap();
  }
  // Hole punching: accepted messages print to a form that parses back to the same message.
  auto punch = colony::net::ParsePunchMessage(line);
  if (punch.ok()) {
    if (punch->addresses.size() > colony::net::kMaxPunchAddresses) __builtin_trap();
    const std::string printed = colony::net::FormatPunchMessage(*punch);
    auto again = colony::net::ParsePunchMessage(printed);
    if (!again.ok() || again->kind != punch->kind || again->addresses != punch->addresses) {
      __builtin_trap();
    }
    for (const auto& a : punch->addresses) {
      if (!a.is_ip() || a.port() == 0 || a.peer_id()) __builtin_trap();
    }
  } else if (punch.status().message().empty()) {
    __builtin_trap();
  }
  return 0;
}
