#include "net/relay_wire.h"

#include <charconv>
#include <vector>

namespace colony::net {
namespace {

constexpr std::string_view kMagic = "COLONY-RELAY/1";

// The words between single spaces. A leading, trailing or doubled space makes an empty word,
// which no request accepts: every accepted line has one canonical form (what Format prints).
std::vector<std::string_view> Words(std::string_view line) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (out.size() < 8) {
    const size_t next = line.find(' ', pos);
    out.push_back(line.substr(pos, next == std::string_view::npos ? next : next - pos));
    if (next == std::string_view::npos) break;
    pos = next + 1;
  }
  return out;
}

bool IsLowerHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// Printable ASCII only, for messages that end up in logs and errors.
std::string Printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 200)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out;
}

}  // namespace

Result<RelayRequest> ParseRelayRequest(std::string_view line) {
  if (line.size() >= kMaxRelayLine) return ProtocolError("relay request line too long");
  const auto words = Words(line);
  if (words.empty() || words[0] != kMagic) {
    return ProtocolError("not a relay request (expected " + std::string(kMagic) +
                         "); is this a Colony relay's circuit port?");
  }
  RelayRequest r;
  if (words.size() == 3 && words[1] == "CONNECT") {
    auto id = PeerId::Parse(words[2]);
    if (!id.ok()) return ProtocolError("relay CONNECT: " + id.status().message());
    r.kind = RelayRequest::Kind::kConnect;
    r.target = *id;
    return r;
  }
  if (words.size() == 4 && words[1] == "ACCEPT") {
    const std::string_view n = words[2];
    auto [ptr, ec] = std::from_chars(n.data(), n.data() + n.size(), r.circuit);
    if (n.empty() || ec != std::errc() || ptr != n.data() + n.size() ||
        (n.size() > 1 && n[0] == '0')) {
      return ProtocolError("relay ACCEPT: bad circuit id");
    }
    if (words[3].size() != kRelayTokenHexLength || !IsLowerHex(words[3])) {
      return ProtocolError("relay ACCEPT: bad token");
    }
    r.kind = RelayRequest::Kind::kAccept;
    r.token = std::string(words[3]);
    return r;
  }
  return ProtocolError("unknown relay request '" + Printable(line) + "'");
}

std::string FormatRelayRequest(const RelayRequest& request) {
  std::string s(kMagic);
  if (request.kind == RelayRequest::Kind::kConnect) {
    s += " CONNECT " + request.target.ToString();
  } else {
    s += " ACCEPT " + std::to_string(request.circuit) + " " + request.token;
  }
  return s + "\n";
}

Status ParseRelayReply(std::string_view line) {
  if (line == "OK") return {};
  if (line.rfind("ERR ", 0) == 0) return Unavailable("relay: " + Printable(line.substr(4)));
  return ProtocolError("the relay answered '" + Printable(line) + "', not OK or ERR");
}

std::string FormatRelayReply(const Status& status) {
  if (status.ok()) return "OK\n";
  std::string msg = Printable(status.message());
  if (msg.size() > kMaxRelayLine - 8) msg.resize(kMaxRelayLine - 8);
  return "ERR " + msg + "\n";
}

Result<std::vector<uint16_t>> ParseDialbackPorts(std::string_view text) {
  std::vector<uint16_t> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t next = text.find(' ', pos);
    if (next == std::string_view::npos) next = text.size();
    const std::string_view word = text.substr(pos, next - pos);
    unsigned port = 0;
    auto [ptr, ec] = std::from_chars(word.data(), word.data() + word.size(), port);
    if (word.empty() || ec != std::errc() || ptr != word.data() + word.size() || port == 0 ||
        port > 65535 || word[0] == '0') {
      return ProtocolError("dial-back request: bad port list");
    }
    if (out.size() == kMaxDialbackPorts) {
      return ProtocolError("dial-back request: more than " + std::to_string(kMaxDialbackPorts) +
                           " ports");
    }
    out.push_back(static_cast<uint16_t>(port));
    pos = next + 1;
  }
  return out;
}

std::string FormatDialbackPorts(const std::vector<uint16_t>& ports) {
  std::string s;
  for (size_t i = 0; i < ports.size() && i < kMaxDialbackPorts; ++i) {
    if (i > 0) s += ' ';
    s += std::to_string(ports[i]);
  }
  return s;
}

Result<PunchMessage> ParsePunchMessage(std::string_view text) {
  if (text == "sync") return PunchMessage{.kind = PunchMessage::Kind::kSync};
  constexpr std::string_view kConnect = "connect";
  if (text.substr(0, kConnect.size()) != kConnect ||
      (text.size() > kConnect.size() && text[kConnect.size()] != ' ')) {
    return ProtocolError("hole punching: expected 'connect' or 'sync'");
  }
  PunchMessage out;
  size_t pos = kConnect.size() + 1;
  while (pos <= text.size() && text.size() > kConnect.size()) {
    size_t next = text.find(' ', pos);
    if (next == std::string_view::npos) next = text.size();
    if (out.addresses.size() == kMaxPunchAddresses) {
      return ProtocolError("hole punching: more than " + std::to_string(kMaxPunchAddresses) +
                           " addresses");
    }
    auto addr = Multiaddr::Parse(text.substr(pos, next - pos));
    if (!addr.ok()) return ProtocolError("hole punching: " + addr.status().message());
    if (!addr->is_ip() || addr->port() == 0 || addr->peer_id() || addr->is_relayed()) {
      return ProtocolError("hole punching: " + addr->ToString() +
                           " is not a plain IP address with a port");
    }
    out.addresses.push_back(std::move(*addr));
    pos = next + 1;
  }
  return out;
}

std::string FormatPunchMessage(const PunchMessage& message) {
  if (message.kind == PunchMessage::Kind::kSync) return "sync";
  std::string s = "connect";
  for (size_t i = 0; i < message.addresses.size() && i < kMaxPunchAddresses; ++i) {
    s += ' ';
    s += message.addresses[i].ToString();
  }
  return s;
}

}  // namespace colony::net
