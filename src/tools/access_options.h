// The options that say who a command's peer is (--identity) and make it a peer of a private swarm
// (--authority, --access-token, --access-token-command, --allowlist, ...), and what they set up:
// the access policy every connection is checked against, this peer's first token, its renewal,
// and the revocations read from the DHT. See docs/private-swarms.md.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "core/identity.h"
#include "dht/node.h"
#include "dht/revocations.h"
#include "net/access_control.h"
#include "net/token_source.h"

namespace colony::cli {

struct AccessArgs {
  // This peer's key file ("": a new random identity on every start): a token file names it, an
  // allowlist lists it, and a server keeps its peer id across restarts with it.
  std::string identity;
  std::string authority;  // the authority's id (as `colony authority init` prints it)
  std::string token_file;
  std::string token_command;
  std::string allowlist;
  double clock_skew = 60;
  double revocation_interval = 30;
};

void AddAccessOptions(CLI::App* cmd, AccessArgs& args);

// A private swarm's policy for a peer with identity `self`; empty (a public swarm) when no access
// option was given. Errors name the option that is wrong.
struct SwarmAccess {
  std::shared_ptr<net::AccessControl> control;  // null: public
  std::optional<net::TokenSource> source;
  double revocation_interval = 30;
  std::unique_ptr<net::TokenRefresher> refresher;
  std::unique_ptr<dht::RevocationWatcher> watcher;

  // Keeps the node's token fresh and reads revocations (a no-op for a public swarm) until
  // Stop() or destruction, which must come before the node goes: declare the attached
  // SwarmAccess after the node.
  void Attach(dht::Node& node);
  void Stop();
  SwarmAccess() = default;
  SwarmAccess(SwarmAccess&&) = default;
  SwarmAccess& operator=(SwarmAccess&&) = default;
  ~SwarmAccess() { Stop(); }
};

// The key pair in the identity file at `path`, or a new random one when `path` is empty.
Result<KeyPair> LoadOrGenerateIdentity(const std::string& path);

Result<SwarmAccess> MakeSwarmAccess(const AccessArgs& args, const PeerId& self);

// A DHT node of the swarm for a command (serve, experts, swarm-train stage, servers): `options`
// with the swarm's record rules and the private swarm's policy, started as the --identity peer,
// and its access attached. The access is declared after the node, so it stops first.
struct StartedNode {
  std::unique_ptr<dht::Node> node;
  SwarmAccess access;
};
Result<StartedNode> StartSwarmNode(const AccessArgs& args, dht::NodeOptions options);

// Parses "90", "90s", "30m", "24h", "7d" into seconds.
Result<double> ParseDuration(const std::string& text);

}  // namespace colony::cli
