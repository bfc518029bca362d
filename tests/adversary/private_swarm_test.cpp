// A private swarm run with the stock CLI, as its users would: `colony authority` creates the
// authority and issues tokens, a `colony dht` node admits only their holders, and servers,
// clients and trainers join with the identities their tokens name. Outsiders (no
// token, another authority's token, a token for another peer, a revoked token) cannot store or
// get a record or join an averaging group, and each is told why; members can.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "core/files.h"
#include "core/identity.h"
#include "core/subprocess.h"
#include "self_signed.h"
#include "test_support.h"

namespace colony {
namespace {

using namespace std::chrono_literals;
using test::ColonyBinary;
using test::RunCli;

class PrivateSwarmCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("colony_private_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    auto init = RunCli({"authority", "init", "--out", Path("authority.key")});
    ASSERT_EQ(init.code, 0) << init.err;
    authority_ = init.out.substr(0, init.out.find('\n'));
    auto other = RunCli({"authority", "init", "--out", Path("other.key")});
    ASSERT_EQ(other.code, 0) << other.err;

    ASSERT_EQ(RunCli({"identity", "new", "--out", Path("boot.key")}).code, 0);
    ASSERT_TRUE(IssueTo("boot", Path("authority.key"), Path("boot.token")));
    auto boot = Subprocess::Spawn(
        {ColonyBinary(), "--log-level", "warn", "dht", "--listen", "/ip4/127.0.0.1/tcp/0",
         "--identity", Path("boot.key"), "--authority", authority_, "--access-token",
         Path("boot.token"), "--revocation-interval", "0.2"},
        Path("boot.err"));
    ASSERT_TRUE(boot.ok()) << boot.status().ToString();
    boot_.emplace(std::move(*boot));
    auto line = boot_->ReadLine(20s);
    ASSERT_TRUE(line.ok()) << line.status().ToString();
    boot_addr_ = *line;
  }
  void TearDown() override {
    if (boot_) {
      boot_->Signal(SIGTERM);
      (void)boot_->Wait(10s);
    }
    RemoveTree(dir_);
  }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a token for the identity `name`.key (made if missing), signed by `authority_key`.
  bool IssueTo(const std::string& name, const std::string& authority_key,
               const std::string& token_path, const std::string& ttl = "1h",
               const std::string& role = "any") {
    if (!std::filesystem::exists(Path(name + ".key")) &&
        RunCli({"identity", "new", "--out", Path(name + ".key")}).code != 0) {
      return false;
    }
    auto id = RunCli({"identity", "show", Path(name + ".key")});
    if (id.code != 0) return false;
    auto token =
        RunCli({"authority", "issue", "--authority", authority_key, "--peer",
                id.out.substr(0, id.out.find('\n')), "--name", name, "--ttl", ttl, "--role", role});
    if (token.code != 0) return false;
    std::ofstream(token_path) << token.out;
    return true;
  }

  test::CliResult Get(std::vector<std::string> extra) {
    std::vector<std::string> args = {"dht", "get", "k", "--latest", "--initial-peers", boot_addr_};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunCli(args);
  }

  std::filesystem::path dir_;
  std::string authority_;
  std::optional<Subprocess> boot_;
  std::string boot_addr_;
};

TEST_F(PrivateSwarmCli, MembersStoreAndGetOutsidersAreRefusedWithTheReason) {
  // A member whose token comes from a command (it learns its peer id from COLONY_PEER_ID).
  const std::string issue_cmd = ColonyBinary() + " authority issue --authority " +
                                Path("authority.key") + " --peer $COLONY_PEER_ID --ttl 10m";
  auto stored = RunCli({"dht", "store", "k", "members-only", "--initial-peers", boot_addr_,
                        "--authority", authority_, "--access-token-command", issue_cmd});
  ASSERT_EQ(stored.code, 0) << stored.err;

  ASSERT_TRUE(IssueTo("alice", Path("authority.key"), Path("alice.token")));
  auto got = Get({"--identity", Path("alice.key"), "--authority", authority_, "--access-token",
                  Path("alice.token")});
  ASSERT_EQ(got.code, 0) << got.err;
  EXPECT_EQ(nlohmann::json::parse(got.out)["value"], "members-only");

  // No token at all.
  auto bare = RunCli({"dht", "store", "k", "junk", "--initial-peers", boot_addr_});
  EXPECT_EQ(bare.code, 1);
  EXPECT_NE(bare.err.find("refused this peer: it shows no access token"), std::string::npos)
      << bare.err;
  EXPECT_NE(bare.err.find(authority_), std::string::npos) << bare.err;
  EXPECT_EQ(Get({}).code, 1);

  // A token of another authority.
  ASSERT_TRUE(IssueTo("mallory", Path("other.key"), Path("mallory.token")));
  auto other_id = RunCli({"identity", "show", Path("other.key")});
  auto foreign = Get({"--identity", Path("mallory.key"), "--authority",
                      other_id.out.substr(0, other_id.out.find('\n')), "--access-token",
                      Path("mallory.token")});
  EXPECT_EQ(foreign.code, 1);
  EXPECT_NE(foreign.err.find("another authority"), std::string::npos) << foreign.err;

  // Alice's token on another identity: refused before it leaves this machine.
  auto stolen = Get({"--authority", authority_, "--access-token", Path("alice.token")});
  EXPECT_EQ(stolen.code, 1);
  EXPECT_NE(stolen.err.find("is for peer"), std::string::npos) << stolen.err;

  // An outsider cannot join an averaging group: it cannot reach any peer of the swarm.
  auto avg = RunCli({"average", "--initial-peers", boot_addr_, "--values", "1000", "--rounds", "1",
                     "--timeout", "5"});
  EXPECT_NE(avg.code, 0);
  EXPECT_NE(avg.err.find("refused this peer"), std::string::npos) << avg.err;

  // The node logged every refusal, and the record is the member's.
  const std::string log = test::ReadFile(Path("boot.err"));
  EXPECT_NE(log.find("refused incoming connection"), std::string::npos) << log;
  got = Get({"--identity", Path("alice.key"), "--authority", authority_, "--access-token",
             Path("alice.token")});
  ASSERT_EQ(got.code, 0) << got.err;
  EXPECT_EQ(nlohmann::json::parse(got.out)["value"], "members-only");
}

// The issuer as it is run beyond loopback: over HTTPS, its certificate verified by curl.
TEST_F(PrivateSwarmCli, MembersFetchTokensFromTheIssuerOverHttpsAndStrangersGetNone) {
  // The operator adds two members (their keys are printed once) and serves their tokens.
  auto alice = RunCli({"authority", "add-member", "--members", Path("members.txt"), "--name",
                       "alice", "--role", "train"});
  ASSERT_EQ(alice.code, 0) << alice.err;
  auto bob = RunCli({"authority", "add-member", "--members", Path("members.txt"), "--name", "bob",
                     "--role", "client"});
  ASSERT_EQ(bob.code, 0) << bob.err;
  const std::string alice_key = alice.out.substr(0, alice.out.find('\n'));
  const std::string bob_key = bob.out.substr(0, bob.out.find('\n'));
  EXPECT_EQ(test::ReadFile(Path("members.txt")).find(alice_key), std::string::npos)
      << "the members file holds the keys themselves";
  const test::Pem pem = test::MakeSelfSigned("issuer");
  test::WriteFile(Path("cert.pem"), pem.certificate);
  test::WriteFile(Path("key.pem"), pem.key);
  auto issuer = Subprocess::Spawn(
      {ColonyBinary(), "--log-level", "info", "authority", "serve", "--authority",
       Path("authority.key"), "--members", Path("members.txt"), "--http", "127.0.0.1:0", "--ttl",
       "10m", "--tls-cert", Path("cert.pem"), "--tls-key", Path("key.pem")},
      Path("issuer.err"));
  ASSERT_TRUE(issuer.ok()) << issuer.status().ToString();
  auto url = issuer->ReadLine(test::HangGuard(20s));
  ASSERT_TRUE(url.ok()) << url.status().ToString() << test::ReadFile(Path("issuer.err"));
  ASSERT_TRUE(url->starts_with("https://127.0.0.1:")) << *url;
  // What a member puts in --access-token-command: each command runs as a new identity, and
  // fetches a token for it, trusting the issuer's certificate.
  const auto fetch = [&](const std::string& key, const std::string& trust) {
    return "curl -sS --fail-with-body --max-time 10 --cacert " + trust +
           " -H 'Authorization: Bearer " + key + "' " + *url + "/token/$COLONY_PEER_ID";
  };
  const auto fetch_as = [&](const std::string& key) { return fetch(key, Path("cert.pem")); };
  // A client that does not trust the certificate sends nothing (curl fails the handshake).
  const test::Pem other = test::MakeSelfSigned("issuer");
  test::WriteFile(Path("other.pem"), other.certificate);
  auto untrusted =
      RunCli({"dht", "store", "k", "from-alice", "--initial-peers", boot_addr_, "--authority",
              authority_, "--access-token-command", fetch(alice_key, Path("other.pem"))});
  EXPECT_EQ(untrusted.code, 1);
  EXPECT_NE(untrusted.err.find("curl: (60) SSL certificate problem"), std::string::npos)
      << untrusted.err;
  auto stored = RunCli({"dht", "store", "k", "from-alice", "--initial-peers", boot_addr_,
                        "--authority", authority_, "--access-token-command", fetch_as(alice_key)});
  ASSERT_EQ(stored.code, 0) << stored.err << test::ReadFile(Path("issuer.err"));
  // Bob's tokens carry his role, client: he may look records up, not store them.
  auto got = Get({"--authority", authority_, "--access-token-command", fetch_as(bob_key)});
  ASSERT_EQ(got.code, 0) << got.err;
  EXPECT_EQ(nlohmann::json::parse(got.out)["value"], "from-alice");
  auto bob_store = RunCli({"dht", "store", "k", "from-bob", "--initial-peers", boot_addr_,
                           "--authority", authority_, "--access-token-command", fetch_as(bob_key)});
  EXPECT_NE(bob_store.code, 0);
  EXPECT_NE(bob_store.err.find("client"), std::string::npos) << bob_store.err;
  // A stranger's key gets no token, and the command's failure says why.
  auto stranger = Get({"--authority", authority_, "--access-token-command",
                       fetch_as("0123456789abcdef0123456789abcdef")});
  EXPECT_EQ(stranger.code, 1);
  EXPECT_NE(stranger.err.find("belongs to no member"), std::string::npos) << stranger.err;

  // The operator removes Bob's line; the running issuer refuses his key from then on.
  std::string kept;
  std::istringstream lines(test::ReadFile(Path("members.txt")));
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("bob ", 0) != 0) kept += line + "\n";
  }
  test::WriteFile(Path("members.txt"), kept);
  const auto bob_status = [&] {
    auto curl = Subprocess::Spawn({"/usr/bin/curl", "-s", "-o", "/dev/null", "-w", "%{http_code}\n",
                                   "--max-time", "10", "--cacert", Path("cert.pem"), "-H",
                                   "Authorization: Bearer " + bob_key,
                                   *url + "/token/" + KeyPair::Generate().peer_id().ToString()});
    auto line =
        curl.ok() ? curl->ReadLine(test::HangGuard(15s)) : Result<std::string>(curl.status());
    if (curl.ok()) (void)curl->Wait(test::HangGuard(15s));
    return line.ok() ? *line : line.status().ToString();
  };
  // The issuer serves 60 requests a minute per address (a bucket of 60 refilled at one a
  // second), these polls included: one every 500 ms drains it by one a second, so the watcher
  // (it checks the file every second) has most of a minute before the polls themselves are
  // refused.
  const auto deadline = std::chrono::steady_clock::now() + test::HangGuard(10s);
  std::string status = bob_status();
  while (status != "401" && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(500ms);
    status = bob_status();
  }
  EXPECT_EQ(status, "401");
  auto again = RunCli({"dht", "store", "k", "from-alice-again", "--initial-peers", boot_addr_,
                       "--authority", authority_, "--access-token-command", fetch_as(alice_key)});
  EXPECT_EQ(again.code, 0) << again.err;

  issuer->Signal(SIGTERM);
  ASSERT_TRUE(issuer->Wait(test::HangGuard(10s)).ok());
  const std::string log = test::ReadFile(Path("issuer.err"));
  EXPECT_NE(log.find("issued a train token"), std::string::npos) << log;
  EXPECT_NE(log.find("to 'bob'"), std::string::npos) << log;
  EXPECT_NE(log.find("members.txt changed: 1 members now"), std::string::npos) << log;
}

TEST_F(PrivateSwarmCli, ARevokedTokenIsRefusedOnceTheRevocationIsPublished) {
  ASSERT_TRUE(IssueTo("bob", Path("authority.key"), Path("bob.token")));
  const std::vector<std::string> as_bob = {"--identity", Path("bob.key"),  "--authority",
                                           authority_,   "--access-token", Path("bob.token")};
  auto before = RunCli({"dht", "store", "k", "bob-was-here", "--initial-peers", boot_addr_,
                        as_bob[0], as_bob[1], as_bob[2], as_bob[3], as_bob[4], as_bob[5]});
  ASSERT_EQ(before.code, 0) << before.err;

  auto revoked = RunCli({"authority", "revoke", "--authority", Path("authority.key"),
                         "--token-file", Path("bob.token"), "--initial-peers", boot_addr_});
  ASSERT_EQ(revoked.code, 0) << revoked.err;
  EXPECT_EQ(nlohmann::json::parse(revoked.out)["name"], "bob");
  // Another authority cannot revoke it (and could not sign entries under this authority's key).
  auto forged = RunCli({"authority", "revoke", "--authority", Path("other.key"), "--token-file",
                        Path("bob.token"), "--initial-peers", boot_addr_});
  EXPECT_EQ(forged.code, 1);

  // The node reads revocations every 0.2 s; Bob is refused once it has.
  test::CliResult after;
  ASSERT_TRUE(test::WaitUntil(
      [&] {
        after = Get(as_bob);
        return after.code == 1;
      },
      20s))
      << after.out << after.err;
  EXPECT_NE(after.err.find("revoked by the authority"), std::string::npos) << after.err;
}

// Serving in a private swarm: `colony serve`, `colony servers` and `colony generate` run as the
// identity their token files were issued for (--identity), with the roles a server and a reader
// need; a server keeps that peer id; an outsider's generate is refused with the reason.
TEST_F(PrivateSwarmCli, ServersAndClientsRunAsTheIdentitiesTheirTokensName) {
  const std::string model =
      (std::filesystem::path(COLONY_HF_FIXTURES) / "llama-v5-rope500k-tied").string();
  ASSERT_TRUE(IssueTo("server", Path("authority.key"), Path("server.token"), "1h", "serve"));
  ASSERT_TRUE(IssueTo("reader", Path("authority.key"), Path("reader.token"), "1h", "client"));
  auto server_id = RunCli({"identity", "show", Path("server.key")});
  ASSERT_EQ(server_id.code, 0) << server_id.err;
  const std::string server_peer = server_id.out.substr(0, server_id.out.find('\n'));

  auto spawned =
      Subprocess::Spawn({ColonyBinary(),    "--log-level", "warn",           "serve",
                         "--model",         model,         "--listen",       "/ip4/127.0.0.1/tcp/0",
                         "--blocks",        "0:4",         "--threads",      "1",
                         "--initial-peers", boot_addr_,    "--identity",     Path("server.key"),
                         "--authority",     authority_,    "--access-token", Path("server.token")},
                        Path("server.err"));
  ASSERT_TRUE(spawned.ok()) << spawned.status().ToString();
  Subprocess server = std::move(*spawned);
  auto address = server.ReadLine(test::HangGuard(60s));
  ASSERT_TRUE(address.ok()) << address.status().ToString() << "\n"
                            << test::ReadFile(Path("server.err"));
  EXPECT_NE(address->find("/p2p/" + server_peer), std::string::npos) << *address;

  const std::vector<std::string> as_reader = {"--initial-peers",  boot_addr_,          "--identity",
                                              Path("reader.key"), "--authority",       authority_,
                                              "--access-token",   Path("reader.token")};
  auto with_reader = [&](std::vector<std::string> args) {
    args.insert(args.end(), as_reader.begin(), as_reader.end());
    return RunCli(args);
  };
  // The server is listed under the token's peer id (its record may take a moment to appear).
  test::CliResult listed;
  EXPECT_TRUE(test::WaitUntil(
      [&] {
        listed = with_reader({"servers", "--model", model, "--json"});
        return listed.code == 0 && listed.out.find(server_peer) != std::string::npos;
      },
      test::HangGuard(30s)))
      << listed.out << listed.err;

  // It generates what transformers generates from this checkpoint (greedy, the fixture's prompt).
  const auto reference = nlohmann::json::parse(
      test::ReadFile((std::filesystem::path(COLONY_HF_FIXTURES) / "reference.json").string()));
  const auto& fixture = reference["models"]["llama-v5-rope500k-tied"];
  const std::vector<int64_t> prompt = fixture["prompt"];
  const std::vector<int64_t> greedy = fixture["greedy_24"];
  std::string tokens;
  for (int64_t t : prompt) tokens += (tokens.empty() ? "" : ",") + std::to_string(t);
  auto generated = with_reader(
      {"generate", "--model", model, "--tokens", tokens, "--max-new-tokens", "4", "--json"});
  ASSERT_EQ(generated.code, 0) << generated.err;
  const std::vector<int64_t> got = nlohmann::json::parse(generated.out)["tokens"];
  EXPECT_EQ(got,
            std::vector<int64_t>(greedy.begin() + static_cast<std::ptrdiff_t>(prompt.size()),
                                 greedy.begin() + static_cast<std::ptrdiff_t>(prompt.size()) + 4))
      << generated.out;

  // An outsider cannot generate: the swarm's peers refuse its connections, and it is told why.
  auto outsider = RunCli({"generate", "--model", model, "--tokens", "1,2,3", "--max-new-tokens",
                          "4", "--initial-peers", boot_addr_});
  EXPECT_NE(outsider.code, 0);
  EXPECT_NE(outsider.err.find("refused this peer"), std::string::npos) << outsider.err;

  server.Signal(SIGTERM);
  auto code = server.Wait(test::HangGuard(30s));
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 0) << test::ReadFile(Path("server.err"));
}

// Training in a private swarm: two `colony train` members with tokens average every step
// together, and an outsider's `colony train` is refused with the reason.
TEST_F(PrivateSwarmCli, MembersTrainTogetherAndAnOutsidersTrainerIsRefused) {
  const std::vector<std::string> train = {ColonyBinary(),
                                          "--log-level",
                                          "warn",
                                          "train",
                                          "--task",
                                          "fashion-mnist",
                                          "--classifier",
                                          "linear",
                                          "--batch-size",
                                          "8",
                                          "--target-batch-size",
                                          "64",
                                          "--threads",
                                          "1",
                                          "--json",
                                          "--progress-interval",
                                          "0",
                                          "--eval-batch-size",
                                          "64",
                                          "--eval-every",
                                          "1000000",
                                          "--matchmaking-time",
                                          "2",
                                          "--averaging-timeout",
                                          "20",
                                          "--initial-peers",
                                          boot_addr_};
  std::vector<Subprocess> members;
  for (const std::string name : {"trainer1", "trainer2"}) {
    ASSERT_TRUE(IssueTo(name, Path("authority.key"), Path(name + ".token")));
    auto argv = train;
    argv.insert(argv.end(),
                {"--max-epochs", "3", "--min-peers", "2", "--identity", Path(name + ".key"),
                 "--authority", authority_, "--access-token", Path(name + ".token")});
    auto p = Subprocess::Spawn(argv, Path(name + ".err"));
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    members.push_back(std::move(*p));
  }
  for (size_t i = 0; i < members.size(); ++i) {
    int averaged = 0;
    nlohmann::json done;
    const auto deadline = std::chrono::steady_clock::now() + test::HangGuard(180s);
    while (done.is_null() && std::chrono::steady_clock::now() < deadline) {
      auto line = members[i].ReadLine(std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now()));
      if (!line.ok()) break;
      auto j = nlohmann::json::parse(*line, nullptr, false);
      if (!j.is_object()) continue;
      if (j.value("event", "") == "step" && j.value("averaged", false) &&
          j.value("group_size", 0) == 2) {
        ++averaged;
      }
      if (j.value("event", "") == "done") done = j;
    }
    ASSERT_FALSE(done.is_null()) << "trainer " << i + 1 << " did not finish: "
                                 << test::ReadFile(
                                        Path("trainer" + std::to_string(i + 1) + ".err"));
    EXPECT_EQ(done["epoch"], 3);
    EXPECT_EQ(averaged, 3) << "trainer " << i + 1;
    auto code = members[i].Wait(30s);
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 0);
  }

  // An outsider (no token) cannot join: every member refuses its connections.
  auto outsider = train;
  outsider.erase(outsider.begin());
  outsider.insert(outsider.end(), {"--max-epochs", "1"});
  auto refused = RunCli(outsider);
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.err.find("refused this peer"), std::string::npos) << refused.err;
}

}  // namespace
}  // namespace colony
