// Peer identity: an Ed25519 key pair and the PeerId derived from its public key.
//
// PeerIds follow libp2p's format for Ed25519 keys: the identity multihash of the protobuf-encoded
// public key, printed in base58 — so they read "12D3KooW…" like those of hivemind's swarms. The
// public key can be recovered from the id itself, so a peer's signature can be checked from its id.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>

#include "core/bytes.h"
#include "core/status.h"

namespace colony {

inline constexpr size_t kPublicKeySize = 32;
inline constexpr size_t kSignatureSize = 64;
using PublicKey = std::array<uint8_t, kPublicKeySize>;
using Signature = std::array<uint8_t, kSignatureSize>;

// Checks an Ed25519 signature made by `key` over `message`. The exact triples found valid are
// remembered (a bounded cache of their digests; messages up to 4 KiB), so the same record
// checked again, as the DHT does with every replica's copy, costs a hash instead of a check.
bool VerifySignature(const PublicKey& key, ByteSpan message, const Signature& signature);
// Ed25519 checks this process has made (VerifySignature calls the cache did not answer): the
// costly part of validating remote records, for tests and metrics that bound it.
uint64_t SignatureChecks();

class PeerId {
 public:
  PeerId() = default;  // the all-zero id; valid() is false
  static PeerId FromPublicKey(const PublicKey& key);
  // Parses the base58 text form; errors say what is wrong ("not base58", "not an Ed25519 id").
  static Result<PeerId> Parse(std::string_view text);
  // Parses the binary (multihash) form, as carried in wire messages.
  static Result<PeerId> FromBytes(ByteSpan bytes);

  bool valid() const { return valid_; }
  const PublicKey& public_key() const { return key_; }
  // Binary multihash form (38 bytes).
  Bytes ToBytes() const;
  // Base58 text form: "12D3KooW…".
  std::string ToString() const;
  // The last 6 characters of the text form, for logs: "…Wabc12".
  std::string Short() const;

  bool Verify(ByteSpan message, const Signature& signature) const {
    return valid_ && VerifySignature(key_, message, signature);
  }

  friend bool operator==(const PeerId& a, const PeerId& b) { return a.key_ == b.key_; }
  friend auto operator<=>(const PeerId& a, const PeerId& b) { return a.key_ <=> b.key_; }

 private:
  PublicKey key_{};
  bool valid_ = false;
};

// An Ed25519 key pair. Movable, not copyable; the secret key is wiped on destruction.
class KeyPair {
 public:
  // A fresh random key pair.
  static KeyPair Generate();
  // Deterministic key pair from a 32-byte seed (tests, reproducible swarms).
  static KeyPair FromSeed(ByteSpan seed32);

  // Loads a key file written by Save(). Errors name the file and what is wrong with it.
  static Result<KeyPair> Load(const std::string& path);
  // Writes the key file with mode 0600. Refuses to overwrite an existing file unless `overwrite`.
  Status Save(const std::string& path, bool overwrite = false) const;

  KeyPair(KeyPair&& other) noexcept;
  KeyPair& operator=(KeyPair&& other) noexcept;
  KeyPair(const KeyPair&) = delete;
  KeyPair& operator=(const KeyPair&) = delete;
  ~KeyPair();

  const PublicKey& public_key() const { return public_key_; }
  const PeerId& peer_id() const { return peer_id_; }
  Signature Sign(ByteSpan message) const;

 private:
  KeyPair() = default;
  std::array<uint8_t, 64> secret_key_{};  // libsodium layout: seed || public key
  PublicKey public_key_{};
  PeerId peer_id_;
};

}  // namespace colony

template <>
struct std::hash<colony::PeerId> {
  size_t operator()(const colony::PeerId& id) const noexcept {
    size_t h;
    std::memcpy(&h, id.public_key().data(), sizeof(h));  // keys are uniformly random
    return h;
  }
};
