#include "net/crypto.h"

#include <sodium.h>

#include <cstring>
#include <stdexcept>

#include "net/wire.h"

namespace colony::net {
namespace {

void EnsureSodium() {
  static const int rc = sodium_init();
  if (rc < 0) throw std::runtime_error("libsodium failed to initialise");
}

std::array<uint8_t, 12> NonceFor(uint64_t counter) {
  std::array<uint8_t, 12> iv{};
  for (int i = 0; i < 8; ++i) iv[4 + i] = static_cast<uint8_t>(counter >> (8 * i));
  return iv;
}

void Check(int ok, const char* what) {
  if (ok != 1) throw std::runtime_error(std::string("OpenSSL AES-GCM failure in ") + what);
}

}  // namespace

EphemeralKeyPair EphemeralKeyPair::Generate() {
  EnsureSodium();
  EphemeralKeyPair kp;
  randombytes_buf(kp.secret_key.data(), kp.secret_key.size());
  crypto_scalarmult_base(kp.public_key.data(), kp.secret_key.data());
  return kp;
}

EphemeralKeyPair::~EphemeralKeyPair() { sodium_memzero(secret_key.data(), secret_key.size()); }

Result<Key32> KeyAgreement(const Key32& secret_key, ByteSpan peer_public_key) {
  EnsureSodium();
  if (peer_public_key.size() != 32) {
    return ProtocolError("ephemeral key is " + std::to_string(peer_public_key.size()) +
                         " bytes; expected 32");
  }
  Key32 shared;
  if (crypto_scalarmult(shared.data(), secret_key.data(), peer_public_key.data()) != 0) {
    return ProtocolError("peer sent a low-order ephemeral key");
  }
  return shared;
}

Key32 Hash256(std::initializer_list<ByteSpan> parts) {
  EnsureSodium();
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, 32);
  for (ByteSpan p : parts) crypto_generichash_update(&st, p.data(), p.size());
  Key32 out;
  crypto_generichash_final(&st, out.data(), out.size());
  return out;
}

SessionKeys DeriveSessionKeys(const Key32& shared_secret, const Key32& transcript) {
  EnsureSodium();
  static constexpr char kLabel[] = "colony-v1 session keys";
  uint8_t okm[64];
  crypto_generichash_state st;
  crypto_generichash_init(&st, shared_secret.data(), shared_secret.size(), sizeof(okm));
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(kLabel), sizeof(kLabel) - 1);
  crypto_generichash_update(&st, transcript.data(), transcript.size());
  crypto_generichash_final(&st, okm, sizeof(okm));
  SessionKeys keys;
  std::memcpy(keys.initiator_to_responder.data(), okm, 32);
  std::memcpy(keys.responder_to_initiator.data(), okm + 32, 32);
  sodium_memzero(okm, sizeof(okm));
  return keys;
}

RecordSealer::RecordSealer(const Key32& key) : ctx_(EVP_CIPHER_CTX_new()) {
  if (!ctx_) throw std::bad_alloc();
  Check(EVP_EncryptInit_ex(ctx_, EVP_aes_256_gcm(), nullptr, nullptr, nullptr), "init");
  Check(EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_IVLEN, 12, nullptr), "ivlen");
  Check(EVP_EncryptInit_ex(ctx_, nullptr, nullptr, key.data(), nullptr), "key");
}

RecordSealer::~RecordSealer() { EVP_CIPHER_CTX_free(ctx_); }

void RecordSealer::Begin(size_t plaintext_length, RawBuffer& out) {
  auto iv = NonceFor(counter_++);
  Check(EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv.data()), "iv");
  uint8_t len[4];
  uint32_t sealed = static_cast<uint32_t>(plaintext_length + kTagSize);
  for (int i = 0; i < 4; ++i) len[i] = static_cast<uint8_t>(sealed >> (8 * i));
  int outl = 0;
  Check(EVP_EncryptUpdate(ctx_, nullptr, &outl, len, 4), "aad");
  ReserveRaw(out, out.size() + 4 + plaintext_length + kTagSize);  // Update and Finish only fill
  out.insert(out.end(), len, len + 4);
  expected_ = plaintext_length;
  seen_ = 0;
}

void RecordSealer::Update(ByteSpan plaintext, RawBuffer& out) {
  if (plaintext.empty()) return;
  size_t at = out.size();
  out.resize(at + plaintext.size());
  int outl = 0;
  Check(EVP_EncryptUpdate(ctx_, out.data() + at, &outl, plaintext.data(),
                          static_cast<int>(plaintext.size())),
        "update");
  // GCM is a stream mode: OpenSSL emits exactly as many bytes as it is given.
  seen_ += plaintext.size();
}

void RecordSealer::Finish(RawBuffer& out) {
  if (seen_ != expected_) throw std::logic_error("record length does not match its plaintext");
  int outl = 0;
  uint8_t dummy[16];
  Check(EVP_EncryptFinal_ex(ctx_, dummy, &outl), "final");
  size_t at = out.size();
  out.resize(at + kTagSize);
  Check(EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, kTagSize, out.data() + at), "tag");
}

RecordOpener::RecordOpener(const Key32& key) : ctx_(EVP_CIPHER_CTX_new()) {
  if (!ctx_) throw std::bad_alloc();
  Check(EVP_DecryptInit_ex(ctx_, EVP_aes_256_gcm(), nullptr, nullptr, nullptr), "init");
  Check(EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_IVLEN, 12, nullptr), "ivlen");
  Check(EVP_DecryptInit_ex(ctx_, nullptr, nullptr, key.data(), nullptr), "key");
}

RecordOpener::~RecordOpener() { EVP_CIPHER_CTX_free(ctx_); }

void RecordOpener::OpenBegin(ByteSpan length_prefix) {
  auto iv = NonceFor(counter_++);
  int outl = 0;
  open_ok_ = EVP_DecryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv.data()) == 1 &&
             EVP_DecryptUpdate(ctx_, nullptr, &outl, length_prefix.data(),
                               static_cast<int>(length_prefix.size())) == 1;
}

void RecordOpener::OpenUpdate(ByteSpan ciphertext, uint8_t* plaintext_out) {
  if (ciphertext.empty()) return;
  int outl = 0;
  open_ok_ = open_ok_ && EVP_DecryptUpdate(ctx_, plaintext_out, &outl, ciphertext.data(),
                                           static_cast<int>(ciphertext.size())) == 1;
}

Status RecordOpener::OpenFinish(ByteSpan tag) {
  uint8_t dummy[16];
  int outl = 0;
  bool ok = open_ok_ && tag.size() == kTagSize &&
            EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_TAG, kTagSize,
                                const_cast<uint8_t*>(tag.data())) == 1 &&
            EVP_DecryptFinal_ex(ctx_, dummy, &outl) == 1;
  if (!ok) {
    return DataLoss("record " + std::to_string(counter_ - 1) +
                    " failed its integrity check (corrupted, forged or replayed data)");
  }
  return Status::Ok();
}

Status RecordOpener::Open(ByteSpan length_prefix, MutableByteSpan sealed) {
  if (sealed.size() < kTagSize) return DataLoss("record shorter than its authentication tag");
  auto iv = NonceFor(counter_++);
  size_t n = sealed.size() - kTagSize;
  int outl = 0;
  bool ok = EVP_DecryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv.data()) == 1 &&
            EVP_DecryptUpdate(ctx_, nullptr, &outl, length_prefix.data(),
                              static_cast<int>(length_prefix.size())) == 1 &&
            (n == 0 || EVP_DecryptUpdate(ctx_, sealed.data(), &outl, sealed.data(),
                                         static_cast<int>(n)) == 1) &&
            EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_TAG, kTagSize, sealed.data() + n) == 1;
  uint8_t dummy[16];
  if (!ok || EVP_DecryptFinal_ex(ctx_, dummy, &outl) != 1) {
    return DataLoss("record " + std::to_string(counter_ - 1) +
                    " failed its integrity check (corrupted, forged or replayed data)");
  }
  return Status::Ok();
}

}  // namespace colony::net
