// The private-swarm options of the commands and the access set-up they make.
#include "tools/access_options.h"

#include <cmath>

#include "core/clock.h"
#include "tools/record_rules.h"

namespace colony::cli {

void AddAccessOptions(CLI::App* cmd, AccessArgs& a) {
  cmd->add_option("--identity", a.identity,
                  "this peer's identity file (`colony identity new`; default: a new random "
                  "identity on every start): keeps the peer id across restarts, and is what an "
                  "--access-token file or an --allowlist names");
  const std::string group = "Private swarm";
  cmd->add_option("--authority", a.authority,
                  "a private swarm: admit only peers with access tokens from this authority (its "
                  "id, as `colony authority init` printed it); needs --access-token or "
                  "--access-token-command")
      ->group(group);
  cmd->add_option("--access-token", a.token_file,
                  "file holding this peer's access token (re-read whenever it changes)")
      ->group(group);
  cmd->add_option("--access-token-command", a.token_command,
                  "command that prints this peer's access token (run through /bin/sh with "
                  "COLONY_PEER_ID set; run again when a third of the token's lifetime is left)")
      ->group(group);
  cmd->add_option("--allowlist", a.allowlist,
                  "a private swarm: admit the peers listed in this file (one peer id per line) "
                  "without a token")
      ->group(group);
  cmd->add_option("--clock-skew", a.clock_skew,
                  "seconds by which tokens' times may disagree with this machine's clock")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--revocation-interval", a.revocation_interval,
                  "seconds between reads of the authority's revocations from the DHT")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str()
      ->group(group);
}

Result<KeyPair> LoadOrGenerateIdentity(const std::string& path) {
  if (path.empty()) return KeyPair::Generate();
  return KeyPair::Load(path);
}

Result<SwarmAccess> MakeSwarmAccess(const AccessArgs& a, const PeerId& self) {
  SwarmAccess access;
  access.revocation_interval = a.revocation_interval;
  const bool has_token = !a.token_file.empty() || !a.token_command.empty();
  if (!a.token_file.empty() && !a.token_command.empty()) {
    return InvalidArgument("give --access-token or --access-token-command, not both");
  }
  if (has_token && a.authority.empty()) {
    return InvalidArgument(
        "an access token needs --authority: a peer of a private swarm checks others too");
  }
  if (a.authority.empty() && a.allowlist.empty()) return access;  // a public swarm
  net::AccessOptions options;
  options.clock_skew_seconds = a.clock_skew;
  if (!a.authority.empty()) {
    auto id = PeerId::Parse(a.authority);
    if (!id.ok()) return InvalidArgument("--authority: " + id.status().message());
    options.authority = *id;
    if (!has_token) {
      return InvalidArgument(
          "--authority needs this peer's access token: --access-token FILE or "
          "--access-token-command CMD (the authority issues one with `colony authority issue "
          "--peer " +
          self.ToString() + "`)");
    }
  }
  if (!a.allowlist.empty()) {
    auto listed = net::LoadAllowlist(a.allowlist);
    if (!listed.ok()) return InvalidArgument("--allowlist: " + listed.status().message());
    options.allowlist = std::move(*listed);
  }
  access.control = std::make_shared<net::AccessControl>(std::move(options));
  if (has_token) {
    net::TokenSource source;
    source.file = a.token_file;
    source.command = a.token_command;
    auto token = net::FetchAccessToken(source, self);
    if (!token.ok()) return token.status();
    Status set = access.control->SetOwnToken(self, std::move(*token));
    if (!set.ok()) {
      return InvalidArgument(
          std::string(a.token_file.empty() ? "--access-token-command" : "--access-token") + ": " +
          set.message());
    }
    access.source = std::move(source);
  }
  return access;
}

void SwarmAccess::Attach(dht::Node& node) {
  if (!control) return;
  if (source) refresher = std::make_unique<net::TokenRefresher>(node.host(), *source);
  if (control->options().authority) {
    watcher = std::make_unique<dht::RevocationWatcher>(node, control,
                                                       SecondsToMillis(revocation_interval));
  }
}

void SwarmAccess::Stop() {
  watcher.reset();
  refresher.reset();
}

Result<double> ParseDuration(const std::string& text) {
  if (text.empty()) return InvalidArgument("empty duration");
  double unit = 1;
  std::string number = text;
  switch (text.back()) {
    case 's':
      number.pop_back();
      break;
    case 'm':
      unit = 60;
      number.pop_back();
      break;
    case 'h':
      unit = 3600;
      number.pop_back();
      break;
    case 'd':
      unit = 86400;
      number.pop_back();
      break;
    default:
      break;
  }
  char* end = nullptr;
  const double v = std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size() || !std::isfinite(v) || v <= 0) {
    return InvalidArgument("'" + text + "' is not a duration (e.g. 90s, 30m, 24h, 7d)");
  }
  return v * unit;
}

Result<StartedNode> StartSwarmNode(const AccessArgs& args, dht::NodeOptions options) {
  COLONY_ASSIGN_OR_RETURN(KeyPair identity, LoadOrGenerateIdentity(args.identity));
  COLONY_ASSIGN_OR_RETURN(SwarmAccess access, MakeSwarmAccess(args, identity.peer_id()));
  options.validators = {SwarmRecordRules()};
  options.host.access = access.control;
  StartedNode started;
  auto node = dht::Node::Start(std::move(identity), std::move(options));
  if (!node.ok()) return node.status().WithContext("joining the DHT");
  started.node = std::move(*node);
  started.access = std::move(access);
  started.access.Attach(*started.node);
  return started;
}

}  // namespace colony::cli
