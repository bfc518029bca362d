#include "dht/node.h"

#include <fmt/format.h>

#include <algorithm>
#include <asio/async_result.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <future>
#include <random>
#include <thread>

#include "core/log.h"
#include "dht/wire.h"
#include "net/run_on_strand.h"
#include "net/source_address.h"

namespace colony::dht {

KeyFamily RelayFamily() {
  return {.name = "relay announcements",
          .matches = [](std::string_view key) { return key == kRelaysKey; },
          .check = [](std::string_view, const PeerId& owner, std::string_view value) -> Status {
            COLONY_ASSIGN_OR_RETURN(Multiaddr addr, Multiaddr::Parse(value));
            if (!addr.peer_id() || !(*addr.peer_id() == owner) || addr.is_relayed()) {
              return ProtocolError("a relay announces its own direct address, ending in its id");
            }
            return Status::Ok();
          }};
}

double Now() { return SystemClock::Instance().WallSeconds(); }

namespace {
constexpr const char* kPing = "dht.ping";
constexpr const char* kStore = "dht.store";
constexpr const char* kFind = "dht.find";

std::chrono::milliseconds Ms(Duration d) {
  return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(d),
                  std::chrono::milliseconds(1));
}
}  // namespace

// The environment of the core on the real network; everything core-related runs on strand_.
class Node::Impl final : public Environment, public std::enable_shared_from_this<Impl> {
 public:
  Impl(net::Host* host, bool client_mode)
      : host_(host), strand_(asio::make_strand(host->io_context())), client_mode_(client_mode) {}

  const Clock& clock() const override { return SystemClock::Instance(); }

  void Ping(const Contact& to, PingRequest request, Duration timeout,
            Callback<PingResponse> done) override {
    auto self = shared_from_this();
    auto op = [self, to, payload = EncodePingRequest(request),
               timeout]() -> asio::awaitable<Result<PingResponse>> {
      PeerId answered_by;
      auto reply = co_await self->CallPeer(to, kPing, payload, timeout, &answered_by);
      if (!reply.ok()) co_return reply.status();
      auto r = DecodePingResponse(*reply);
      if (r.ok()) r->peer = answered_by;
      co_return r;
    };
    Spawn<PingResponse>(std::move(op), std::move(done));
  }

  void Store(const Contact& to, StoreRequest request, Duration timeout,
             Callback<StoreResponse> done) override {
    auto self = shared_from_this();
    const size_t n = request.items.size();
    auto op = [self, to, payload = EncodeStoreRequest(request), timeout,
               n]() -> asio::awaitable<Result<StoreResponse>> {
      auto reply = co_await self->CallPeer(to, kStore, payload, timeout, nullptr);
      if (!reply.ok()) co_return reply.status();
      co_return DecodeStoreResponse(*reply, n);
    };
    Spawn<StoreResponse>(std::move(op), std::move(done));
  }

  void Find(const Contact& to, FindRequest request, Duration timeout,
            Callback<FindResponse> done) override {
    auto self = shared_from_this();
    const size_t n = request.ids.size();
    auto op = [self, to, payload = EncodeFindRequest(request), timeout,
               n]() -> asio::awaitable<Result<FindResponse>> {
      std::string group;
      auto reply = co_await self->CallPeer(to, kFind, payload, timeout, nullptr, &group);
      if (!reply.ok()) co_return reply.status();
      auto response = DecodeFindResponse(*reply, n);
      if (response.ok()) response->source_group = std::move(group);
      co_return response;
    };
    Spawn<FindResponse>(std::move(op), std::move(done));
  }

  void Schedule(Duration delay, std::function<void()> fn) override {
    auto timer = std::make_shared<asio::steady_timer>(strand_, delay);
    timer->async_wait([timer, fn = std::move(fn)](const std::error_code& ec) {
      if (!ec) fn();
    });
  }

  std::optional<std::string> AddressGroupOf(const PeerId& peer) const override {
    const auto conn = host_->FindConnection(peer);
    if (!conn) return std::nullopt;
    return GroupOf(conn->remote_address());
  }

  std::string GroupOf(const Multiaddr& remote) const {
    const std::string key = net::SourceKey(remote.host(), host_->limits_loopback());
    // A peer reached through a relay counts under the relay's address: one machine could
    // otherwise relay any number of its own identities.
    return remote.is_relayed() && !key.empty() ? "relay " + key : key;
  }

  // Calls `method` on the peer within one deadline. A peer with a known id is dialed at any of
  // its addresses (Host::ConnectAny: a wrong, refused or silent address does not take the
  // deadline from the right one); bootstrap addresses without an id are tried in turn. `group`,
  // if given, gets the address group of the connection that carried the answer.
  asio::awaitable<Result<std::string>> CallPeer(Contact to, std::string method, std::string payload,
                                                Duration timeout, PeerId* answered_by,
                                                std::string* group = nullptr) {
    const SteadyTime deadline = SteadyTime::clock::now() + timeout;
    Status last = Unavailable("no usable address");
    std::vector<Multiaddr> addrs;
    for (const std::string& a : to.addrs) {
      auto addr = Multiaddr::Parse(a);
      if (!addr.ok()) {
        last = addr.status();
        continue;
      }
      if (to.peer.valid()) {
        if (addr->peer_id() && !(*addr->peer_id() == to.peer)) continue;
        *addr = addr->WithPeerId(to.peer);
      }
      addrs.push_back(std::move(*addr));
    }
    if (to.peer.valid() && !addrs.empty()) {
      auto conn = co_await host_->ConnectAny(to.peer, addrs, 0, Ms(timeout));
      if (conn.ok()) {
        if (answered_by != nullptr) *answered_by = (*conn)->peer();
        if (group != nullptr) *group = GroupOf((*conn)->remote_address());
        // The connection is pooled: the call below takes it.
        auto reply = co_await host_->Call(addrs.front(), method, net::Message(payload),
                                          {.timeout = Ms(deadline - SteadyTime::clock::now())});
        if (reply.ok()) co_return std::move(reply->meta);
        last = reply.status();
      } else {
        last = conn.status();
      }
      addrs.clear();
    }
    // Errors name the peer; bootstrap errors are prefixed with the address by the core.
    const std::string where = to.peer.valid() ? "peer " + to.peer.Short() : std::string();
    for (const Multiaddr& addr : addrs) {
      const Duration left = deadline - SteadyTime::clock::now();
      if (left <= Duration::zero()) {
        last = DeadlineExceeded("no time left");
        break;
      }
      if (answered_by != nullptr || group != nullptr) {
        auto conn = co_await host_->Connect(addr, 0, Ms(left));
        if (!conn.ok()) {
          last = conn.status();
          continue;
        }
        if (answered_by != nullptr) *answered_by = (*conn)->peer();
        if (group != nullptr) *group = GroupOf((*conn)->remote_address());
      }
      auto reply = co_await host_->Call(addr, method, net::Message(payload),
                                        {.timeout = Ms(deadline - SteadyTime::clock::now())});
      if (reply.ok()) co_return std::move(reply->meta);
      last = reply.status();
      // Try another address only when this one could not be reached.
      if (last.code() != StatusCode::kUnavailable && last.code() != StatusCode::kClosed) break;
    }
    if (last.code() == StatusCode::kDeadlineExceeded) {
      last = DeadlineExceeded(fmt::format("did not answer within {} ms", Ms(timeout).count()));
    }
    co_return where.empty() ? last : last.WithContext(where);
  }

  template <typename T, typename Op>
  void Spawn(Op op, Callback<T> done) {
    asio::co_spawn(strand_, std::move(op),
                   [done = std::move(done)](std::exception_ptr e, Result<T> r) {
                     if (e) r = Internal("DHT request failed with an exception");
                     done(std::move(r));
                   });
  }

  // Runs `start(callback)` on the strand and waits for the callback (blocking). nullopt when
  // the node shut down before it answered.
  template <typename T, typename Start>
  std::optional<T> Block(Start start) {
    auto promise = std::make_shared<std::promise<T>>();
    auto future = promise->get_future();
    auto self = shared_from_this();
    asio::post(strand_, [self, start = std::move(start), promise]() mutable {
      start([promise](T value) { promise->set_value(std::move(value)); });
    });
    while (future.wait_for(std::chrono::milliseconds(200)) != std::future_status::ready) {
      if (stopped_.load()) {
        if (future.wait_for(std::chrono::seconds(2)) == std::future_status::ready) break;
        return std::nullopt;
      }
    }
    return future.get();
  }

  // Awaitable form of Block: the callback resumes the awaiting coroutine on its own executor.
  template <typename T, typename Start>
  asio::awaitable<T> Await(Start start) {
    auto self = shared_from_this();
    auto initiation = [self, start = std::move(start)](auto handler) mutable {
      auto h = std::make_shared<decltype(handler)>(std::move(handler));
      asio::post(self->strand_, [start = std::move(start), h]() mutable {
        start([h](T value) {
          auto ex = asio::get_associated_executor(*h);
          asio::post(ex, [h, value = std::move(value)]() mutable { (*h)(std::move(value)); });
        });
      });
    };
    co_return co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(T)>(
        std::move(initiation), asio::use_awaitable);
  }

  void RegisterHandlers() {
    Register(kPing, &DecodePingRequest, &DhtCore::HandlePing, &EncodePingResponse);
    Register(kStore, &DecodeStoreRequest, &DhtCore::HandleStore, &EncodeStoreResponse);
    Register(kFind, &DecodeFindRequest, &DhtCore::HandleFind, &EncodeFindResponse);
  }

  // Serves `method`: decode the request, let the core handle it on the strand (with the
  // caller's peer id and source address key), encode the reply.
  template <typename Request, typename Response>
  void Register(const char* method, Result<Request> (*decode)(std::string_view),
                Result<Response> (DhtCore::*handle)(const PeerId&, const Request&,
                                                    const std::string&),
                std::string (*encode)(const Response&)) {
    std::weak_ptr<Impl> weak = weak_from_this();
    const bool limit_loopback = host_->limits_loopback();
    host_->RegisterUnary(
        method,
        [weak, decode, handle, encode, limit_loopback](
            net::CallContext& ctx, net::Message m) -> asio::awaitable<Result<net::Message>> {
          auto req = decode(m.meta);
          if (!req.ok()) co_return req.status();
          auto serve = [from = ctx.peer(), source = net::SourceKey(ctx, limit_loopback),
                        req = std::move(*req), handle,
                        encode](DhtCore& core) -> Result<net::Message> {
            auto r = (core.*handle)(from, req, source);
            if (!r.ok()) return r.status();
            return net::Message(encode(*r));
          };
          co_return co_await Serve(weak, std::move(serve));
        });
  }

  // Builds the reply on the strand; from then until it is back on the caller's executor (where
  // the connection takes it, counting it against its reply budget) it is held in transit,
  // within max_replies_in_transit_. The charge travels with the reply, so a reply dropped on
  // the way (the node shutting down) gives it back too.
  struct InTransit {
    std::shared_ptr<Impl> impl;
    uint64_t bytes = 0;
    ~InTransit() {
      if (impl) impl->in_transit_ -= bytes;
    }
  };
  using Charged = std::pair<net::Message, std::shared_ptr<InTransit>>;

  template <typename F>
  static asio::awaitable<Result<net::Message>> Serve(std::weak_ptr<Impl> weak, F serve) {
    auto self = weak.lock();
    if (!self || self->stopped_.load()) co_return Unavailable("DHT node is shutting down");
    auto work = [self, serve = std::move(serve)]() -> asio::awaitable<Result<Charged>> {
      if (self->stopped_.load()) co_return Unavailable("DHT node is shutting down");
      auto reply = serve(*self->core_);
      if (!reply.ok()) co_return reply.status();
      const uint64_t size = reply->meta.size();
      const uint64_t held = self->in_transit_.load();
      if (held > 0 && held + size > self->max_replies_in_transit_) {
        co_return ResourceExhausted(
            fmt::format("this DHT node holds {} bytes of replies not yet sent, its limit is {}; "
                        "try again later",
                        held, self->max_replies_in_transit_));
      }
      auto charge = std::make_shared<InTransit>();
      charge->impl = self;
      charge->bytes = size;
      self->in_transit_ += size;
      co_return Charged(std::move(*reply), std::move(charge));
    };
    auto charged = co_await net::RunOnStrand<Result<Charged>>(self->strand_, std::move(work));
    if (!charged.ok()) co_return charged.status();
    co_return std::move(charged->first);  // uncharged as it goes on to its connection
  }

  net::Host* host_;
  net::Strand strand_;
  std::atomic<bool> client_mode_;  // set at start, and by Node::WatchAddress
  std::shared_ptr<DhtCore> core_;
  uint64_t max_replies_in_transit_ = 0;
  std::atomic<uint64_t> in_transit_{0};  // bytes of built replies, counted on the strand
  std::atomic<bool> stopped_{false};

  // What VisibleAddresses() gives when not a client; shared with the relay announcement.
  std::vector<Multiaddr> DirectAddresses() const {
    std::lock_guard lock(addresses_mu_);
    return direct_addresses_;
  }
  void SetDirectAddresses(std::vector<Multiaddr> addrs) {
    std::lock_guard lock(addresses_mu_);
    direct_addresses_ = std::move(addrs);
  }

 private:
  mutable std::mutex addresses_mu_;
  std::vector<Multiaddr> direct_addresses_;  // guarded by addresses_mu_
};

Node::Node(std::shared_ptr<Impl> impl, std::shared_ptr<net::Host> host)
    : host_(std::move(host)), impl_(std::move(impl)) {}

Node::~Node() {
  Shutdown();
  impl_.reset();  // before the host (and its io_context) can go
}

Result<std::unique_ptr<Node>> Node::Start(KeyPair identity, NodeOptions options) {
  net::HostOptions host_options = options.host;
  host_options.listen = options.listen;
  host_options.dial_timeout =
      std::min(host_options.dial_timeout,
               std::chrono::duration_cast<std::chrono::milliseconds>(options.dht.request_timeout));
  if (options.listen.empty()) options.dht.client_mode = true;
  auto host = std::make_shared<net::Host>(std::move(identity), std::move(host_options));
  COLONY_RETURN_IF_ERROR(host->Start());
  auto node = Attach(host, std::move(options));
  if (!node.ok()) {
    host->Shutdown();
  } else {
    (*node)->owns_host_ = true;
  }
  return node;
}

namespace {

bool IsLoopback(const Multiaddr& a) {
  return a.host() == "::1" || a.host().rfind("127.", 0) == 0 || a.host() == "localhost";
}

// What dial-backs found: whether others can dial us (false only when a helper answered that it
// could not: an unanswered question leaves the node public), where a helper reached us, and
// whether an initial peer's answer decided it (it reached us, or could not).
struct DialBackAnswer {
  bool is_public = true;
  std::optional<Multiaddr> reached;
  bool trusted = false;
};

// Host::CheckReachability through `helper`; nullopt when `stop` said so before it ended (it then
// ends by its own deadline, unwaited).
std::optional<Result<std::optional<Multiaddr>>> DialBackThrough(net::Host& host,
                                                                const Multiaddr& helper,
                                                                const std::function<bool()>& stop) {
  auto fut = asio::co_spawn(host.io_context(), host.CheckReachability(helper), asio::use_future);
  while (fut.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    if (stop()) return std::nullopt;
  }
  return fut.get();
}

// A helper busy dialing others back (it runs few dial-backs at once: Host::ServeDialback) is
// asked again, up to this many times in all, after the other helpers and a pause of 0.5-1.5 s:
// many nodes that start at once from one bootstrap peer would otherwise find it busy, and a node
// that no helper answered takes itself for public.
constexpr int kDialBackTries = 3;

// Sleeps `d`, or less when `stop` says so (then false).
bool PauseUnless(std::chrono::milliseconds d, const std::function<bool()>& stop) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
    if (stop()) return false;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        std::chrono::milliseconds(50), until - std::chrono::steady_clock::now()));
  }
  return !stop();
}

// Asks `trusted` helpers (the initial peers, whom the operator chose; in an order of this check's
// own, so that the nodes of a swarm spread their questions over them instead of all asking the
// first), then `others` (peers of the routing table), to dial us back, in turn. A trusted helper's
// answer is taken; an address that others found needs two of them to agree (any peer can claim
// anything). Two helpers that could not reach us are enough to say so.
DialBackAnswer AskForDialBack(
    net::Host& host, std::vector<std::string> trusted, const std::vector<std::string>& others,
    const std::function<bool()>& stop = [] { return false; }) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::shuffle(trusted.begin(), trusted.end(), rng);
  size_t unreachable = 0;
  bool trusted_unreachable = false;
  std::vector<Multiaddr> found_by_others;  // the address each other helper reached us at
  std::vector<size_t> ask(trusted.size() + others.size());  // trusted first, then others
  for (size_t i = 0; i < ask.size(); ++i) ask[i] = i;
  for (int round = 0; round < kDialBackTries && !ask.empty() && unreachable < 2; ++round) {
    if (round > 0 &&
        !PauseUnless(std::chrono::milliseconds(std::uniform_int_distribution<int>(500, 1500)(rng)),
                     stop)) {
      break;
    }
    std::vector<size_t> busy;  // asked again next round
    for (const size_t i : ask) {
      if (stop()) break;
      const bool is_trusted = i < trusted.size();
      const std::string& text = is_trusted ? trusted[i] : others[i - trusted.size()];
      auto addr = Multiaddr::Parse(text);
      if (!addr.ok() || !addr->peer_id() || addr->is_relayed()) continue;
      auto r = DialBackThrough(host, *addr, stop);
      if (!r) break;
      if (!r->ok()) {
        COLONY_LOG_DEBUG("dial-back through {} failed: {}", text, r->status().ToString());
        if (r->status().code() == StatusCode::kResourceExhausted) busy.push_back(i);
        continue;
      }
      if (!r->value().has_value()) {
        trusted_unreachable = trusted_unreachable || is_trusted;
        if (++unreachable >= 2) break;
        continue;
      }
      const Multiaddr& reached = *r->value();
      if (is_trusted) return {.is_public = true, .reached = reached, .trusted = true};
      if (std::find(found_by_others.begin(), found_by_others.end(), reached) !=
          found_by_others.end()) {
        return {.is_public = true, .reached = reached};
      }
      found_by_others.push_back(reached);
    }
    ask = std::move(busy);
  }
  // Reached by one untrusted helper only: public, at an address not taken on its word.
  const bool is_public = unreachable == 0 || !found_by_others.empty();
  return {.is_public = is_public,
          .reached = std::nullopt,
          .trusted = !is_public && trusted_unreachable};
}

// NodeOptions::announce, checked, each with our id.
Result<std::vector<Multiaddr>> CheckAnnounced(const std::vector<Multiaddr>& announce,
                                              const PeerId& me) {
  std::vector<Multiaddr> out;
  for (const Multiaddr& a : announce) {
    const char* wrong = a.is_relayed()  ? "is relayed (announce direct addresses; "
                                          "relays are named with --relay)"
                        : a.port() == 0 ? "has no port"
                        : a.peer_id() && *a.peer_id() != me ? "names another peer's id"
                                                            : nullptr;
    if (wrong != nullptr) {
      return InvalidArgument(fmt::format("announce address {} {}", a.ToString(), wrong));
    }
    out.push_back(a.WithPeerId(me));
  }
  return out;
}

// `reached` (where a dial-back got through) added to `listen` when none of them is that one:
// after the loopback addresses, which stay first for peers on the same machine.
std::vector<Multiaddr> WithReachedAddress(std::vector<Multiaddr> listen, const Multiaddr& reached) {
  if (std::find(listen.begin(), listen.end(), reached) != listen.end()) return listen;
  auto at = std::find_if_not(listen.begin(), listen.end(), IsLoopback);
  listen.insert(at, reached);
  return listen;
}

// The DHT's form of `direct`: without /p2p/ (the peer id travels beside the addresses, and
// base58-decoding it again for every address of every contact in every reply was the largest
// cost of a lookup).
std::vector<std::string> DhtAddresses(const std::vector<Multiaddr>& direct) {
  std::vector<std::string> out;
  for (const Multiaddr& a : direct) out.push_back(a.WithoutPeerId().ToString());
  return out;
}

std::string Joined(const std::vector<Multiaddr>& addrs) {
  std::string out;
  for (const Multiaddr& a : addrs) out += (out.empty() ? "" : ", ") + a.ToString();
  return out;
}

}  // namespace

Result<std::unique_ptr<Node>> Node::Attach(std::shared_ptr<net::Host> host, NodeOptions options) {
  if (const double share = options.dht.storage.dictionary_share_per_source;
      !(share > 0 && share <= 1)) {
    return InvalidArgument(
        fmt::format("dht.storage.dictionary_share_per_source {} outside (0, 1]", share));
  }
  if (options.dht.disjoint_paths < 1 || options.dht.disjoint_paths > kMaxDisjointPaths) {
    return InvalidArgument(fmt::format("dht.disjoint_paths {} outside [1, {}]",
                                       options.dht.disjoint_paths, kMaxDisjointPaths));
  }
  std::vector<Multiaddr> direct = host->ListenAddresses();
  if (!options.announce.empty()) {
    if (options.dht.client_mode || direct.empty()) {
      return InvalidArgument(
          "announce addresses need a node that listens and is not a client (with a relay or "
          "in client mode nobody dials it directly)");
    }
    auto announced = CheckAnnounced(options.announce, host->peer_id());
    if (!announced.ok()) return announced.status();
    direct = std::move(*announced);
  }
  bool publicly_reachable = !options.dht.client_mode && !direct.empty();
  bool dialed_back = false;       // whether the initial peers' dial-back found the node public
  bool found_behind_nat = false;  // whether they answered that they could not dial it
  const std::vector<Multiaddr> listen_direct = direct;
  if (publicly_reachable && options.reachability == NodeOptions::Reachability::kPrivate) {
    publicly_reachable = false;
  } else if (publicly_reachable && options.reachability == NodeOptions::Reachability::kAuto &&
             options.announce.empty() && !options.initial_peers.empty() &&
             !std::all_of(direct.begin(), direct.end(), IsLoopback)) {
    const DialBackAnswer answer = AskForDialBack(*host, options.initial_peers, {});
    dialed_back = answer.is_public;
    if (!answer.is_public) {
      COLONY_LOG_INFO(
          "peers cannot dial this node back (behind NAT or a firewall): running as a DHT client "
          "reachable through a relay");
      publicly_reachable = false;
      found_behind_nat = true;
    } else if (answer.reached) {
      direct = WithReachedAddress(std::move(direct), *answer.reached);
      if (direct.size() > listen_direct.size()) {
        COLONY_LOG_INFO(
            "the initial peers reached this node at {}, which none of its interfaces has (a "
            "router forwarding the port): giving others that address too",
            answer.reached->ToString());
      }
    }
  }
  if (!publicly_reachable) options.dht.client_mode = true;
  // Whom NodeOptions::reachability_recheck watches: a node the dial-back found public, and one it
  // found behind NAT that picks its relay itself (its router may forward the port later, or the
  // check at start failed by chance); the latter serves the DHT once an initial peer reaches it.
  const bool watch_address =
      options.reachability_recheck.count() > 0 &&
      ((dialed_back && !options.dht.client_mode) || (found_behind_nat && options.relays.empty()));
  std::vector<std::string> addrs;
  if (!options.dht.client_mode) {
    addrs = DhtAddresses(direct);
    if (addrs.empty()) options.dht.client_mode = true;
  }
  auto impl = std::make_shared<Impl>(host.get(), options.dht.client_mode);
  impl->max_replies_in_transit_ = options.max_replies_in_transit_bytes;
  impl->core_ = DhtCore::Create(host->identity(), std::move(addrs), options.dht, *impl);
  impl->core_->AddValidator(std::make_shared<KeyFamilyValidator>(std::vector{RelayFamily()}));
  for (auto& v : options.validators) impl->core_->AddValidator(v);
  if (!options.dht.client_mode || watch_address) impl->RegisterHandlers();  // a client refuses
  std::unique_ptr<Node> node(new Node(impl, host));
  impl->SetDirectAddresses(std::move(direct));
  auto booted = impl->Block<Result<size_t>>(
      [impl, peers = options.initial_peers](std::function<void(Result<size_t>)> cb) {
        impl->core_->Bootstrap(peers, std::move(cb));
      });
  if (!booted) return Closed("DHT node shut down during bootstrap");
  if (!booted->ok()) {
    node->Shutdown();
    return booted->status().WithContext("DHT bootstrap failed");
  }
  COLONY_LOG_DEBUG("DHT node {} joined; {} peers in its routing table", host->peer_id().Short(),
                   **booted);
  node->initial_peers_ = options.initial_peers;
  node->relay_failover_ = options.relay_failover;
  node->publicly_reachable_ = publicly_reachable;
  if (options.relay_service) {
    auto relay = net::Relay::Start(*host, *options.relay_service);
    if (!relay.ok()) {
      node->Shutdown();
      return relay.status();
    }
    node->relay_ = std::move(*relay);
    node->AnnounceRelay();
  }
  // Started once the node holds the reservation it starts with (none is taken after the watcher
  // has dropped them).
  const auto start_address_watcher = [&] {
    if (!watch_address) return;
    node->address_watcher_ =
        std::thread([n = node.get(), listen_direct, every = options.reachability_recheck,
                     changed = options.on_addresses_changed] {
          n->WatchAddress(listen_direct, every, changed);
        });
  };
  // Behind NAT without a relay named: one announced in the DHT, else the initial peers.
  const bool find_relay =
      !publicly_reachable && options.relays.empty() && !host->ListenAddresses().empty();
  std::vector<std::string> refused;
  if (find_relay) {
    const std::vector<std::string> candidates = node->FindRelays(options.initial_peers);
    if (!node->ReserveWithOneOf(candidates, {}, &refused)) {
      COLONY_LOG_WARN(
          "this node is behind NAT and no relay granted a reservation: it can call others but "
          "nobody can call it (run a relay: colony dht --relay-listen ADDR on a public peer)");
    }
    node->relay_watcher_ =
        std::thread([n = node.get(), fallback = options.initial_peers,
                     failover = options.relay_failover] { n->WatchRelay(fallback, failover); });
    start_address_watcher();
    return node;
  }
  for (const auto& text : options.relays) {
    const std::vector<std::string> one = {text};
    node->ReserveWithOneOf(one, {}, &refused);
  }
  if (!options.relays.empty() && refused.size() == options.relays.size()) {
    node->Shutdown();
    std::string why;
    for (const auto& r : refused) why += (why.empty() ? "" : "; ") + r;
    return Unavailable("no relay granted a reservation (" + why +
                       "); without one, peers behind NAT cannot be reached");
  }
  start_address_watcher();
  return node;
}

std::vector<std::string> Node::FindRelays(const std::vector<std::string>& fallback) {
  std::vector<std::string> out;
  auto announced = GetSync(kRelaysKey, Freshness::kLatest);  // not a cached, older list
  if (announced.ok() && announced->is_dict) {
    for (const auto& [peer, v] : announced->subkeys) out.push_back(v.value);
  }
  out.insert(out.end(), fallback.begin(), fallback.end());
  return out;
}

std::optional<Multiaddr> Node::ReserveWithOneOf(const std::vector<std::string>& candidates,
                                                const std::vector<PeerId>& avoid,
                                                std::vector<std::string>* refusals) {
  for (const auto& text : candidates) {
    {
      std::lock_guard lock(reservations_mu_);
      if (watcher_stop_) break;
    }
    auto addr = Multiaddr::Parse(text);
    if (addr.ok() && addr->peer_id() &&
        std::find(avoid.begin(), avoid.end(), *addr->peer_id()) != avoid.end()) {
      continue;
    }
    Result<std::unique_ptr<net::RelayReservation>> r =
        addr.ok() ? net::RelayReservation::Start(*host_, *addr) : addr.status();
    if (r.ok()) {
      const Multiaddr via = (*r)->address();
      std::lock_guard lock(reservations_mu_);
      reservations_.push_back(std::move(*r));
      return via;
    }
    if (refusals) {
      COLONY_LOG_WARN("relay {} refused a reservation: {}", text, r.status().ToString());
      refusals->push_back(r.status().ToString());
    } else {
      COLONY_LOG_DEBUG("relay {} refused a reservation: {}", text, r.status().ToString());
    }
  }
  return std::nullopt;
}

void Node::WatchRelay(std::vector<std::string> fallback, std::chrono::milliseconds failover) {
  using Clock = std::chrono::steady_clock;
  const auto tick =
      std::clamp(failover / 4, std::chrono::milliseconds(100), std::chrono::milliseconds(5000));
  // Since when no reservation was active (max: one is).
  Clock::time_point lost_since = Clock::time_point::max();
  std::unique_lock lock(reservations_mu_);
  while (!watcher_wake_.wait_for(lock, tick, [this] { return watcher_stop_; })) {
    // Serving directly again (WatchAddress) needs no relay: as good as an active reservation.
    bool active = !impl_->client_mode_;
    std::vector<PeerId> current;
    for (const auto& r : reservations_) {
      active = active || r->active();
      if (r->address().relay_id()) current.push_back(*r->address().relay_id());
    }
    if (active) {
      lost_since = Clock::time_point::max();
      continue;
    }
    if (lost_since == Clock::time_point::max()) lost_since = Clock::now();
    if (Clock::now() - lost_since < failover) continue;
    // Look for another relay without holding the lock (lookups and reservations take time).
    lock.unlock();
    const std::vector<std::string> candidates = FindRelays(fallback);
    std::vector<std::unique_ptr<net::RelayReservation>> old;
    {
      std::lock_guard guard(reservations_mu_);
      old.swap(reservations_);  // the reservations to dead relays are dropped below
    }
    const std::optional<Multiaddr> moved = ReserveWithOneOf(candidates, current, nullptr);
    if (moved) {
      COLONY_LOG_INFO("lost the relay reservation for {:.0f} s; now reachable through {}",
                      failover.count() / 1000.0, moved->ToString());
      old.clear();
      lost_since = Clock::time_point::max();
    } else {
      // Keep the old ones retrying (the relay may come back) and ask again later.
      std::lock_guard guard(reservations_mu_);
      for (auto& r : old) reservations_.push_back(std::move(r));
      lost_since = Clock::now();
    }
    lock.lock();
    // Served directly again while this looked (WatchAddress dropped the reservations then).
    if (!impl_->client_mode_) reservations_.clear();
  }
}

bool Node::WatcherStopping() const {
  std::lock_guard lock(reservations_mu_);
  return watcher_stop_;
}

void Node::WatchAddress(std::vector<Multiaddr> listen, std::chrono::milliseconds every,
                        std::function<void(const std::vector<Multiaddr>&)> changed) {
  const std::function<bool()> stop = [this] { return WatcherStopping(); };
  bool warned = false;
  // Behind a relay, each check that leaves the node there doubles the wait before the next, up
  // to 8 x `every`: a helper's dial to a node behind NAT takes it its whole dial timeout, and
  // one helper serves few dial-backs at once (Host::ServeDialback), which every node behind NAT
  // in the swarm asks for.
  std::chrono::milliseconds wait = every;
  for (;;) {
    {
      std::unique_lock lock(reservations_mu_);
      if (watcher_wake_.wait_for(lock, wait, [this] { return watcher_stop_; })) return;
    }
    const bool behind_relay = impl_->client_mode_;
    // The initial peers first; else up to 6 peers of the routing table, at their first address.
    // Behind a relay the initial peers alone: only their answer changes anything there.
    std::vector<std::string> others;
    if (!behind_relay) {
      for (const Contact& c : KnownPeers()) {
        if (others.size() >= 6) break;
        if (c.addrs.empty()) continue;
        auto a = Multiaddr::Parse(c.addrs.front());
        if (a.ok()) others.push_back(a->WithPeerId(c.peer).ToString());
      }
    }
    const DialBackAnswer answer = AskForDialBack(*host_, initial_peers_, others, stop);
    if (stop()) return;
    wait = behind_relay ? std::min(wait * 2, every * 8) : every;  // reset below when it moves
    if (!answer.is_public) {
      // Only an initial peer's word moves the node behind a relay: any peer of the routing table
      // could claim it cannot reach us, and a swarm's servers are what attackers would move.
      if (answer.trusted && !behind_relay) {
        if (!MoveBehindRelay(stop)) return;
        if (changed) changed(VisibleAddresses());
        wait = every;  // a router that was reset may soon forward again
        continue;
      }
      if (!warned && !behind_relay) {
        COLONY_LOG_WARN(
            "peers of the routing table cannot dial this node at {} (did a router stop forwarding "
            "its port?); its initial peers did not answer, so it stays a DHT server",
            Joined(impl_->DirectAddresses()));
      }
      warned = true;
      continue;
    }
    warned = false;
    if (!answer.reached) continue;  // nobody answered, or one peer alone named an address
    std::vector<Multiaddr> now = WithReachedAddress(listen, *answer.reached);
    if (behind_relay) {
      if (!answer.trusted) continue;  // out from behind the relay on an initial peer's word only
      if (!ServeDirectlyAgain(now, stop)) return;
      if (changed) changed(now);
      wait = every;
      continue;
    }
    // Reached at an address of our own interfaces (a helper on our LAN, or a public interface;
    // `now` is then `listen`): that says nothing about a router's address, which stays.
    if (now.size() == listen.size()) continue;
    const std::vector<Multiaddr> before = impl_->DirectAddresses();
    if (now == before) continue;
    COLONY_LOG_INFO(
        "peers now reach this node at {} (its router's public address changed?): giving others "
        "{} instead of {}",
        answer.reached->ToString(), Joined(now), Joined(before));
    impl_->SetDirectAddresses(now);
    if (!TellDhtAddresses(DhtAddresses(now), stop)) return;
    if (changed) changed(now);
  }
}

bool Node::TellDhtAddresses(std::vector<std::string> addrs, const std::function<bool()>& stop) {
  auto told = std::make_shared<std::promise<void>>();
  std::future<void> done = told->get_future();
  asio::post(impl_->strand_, [impl = impl_, addrs = std::move(addrs), told]() mutable {
    impl->core_->SetAddresses(std::move(addrs), [told] { told->set_value(); });
  });
  // The nearest peers' lookup has its deadline; Shutdown ends it.
  while (done.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    if (stop()) return false;
  }
  return true;
}

bool Node::MoveBehindRelay(const std::function<bool()>& stop) {
  COLONY_LOG_WARN(
      "its initial peers can no longer dial this node at {} (did a router stop forwarding its "
      "port?): running as a DHT client reachable through a relay until they can again",
      Joined(impl_->DirectAddresses()));
  // The reservation first, so that VisibleAddresses() is never empty in between.
  if (!ReserveWithOneOf(FindRelays(initial_peers_), {}, nullptr)) {
    COLONY_LOG_WARN(
        "no relay granted a reservation: nobody can call this node until one does (it asks "
        "again every {:.0f} s)",
        relay_failover_.count() / 1000.0);
  }
  if (stop()) return false;
  impl_->client_mode_ = true;
  publicly_reachable_ = false;
  if (!TellDhtAddresses({}, stop)) return false;
  // One relay watcher for the node's life: it keeps a reservation while the node is a client.
  std::lock_guard lock(reservations_mu_);
  if (!relay_watcher_.joinable() && !watcher_stop_) {
    relay_watcher_ = std::thread([this, fallback = initial_peers_, failover = relay_failover_] {
      WatchRelay(fallback, failover);
    });
  }
  return true;
}

bool Node::ServeDirectlyAgain(const std::vector<Multiaddr>& direct,
                              const std::function<bool()>& stop) {
  COLONY_LOG_INFO(
      "its initial peers now reach this node directly at {}: serving the DHT there and dropping "
      "its relay reservation",
      Joined(direct));
  impl_->SetDirectAddresses(direct);
  impl_->client_mode_ = false;
  publicly_reachable_ = true;
  std::vector<std::unique_ptr<net::RelayReservation>> dropped;
  {
    std::lock_guard lock(reservations_mu_);
    dropped.swap(reservations_);
  }
  dropped.clear();
  return TellDhtAddresses(DhtAddresses(direct), stop);
}

void Node::AnnounceRelay() {
  // Stored now and every 2 minutes, valid for 5, until shutdown.
  std::weak_ptr<Impl> weak = impl_;
  const std::string subkey = OwnerMarker(host_->peer_id());
  auto loop = [weak, subkey]() -> asio::awaitable<void> {
    for (;;) {
      auto impl = weak.lock();
      if (!impl || impl->stopped_.load()) co_return;
      // Not while nobody can dial us (behind a relay ourselves): the announcement lapses.
      if (!impl->client_mode_) {
        // The first address others can use (the latest: a router's address may change): not
        // loopback (a wildcard bind lists loopback first).
        std::optional<Multiaddr> chosen;
        for (const Multiaddr& a : impl->DirectAddresses()) {
          if (!chosen || (IsLoopback(*chosen) && !IsLoopback(a))) chosen = a;
        }
        const std::string value = chosen ? chosen->ToString() : std::string();
        std::vector<StoreItem> items;
        items.push_back({kRelaysKey, subkey, value, Now() + 300});
        auto start =
            [impl, items = std::move(items)](std::function<void(std::vector<Status>)> cb) mutable {
              impl->core_->Store(std::move(items), std::move(cb));
            };
        auto stored = co_await impl->Await<std::vector<Status>>(std::move(start));
        if (stored.empty() || !stored[0].ok()) {
          COLONY_LOG_DEBUG("announcing the relay in the DHT failed");
        }
      }
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (std::chrono::steady_clock::now() < until && !impl->stopped_.load()) {
        asio::steady_timer t(impl->strand_, std::chrono::milliseconds(200));
        co_await t.async_wait(asio::use_awaitable);
      }
    }
  };
  asio::co_spawn(impl_->strand_, std::move(loop), asio::detached);
}

void Node::Shutdown() {
  if (!impl_ || impl_->stopped_.exchange(true)) return;
  auto impl = impl_;
  auto done = std::make_shared<std::promise<void>>();
  asio::post(impl->strand_, [impl, done] {
    impl->core_->Shutdown();
    done->set_value();
  });
  done->get_future().wait_for(std::chrono::seconds(5));
  {
    std::lock_guard lock(reservations_mu_);
    watcher_stop_ = true;
  }
  watcher_wake_.notify_all();
  // The address watcher first: it may start the relay watcher.
  if (address_watcher_.joinable()) address_watcher_.join();
  if (relay_watcher_.joinable()) relay_watcher_.join();
  {
    std::lock_guard lock(reservations_mu_);
    reservations_.clear();
  }
  relay_.reset();
  if (owns_host_) host_->Shutdown();
}

const PeerId& Node::peer_id() const { return host_->peer_id(); }

bool Node::client_mode() const { return impl_->client_mode_; }

std::vector<Multiaddr> Node::VisibleAddresses() const {
  if (!impl_->client_mode_) return impl_->DirectAddresses();
  std::vector<Multiaddr> out;
  std::lock_guard lock(reservations_mu_);
  for (const auto& r : reservations_) {
    if (r->active()) out.push_back(r->address());
  }
  return out;
}

asio::awaitable<std::vector<Status>> Node::StoreMany(std::vector<StoreItem> items) {
  auto impl = impl_;
  auto start = [impl,
                items = std::move(items)](std::function<void(std::vector<Status>)> cb) mutable {
    impl->core_->Store(std::move(items), std::move(cb));
  };
  co_return co_await impl->Await<std::vector<Status>>(std::move(start));
}

asio::awaitable<Status> Node::Store(std::string key, std::string value, double expiration,
                                    std::optional<std::string> subkey) {
  std::vector<StoreItem> items;
  items.push_back({std::move(key), std::move(subkey), std::move(value), expiration});
  auto r = co_await StoreMany(std::move(items));
  co_return r.at(0);
}

asio::awaitable<std::vector<Result<Record>>> Node::GetMany(std::vector<std::string> keys,
                                                           Freshness freshness) {
  auto impl = impl_;
  auto start = [impl, keys = std::move(keys),
                freshness](std::function<void(std::vector<Result<Record>>)> cb) mutable {
    impl->core_->Get(std::move(keys), freshness, std::move(cb));
  };
  co_return co_await impl->Await<std::vector<Result<Record>>>(std::move(start));
}

asio::awaitable<Result<Record>> Node::Get(std::string key, Freshness freshness) {
  std::vector<std::string> keys{std::move(key)};
  auto r = co_await GetMany(std::move(keys), freshness);
  co_return std::move(r.at(0));
}

std::vector<Status> Node::StoreManySync(std::vector<StoreItem> items) {
  const size_t n = items.size();
  auto impl = impl_;
  auto r = impl->Block<std::vector<Status>>(
      [impl, items = std::move(items)](std::function<void(std::vector<Status>)> cb) mutable {
        impl->core_->Store(std::move(items), std::move(cb));
      });
  return r ? std::move(*r) : std::vector<Status>(n, Closed("DHT node is shut down"));
}

Status Node::StoreSync(std::string key, std::string value, double expiration,
                       std::optional<std::string> subkey) {
  std::vector<StoreItem> items;
  items.push_back({std::move(key), std::move(subkey), std::move(value), expiration});
  return StoreManySync(std::move(items)).at(0);
}

std::vector<Result<Record>> Node::GetManySync(std::vector<std::string> keys, Freshness freshness) {
  const size_t n = keys.size();
  auto impl = impl_;
  auto r = impl->Block<std::vector<Result<Record>>>(
      [impl, keys = std::move(keys),
       freshness](std::function<void(std::vector<Result<Record>>)> cb) mutable {
        impl->core_->Get(std::move(keys), freshness, std::move(cb));
      });
  return r ? std::move(*r)
           : std::vector<Result<Record>>(n, Result<Record>(Closed("DHT node is shut down")));
}

Result<Record> Node::GetSync(std::string key, Freshness freshness) {
  std::vector<std::string> keys{std::move(key)};
  return std::move(GetManySync(std::move(keys), freshness).at(0));
}

Result<size_t> Node::Rejoin() {
  if (initial_peers_.empty()) {
    return FailedPrecondition("this DHT node started without initial peers: nothing to rejoin");
  }
  auto impl = impl_;
  auto r = impl->Block<Result<size_t>>(
      [impl, peers = initial_peers_](std::function<void(Result<size_t>)> cb) {
        impl->core_->Bootstrap(peers, std::move(cb));
      });
  if (!r) return Closed("DHT node is shut down");
  return std::move(*r);
}

DhtStats Node::Stats() const {
  auto impl = impl_;
  auto r =
      impl->Block<DhtStats>([impl](std::function<void(DhtStats)> cb) { cb(impl->core_->stats()); });
  return r.value_or(DhtStats{});
}

size_t Node::RoutingTableSize() const {
  auto impl = impl_;
  auto r = impl->Block<size_t>(
      [impl](std::function<void(size_t)> cb) { cb(impl->core_->routing_table().size()); });
  return r.value_or(0);
}

std::vector<Contact> Node::KnownPeers() const {
  auto impl = impl_;
  auto r = impl->Block<std::vector<Contact>>([impl](std::function<void(std::vector<Contact>)> cb) {
    cb(impl->core_->routing_table().All());
  });
  return r.value_or(std::vector<Contact>{});
}

}  // namespace colony::dht
