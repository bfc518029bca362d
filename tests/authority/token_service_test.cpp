// The token issuer of a private swarm (authority/token_service.h), driven through its routes with
// requests a member, a stranger and a greedy member would send: what it issues is checked by
// decoding the token (signature, peer, name, role, lifetime) with the transport's own decoder.
#include "authority/token_service.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "test_support.h"

namespace colony::authority {
namespace {

using namespace std::chrono_literals;

KeyPair Key(uint8_t seed) {
  Bytes s(32, seed);
  return KeyPair::FromSeed(s);
}

std::string PeerText(uint8_t seed) { return Key(seed).peer_id().ToString(); }

class TokenServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto [alice_key, alice_hash] = NewMemberKey();
    auto [bob_key, bob_hash] = NewMemberKey();
    alice_key_ = alice_key;
    bob_key_ = bob_key;
    members_ = {{.name = "alice", .role = net::AccessRole::kTrain, .key_sha256 = alice_hash},
                {.name = "bob@lab", .role = net::AccessRole::kClient, .key_sha256 = bob_hash}};
  }

  void Start(TokenServiceOptions options) {
    options.clock = &clock_;
    auto made = TokenService::Create(Key(1), members_, options);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    service_ = *made;
    router_ = service_->Routes();
  }

  http::Reply Get(const std::string& path, const std::string& key,
                  const std::string& from = "198.51.100.7:40000") {
    http::Request r;
    r.method = "GET";
    r.target = r.path = path;
    r.remote_address = from;
    if (!key.empty()) r.headers.emplace_back("authorization", "Bearer " + key);
    auto match = router_.Find(r.method, r.path);
    if (!match.handler) return match.error;
    return (*match.handler)(r);
  }

  // The token of a 200 reply, decoded and checked against the authority's signature.
  net::AccessToken Token(const http::Reply& reply) {
    EXPECT_EQ(reply.status, 200) << reply.body;
    auto bytes = net::ParseAccessTokenText(reply.body);
    EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
    auto token = net::DecodeAccessToken(bytes.ok() ? *bytes : Bytes{});
    EXPECT_TRUE(token.ok()) << token.status().ToString();
    return token.ok() ? *token : net::AccessToken{};
  }

  ManualClock clock_{1.8e9};
  std::string alice_key_, bob_key_;
  std::vector<Member> members_;
  std::shared_ptr<TokenService> service_;
  http::Router router_;
};

TEST_F(TokenServiceTest, AMemberGetsATokenForItsPeerWithItsNameRoleAndLifetime) {
  ASSERT_NO_FATAL_FAILURE(Start({.ttl_seconds = 1800}));
  const auto reply = Get("/v1/token/" + PeerText(7), alice_key_);
  EXPECT_EQ(reply.content_type.rfind("text/plain", 0), 0u);
  EXPECT_EQ(reply.body.back(), '\n');  // one line, as --access-token-command reads it
  const net::AccessToken t = Token(reply);
  EXPECT_EQ(t.authority, Key(1).public_key());
  EXPECT_EQ(t.peer.ToString(), PeerText(7));
  EXPECT_EQ(t.name, "alice");
  EXPECT_EQ(t.role, net::AccessRole::kTrain);
  EXPECT_DOUBLE_EQ(t.issued_at, 1.8e9);
  EXPECT_DOUBLE_EQ(t.expires_at, 1.8e9 + 1800);
  EXPECT_EQ(Token(Get("/v1/token/" + PeerText(8), bob_key_)).role, net::AccessRole::kClient);
  EXPECT_EQ(service_->stats().issued, 2);

  const auto about = Get("/v1/authority", "");
  ASSERT_EQ(about.status, 200);
  const auto j = nlohmann::json::parse(about.body);
  EXPECT_EQ(j["authority"], Key(1).peer_id().ToString());
  EXPECT_EQ(j["ttl_seconds"], 1800.0);
}

TEST_F(TokenServiceTest, StrangersAndMalformedPeerIdsGetNothing) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  const std::string path = "/v1/token/" + PeerText(7);
  EXPECT_EQ(Get(path, "").status, 401);
  EXPECT_EQ(Get(path, alice_key_ + "0").status, 401);
  // The file's hash is not a key.
  EXPECT_EQ(Get(path, members_[0].key_sha256).status, 401);
  EXPECT_EQ(Get(path, std::string(5000, 'k')).status, 401);
  EXPECT_EQ(Get("/v1/token/12D3KooWnot-a-peer", alice_key_).status, 400);
  EXPECT_EQ(Get("/v1/token/", alice_key_).status, 404);  // no peer id: not a token's path
  EXPECT_EQ(Get("/v1/token/" + std::string(4096, '1'), alice_key_).status, 400);
  EXPECT_EQ(Get("/v1/token/" + PeerText(7) + "/x", alice_key_).status, 400);
  const auto st = service_->stats();
  EXPECT_EQ(st.unauthorized, 4);
  EXPECT_EQ(st.bad_peer_ids, 3);
  EXPECT_EQ(st.issued, 0);
}

TEST_F(TokenServiceTest, AMemberHoldsAtMostItsShareOfPeerIdsUntilTheirTokensExpire) {
  ASSERT_NO_FATAL_FAILURE(Start({.ttl_seconds = 600, .max_peers_per_member = 2}));
  EXPECT_EQ(Get("/v1/token/" + PeerText(10), alice_key_).status, 200);
  EXPECT_EQ(Get("/v1/token/" + PeerText(11), alice_key_).status, 200);
  const auto third = Get("/v1/token/" + PeerText(12), alice_key_);
  EXPECT_EQ(third.status, 403);
  EXPECT_NE(third.body.find("2 peer ids"), std::string::npos) << third.body;
  // Renewing a peer it holds is always allowed, and another member has its own share.
  clock_.Advance(300s);
  EXPECT_EQ(Get("/v1/token/" + PeerText(10), alice_key_).status, 200);
  EXPECT_EQ(Get("/v1/token/" + PeerText(12), bob_key_).status, 200);
  // Peer 11's token (issued at 0) expires at 600; peer 10's was renewed until 900.
  clock_.Advance(301s);
  EXPECT_EQ(Get("/v1/token/" + PeerText(12), alice_key_).status, 200);
  EXPECT_EQ(Get("/v1/token/" + PeerText(13), alice_key_).status, 403);
  EXPECT_EQ(service_->stats().over_peer_limit, 2);
}

TEST_F(TokenServiceTest, EachAddressHasARateWhateverKeyItShows) {
  ASSERT_NO_FATAL_FAILURE(Start({.requests_per_minute = 3}));
  const std::string path = "/v1/token/" + PeerText(7);
  EXPECT_EQ(Get(path, "wrong-key-0123456789").status, 401);
  EXPECT_EQ(Get(path, alice_key_).status, 200);
  EXPECT_EQ(Get(path, alice_key_).status, 200);
  const auto limited = Get(path, alice_key_);
  EXPECT_EQ(limited.status, 429);
  EXPECT_EQ(Get(path, bob_key_).status, 429);  // same address
  EXPECT_EQ(Get(path, bob_key_, "203.0.113.9:5000").status, 200);
  EXPECT_EQ(service_->stats().rate_limited, 2);
}

TEST_F(TokenServiceTest, ReplacedMembersTakeEffectAtTheNextRequest) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  const std::string path = "/v1/token/" + PeerText(7);
  auto [carol_key, carol_hash] = NewMemberKey();
  // Alice goes, Bob becomes a server, Carol comes.
  ASSERT_TRUE(service_
                  ->ReplaceMembers(
                      {{.name = "bob@lab",
                        .role = net::AccessRole::kServe,
                        .key_sha256 = members_[1].key_sha256},
                       {.name = "carol", .role = net::AccessRole::kAny, .key_sha256 = carol_hash}})
                  .ok());
  EXPECT_EQ(service_->member_count(), 2u);
  EXPECT_EQ(Get(path, alice_key_).status, 401);
  EXPECT_EQ(Token(Get(path, bob_key_)).role, net::AccessRole::kServe);
  EXPECT_EQ(Token(Get(path, carol_key)).name, "carol");
  EXPECT_EQ(service_->ReplaceMembers({}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Get(path, carol_key).status, 200);  // a refused replacement changes nothing
}

TEST(MembersWatcher, AChangedFileReplacesTheMembersAndABrokenOneLeavesThem) {
  const test::TempDir dir("members");
  const std::string file = dir.File("members.txt");
  auto [alice_key, alice_hash] = NewMemberKey();
  auto [bob_key, bob_hash] = NewMemberKey();
  const Member alice{.name = "alice", .key_sha256 = alice_hash};
  const Member bob{.name = "bob", .key_sha256 = bob_hash};
  test::WriteFile(file, MemberLine(alice) + "\n" + MemberLine(bob) + "\n");
  auto members = LoadMembers(file);
  ASSERT_TRUE(members.ok());
  auto service = TokenService::Create(Key(1), *members, {});
  ASSERT_TRUE(service.ok());
  MembersWatcher watcher(*service, file, 10ms);
  // (Written whole, as an operator's editor may not: a check between a truncation and the write
  // would count a change of its own.)
  const auto rewrite = [&](const std::string& text) {
    test::WriteFile(file + ".new", text);
    std::filesystem::rename(file + ".new", file);
  };
  const auto next_change = [&](uint64_t seen) {
    return test::WaitUntil([&] { return watcher.changes() > seen; }, test::HangGuard(10s));
  };
  EXPECT_EQ((*service)->member_count(), 2u);
  rewrite(MemberLine(bob) + "\n");
  ASSERT_TRUE(next_change(0));
  EXPECT_EQ((*service)->member_count(), 1u);
  rewrite("bob any " + bob_key + "\n");  // a key where its hash belongs
  ASSERT_TRUE(next_change(1));
  EXPECT_EQ((*service)->member_count(), 1u);
  rewrite(MemberLine(alice) + "\n" + MemberLine(bob) + "\n# two again\n");
  ASSERT_TRUE(next_change(2));
  EXPECT_EQ((*service)->member_count(), 2u);
}

TEST(Members, AFileOfNamesRolesAndHashesLoadsAndMistakesAreNamedByLine) {
  const test::TempDir dir("members");
  auto [key, hash] = NewMemberKey();
  EXPECT_EQ(key.size(), 48u);
  EXPECT_EQ(hash, KeySha256(key));
  // sha256("abc"), as sha256sum prints it.
  EXPECT_EQ(KeySha256("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const Member m{.name = "carol", .role = net::AccessRole::kServe, .key_sha256 = hash};
  test::WriteFile(dir.File("ok.txt"), "# the lab\n\n" + MemberLine(m) + "\r\n  \n");
  auto loaded = LoadMembers(dir.File("ok.txt"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ASSERT_EQ(loaded->size(), 1u);
  EXPECT_EQ((*loaded)[0].name, "carol");
  EXPECT_EQ((*loaded)[0].role, net::AccessRole::kServe);
  EXPECT_EQ((*loaded)[0].key_sha256, hash);

  const std::string h = "sha256:" + hash;
  const std::string other = "sha256:" + NewMemberKey().second;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"dave train " + key + "\n", "never the key itself"},
      {"dave train\n", "three fields"},
      {"dave train " + h + " extra\n", "three fields"},
      {"dave admin " + h + "\n", "role"},
      {"da ve train " + h + "\n", "three fields"},
      {"dave/x train " + h + "\n", "name"},
      {std::string(129, 'd') + " train " + h + "\n", "name"},
      {"dave train sha256:" + std::string(64, 'A') + "\n", "lower-case hex"},
      {"dave train " + h + "\ndave any " + other + "\n", "listed twice"},
      {"dave train " + h + "\nerin any " + h + "\n", "another member's"},
      {"# nobody\n", "no member"},
  };
  for (const auto& [text, why] : bad) {
    test::WriteFile(dir.File("bad.txt"), text);
    auto r = LoadMembers(dir.File("bad.txt"));
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().ToString();
    if (why != "no member") {
      EXPECT_NE(r.status().message().find(" line "), std::string::npos) << r.status().ToString();
    }
  }
  EXPECT_EQ(LoadMembers(dir.File("missing.txt")).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace colony::authority
