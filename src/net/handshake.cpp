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

}  // namespace

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
    return Unavailable(std::string("handshake with ") + peer_desc + " failed while " + what + ": " +
                       ec.message());
  };

  EphemeralKeyPair eph = EphemeralKeyPair::Generate();
  Bytes my_hello =
      EncodeHello(eph.public_key, options.version_major, options.version_minor, options.agent);
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

  {
    Bytes auth = EncodeAuth(*options.identity, options.role, transcript, options.observed_addr,
                            options.listen_addrs, options.limits);
    RawBuffer out;
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
    co_return Unauthenticated(
        peer_desc + " is peer " + auth->peer.ToString() + ", not the expected " +
        options.expected_peer->ToString() +
        "; the address may now belong to another peer — check /p2p/ in the address");
  }
  result.peer = std::move(*auth);
  result.peer_hello = std::move(*peer_hello);
  co_return result;
}

}  // namespace colony::net
