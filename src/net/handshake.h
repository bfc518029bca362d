// The secure-channel handshake (internal to net).
//
// 1. Both sides send, in the clear: the 8-byte magic "colony\r\n", then a length-prefixed Hello
//    with the protocol version and a fresh X25519 ephemeral key. Each side checks the other's
//    version: an incompatible major version fails with an error naming both versions.
// 2. Both derive the shared secret, hash the transcript (initiator's Hello, then responder's)
//    and derive one AES-256-GCM key per direction.
// 3. Both send, as their first encrypted record, an Auth message: their Ed25519 public key and a
//    signature over ("colony-auth-v1", their role, the transcript hash), the address they observe
//    the other side at, and their receive limits. A valid signature proves possession of the key
//    behind the PeerId; binding the transcript (which holds both fresh ephemeral keys) makes a
//    recorded handshake useless on any other connection, and binding the role stops reflection.
//    The dialer checks the key against the PeerId it expected. In a private swarm, Auth also
//    carries the sender's access token (access_token.h).
// 4. When either Hello says its sender checks access (a private swarm), both send a Verdict as
//    their second encrypted record: admitted, or refused with the reason (no token, expired,
//    another authority, another peer's token, revoked, not on the allowlist). A refused side
//    fails with that reason; the refusing side fails too, after it has said why.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/identity.h"
#include "net/access_control.h"
#include "net/crypto.h"
#include "net/handshake_messages.h"
#include "net/wire.h"

namespace colony::net {

struct HandshakeOptions {
  Role role = Role::kInitiator;
  const KeyPair* identity = nullptr;
  std::optional<PeerId> expected_peer;  // the dialer's expectation; responders accept anyone
  std::string observed_addr;            // the remote endpoint as we see it, as a multiaddr
  std::vector<std::string> listen_addrs;
  PeerLimits limits;
  uint32_t version_major = kProtocolMajor;
  uint32_t version_minor = kProtocolMinor;
  std::string agent;
  // Who may connect (null: anyone) and the token this side shows.
  std::shared_ptr<const AccessControl> access;
  // An initiator that only tests reachability (AuthInfo::probe).
  bool probe = false;
};

struct HandshakeResult {
  AuthInfo peer;
  // Set when this side checks access: why the peer was admitted.
  std::optional<AccessGrant> peer_access;
  HelloInfo peer_hello;
  std::unique_ptr<RecordSealer> sealer;
  std::unique_ptr<RecordOpener> opener;
};

// Runs the handshake on a connected socket. The caller bounds it with a deadline (by closing the
// socket). Errors name what went wrong; `peer_desc` (the address) is used in messages. A peer
// refused (PermissionDenied) by this side's access policy sets *refused_by_us; a refusal by the
// peer is PermissionDenied too, without it.
asio::awaitable<Result<HandshakeResult>> RunHandshake(asio::ip::tcp::socket& socket,
                                                      const HandshakeOptions& options,
                                                      std::string peer_desc,
                                                      bool* refused_by_us = nullptr);

}  // namespace colony::net
