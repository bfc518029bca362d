// Helpers for net tests: hosts on loopback, and running coroutines to completion with a bound.
#pragma once

#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/use_future.hpp>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>

#include "core/identity.h"
#include "core/multiaddr.h"
#include "net/host.h"

namespace colony::net::testing {

inline HostOptions LoopbackOptions() {
  HostOptions o;
  o.listen = {*Multiaddr::Parse("/ip4/127.0.0.1/tcp/0")};
  return o;
}

inline std::unique_ptr<Host> StartHost(HostOptions options = LoopbackOptions()) {
  auto h = std::make_unique<Host>(KeyPair::Generate(), std::move(options));
  Status st = h->Start();
  EXPECT_TRUE(st.ok()) << st.ToString();
  return h;
}

inline Multiaddr AddressOf(const Host& h) { return h.ListenAddresses().at(0); }

// /ip4/127.0.0.1/tcp/<port>/p2p/<peer>: where a dial to `port` expects to find `peer`.
inline Multiaddr LoopbackAddress(uint16_t port, const PeerId& peer) {
  return Multiaddr::Parse("/ip4/127.0.0.1/tcp/" + std::to_string(port))->WithPeerId(peer);
}

// A TCP listener that completes connections (the kernel does) but never says a word: a dial to
// it waits for a handshake that never comes.
struct SilentListener {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor{io, {asio::ip::make_address("127.0.0.1"), 0}};
  Multiaddr Address(const PeerId& claimed) const {
    return LoopbackAddress(acceptor.local_endpoint().port(), claimed);
  }
};

// Runs `aw` on the host's io_context and waits for it, failing the test (instead of hanging)
// if it does not finish within `limit`.
template <typename T>
T RunFor(Host& host, asio::awaitable<T> aw, std::chrono::seconds limit = std::chrono::seconds(20)) {
  auto fut = asio::co_spawn(host.io_context(), std::move(aw), asio::use_future);
  if (fut.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << "operation did not finish within " << limit.count() << " s";
    std::abort();  // a hung operation would otherwise hang the whole test binary
  }
  return fut.get();
}

inline Message TextMessage(std::string s) { return Message(std::move(s)); }

}  // namespace colony::net::testing
