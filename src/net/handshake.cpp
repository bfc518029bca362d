#include "net/handshake.h"

#include <asio/buffer.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/read.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <cstring>

namespace colony::net {
namespace {

constexpr auto kUse = asio::experimental::as_tuple(asio::use_awaitable);

std::string Printable(ByteSpan b) {
  std::string s;
  for (uint8_t c : b) s += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '.';
  return s;
}

Status IoError(const std::string& peer_desc, const char* what, const std::error_code& ec) {
  if (ec == asio::error::eof || ec == asio::error::connection_reset) {
    return Unavailable(peer_desc + " closed the connection during the handshake (" + what +
                       "); it may have refused us — check its logs");
  }
  if (ec == asio::error::operation_aborted) {
    return DeadlineExceeded(peer_desc + " did not complete the handshake in time (" + what + ")");
  }
  return Unavailable(std::string("handshake with ") + peer_desc + " failed while " + what + ": " +
                     ec.message());
}

// Sealed handshake records: a 4-byte length, then the ciphertext and its tag.
asio::awaitable<Status> WriteSealed(asio::ip::tcp::socket& socket, RecordSealer& sealer,
                                    ByteSpan plain, const std::string& peer_desc,
                                    const char* what) {
  RawBuffer out;
  sealer.Begin(plain.size(), out);
  sealer.Update(plain, out);
  sealer.Finish(out);
  auto [ec, n] = co_await asio::async_write(socket, asio::buffer(out), kUse);
  if (ec) co_return IoError(peer_desc, what, ec);
  co_return Status::Ok();
}

asio::awaitable<Result<Bytes>> ReadSealed(asio::ip::tcp::socket& socket, RecordOpener& opener,
                                          const std::string& peer_desc, const char* what) {
  uint8_t len_bytes[4];
  {
    auto [ec, n] = co_await asio::async_read(socket, asio::buffer(len_bytes), kUse);
    if (ec) co_return IoError(peer_desc, what, ec);
  }
  ByteReader ar(ByteSpan(len_bytes, 4));
  uint32_t sealed_len = ar.U32();
  if (sealed_len < kTagSize || sealed_len > kMaxHandshakeMessage + kTagSize) {
    co_return ProtocolError(peer_desc + " sent a handshake record of invalid length " +
                            std::to_string(sealed_len) + " (" + what + ")");
  }
  Bytes sealed(sealed_len);
  {
    auto [ec, n] = co_await asio::async_read(socket, asio::buffer(sealed), kUse);
    if (ec) co_return IoError(peer_desc, what, ec);
  }
  Status opened = opener.Open(ByteSpan(len_bytes, 4), sealed);
  if (!opened.ok()) {
    co_return Unauthenticated(peer_desc + ": handshake record failed decryption (" + what + ": " +
                              opened.message() + ")");
  }
  sealed.resize(sealed_len - kTagSize);
  co_return sealed;
}

}  // namespace

asio::awaitable<Result<HandshakeResult>> RunHandshake(asio::ip::tcp::socket& socket,
                                                      const HandshakeOptions& options,
                                                      std::string peer_desc, bool* refused_by_us) {
  auto io_error = [&](const char* what, const std::error_code& ec) {
    return IoError(peer_desc, what, ec);
  };

  EphemeralKeyPair eph = EphemeralKeyPair::Generate();
  Bytes my_hello = EncodeHello(eph.public_key, options.version_major, options.version_minor,
                               options.agent, options.access && options.access->is_private(),
                               options.access ? options.access->options().authority : std::nullopt);
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
    co_return ProtocolError(peer_desc +
                            " does not speak the Colony protocol (its first bytes were '" +
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
  Key32 transcript =
      initiator ? Hash256({my_hello, peer_hello_bytes}) : Hash256({peer_hello_bytes, my_hello});
  SessionKeys keys = DeriveSessionKeys(*shared, transcript);
  HandshakeResult result;
  result.sealer = std::make_unique<RecordSealer>(initiator ? keys.initiator_to_responder
                                                           : keys.responder_to_initiator);
  result.opener = std::make_unique<RecordOpener>(initiator ? keys.responder_to_initiator
                                                           : keys.initiator_to_responder);

  const AccessControl* access = options.access.get();
  const bool we_check = access && access->is_private();
  std::optional<Bytes> own_token = access ? access->own_token() : std::nullopt;
  {
    Bytes auth = EncodeAuth(
        *options.identity, options.role, transcript, options.observed_addr, options.listen_addrs,
        options.limits, own_token ? ByteSpan(*own_token) : ByteSpan(), options.probe && initiator);
    Status sent = co_await WriteSealed(socket, *result.sealer, auth, peer_desc, "sending Auth");
    if (!sent.ok()) co_return sent;
  }
  auto auth_bytes = co_await ReadSealed(socket, *result.opener, peer_desc, "reading Auth");
  if (!auth_bytes.ok()) co_return auth_bytes.status();
  Role peer_role = initiator ? Role::kResponder : Role::kInitiator;
  auto auth = DecodeAuth(*auth_bytes, peer_role, transcript);
  if (!auth.ok()) co_return auth.status().WithContext(peer_desc);
  if (options.expected_peer && auth->peer != *options.expected_peer) {
    co_return Unauthenticated(
        peer_desc + " is peer " + auth->peer.ToString() + ", not the expected " +
        options.expected_peer->ToString() +
        "; the address may now belong to another peer — check /p2p/ in the address");
  }

  // A private swarm: both sides say whether they admit the other, so that a refused peer learns
  // why instead of seeing a closed connection.
  if (we_check || peer_hello->checks_access) {
    VerdictInfo mine{true, {}};
    if (we_check) {
      auto grant = access->Admit(auth->peer, auth->access_token);
      if (grant.ok()) {
        result.peer_access = *grant;
      } else {
        mine = {false, grant.status().message()};
      }
    }
    Status sent = co_await WriteSealed(socket, *result.sealer, EncodeVerdict(mine), peer_desc,
                                       "sending Verdict");
    if (!sent.ok()) co_return sent;
    // Read the peer's verdict even when refusing it: closing with its bytes unread would reset
    // the connection, and the peer could lose our reason on the way.
    auto verdict_bytes = co_await ReadSealed(socket, *result.opener, peer_desc, "reading Verdict");
    if (!mine.admitted) {
      if (refused_by_us) *refused_by_us = true;
      co_return PermissionDenied("refused " + peer_desc + " (peer " + auth->peer.ToString() +
                                 "): " + mine.reason);
    }
    if (!verdict_bytes.ok()) co_return verdict_bytes.status();
    auto theirs = DecodeVerdict(*verdict_bytes);
    if (!theirs.ok()) co_return theirs.status().WithContext(peer_desc);
    if (!theirs->admitted) {
      std::string hint;
      if (!own_token && peer_hello->authority) {
        hint = "; it is a private swarm whose authority is " + peer_hello->authority->ToString() +
               ": pass --authority and an access token for this peer";
      }
      co_return PermissionDenied(peer_desc + " refused this peer: " + theirs->reason + hint);
    }
  }
  result.peer = std::move(*auth);
  result.peer_hello = std::move(*peer_hello);
  co_return result;
}

}  // namespace colony::net
