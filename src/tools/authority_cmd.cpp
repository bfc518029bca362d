// colony authority init|issue|revoke|add-member|serve: run the authority of a private swarm.
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "authority/token_service.h"
#include "core/identity.h"
#include "core/log.h"
#include "dht/node.h"
#include "dht/revocations.h"
#include "http/server.h"
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
      "authority",
      "run the authority of a private swarm: create it, issue and revoke tokens, serve them to "
      "its members over HTTP");
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

  struct AddMemberArgs {
    std::string members, name, role = "any";
  };
  auto am = std::make_shared<AddMemberArgs>();
  auto* add_member = authority->add_subcommand(
      "add-member",
      "add a member to a members file (made with mode 0600 if missing) and print the member's "
      "new key, which only the file's hash of it can check; `colony authority serve` issues "
      "tokens to whoever shows it");
  add_member->add_option("--members", am->members, "the members file")->required();
  add_member
      ->add_option("--name", am->name,
                   "the member's name (letters, digits and ._@+-; the tokens' name in the "
                   "swarm's logs)")
      ->required();
  add_member
      ->add_option("--role", am->role,
                   "what the member's peers may call: any, train, serve or client (as "
                   "`issue --role`)")
      ->capture_default_str();
  commands.emplace_back(add_member, [am] {
    auto role = net::ParseAccessRole(am->role);
    if (!role.ok()) return Fail("--role: " + role.status().message());
    if (Status st = authority::CheckMemberName(am->name); !st.ok())
      return Fail(st.WithContext("--name"));
    std::error_code ec;
    const bool exists = std::filesystem::exists(am->members, ec);
    if (exists) {
      auto members = authority::LoadMembers(am->members);
      if (!members.ok()) return Fail(members.status());
      for (const auto& m : *members) {
        if (m.name == am->name) return Fail("'" + am->name + "' is a member already");
      }
    }
    auto [key, hash] = authority::NewMemberKey();
    const authority::Member member{.name = am->name, .role = *role, .key_sha256 = hash};
    std::string line = authority::MemberLine(member) + "\n";
    if (exists && std::filesystem::file_size(am->members, ec) > 0) {
      std::ifstream in(am->members, std::ios::binary);
      in.seekg(-1, std::ios::end);
      if (in.get() != '\n') line = "\n" + line;  // the last line stays whole
    }
    {
      std::ofstream out(am->members, std::ios::app);
      if (!exists) ::chmod(am->members.c_str(), 0600);
      out << line;
      if (!out) return Fail("could not write " + am->members);
    }
    // Read back as the server will read it (e.g. a name it refuses).
    if (auto check = authority::LoadMembers(am->members); !check.ok()) {
      return Fail(check.status());
    }
    std::printf("%s\n", key.c_str());
    std::fprintf(stderr,
                 "added %s (role %s) to %s; the key above is shown once: give it to %s, who "
                 "fetches tokens with it\n",
                 am->name.c_str(), std::string(net::AccessRoleName(*role)).c_str(),
                 am->members.c_str(), am->name.c_str());
    return 0;
  });

  struct ServeArgs {
    std::string key, members, http = "127.0.0.1:8780", ttl = "1h";
    size_t max_peers = 8;
    double requests_per_minute = 60;
    HttpServeArgs serving;
  };
  auto sa = std::make_shared<ServeArgs>();
  auto* serve = authority->add_subcommand(
      "serve",
      "issue access tokens over HTTP to the members of a members file: GET "
      "/v1/token/<peer id> with 'Authorization: Bearer KEY' answers the token as text, for "
      "--access-token-command (docs/private-swarms.md)");
  serve->add_option("--authority", sa->key, "the authority's key file")->required();
  serve->add_option("--members", sa->members, "the members file (`authority add-member`)")
      ->required();
  serve
      ->add_option("--http", sa->http,
                   "host:port to listen on (default 127.0.0.1:8780: loopback only; port 0 picks a "
                   "free one, printed on stdout); beyond loopback give --tls-cert and --tls-key "
                   "or put a TLS proxy in front, since members send their keys")
      ->capture_default_str();
  AddHttpServeOptions(serve, sa->serving);
  serve->add_option("--ttl", sa->ttl, "how long each token is valid: 90s, 30m, 24h, 7d")
      ->capture_default_str();
  serve
      ->add_option("--max-peers-per-member", sa->max_peers,
                   "peer ids one member may hold unexpired tokens for at once")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  serve
      ->add_option("--requests-per-minute", sa->requests_per_minute,
                   "requests per client address per minute, in bursts of up to a minute's worth "
                   "(429 past it; 0: no limit)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  commands.emplace_back(serve, [sa] {
    auto key = KeyPair::Load(sa->key);
    if (!key.ok()) return Fail(key.status());
    auto members = authority::LoadMembers(sa->members);
    if (!members.ok()) return Fail(members.status().WithContext("--members"));
    auto ttl = ParseDuration(sa->ttl);
    if (!ttl.ok()) return Fail("--ttl: " + ttl.status().message());
    auto where = ParseHostPort(sa->http);
    if (!where.ok()) return Fail(where.status());
    const size_t count = members->size();
    auto service =
        authority::TokenService::Create(std::move(*key), std::move(*members),
                                        {.ttl_seconds = *ttl,
                                         .max_peers_per_member = sa->max_peers,
                                         .requests_per_minute = sa->requests_per_minute});
    if (!service.ok()) return Fail(service.status());
    if (!IsLoopbackHost(where->first) && !sa->serving.tls()) {
      COLONY_LOG_WARN(
          "authority: serving on {} over plain HTTP: members' keys cross the network in the "
          "clear; give --tls-cert and --tls-key, or put a TLS proxy in front and listen on "
          "loopback",
          where->first);
    }
    BlockTerminationSignals();
    // Removing a member's line revokes its key within a second, without a restart.
    authority::MembersWatcher watcher(*service, sa->members, std::chrono::seconds(1));
    http::ServerOptions http_options{.host = where->first, .port = where->second};
    sa->serving.ApplyTo(http_options);
    auto server = http::Server::Start(http_options, (*service)->Routes());
    if (!server.ok()) return Fail(server.status().WithContext(sa->serving.OptionNames()));
    const std::string url = (*server)->BaseUrl() + "/v1";
    std::printf("%s\n", url.c_str());
    std::fflush(stdout);
    COLONY_LOG_INFO("authority: issuing tokens of {} to {} members at {}/token/",
                    (*service)->authority().ToString(), count, url);
    const std::string sig = WaitForTerminationSignal();
    COLONY_LOG_INFO("authority: {} received; stopping", sig);
    (*server)->Stop();
    const auto st = (*service)->stats();
    COLONY_LOG_INFO(
        "authority: issued {} tokens; refused {} without a member's key, {} bad peer ids, {} "
        "over the peer limit, {} over the rate",
        st.issued, st.unauthorized, st.bad_peer_ids, st.over_peer_limit, st.rate_limited);
    return 0;
  });
}

}  // namespace colony::cli
