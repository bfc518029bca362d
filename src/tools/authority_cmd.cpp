// colony authority init|issue|revoke: run the authority of a private swarm.
#include <cstdio>
#include <memory>

#include "core/identity.h"
#include "dht/node.h"
#include "dht/revocations.h"
#include "net/access_token.h"
#include "net/token_source.h"
#include "tools/access_options.h"
#include "tools/commands.h"
#include "tools/record_rules.h"

namespace colony::cli {
namespace {

Result<Bytes> ReadToken(const std::string& text, const std::string& file) {
  return file.empty() ? net::ParseAccessTokenText(text) : net::ReadAccessTokenFile(file);
}

}  // namespace

void AddAuthorityCommands(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands) {
  auto* authority = app.add_subcommand(
      "authority", "run the authority of a private swarm: create it, issue and revoke tokens");
  authority->require_subcommand(1);

  struct InitArgs {
    std::string out;
    bool force = false;
  };
  auto ia = std::make_shared<InitArgs>();
  auto* init = authority->add_subcommand(
      "init",
      "create an authority key (mode 0600) and print its id, which peers pass to "
      "--authority");
  init->add_option("--out", ia->out, "file to write")->required();
  init->add_flag("--force", ia->force, "overwrite an existing file");
  commands.emplace_back(init, [ia] {
    KeyPair kp = KeyPair::Generate();
    if (Status st = kp.Save(ia->out, ia->force); !st.ok()) return Fail(st);
    std::printf("%s\n", kp.peer_id().ToString().c_str());
    std::fprintf(stderr,
                 "wrote authority %s to %s (keep it private); peers join with --authority %s\n",
                 kp.peer_id().ToString().c_str(), ia->out.c_str(), kp.peer_id().ToString().c_str());
    return 0;
  });

  struct IssueArgs {
    std::string key, peer, name, ttl = "24h", role = "any";
  };
  auto is = std::make_shared<IssueArgs>();
  auto* issue = authority->add_subcommand(
      "issue", "print an access token that admits one peer id to the swarm until it expires");
  issue->add_option("--authority", is->key, "the authority's key file")->required();
  issue->add_option("--peer", is->peer, "the peer id the token admits")->required();
  issue->add_option("--name", is->name, "who it is for (shown in the swarm's logs)");
  issue->add_option("--ttl", is->ttl, "how long it is valid: 90s, 30m, 24h, 7d")
      ->capture_default_str();
  issue
      ->add_option("--role", is->role,
                   "what its holder may call: any, train (DHT, averaging), serve (DHT, block "
                   "servers) or client (DHT lookups, block servers)")
      ->capture_default_str();
  commands.emplace_back(issue, [is] {
    auto key = KeyPair::Load(is->key);
    if (!key.ok()) return Fail(key.status());
    auto peer = PeerId::Parse(is->peer);
    if (!peer.ok()) return Fail("--peer: " + peer.status().message());
    auto ttl = ParseDuration(is->ttl);
    if (!ttl.ok()) return Fail("--ttl: " + ttl.status().message());
    if (*ttl > 366 * 86400.0) return Fail("--ttl: at most 366d");
    auto role = net::ParseAccessRole(is->role);
    if (!role.ok()) return Fail("--role: " + role.status().message());
    if (*ttl > 86400) {
      std::fprintf(stderr,
                   "colony: note: a revocation of this token stays in the DHT for one day at a "
                   "time; revoking it means running `colony authority revoke` daily until it "
                   "expires\n");
    }
    const Bytes token = net::IssueAccessToken(*key, *peer, is->name, *role, dht::Now(), *ttl);
    std::printf("%s\n", net::AccessTokenText(token).c_str());
    return 0;
  });

  struct RevokeArgs {
    std::string key, token, token_file;
    std::vector<std::string> initial_peers;
    double timeout = 10;
  };
  auto ra = std::make_shared<RevokeArgs>();
  auto* revoke = authority->add_subcommand(
      "revoke",
      "publish a signed revocation of a token in the swarm's DHT: its peers refuse it "
      "and close its connections");
  revoke->add_option("--authority", ra->key, "the authority's key file")->required();
  auto* token_opt = revoke->add_option("--token", ra->token, "the token (its text)");
  revoke->add_option("--token-file", ra->token_file, "a file holding the token")
      ->excludes(token_opt);
  revoke
      ->add_option("--initial-peers", ra->initial_peers,
                   "multiaddr of a peer of the swarm (repeatable)")
      ->required()
      ->check(MultiaddrCheck());
  revoke->add_option("--request-timeout", ra->timeout, "seconds to wait for each DHT request")
      ->check(CLI::Range(0.01, 600.0))
      ->capture_default_str();
  commands.emplace_back(revoke, [ra] {
    if (ra->token.empty() && ra->token_file.empty()) return Fail("give --token or --token-file");
    auto key = KeyPair::Load(ra->key);
    if (!key.ok()) return Fail(key.status());
    auto bytes = ReadToken(ra->token, ra->token_file);
    if (!bytes.ok()) return Fail(bytes.status());
    auto token = net::DecodeAccessToken(*bytes);
    if (!token.ok()) return Fail(token.status());
    if (token->authority != key->public_key()) {
      return Fail("the token was issued by authority " +
                  PeerId::FromPublicKey(token->authority).ToString() + ", not by " + ra->key);
    }
    // The authority joins its own swarm with a short token it issues itself.
    net::AccessOptions access_options;
    access_options.authority = key->peer_id();
    auto access = std::make_shared<net::AccessControl>(access_options);
    Status own = access->SetOwnToken(key->peer_id(),
                                     net::IssueAccessToken(*key, key->peer_id(), "authority",
                                                           net::AccessRole::kAny, dht::Now(), 600));
    if (!own.ok()) return Fail(own);
    dht::NodeOptions options;
    options.validators = {SwarmRecordRules()};
    options.initial_peers = ra->initial_peers;
    options.dht.client_mode = true;
    options.host.access = access;
    options.dht.request_timeout =
        std::chrono::duration_cast<Duration>(std::chrono::duration<double>(ra->timeout));
    auto node = dht::Node::Start(std::move(*key), std::move(options));
    if (!node.ok()) return Fail(node.status());
    auto until = dht::PublishRevocation(**node, *token);
    (*node)->Shutdown();
    if (!until.ok()) return Fail(until.status());
    std::printf("%s\n", Dump({{"revoked", std::to_string(token->serial)},
                              {"name", token->name},
                              {"peer", token->peer.ToString()},
                              {"until", *until}})
                            .c_str());
    return 0;
  });
}

}  // namespace colony::cli
