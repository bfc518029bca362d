#include "net/handshake.h"

#include <asio/experimental/as_tuple.hpp>
#include <asio/buffer.hpp>
#include <asio/read.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <cstring>

#include "net/protocol.pb.h"

namespace colony::net {
namespace {

constexpr auto kUse = asio::experimental::as_tuple(asio::use_awaitable);
constexpr char kAuthContext[] = "colony-auth-v1";

std::string Printable(ByteSpan b) {
  std::string s;
  for (uint8_t c : b) s += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '.';
  return s;
}

template <typename Msg>
Bytes Serialize(const Msg& m) {
  Bytes out(m.ByteSizeLong());
  m.SerializeToArray(out.data(), static_cast<int>(out.size()));
  return out;
}

std::string VersionText(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

}  // namespace

Bytes EncodeHello(const Key32& ephemeral_public, uint32_t major, uint32_t minor,
                  const std::string& agent) {
  proto::Hello h;
  h.set_version_major(major);
  h.set_version_minor(minor);
  h.set_ephemeral_key(ephemeral_public.data(), ephemeral_public.size());
  h.set_agent(agent.substr(0, 128));
  return Serialize(h);
}

Result<HelloInfo> DecodeHello(ByteSpan bytes, uint32_t our_major, uint32_t our_minor) {
  proto::Hello h;
  if (!h.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return ProtocolError("handshake Hello is not a valid message");
  }
  if (h.version_major() != our_major) {
    return FailedPrecondition("incompatible protocol versions: the peer speaks Colony protocol " +
                              VersionText(h.version_major(), h.version_minor()) +
                              ", this node speaks " + VersionText(our_major, our_minor) +
                              "; upgrade the older side");
  }
  if (h.ephemeral_key().size() != 32) {
    return ProtocolError("handshake Hello carries a " + std::to_string(h.ephemeral_key().size()) +
                         "-byte ephemeral key; expected 32");
  }
  if (h.agent().size() > 128) return ProtocolError("handshake Hello agent string too long");
  HelloInfo info;
  info.version_major = h.version_major();
  info.version_minor = h.version_minor();
  std::memcpy(info.ephemeral_key.data(), h.ephemeral_key().data(), 32);
  info.agent = h.agent();
  return info;
}

Bytes AuthSignedBytes(Role signer, const Key32& transcript) {
  Bytes b(kAuthContext, kAuthContext + sizeof(kAuthContext) - 1);
  b.push_back(static_cast<uint8_t>(signer));
  b.insert(b.end(), transcript.begin(), transcript.end());
  return b;
}

Bytes EncodeAuth(const KeyPair& identity, Role role, const Key32& transcript,
                 const std::string& observed_addr, const std::vector<std::string>& listen_addrs,
                 const PeerLimits& limits) {
  proto::Auth a;
  a.set_public_key(identity.public_key().data(), identity.public_key().size());
  Signature sig = identity.Sign(AuthSignedBytes(role, transcript));
  a.set_signature(sig.data(), sig.size());
  a.set_observed_addr(observed_addr);
  for (const auto& l : listen_addrs) a.add_listen_addrs(l);
  a.set_stream_window(limits.stream_window);
  a.set_connection_window(limits.connection_window);
  a.set_max_concurrent_streams(limits.max_concurrent_streams);
  a.set_max_message_bytes(limits.max_message_bytes);
  return Serialize(a);
}

Result<AuthInfo> DecodeAuth(ByteSpan bytes, Role sender_role, const Key32& transcript) {
  proto::Auth a;
  if (!a.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return ProtocolError("handshake Auth is not a valid message");
  }
  if (a.public_key().size() != kPublicKeySize || a.signature().size() != kSignatureSize) {
    return ProtocolError("handshake Auth has a malformed key or signature");
  }
  if (a.listen_addrs_size() > 32 || a.observed_addr().size() > 256) {
    return ProtocolError("handshake Auth lists too many or too long addresses");
  }
  PublicKey key;
  std::memcpy(key.data(), a.public_key().data(), kPublicKeySize);
  Signature sig;
  std::memcpy(sig.data(), a.signature().data(), kSignatureSize);
  if (!VerifySignature(key, AuthSignedBytes(sender_role, transcript), sig)) {
    return Unauthenticated("the peer failed to prove it holds its identity key (bad signature)");
  }
  // Limits below these floors would make the connection unusable; treat as malformed.
  if (a.stream_window() < 64 * 1024 || a.connection_window() < a.stream_window() ||
      a.max_concurrent_streams() < 1 || a.max_message_bytes() < 64 * 1024) {
    return ProtocolError("handshake Auth announces unusable receive limits");
  }
  AuthInfo info;
  info.peer = PeerId::FromPublicKey(key);
  info.observed_addr = a.observed_addr();
  info.listen_addrs.assign(a.listen_addrs().begin(), a.listen_addrs().end());
  info.limits.stream_window = a.stream_window();
  info.limits.connection_window = a.connection_window();
  info.limits.max_concurrent_streams = a.max_concurrent_streams();
  info.limits.max_message_bytes = a.max_message_bytes();
  return info;
}

asio::awaitable<Result<HandshakeResult>> RunHandshake(asio::ip::tcp::socket& socket,
                                                      const HandshakeOptions& options,
                                                      std::string peer_desc) {
  auto io_error = [&](const char* what, const std::error_code& ec) -> Status {
    if (ec == asio::error::eof || ec == asio::error::connection_reset) {
      return Unavailable(peer_desc + " closed the connection during the handshake (" + what +
                         "); it may have refused us — check its logs");
    }
    if (ec == asio::error::operation_aborted) {
      return DeadlineExceeded(peer_desc + " did not complete the handshake in time (" + what + ")");
    }
    return Unavailable(std::string("handshake with ") + peer_desc + " failed while " + what +
                       ": " + ec.message());
  };

  EphemeralKeyPair eph = EphemeralKeyPair::Generate();
  Bytes my_hello = EncodeHello(eph.public_key, options.version_major, options.version_minor,
                               options.agent);
  {
    Bytes out(kMagic, kMagic + 8);
    ByteWriter w(out);
    w.U32(static_cast<uint32_t>(my_hello.size()));
    w.Raw(my_hello);
    auto [ec, n] = co_await asio::async_write(socket, asio::buffer(out), kUse);
    if (ec) co_return io_error("sending Hello", ec);
  }

  uint8_t head[12];
  {
    auto [ec, n] = co_await asio::async_read(socket, asio::buffer(head), kUse);
    if (ec) co_return io_error("reading Hello", ec);
  }
  if (std::memcmp(head, kMagic, 8) != 0) {
    co_return ProtocolError(peer_desc + " does not speak the Colony protocol (its first bytes were '" +
                            Printable(ByteSpan(head, 8)) + "'); check the address and port");
  }
  ByteReader lr(ByteSpan(head + 8, 4));
  uint32_t hello_len = lr.U32();
  if (hello_len == 0 || hello_len > kMaxHandshakeMessage) {
    co_return ProtocolError(peer_desc + " sent a Hello of " + std::to_string(hello_len) +
                            " bytes (limit " + std::to_string(kMaxHandshakeMessage) + ")");
  }
  Bytes peer_hello_bytes(hello_len);
  {
    auto [ec, n] = co_await asio::async_read(socket, asio::buffer(peer_hello_bytes), kUse);
    if (ec) co_return io_error("reading Hello", ec);
  }
  auto peer_hello = DecodeHello(peer_hello_bytes, options.version_major, options.version_minor);
  if (!peer_hello.ok()) co_return peer_hello.status().WithContext(peer_desc);

  auto shared = KeyAgreement(eph.secret_key, peer_hello->ephemeral_key);
  if (!shared.ok()) co_return shared.status().WithContext(peer_desc);
  const bool initiator = options.role == Role::kInitiator;
  Key32 transcript = initiator ? Hash256({my_hello, peer_hello_bytes})
                               : Hash256({peer_hello_bytes, my_hello});
  SessionKeys keys = DeriveSessionKeys(*shared, transcript);
  HandshakeResult result;
  result.sealer = std::make_unique<RecordSealer>(initiator ? keys.initiator_to_responder
                                                           : keys.responder_to_initiator);
  result.opener = std::make_unique<RecordOpener>(initiator ? keys.responder_to_initiator
                                                           : keys.initiator_to_responder);

  {
    Bytes auth = EncodeAuth(*options.identity, options.role, transcript, options.observed_addr,
                            options.listen_addrs, options.limits);
    Bytes out;
    result.sealer->Begin(auth.size(), out);
    result.sealer->Update(auth, out);
    result.sealer->Finish(out);
    auto [ec, n] = co_await asio::async_write(socket, asio::buffer(out), kUse);
    if (ec) co_return io_error("sending Auth", ec);
  }

  uint8_t len_bytes[4];
  {
    auto [ec, n] = co_await asio::async_read(socket, asio::buffer(len_bytes), kUse);
    if (ec) co_return io_error("reading Auth", ec);
  }
  ByteReader ar(ByteSpan(len_bytes, 4));
  uint32_t sealed_len = ar.U32();
  if (sealed_len < kTagSize || sealed_len > kMaxHandshakeMessage + kTagSize) {
    co_return ProtocolError(peer_desc + " sent an Auth record of invalid length " +
                            std::to_string(sealed_len));
  }
  Bytes sealed(sealed_len);
  {
    auto [ec, n] = co_await asio::async_read(socket, asio::buffer(sealed), kUse);
    if (ec) co_return io_error("reading Auth", ec);
  }
  Status opened = result.opener->Open(ByteSpan(len_bytes, 4), sealed);
  if (!opened.ok()) {
    co_return Unauthenticated(peer_desc + ": handshake Auth failed decryption (" +
                              opened.message() + ")");
  }
  Role peer_role = initiator ? Role::kResponder : Role::kInitiator;
  auto auth = DecodeAuth(ByteSpan(sealed.data(), sealed_len - kTagSize), peer_role, transcript);
  if (!auth.ok()) co_return auth.status().WithContext(peer_desc);
  if (options.expected_peer && auth->peer != *options.expected_peer) {
    co_return Unauthenticated(peer_desc + " is peer " + auth->peer.ToString() + ", not the expected " +
                              options.expected_peer->ToString() +
                              "; the address may now belong to another peer — check /p2p/ in the address");
  }
  result.peer = std::move(*auth);
  result.peer_hello = std::move(*peer_hello);
  co_return result;
}

}  // namespace colony::net
