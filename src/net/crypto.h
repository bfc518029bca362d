// Cryptographic building blocks of the secure channel (internal to net).
//   - X25519 ephemeral key agreement (libsodium)
//   - key derivation with keyed BLAKE2b (libsodium)
//   - AES-256-GCM record protection (OpenSSL EVP, using AES-NI where present)
#pragma once

#include <openssl/evp.h>

#include <array>
#include <cstdint>
#include <memory>

#include "core/bytes.h"
#include "core/status.h"

namespace colony::net {

using Key32 = std::array<uint8_t, 32>;

struct EphemeralKeyPair {
  Key32 public_key;
  Key32 secret_key;
  static EphemeralKeyPair Generate();
  ~EphemeralKeyPair();
};

// X25519(secret, peer_public). Fails for low-order peer keys (all-zero shared secret).
Result<Key32> KeyAgreement(const Key32& secret_key, ByteSpan peer_public_key);

// BLAKE2b-256 of the concatenation of `parts`.
Key32 Hash256(std::initializer_list<ByteSpan> parts);

// Derives the two directional record keys from the shared secret and the transcript hash.
struct SessionKeys {
  Key32 initiator_to_responder;
  Key32 responder_to_initiator;
};
SessionKeys DeriveSessionKeys(const Key32& shared_secret, const Key32& transcript);

// Protects outgoing records of one direction. Nonce = 64-bit record counter, so every record of a
// connection is sealed under a distinct nonce and the receiver detects replay or reordering.
//
//   Begin(n, out) appends the 4-byte length prefix (n + tag) to `out`;
//   Update(bytes, out) appends the ciphertext of the next plaintext bytes;
//   Finish(out) appends the tag. The plaintext given to Update must total exactly n bytes.
class RecordSealer {
 public:
  explicit RecordSealer(const Key32& key);
  ~RecordSealer();
  RecordSealer(const RecordSealer&) = delete;
  RecordSealer& operator=(const RecordSealer&) = delete;

  void Begin(size_t plaintext_length, RawBuffer& out);
  void Update(ByteSpan plaintext, RawBuffer& out);
  void Finish(RawBuffer& out);
  uint64_t records() const { return counter_; }

 private:
  EVP_CIPHER_CTX* ctx_;
  uint64_t counter_ = 0;
  size_t expected_ = 0, seen_ = 0;
};

// Checks and decrypts incoming records of one direction, in order.
class RecordOpener {
 public:
  explicit RecordOpener(const Key32& key);
  ~RecordOpener();
  RecordOpener(const RecordOpener&) = delete;
  RecordOpener& operator=(const RecordOpener&) = delete;

  // `length_prefix` is the record's 4 length bytes; `sealed` holds ciphertext || tag. Decrypts in
  // place: on success the first sealed.size() - 16 bytes of `sealed` hold the plaintext.
  // DataLoss when authentication fails (corrupted, forged, replayed or reordered record).
  Status Open(ByteSpan length_prefix, MutableByteSpan sealed);

  // The same in steps, for decrypting parts of a record to different places (e.g. a frame
  // header into scratch space and its payload straight into the message it belongs to):
  // OpenBegin, then OpenUpdate over consecutive ciphertext ranges that together cover
  // `ciphertext_length` bytes, then OpenFinish with the tag. Nothing decrypted may be acted on
  // before OpenFinish succeeds.
  void OpenBegin(ByteSpan length_prefix);
  void OpenUpdate(ByteSpan ciphertext, uint8_t* plaintext_out);
  Status OpenFinish(ByteSpan tag);
  uint64_t records() const { return counter_; }

 private:
  EVP_CIPHER_CTX* ctx_;
  uint64_t counter_ = 0;
  bool open_ok_ = false;
};

}  // namespace colony::net
