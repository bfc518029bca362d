// The address options every command of the CLI shares (see commands.h): multiaddrs, --announce,
// and the HTTP servers' --http, --tls-cert, --tls-key and --max-connections-per-address.
#include "core/multiaddr.h"
#include "http/server.h"
#include "tools/commands.h"

namespace colony::cli {

CLI::Validator MultiaddrCheck() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        auto address = Multiaddr::Parse(text);
        return address.ok() ? std::string() : address.status().message();
      },
      "MULTIADDR", "multiaddr");
}

void AddAnnounceOption(CLI::App* cmd, std::vector<std::string>& announce) {
  cmd->add_option("--announce", announce,
                  "where others should dial this peer, instead of its listen addresses "
                  "(repeatable): behind a router that forwards a port to it, or a cloud machine "
                  "whose public address none of its interfaces has; skips the dial-back check")
      ->check(MultiaddrCheck());
}

Result<std::vector<Multiaddr>> ParseAnnounce(const std::vector<std::string>& announce) {
  std::vector<Multiaddr> out;
  for (const std::string& text : announce) {
    auto address = Multiaddr::Parse(text);
    if (!address.ok()) return address.status().WithContext("--announce");
    out.push_back(std::move(*address));
  }
  return out;
}

Result<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size()) {
    return InvalidArgument("--http: '" + text + "' is not host:port");
  }
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  try {
    size_t used = 0;
    port = std::stoi(text.substr(colon + 1), &used);
    if (used != text.size() - colon - 1) port = -1;
  } catch (const std::exception&) {
    port = -1;
  }
  if (port < 0 || port > 65535) return InvalidArgument("--http: bad port in '" + text + "'");
  return std::pair{host, static_cast<uint16_t>(port)};
}

void AddHttpServeOptions(CLI::App* cmd, HttpServeArgs& args) {
  auto* cert = cmd->add_option("--tls-cert", args.certificate,
                               "serve HTTPS with this PEM certificate chain (the server's "
                               "certificate first); a renewed file is served to new connections "
                               "within a second");
  auto* key = cmd->add_option("--tls-key", args.key, "the PEM private key of --tls-cert");
  cert->needs(key);
  key->needs(cert);
  cmd->add_option(
         "--max-connections-per-address", args.max_connections_per_address,
         "HTTP connections one IP address (an IPv6 /64) may hold open at once (more are refused; "
         "loopback, e.g. a proxy in front, is not limited; 0: no limit)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65536));
}

void HttpServeArgs::ApplyTo(http::ServerOptions& options) const {
  options.tls_certificate = certificate;
  options.tls_private_key = key;
  options.max_connections_per_address = max_connections_per_address;
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host.starts_with("127.");
}

}  // namespace colony::cli
