// Dialing one peer at several addresses (Host::ConnectAny) and the addresses peers announced
// (Host::SetPeerAddresses).
//
// A peer listening on every interface announces each of them, loopback first: from its own
// machine 127.0.0.1 is the right one, from another machine it leads to whatever listens there
// (nothing, or another peer, even the dialer itself), and a LAN or container address may lead
// nowhere at all. So the addresses are dialed as in RFC 8305 ("happy eyeballs"): in order, the
// next as soon as the one before failed, or after HostOptions::dial_stagger without an answer
// (that one keeps going); the first handshake with the right peer wins. A refused or wrong
// address costs one round trip on the way to the right one, a silent one dial_stagger.
#include <fmt/format.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include "net/host.h"
#include "net/notifier.h"
#include "net/run_on_strand.h"

namespace colony::net {
namespace {

// One ConnectAny: its dials report here, on the dial strand.
struct DialRace {
  explicit DialRace(const Strand& strand) : done(strand) {}
  Notifier done;
  std::shared_ptr<Connection> winner;
  std::vector<Status> failures;  // in the order the dials failed
};

// Every address failed: one code when they agree, else kUnavailable; each failure in the text.
Status AllFailed(const PeerId& peer, const std::vector<Status>& failures) {
  std::string text;
  bool one_code = true;
  for (const Status& f : failures) {
    one_code = one_code && f.code() == failures.front().code();
    text += (text.empty() ? "" : "; ") + f.message();
  }
  const std::string message =
      fmt::format("peer {} could not be reached at any of its {} addresses: {}", peer.ToString(),
                  failures.size(), text);
  return Status(one_code ? failures.front().code() : StatusCode::kUnavailable, message);
}

}  // namespace

void Host::SetPeerAddresses(const PeerId& peer, const std::vector<Multiaddr>& addrs) {
  std::lock_guard lock(mu_);
  peer_addresses_.Set(peer, addrs);
}

asio::awaitable<Result<std::shared_ptr<Connection>>> Host::ConnectAny(
    PeerId peer, std::vector<Multiaddr> addrs, size_t lane, std::chrono::milliseconds timeout) {
  const auto wait_until = timeout.count() > 0 ? std::chrono::steady_clock::now() + timeout
                                              : std::chrono::steady_clock::time_point::max();
  if (auto why = BlockedReason(peer)) {
    co_return PermissionDenied("peer " + peer.ToString() + " is blocked here: " + *why);
  }
  if (auto c = FindConnection(peer, lane)) co_return c;
  COLONY_CO_RETURN_IF_ERROR(DialPrecondition(lane));
  std::vector<Multiaddr> named = AddressesOfPeer(peer, addrs);
  if (named.empty()) co_return Unavailable("peer " + peer.ToString() + " has no address to dial");
  auto fn = [this, peer, named = std::move(named), lane, wait_until] {
    return RaceDials(peer, named, lane, wait_until);
  };
  co_return co_await RunOnStrand<Result<std::shared_ptr<Connection>>>(dial_strand_, std::move(fn));
}

asio::awaitable<Result<std::shared_ptr<Connection>>> Host::RaceDials(
    PeerId peer, std::vector<Multiaddr> addrs, size_t lane,
    std::chrono::steady_clock::time_point wait_until) {
  if (auto c = FindConnection(peer, lane)) co_return c;
  if (addrs.size() == 1) co_return co_await ConnectOnDialStrand(addrs[0], lane, wait_until);
  auto race = std::make_shared<DialRace>(dial_strand_);
  size_t started = 0;
  auto next_at = std::chrono::steady_clock::now();
  for (;;) {
    if (race->winner) co_return race->winner;
    const auto now = std::chrono::steady_clock::now();
    if (started < addrs.size() && (race->failures.size() == started || now >= next_at)) {
      // Each dial is shared with other callers of that address (ConnectOnDialStrand) and goes on
      // after a winner: its connection, if it gets one, is pooled.
      auto attempt = [this, race, address = addrs[started], lane,
                      wait_until]() -> asio::awaitable<void> {
        auto r = co_await ConnectOnDialStrand(address, lane, wait_until);
        if (!r.ok()) {
          race->failures.push_back(r.status());
        } else if (!race->winner) {
          race->winner = *r;
        }
        race->done.Notify();
      };
      asio::co_spawn(dial_strand_, std::move(attempt), asio::detached);
      ++started;
      next_at = now + options_.dial_stagger;
      continue;
    }
    if (race->failures.size() == addrs.size()) co_return AllFailed(peer, race->failures);
    auto cancel = co_await asio::this_coro::cancellation_state;
    if (cancel.cancelled() != asio::cancellation_type::none) {
      co_return Cancelled("connecting to peer " + peer.ToString() + " was cancelled");
    }
    if (now >= wait_until) {
      co_return DeadlineExceeded(fmt::format(
          "peer {} was not connected within the call's timeout ({} of its addresses dialed, {} "
          "failed)",
          peer.ToString(), started, race->failures.size()));
    }
    co_await race->done.WaitUntil(started < addrs.size() ? std::min(next_at, wait_until)
                                                         : wait_until);
  }
}

}  // namespace colony::net
