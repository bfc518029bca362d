#include "core/multiaddr.h"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <vector>

namespace colony {
namespace {

constexpr size_t kMaxAddrLen = 1024;

std::vector<std::string_view> SplitPath(std::string_view text) {
  std::vector<std::string_view> parts;
  size_t pos = 1;  // skip the leading '/'
  while (pos <= text.size()) {
    size_t next = text.find('/', pos);
    if (next == std::string_view::npos) next = text.size();
    parts.push_back(text.substr(pos, next - pos));
    pos = next + 1;
  }
  return parts;
}

bool ValidDnsName(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  size_t label = 0;
  for (char c : name) {
    if (c == '.') {
      if (label == 0) return false;
      label = 0;
      continue;
    }
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_';
    if (!ok || ++label > 63) return false;
  }
  return true;
}

const char* KindName(Multiaddr::HostKind kind) {
  switch (kind) {
    case Multiaddr::HostKind::kIp4:
      return "ip4";
    case Multiaddr::HostKind::kIp6:
      return "ip6";
    case Multiaddr::HostKind::kDns:
      return "dns";
    case Multiaddr::HostKind::kDns4:
      return "dns4";
    case Multiaddr::HostKind::kDns6:
      return "dns6";
  }
  return "ip4";
}

}  // namespace

Result<Multiaddr> Multiaddr::FromIp(std::string_view ip, uint16_t port,
                                    std::optional<PeerId> peer) {
  std::string host(ip);
  // inet_pton reads up to the first NUL: without this check "1.2.3.4\0junk" would be accepted.
  if (host.find('\0') != std::string::npos) {
    return InvalidArgument("IP address contains a NUL character");
  }
  in_addr a4;
  in6_addr a6;
  if (inet_pton(AF_INET, host.c_str(), &a4) == 1) {
    return Multiaddr(HostKind::kIp4, host, port, peer);
  }
  if (inet_pton(AF_INET6, host.c_str(), &a6) == 1) {
    // Canonical form, and IPv4-mapped addresses printed as /ip4/.
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &a6.s6_addr[12], buf, sizeof(buf));
      return Multiaddr(HostKind::kIp4, buf, port, peer);
    }
    char buf[INET6_ADDRSTRLEN];
    inet_ntop(AF_INET6, &a6, buf, sizeof(buf));
    return Multiaddr(HostKind::kIp6, buf, port, peer);
  }
  return InvalidArgument("'" + host + "' is not an IPv4 or IPv6 address");
}

Result<Multiaddr> Multiaddr::Parse(std::string_view text) {
  auto bad = [&](const std::string& why) {
    std::string shown(text.substr(0, std::min<size_t>(text.size(), 200)));
    return InvalidArgument("invalid address '" + shown + "': " + why +
                           " (expected e.g. /ip4/1.2.3.4/tcp/31337/p2p/12D3KooW…)");
  };
  if (text.empty()) return bad("address is empty");
  if (text.size() > kMaxAddrLen) {
    return bad("longer than " + std::to_string(kMaxAddrLen) + " characters");
  }
  if (text.front() != '/') return bad("must start with '/'");
  auto parts = SplitPath(text);
  if (!parts.empty() && parts.back().empty()) parts.pop_back();  // tolerate a trailing '/'
  if (parts.size() < 4) return bad("needs a host part and a /tcp/<port> part");

  Multiaddr addr;
  std::string_view proto = parts[0];
  std::string host(parts[1]);
  if (host.empty()) return bad("empty host after /" + std::string(proto) + "/");
  // inet_pton reads up to the first NUL: without this check "1.2.3.4\0junk" would be accepted
  // and the junk kept in host().
  if (host.find('\0') != std::string::npos) return bad("host contains a NUL character");
  if (proto == "ip4") {
    in_addr a;
    if (inet_pton(AF_INET, host.c_str(), &a) != 1) {
      return bad("'" + host + "' is not an IPv4 address");
    }
    addr.kind_ = HostKind::kIp4;
  } else if (proto == "ip6") {
    in6_addr a;
    if (inet_pton(AF_INET6, host.c_str(), &a) != 1) {
      return bad("'" + host + "' is not an IPv6 address");
    }
    char buf[INET6_ADDRSTRLEN];
    inet_ntop(AF_INET6, &a, buf, sizeof(buf));
    host = buf;
    addr.kind_ = HostKind::kIp6;
  } else if (proto == "dns" || proto == "dns4" || proto == "dns6") {
    if (!ValidDnsName(host)) return bad("'" + host + "' is not a valid DNS name");
    addr.kind_ = proto == "dns"    ? HostKind::kDns
                 : proto == "dns4" ? HostKind::kDns4
                                   : HostKind::kDns6;
  } else {
    return bad("unsupported protocol '/" + std::string(proto) +
               "' (use /ip4, /ip6, /dns, /dns4 or /dns6)");
  }
  addr.host_ = host;

  if (parts[2] != "tcp") {
    if (parts[2] == "udp" || parts[2] == "quic" || parts[2] == "quic-v1") {
      return bad("transport /" + std::string(parts[2]) + " is not supported; Colony uses /tcp");
    }
    return bad("expected /tcp/<port> after the host, got '/" + std::string(parts[2]) + "'");
  }
  std::string_view port_text = parts[3];
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || ptr != port_text.data() + port_text.size() || port_text.empty() ||
      port > 65535 || (port_text.size() > 1 && port_text[0] == '0')) {
    return bad("port '" + std::string(port_text) + "' is not a number from 0 to 65535");
  }
  addr.port_ = static_cast<uint16_t>(port);

  size_t i = 4;
  auto peer_part = [&](std::optional<PeerId>& out) -> Status {
    if (parts[i] != "p2p" && parts[i] != "ipfs") {
      return bad("unexpected component '/" + std::string(parts[i]) +
                 "' after the port (only /p2p/<peer id> or /p2p-circuit may follow)");
    }
    if (i + 1 >= parts.size() || parts[i + 1].empty()) {
      return bad("/p2p/ must be followed by a peer id");
    }
    auto id = PeerId::Parse(parts[i + 1]);
    if (!id.ok()) return bad(id.status().message());
    out = *id;
    i += 2;
    return {};
  };
  if (i < parts.size() && parts[i] != "p2p-circuit") {
    COLONY_RETURN_IF_ERROR(peer_part(addr.peer_));
  }
  if (i < parts.size() && parts[i] == "p2p-circuit") {
    ++i;
    if (i >= parts.size()) return bad("/p2p-circuit must be followed by /p2p/<peer id>");
    addr.relayed_ = true;
    addr.relay_ = addr.peer_;
    addr.peer_.reset();
    COLONY_RETURN_IF_ERROR(peer_part(addr.peer_));
  }
  if (i < parts.size()) {
    return bad("unexpected trailing component '/" + std::string(parts[i]) + "'");
  }
  return addr;
}

std::string Multiaddr::ToString() const {
  std::string s = "/";
  s += KindName(kind_);
  s += "/";
  s += host_;
  s += "/tcp/";
  s += std::to_string(port_);
  if (relayed_) {
    if (relay_) {
      s += "/p2p/";
      s += relay_->ToString();
    }
    s += "/p2p-circuit";
  }
  if (peer_) {
    s += "/p2p/";
    s += peer_->ToString();
  }
  return s;
}

std::vector<Multiaddr> ParseMultiaddrs(const std::vector<std::string>& texts) {
  std::vector<Multiaddr> out;
  for (const std::string& t : texts) {
    auto m = Multiaddr::Parse(t);
    if (m.ok()) out.push_back(std::move(*m));
  }
  return out;
}

}  // namespace colony
