// The circuit relay's preamble: one plaintext line each way on a fresh TCP connection to a
// relay's circuit port, before the secure handshake runs end to end through the relay.
//
//   dialer -> relay:          COLONY-RELAY/1 CONNECT <peer id>\n
//   peer behind NAT -> relay: COLONY-RELAY/1 ACCEPT <circuit id> <token>\n
//   relay -> each:            OK\n   or   ERR <message>\n
//
// The relay learns only who is asked for; everything after the preamble is the two peers'
// encrypted, authenticated connection, which the relay can neither read nor forge. I/O-free, so
// the fuzz target covers exactly what parses bytes from the network.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/identity.h"
#include "core/multiaddr.h"
#include "core/status.h"

namespace colony::net {

// Longest line either side accepts, newline included.
inline constexpr size_t kMaxRelayLine = 256;
// The reserved peer's secret for accepting one circuit (hex, 32 characters).
inline constexpr size_t kRelayTokenHexLength = 32;

struct RelayRequest {
  enum class Kind { kConnect, kAccept };
  Kind kind = Kind::kConnect;
  PeerId target;         // kConnect: the peer to reach
  uint64_t circuit = 0;  // kAccept
  std::string token;     // kAccept: lowercase hex
};

// `line` without its newline.
Result<RelayRequest> ParseRelayRequest(std::string_view line);
// With the newline.
std::string FormatRelayRequest(const RelayRequest& request);
// OK, or the relay's error (Unavailable with its message).
Status ParseRelayReply(std::string_view line);
std::string FormatRelayReply(const Status& status);

// The "net.dialback" request (Host::CheckReachability): the ports to dial back, as decimal
// numbers separated by single spaces, 1 to kMaxDialbackPorts of them, none zero.
inline constexpr size_t kMaxDialbackPorts = 4;
Result<std::vector<uint16_t>> ParseDialbackPorts(std::string_view text);
std::string FormatDialbackPorts(const std::vector<uint16_t>& ports);

// Hole punching ("net.punch", Host): two messages over a relayed connection, as message text.
//   connect <addr> [<addr>...]   the sender's public addresses for the punch (plain /ip4/ or
//                                /ip6/ addresses with a port, 0 to kMaxPunchAddresses of them;
//                                none: the sender cannot punch)
//   sync                         the initiator starts its connect now; so does the receiver
inline constexpr char kPunchMethod[] = "net.punch";
inline constexpr size_t kMaxPunchAddresses = 4;
struct PunchMessage {
  enum class Kind { kConnect, kSync };
  Kind kind = Kind::kConnect;
  std::vector<Multiaddr> addresses = {};  // kConnect
};
Result<PunchMessage> ParsePunchMessage(std::string_view text);
std::string FormatPunchMessage(const PunchMessage& message);

}  // namespace colony::net
