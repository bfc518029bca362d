// A scriptable malicious peer for the adversary tests: it speaks the real protocol over a real
// connection (its own host and identity) but sends whatever fields a test gives it, skipping
// every check an honest node makes before sending.
#pragma once

#include <asio/co_spawn.hpp>
#include <asio/use_future.hpp>
#include <memory>
#include <string>
#include <vector>

#include "core/identity.h"
#include "core/multiaddr.h"
#include "core/status.h"
#include "dht/messages.h"
#include "dht/validation.h"
#include "dht/wire.h"
#include "net/host.h"

namespace colony::test {

// Options for a host whose connections come from `ip`: 127.0.0.2 plays another machine against
// a victim that applies its per-address caps to loopback.
inline net::HostOptions DialingFrom(const std::string& ip) {
  net::HostOptions o;
  o.dial_from = ip;
  return o;
}

class HostilePeer {
 public:
  explicit HostilePeer(net::HostOptions options = {})
      : host_(KeyPair::Generate(), std::move(options)) {
    if (Status st = host_.Start(); !st.ok()) start_error_ = st;
  }
  ~HostilePeer() { host_.Shutdown(); }
  HostilePeer(const HostilePeer&) = delete;
  HostilePeer& operator=(const HostilePeer&) = delete;

  const Status& start_error() const { return start_error_; }
  const PeerId& id() const { return host_.peer_id(); }
  const KeyPair& identity() const { return host_.identity(); }
  // For attacks that answer calls (a replica that lies): register handlers on it.
  net::Host& host() { return host_; }

  // `item` with its value signed by `signer` the way an honest owner signs (for a marker that
  // names `signer`); a forger uses this with its own key to pass the signature check itself.
  static dht::StoreItem SignedBy(const KeyPair& signer, dht::StoreItem item) {
    dht::OwnerValidator validator(&signer);
    auto signed_value = validator.Sign({item.key, item.subkey, item.value, item.expiration});
    if (signed_value.ok()) item.value = std::move(*signed_value);
    return item;
  }

  // Opens a call to `method` on `lane`, sends `request` and the end of its requests, and returns
  // the stream without ever reading it: its replies get no flow-control credit beyond the
  // windows this peer announced.
  Result<std::shared_ptr<net::Stream>> OpenAndAbandon(const Multiaddr& victim,
                                                      const std::string& method,
                                                      net::Message request, size_t lane) {
    auto open = [&]() -> asio::awaitable<Result<std::shared_ptr<net::Stream>>> {
      auto stream = co_await host_.OpenStream(victim, method,
                                              {.timeout = std::chrono::hours(1), .lane = lane});
      if (!stream.ok()) co_return stream.status();
      COLONY_CO_RETURN_IF_ERROR(co_await (*stream)->Write(request));
      COLONY_CO_RETURN_IF_ERROR(co_await (*stream)->CloseWrite());
      co_return *stream;
    };
    return asio::co_spawn(host_.io_context(), open(), asio::use_future).get();
  }

  // One dht.store with exactly these items, as a client (so the victim does not route to it);
  // the victim's result per item.
  Result<std::vector<Status>> Store(const Multiaddr& victim, std::vector<dht::StoreItem> items,
                                    bool in_cache = false) {
    dht::StoreRequest request;
    request.sender.client_mode = true;
    for (auto& item : items) request.items.push_back({std::move(item), in_cache});
    const size_t n = request.items.size();
    COLONY_ASSIGN_OR_RETURN(
        net::Message reply,
        host_.CallSync(victim, "dht.store", net::Message(dht::EncodeStoreRequest(request))));
    COLONY_ASSIGN_OR_RETURN(dht::StoreResponse response, dht::DecodeStoreResponse(reply.meta, n));
    return std::move(response.results);
  }

 private:
  net::Host host_;
  Status start_error_;
};

}  // namespace colony::test
