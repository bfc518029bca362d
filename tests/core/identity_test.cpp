#include "core/identity.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/base58.h"
#include "test_support.h"

namespace colony {
namespace {

namespace fs = std::filesystem;
using test::ReadFile;
using test::WriteFile;

Bytes FromHex(std::string_view hex) {
  Bytes out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<uint8_t>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

Bytes Seed(uint8_t fill) { return Bytes(32, fill); }

// RFC 8032, section 7.1, TEST 1.
constexpr std::string_view kRfcSeed =
    "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
constexpr std::string_view kRfcPublicKey =
    "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
constexpr std::string_view kRfcSignature =
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b4"
    "6bd25bf5f0595bbe24655141438e7a100b";
// The libp2p text form of kRfcPublicKey, computed independently (Python, big-integer base58).
constexpr std::string_view kRfcPeerId = "12D3KooWQK1wnefoLrcVHbbnf5tLzbopUd3K3bFAoJpA7YJgL5pV";

using colony::test::TempDir;

TEST(KeyPairTest, GenerateSignVerify) {
  KeyPair kp = KeyPair::Generate();
  EXPECT_TRUE(kp.peer_id().valid());
  EXPECT_EQ(kp.peer_id().public_key(), kp.public_key());
  Signature sig = kp.Sign(AsBytes("hello"));
  EXPECT_TRUE(VerifySignature(kp.public_key(), AsBytes("hello"), sig));
  EXPECT_TRUE(kp.peer_id().Verify(AsBytes("hello"), sig));
}

TEST(KeyPairTest, GeneratedKeysDiffer) {
  KeyPair a = KeyPair::Generate();
  KeyPair b = KeyPair::Generate();
  EXPECT_NE(a.peer_id(), b.peer_id());
}

TEST(KeyPairTest, TamperedMessageOrSignatureFails) {
  KeyPair kp = KeyPair::Generate();
  std::string msg = "transfer 10 tokens";
  Signature sig = kp.Sign(AsBytes(msg));
  std::string tampered = msg;
  tampered[9] = '9';
  EXPECT_FALSE(kp.peer_id().Verify(AsBytes(tampered), sig));
  EXPECT_FALSE(kp.peer_id().Verify(AsBytes(msg + " "), sig));
  for (size_t i : {size_t{0}, size_t{31}, size_t{32}, size_t{63}}) {
    Signature bad = sig;
    bad[i] ^= 0x01;
    EXPECT_FALSE(kp.peer_id().Verify(AsBytes(msg), bad)) << "byte " << i;
  }
  // A different key does not verify it either.
  KeyPair other = KeyPair::Generate();
  EXPECT_FALSE(other.peer_id().Verify(AsBytes(msg), sig));
}

// VerifySignature remembers the triples it found valid: checking the same bytes again skips
// Ed25519 (SignatureChecks does not move), while anything that differs in one bit (key,
// signature, message) is checked and refused, and failures are never remembered.
TEST(SignatureCache, OnlyTheExactValidBytesAreRemembered) {
  KeyPair kp = KeyPair::Generate();
  const std::string msg = "a record's value and expiration";
  const Signature sig = kp.Sign(AsBytes(msg));
  auto checks = [](auto&& fn) {
    const uint64_t before = SignatureChecks();
    fn();
    return SignatureChecks() - before;
  };
  EXPECT_EQ(checks([&] { EXPECT_TRUE(VerifySignature(kp.public_key(), AsBytes(msg), sig)); }), 1u);
  EXPECT_EQ(checks([&] { EXPECT_TRUE(VerifySignature(kp.public_key(), AsBytes(msg), sig)); }), 0u)
      << "the same valid bytes were checked twice";
  for (size_t bit = 0; bit < msg.size() * 8; bit += 3) {
    std::string bad = msg;
    bad[bit / 8] = static_cast<char>(bad[bit / 8] ^ (1 << (bit % 8)));
    EXPECT_EQ(checks([&] { EXPECT_FALSE(VerifySignature(kp.public_key(), AsBytes(bad), sig)); }),
              1u)
        << "message bit " << bit;
  }
  for (size_t bit = 0; bit < sig.size() * 8; bit += 5) {
    Signature bad = sig;
    bad[bit / 8] ^= static_cast<uint8_t>(1 << (bit % 8));
    EXPECT_EQ(checks([&] { EXPECT_FALSE(VerifySignature(kp.public_key(), AsBytes(msg), bad)); }),
              1u)
        << "signature bit " << bit;
  }
  PublicKey other = kp.public_key();
  other[0] ^= 0x01;
  EXPECT_FALSE(VerifySignature(other, AsBytes(msg), sig));
  EXPECT_FALSE(VerifySignature(KeyPair::Generate().public_key(), AsBytes(msg), sig));
  // A shorter or longer message is another message.
  EXPECT_FALSE(VerifySignature(kp.public_key(), AsBytes(msg.substr(1)), sig));
  EXPECT_FALSE(VerifySignature(kp.public_key(), AsBytes(msg + "x"), sig));
  // A failure is checked every time.
  Signature bad = sig;
  bad[9] ^= 0x40;
  EXPECT_EQ(checks([&] {
              EXPECT_FALSE(VerifySignature(kp.public_key(), AsBytes(msg), bad));
              EXPECT_FALSE(VerifySignature(kp.public_key(), AsBytes(msg), bad));
            }),
            2u);
  // After more valid signatures than the cache holds, the first is still valid (checked again
  // if it was evicted), and the original stays true from four threads at once.
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      KeyPair mine = KeyPair::Generate();
      for (int i = 0; i < 1500; ++i) {
        const std::string m = "t" + std::to_string(t) + " m" + std::to_string(i);
        const Signature ms = mine.Sign(AsBytes(m));
        if (!VerifySignature(mine.public_key(), AsBytes(m), ms)) ++wrong;
        if (VerifySignature(mine.public_key(), AsBytes(m + "!"), ms)) ++wrong;
        if (!VerifySignature(kp.public_key(), AsBytes(msg), sig)) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_TRUE(VerifySignature(kp.public_key(), AsBytes(msg), sig));
  // Messages over 4 KiB are checked every time (hashing them is most of their check).
  const std::string big(5000, 'b');
  const Signature big_sig = kp.Sign(AsBytes(big));
  EXPECT_EQ(checks([&] {
              EXPECT_TRUE(VerifySignature(kp.public_key(), AsBytes(big), big_sig));
              EXPECT_TRUE(VerifySignature(kp.public_key(), AsBytes(big), big_sig));
            }),
            2u);
}

TEST(KeyPairTest, InvalidPeerIdNeverVerifies) {
  KeyPair kp = KeyPair::Generate();
  Signature sig = kp.Sign(AsBytes("x"));
  PeerId none;
  EXPECT_FALSE(none.valid());
  EXPECT_FALSE(none.Verify(AsBytes("x"), sig));
}

TEST(KeyPairTest, EmptyMessage) {
  KeyPair kp = KeyPair::Generate();
  Signature sig = kp.Sign(ByteSpan());
  EXPECT_TRUE(kp.peer_id().Verify(ByteSpan(), sig));
  EXPECT_FALSE(kp.peer_id().Verify(AsBytes("a"), sig));
}

TEST(KeyPairTest, FromSeedIsDeterministic) {
  KeyPair a = KeyPair::FromSeed(Seed(7));
  KeyPair b = KeyPair::FromSeed(Seed(7));
  KeyPair c = KeyPair::FromSeed(Seed(8));
  EXPECT_EQ(a.peer_id(), b.peer_id());
  EXPECT_EQ(a.public_key(), b.public_key());
  EXPECT_NE(a.peer_id(), c.peer_id());
  // Ed25519 signatures are deterministic too.
  EXPECT_EQ(a.Sign(AsBytes("m")), b.Sign(AsBytes("m")));
}

TEST(KeyPairTest, FromSeedMatchesRfc8032) {
  KeyPair kp = KeyPair::FromSeed(FromHex(kRfcSeed));
  EXPECT_EQ(HexEncode(kp.public_key()), kRfcPublicKey);
  Signature sig = kp.Sign(ByteSpan());
  EXPECT_EQ(HexEncode(sig), kRfcSignature);
  EXPECT_EQ(kp.peer_id().ToString(), kRfcPeerId);
}

TEST(KeyPairTest, FromSeedRejectsWrongSize) {
  EXPECT_THROW(KeyPair::FromSeed(Bytes(31, 1)), std::invalid_argument);
  EXPECT_THROW(KeyPair::FromSeed(Bytes(33, 1)), std::invalid_argument);
}

TEST(KeyPairTest, MoveKeepsTheIdentity) {
  KeyPair a = KeyPair::FromSeed(Seed(3));
  PeerId id = a.peer_id();
  KeyPair b = std::move(a);
  EXPECT_EQ(b.peer_id(), id);
  EXPECT_TRUE(id.Verify(AsBytes("m"), b.Sign(AsBytes("m"))));
  KeyPair c = KeyPair::FromSeed(Seed(4));
  c = std::move(b);
  EXPECT_EQ(c.peer_id(), id);
  EXPECT_TRUE(id.Verify(AsBytes("m"), c.Sign(AsBytes("m"))));
}

TEST(PeerIdTest, TextFormIsLibp2pEd25519) {
  for (int i = 0; i < 20; ++i) {
    KeyPair kp = KeyPair::Generate();
    std::string text = kp.peer_id().ToString();
    EXPECT_EQ(text.rfind("12D3KooW", 0), 0u) << text;
    EXPECT_EQ(text.size(), 52u) << text;
  }
}

TEST(PeerIdTest, ExtremeKeysStillStartWithThePrefix) {
  PublicKey zero{};
  PublicKey ff;
  ff.fill(0xff);
  EXPECT_EQ(PeerId::FromPublicKey(zero).ToString(),
            "12D3KooW9pNAk8aiBuGVQtWRdbkLmo5qVL3e2h5UxbN2Nz9ttwiw");
  EXPECT_EQ(PeerId::FromPublicKey(ff).ToString(),
            "12D3KooWT3gYEvLJyx1FyyHqrmvdy1tMjpgxmu9aSeKMEuafQtyC");
}

TEST(PeerIdTest, ParseRoundTrip) {
  for (int i = 0; i < 20; ++i) {
    KeyPair kp = KeyPair::Generate();
    auto parsed = PeerId::Parse(kp.peer_id().ToString());
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_TRUE(parsed->valid());
    EXPECT_EQ(*parsed, kp.peer_id());
    EXPECT_EQ(parsed->public_key(), kp.public_key());
  }
  auto rfc = PeerId::Parse(kRfcPeerId);
  ASSERT_TRUE(rfc.ok());
  EXPECT_EQ(HexEncode(rfc->public_key()), kRfcPublicKey);
}

TEST(PeerIdTest, ParsedIdVerifiesSignatures) {
  // The whole point of identity multihashes: the key comes back out of the text.
  KeyPair kp = KeyPair::Generate();
  Signature sig = kp.Sign(AsBytes("hello"));
  auto parsed = PeerId::Parse(kp.peer_id().ToString());
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->Verify(AsBytes("hello"), sig));
}

TEST(PeerIdTest, BytesRoundTrip) {
  KeyPair kp = KeyPair::Generate();
  Bytes bytes = kp.peer_id().ToBytes();
  ASSERT_EQ(bytes.size(), 38u);
  EXPECT_EQ(HexEncode(ByteSpan(bytes).first(6)), "002408011220");
  auto back = PeerId::FromBytes(bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, kp.peer_id());
  EXPECT_EQ(Base58Encode(bytes), kp.peer_id().ToString());
}

TEST(PeerIdTest, ParseRejectsEmpty) {
  auto r = PeerId::Parse("");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("empty"), std::string::npos);
}

TEST(PeerIdTest, ParseRejectsNonBase58) {
  auto r = PeerId::Parse("12D3KooW0000");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("12D3KooW0000"), std::string::npos) << m;  // names the input
  EXPECT_NE(m.find("base58"), std::string::npos) << m;
  EXPECT_NE(m.find("'0'"), std::string::npos) << m;
  EXPECT_NE(m.find("position 8"), std::string::npos) << m;
}

TEST(PeerIdTest, ParseRejectsJunkThatIsBase58) {
  for (std::string_view junk : {"abc", "12D3KooW", "1111", "2g"}) {
    auto r = PeerId::Parse(junk);
    ASSERT_FALSE(r.ok()) << junk;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("Ed25519"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(std::string(junk)), std::string::npos)
        << r.status().message();
  }
}

TEST(PeerIdTest, ParseRejectsTruncatedAndExtendedIds) {
  std::string text = KeyPair::Generate().peer_id().ToString();
  EXPECT_FALSE(PeerId::Parse(text.substr(0, text.size() - 1)).ok());
  EXPECT_FALSE(PeerId::Parse(text + "2").ok());
  EXPECT_FALSE(PeerId::Parse(text + " ").ok());
  EXPECT_FALSE(PeerId::Parse(" " + text).ok());
}

TEST(PeerIdTest, ParseRejectsSha256IdsWithAnExplanation) {
  auto r = PeerId::Parse("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("SHA-256"), std::string::npos) << m;
  EXPECT_NE(m.find("12D3KooW"), std::string::npos) << m;
}

TEST(PeerIdTest, FromBytesRejectsWrongLengths) {
  Bytes good = KeyPair::Generate().peer_id().ToBytes();
  for (size_t len : {size_t{0}, size_t{1}, size_t{6}, size_t{32}, size_t{37}, size_t{39}}) {
    Bytes b = good;
    b.resize(len, 0);
    auto r = PeerId::FromBytes(b);
    ASSERT_FALSE(r.ok()) << len;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(std::to_string(len) + " bytes"), std::string::npos)
        << r.status().message();
  }
}

TEST(PeerIdTest, FromBytesRejectsWrongPrefix) {
  Bytes good = KeyPair::Generate().peer_id().ToBytes();
  for (size_t i = 0; i < 6; ++i) {
    Bytes b = good;
    b[i] ^= 0x40;
    EXPECT_FALSE(PeerId::FromBytes(b).ok()) << "byte " << i;
  }
  // A raw sha256 multihash of the right shape gets the specific message.
  Bytes sha(34, 0xab);
  sha[0] = 0x12;
  sha[1] = 0x20;
  auto r = PeerId::FromBytes(sha);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("SHA-256"), std::string::npos);
}

TEST(PeerIdTest, DefaultIsInvalid) {
  PeerId id;
  EXPECT_FALSE(id.valid());
  EXPECT_EQ(id.public_key(), PublicKey{});
}

TEST(PeerIdTest, ShortIsASuffixOfTheText) {
  PeerId id = KeyPair::Generate().peer_id();
  std::string s = id.Short();
  std::string text = id.ToString();
  const std::string ellipsis = "…";
  ASSERT_EQ(s.rfind(ellipsis, 0), 0u) << s;
  std::string tail = s.substr(ellipsis.size());
  EXPECT_FALSE(tail.empty());
  EXPECT_LT(tail.size(), text.size());
  EXPECT_EQ(text.substr(text.size() - tail.size()), tail);
}

TEST(PeerIdTest, UsableInHashAndOrderedContainers) {
  std::vector<PeerId> ids;
  for (int i = 0; i < 50; ++i) {
    ids.push_back(KeyPair::FromSeed(Seed(static_cast<uint8_t>(i))).peer_id());
  }
  std::unordered_set<PeerId> hashed(ids.begin(), ids.end());
  std::set<PeerId> ordered(ids.begin(), ids.end());
  EXPECT_EQ(hashed.size(), 50u);
  EXPECT_EQ(ordered.size(), 50u);
  // Duplicates collapse, including ids obtained by parsing.
  for (const auto& id : ids) {
    auto parsed = PeerId::Parse(id.ToString());
    ASSERT_TRUE(parsed.ok());
    EXPECT_FALSE(hashed.insert(*parsed).second);
    EXPECT_FALSE(ordered.insert(*parsed).second);
    EXPECT_EQ(std::hash<PeerId>{}(*parsed), std::hash<PeerId>{}(id));
  }
  // The order is a strict weak order consistent with ==.
  PeerId prev;
  bool first = true;
  for (const auto& id : ordered) {
    if (!first) {
      EXPECT_TRUE(prev < id);
      EXPECT_FALSE(id < prev);
      EXPECT_NE(prev, id);
    }
    prev = id;
    first = false;
  }
}

TEST(KeyFileTest, SaveWritesMode0600) {
  TempDir dir;
  std::string path = dir.File("id.key");
  mode_t old = ::umask(0);  // the file must be private even with a permissive umask
  Status st = KeyPair::Generate().Save(path);
  ::umask(old);
  ASSERT_TRUE(st.ok()) << st.ToString();
  struct stat sb {};
  ASSERT_EQ(::stat(path.c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0600u);
}

TEST(KeyFileTest, SaveRefusesToOverwriteUnlessAsked) {
  TempDir dir;
  std::string path = dir.File("id.key");
  KeyPair first = KeyPair::FromSeed(Seed(1));
  KeyPair second = KeyPair::FromSeed(Seed(2));
  ASSERT_TRUE(first.Save(path).ok());
  std::string before = ReadFile(path);

  Status st = second.Save(path);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
  EXPECT_EQ(ReadFile(path), before);  // untouched

  ASSERT_TRUE(second.Save(path, /*overwrite=*/true).ok());
  auto loaded = KeyPair::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->peer_id(), second.peer_id());
}

TEST(KeyFileTest, OverwriteTightensThePermissionsOfAnExistingFile) {
  TempDir dir;
  std::string path = dir.File("id.key");
  WriteFile(path,
            "old contents that are much longer than the new key file ....................."
            "................................................................................"
            "................................................................................");
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  KeyPair kp = KeyPair::Generate();
  ASSERT_TRUE(kp.Save(path, /*overwrite=*/true).ok());
  struct stat sb {};
  ASSERT_EQ(::stat(path.c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0600u);
  auto loaded = KeyPair::Load(path);  // the old, longer contents were truncated
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->peer_id(), kp.peer_id());
}

TEST(KeyFileTest, SaveIntoMissingDirectoryFails) {
  TempDir dir;
  std::string path = dir.File("no/such/dir/id.key");
  Status st = KeyPair::Generate().Save(path);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
}

TEST(KeyFileTest, LoadRoundTrip) {
  TempDir dir;
  std::string path = dir.File("id.key");
  KeyPair kp = KeyPair::Generate();
  ASSERT_TRUE(kp.Save(path).ok());
  std::string text = ReadFile(path);
  EXPECT_NE(text.find("peer_id: " + kp.peer_id().ToString() + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("ed25519_seed: "), std::string::npos) << text;

  auto loaded = KeyPair::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->peer_id(), kp.peer_id());
  EXPECT_EQ(loaded->public_key(), kp.public_key());
  // Same secret key: same (deterministic) signature.
  EXPECT_EQ(loaded->Sign(AsBytes("m")), kp.Sign(AsBytes("m")));
}

TEST(KeyFileTest, LoadAcceptsHandWrittenVariants) {
  TempDir dir;
  std::string path = dir.File("id.key");
  // CRLF line ends, blank lines, extra spaces, upper-case hex, comments, unknown fields, and no
  // peer_id line.
  std::string seed_hex(kRfcSeed);
  for (auto& c : seed_hex) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  WriteFile(path, "# comment\r\n\r\n  \t\r\nnote: hello\r\ned25519_seed:   " + seed_hex + "  \r\n");
  auto loaded = KeyPair::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->peer_id().ToString(), kRfcPeerId);
}

TEST(KeyFileTest, LoadMissingFileNamesThePath) {
  TempDir dir;
  std::string path = dir.File("missing.key");
  auto r = KeyPair::Load(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
}

void ExpectLoadError(const std::string& path, const std::string& contents,
                     std::string_view expected_fragment) {
  WriteFile(path, contents);
  auto r = KeyPair::Load(path);
  ASSERT_FALSE(r.ok()) << contents;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find(path), std::string::npos) << m;
  EXPECT_NE(m.find(expected_fragment), std::string::npos) << m;
}

TEST(KeyFileTest, LoadCorruptedSeed) {
  TempDir dir;
  std::string path = dir.File("id.key");
  std::string seed(kRfcSeed);
  ExpectLoadError(path, "ed25519_seed: " + seed.substr(0, 62) + "\n", "ed25519_seed");
  ExpectLoadError(path, "ed25519_seed: " + seed + "00\n", "ed25519_seed");
  ExpectLoadError(path, "ed25519_seed: " + seed.substr(0, 63) + "g\n", "not hexadecimal");
  ExpectLoadError(path, "", "ed25519_seed");
  ExpectLoadError(path, "peer_id: " + std::string(kRfcPeerId) + "\n", "ed25519_seed");
  ExpectLoadError(path, "this line has no colon\n", "line 1");
}

TEST(KeyFileTest, LoadMismatchedPeerId) {
  TempDir dir;
  std::string path = dir.File("id.key");
  KeyPair other = KeyPair::FromSeed(Seed(9));
  ExpectLoadError(
      path,
      "peer_id: " + other.peer_id().ToString() + "\ned25519_seed: " + std::string(kRfcSeed) + "\n",
      "does not match");
}

TEST(KeyFileTest, LoadDetectsAFlippedSeedDigit) {
  TempDir dir;
  std::string path = dir.File("id.key");
  KeyPair kp = KeyPair::FromSeed(FromHex(kRfcSeed));
  ASSERT_TRUE(kp.Save(path).ok());
  std::string text = ReadFile(path);
  size_t pos = text.find("ed25519_seed: ") + 14;
  text[pos] = text[pos] == '0' ? '1' : '0';
  ExpectLoadError(path, text, "does not match");
}

}  // namespace
}  // namespace colony
