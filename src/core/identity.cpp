#include "core/identity.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "core/base58.h"

namespace colony {
namespace {

// identity multihash (code 0x00, length 36) of protobuf PublicKey{Type: Ed25519 (1), Data: key}.
constexpr uint8_t kPeerIdPrefix[] = {0x00, 0x24, 0x08, 0x01, 0x12, 0x20};
constexpr size_t kPeerIdBytes = sizeof(kPeerIdPrefix) + kPublicKeySize;

void EnsureSodium() {
  static const int rc = sodium_init();
  if (rc < 0) throw std::runtime_error("libsodium failed to initialise");
}

std::string ErrnoText() { return std::strerror(errno); }

}  // namespace

namespace {
std::atomic<uint64_t> g_signature_checks{0};

// Signatures this process has found valid, by a BLAKE2b-256 digest of key || signature ||
// message (the first two have fixed sizes, so the concatenation is unambiguous). The same signed
// record reaches a DHT node in the reply of every replica that holds it and is validated again
// after the replies are merged; a hit costs a digest (well under a microsecond for a record)
// instead of an Ed25519 check (~50 us). Only successful checks are added, so a hit means these
// exact bytes verified before. Direct-mapped and fixed-size (128 KiB): a peer sending many
// valid records can only evict entries, which costs checks again, never memory. Messages over
// kMaxMessage bytes are left out: their check is mostly hashing the message, which the digest
// would repeat.
class ValidSignatures {
 public:
  static constexpr size_t kMaxMessage = 4096;
  using Digest = std::array<uint8_t, crypto_generichash_BYTES>;
  static Digest Of(const PublicKey& key, ByteSpan message, const Signature& signature) {
    crypto_generichash_state state;
    crypto_generichash_init(&state, nullptr, 0, crypto_generichash_BYTES);
    crypto_generichash_update(&state, key.data(), key.size());
    crypto_generichash_update(&state, signature.data(), signature.size());
    crypto_generichash_update(&state, message.data(), message.size());
    Digest d;
    crypto_generichash_final(&state, d.data(), d.size());
    return d;
  }
  bool Contains(const Digest& d) {
    std::lock_guard lock(mu_);
    const Slot& slot = slots_[SlotOf(d)];
    return slot.used && slot.digest == d;
  }
  void Add(const Digest& d) {
    std::lock_guard lock(mu_);
    slots_[SlotOf(d)] = {true, d};
  }

 private:
  static constexpr size_t kSlots = 4096;
  struct Slot {
    bool used = false;
    Digest digest{};
  };
  static size_t SlotOf(const Digest& d) { return (d[0] | (size_t{d[1]} << 8)) % kSlots; }
  std::mutex mu_;
  std::array<Slot, kSlots> slots_{};
};

ValidSignatures& Valid() {
  static ValidSignatures* valid = new ValidSignatures();  // never destroyed: used at exit too
  return *valid;
}
}  // namespace

uint64_t SignatureChecks() { return g_signature_checks.load(std::memory_order_relaxed); }

bool VerifySignature(const PublicKey& key, ByteSpan message, const Signature& signature) {
  EnsureSodium();
  const bool cached = message.size() <= ValidSignatures::kMaxMessage;
  ValidSignatures::Digest digest{};
  if (cached) {
    digest = ValidSignatures::Of(key, message, signature);
    if (Valid().Contains(digest)) return true;
  }
  g_signature_checks.fetch_add(1, std::memory_order_relaxed);
  const bool ok = crypto_sign_verify_detached(signature.data(), message.data(), message.size(),
                                              key.data()) == 0;
  if (ok && cached) Valid().Add(digest);
  return ok;
}

PeerId PeerId::FromPublicKey(const PublicKey& key) {
  PeerId id;
  id.key_ = key;
  id.valid_ = true;
  return id;
}

Result<PeerId> PeerId::FromBytes(ByteSpan bytes) {
  if (bytes.size() != kPeerIdBytes ||
      std::memcmp(bytes.data(), kPeerIdPrefix, sizeof(kPeerIdPrefix)) != 0) {
    if (bytes.size() == 34 && bytes[0] == 0x12 && bytes[1] == 0x20) {
      return InvalidArgument(
          "peer id is a SHA-256 multihash (\"Qm…\", e.g. an RSA key); Colony peers use Ed25519 "
          "ids that start with \"12D3KooW\"");
    }
    return InvalidArgument("peer id is not an Ed25519 identity multihash (" +
                           std::to_string(bytes.size()) + " bytes; expected " +
                           std::to_string(kPeerIdBytes) + " starting 00 24 08 01 12 20)");
  }
  PublicKey key;
  std::memcpy(key.data(), bytes.data() + sizeof(kPeerIdPrefix), kPublicKeySize);
  return FromPublicKey(key);
}

Result<PeerId> PeerId::Parse(std::string_view text) {
  if (text.empty()) return InvalidArgument("peer id is empty");
  auto bytes = Base58Decode(text);
  if (!bytes.ok()) return bytes.status().WithContext("peer id '" + std::string(text) + "'");
  auto id = FromBytes(*bytes);
  if (!id.ok()) return id.status().WithContext("peer id '" + std::string(text) + "'");
  return id;
}

Bytes PeerId::ToBytes() const {
  // Sized up front and filled with memcpy: g++ 12 at -O2 reports a false -Wstringop-overread on
  // the grow-then-insert version.
  Bytes out(kPeerIdBytes);
  std::memcpy(out.data(), kPeerIdPrefix, sizeof(kPeerIdPrefix));
  std::memcpy(out.data() + sizeof(kPeerIdPrefix), key_.data(), key_.size());
  return out;
}

std::string PeerId::ToString() const { return Base58Encode(ToBytes()); }

std::string PeerId::Short() const {
  std::string s = ToString();
  return "…" + s.substr(s.size() > 6 ? s.size() - 6 : 0);
}

KeyPair KeyPair::Generate() {
  EnsureSodium();
  KeyPair kp;
  crypto_sign_keypair(kp.public_key_.data(), kp.secret_key_.data());
  kp.peer_id_ = PeerId::FromPublicKey(kp.public_key_);
  return kp;
}

KeyPair KeyPair::FromSeed(ByteSpan seed32) {
  EnsureSodium();
  if (seed32.size() != crypto_sign_SEEDBYTES) throw std::invalid_argument("seed must be 32 bytes");
  KeyPair kp;
  crypto_sign_seed_keypair(kp.public_key_.data(), kp.secret_key_.data(), seed32.data());
  kp.peer_id_ = PeerId::FromPublicKey(kp.public_key_);
  return kp;
}

KeyPair::KeyPair(KeyPair&& other) noexcept
    : secret_key_(other.secret_key_), public_key_(other.public_key_), peer_id_(other.peer_id_) {
  sodium_memzero(other.secret_key_.data(), other.secret_key_.size());
}

KeyPair& KeyPair::operator=(KeyPair&& other) noexcept {
  if (this != &other) {
    secret_key_ = other.secret_key_;
    public_key_ = other.public_key_;
    peer_id_ = other.peer_id_;
    sodium_memzero(other.secret_key_.data(), other.secret_key_.size());
  }
  return *this;
}

KeyPair::~KeyPair() { sodium_memzero(secret_key_.data(), secret_key_.size()); }

Signature KeyPair::Sign(ByteSpan message) const {
  Signature sig;
  crypto_sign_detached(sig.data(), nullptr, message.data(), message.size(), secret_key_.data());
  return sig;
}

// Key file format (text, mode 0600):
//   # Colony identity (Ed25519 private key). Keep this file secret.
//   peer_id: 12D3KooW…
//   ed25519_seed: <64 hex digits>
Status KeyPair::Save(const std::string& path, bool overwrite) const {
  std::ostringstream text;
  text << "# Colony identity (Ed25519 private key). Keep this file secret.\n";
  text << "peer_id: " << peer_id_.ToString() << "\n";
  text << "ed25519_seed: " << HexEncode(ByteSpan(secret_key_.data(), crypto_sign_SEEDBYTES))
       << "\n";
  std::string data = text.str();

  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (overwrite ? O_TRUNC : O_EXCL);
  int fd = ::open(path.c_str(), flags, 0600);
  if (fd < 0) {
    if (errno == EEXIST) {
      return {StatusCode::kAlreadyExists,
              "identity file " + path + " already exists; choose another path or delete it first"};
    }
    return Unavailable("cannot create identity file " + path + ": " + ErrnoText());
  }
  // O_CREAT's mode does not apply to an existing file being overwritten; enforce it.
  if (::fchmod(fd, 0600) != 0) {
    Status st = Unavailable("cannot set mode 0600 on " + path + ": " + ErrnoText());
    ::close(fd);
    return st;
  }
  size_t written = 0;
  while (written < data.size()) {
    ssize_t n = ::write(fd, data.data() + written, data.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      Status st = Unavailable("cannot write identity file " + path + ": " + ErrnoText());
      ::close(fd);
      return st;
    }
    written += static_cast<size_t>(n);
  }
  // Close even when fsync fails; report the first error.
  Status st;
  if (::fsync(fd) != 0) {
    st = Unavailable("cannot write identity file " + path + ": " + ErrnoText());
  }
  if (::close(fd) != 0 && st.ok()) {
    st = Unavailable("cannot write identity file " + path + ": " + ErrnoText());
  }
  return st;
}

Result<KeyPair> KeyPair::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return NotFound("cannot open identity file " + path + ": " + ErrnoText() +
                    "; create one with 'colony identity new --out " + path + "'");
  }
  std::string line, peer_id_text, seed_hex;
  int lineno = 0;
  while (std::getline(in, line) && lineno < 100) {
    ++lineno;
    // Tolerate CRLF files and blank lines made of whitespace (hand-edited files).
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) {
      line.pop_back();
    }
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    line.erase(0, start);
    auto colon = line.find(':');
    if (colon == std::string::npos) {
      return InvalidArgument("identity file " + path + " line " + std::to_string(lineno) +
                             ": expected 'name: value'");
    }
    std::string name = line.substr(0, colon);
    std::string value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.erase(0, 1);
    if (name == "peer_id")
      peer_id_text = value;
    else if (name == "ed25519_seed")
      seed_hex = value;
  }
  if (seed_hex.size() != 64) {
    return InvalidArgument("identity file " + path +
                           " has no valid 'ed25519_seed:' line (64 hex digits expected)");
  }
  uint8_t seed[32];
  for (size_t i = 0; i < 32; ++i) {
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    int hi = hex(seed_hex[2 * i]), lo = hex(seed_hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return InvalidArgument("identity file " + path + ": 'ed25519_seed' is not hexadecimal");
    }
    seed[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  KeyPair kp = FromSeed(ByteSpan(seed, 32));
  sodium_memzero(seed, sizeof(seed));
  if (!peer_id_text.empty() && peer_id_text != kp.peer_id().ToString()) {
    return InvalidArgument("identity file " + path + ": peer_id " + peer_id_text +
                           " does not match the key (which gives " + kp.peer_id().ToString() +
                           "); the file is corrupted");
  }
  return kp;
}

}  // namespace colony
