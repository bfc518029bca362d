#include "net/host.h"

#include <fmt/format.h>
#include <ifaddrs.h>
#include <net/if.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/v6_only.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <cmath>
#include <limits>

#include "core/log.h"
#include "net/protobuf_logs.h"
#include "net/relay.h"
#include "net/relay_wire.h"
#include "net/run_on_strand.h"
#include "net/source_address.h"

namespace colony::net {
namespace {

constexpr auto kUse = asio::experimental::as_tuple(asio::use_awaitable);
constexpr char kDialbackMethod[] = "net.dialback";
// Dial() with this lane makes a connection that is not pooled (reachability probes).
constexpr size_t kProbeLane = std::numeric_limits<size_t>::max();
// Why both ends close a probe's connection after its handshake.
constexpr char kProbeDone[] = "reachability probe done";
// Dial-back probes one host runs at once for others.
constexpr size_t kMaxDialbacks = 4;

// Local interface addresses of one family, loopback first.
std::vector<std::string> InterfaceAddresses(bool v6) {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
    int family = i->ifa_addr->sa_family;
    if (family != (v6 ? AF_INET6 : AF_INET)) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    const void* src =
        v6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr)
           : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr);
    if (!inet_ntop(family, src, buf, sizeof(buf))) continue;
    std::string s = buf;
    if (v6 && s.rfind("fe80", 0) == 0) continue;  // link-local needs a scope id; skip
    if (i->ifa_flags & IFF_LOOPBACK)
      out.insert(out.begin(), s);
    else
      out.push_back(s);
  }
  freeifaddrs(list);
  return out;
}

// The one request of a unary or server-streaming call.
asio::awaitable<Result<Message>> ReadRequest(CallContext& ctx) {
  auto request = co_await ctx.stream().Read();
  if (!request.ok()) co_return request.status();
  if (!request->has_value()) {
    co_return InvalidArgument("call '" + ctx.method() + "' carried no request");
  }
  co_return std::move(**request);
}

std::string ConnectErrorText(const std::error_code& ec) {
  if (ec == asio::error::connection_refused) {
    return "connection refused; is the peer running and listening on that port?";
  }
  if (ec == asio::error::host_unreachable || ec == asio::error::network_unreachable) {
    return ec.message() + "; check the address and your network";
  }
  return ec.message();
}

// What is left until `deadline`, at least 1 ms (0 would mean "no timeout" to the callee).
std::chrono::milliseconds TimeLeft(std::chrono::steady_clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now()));
}

}  // namespace

struct Host::PendingDial {
  explicit PendingDial(const Strand& strand) : done(strand) {}
  Notifier done;
  std::optional<Result<std::shared_ptr<Connection>>> result;
};

Host::Host(KeyPair identity, HostOptions options)
    : identity_(std::move(identity)),
      options_(std::move(options)),
      dial_strand_(asio::make_strand(io_)) {
  RouteProtobufLogs();  // remote bytes must not write to this process's stderr
  if (options_.io_threads == 0) options_.io_threads = 1;
  options_.connection.host_reply_budget = std::make_shared<ByteBudget>(options_.max_reply_bytes);
  options_.connection.host_received_budget =
      std::make_shared<ByteBudget>(options_.max_received_bytes);
  options_.connection.access = options_.access;
  RegisterUnary(kDialbackMethod, [this](CallContext& ctx, Message request) {
    return ServeDialback(ctx, std::move(request));
  });
  RegisterBidiStreaming(kPunchMethod, [this](CallContext& ctx) { return ServePunch(ctx); });
}

Host::~Host() { Shutdown(); }

Status Host::Start() {
  if (started_) return FailedPrecondition("host already started");
  COLONY_RETURN_IF_ERROR(CheckTokenRate(
      "handshakes_per_second_per_address", options_.handshakes_per_second_per_address,
      "handshake_burst_per_address", options_.handshake_burst_per_address));
  if (options_.handshakes_per_second_per_address > 0) {
    handshake_rate_.emplace(
        TokenBucketOptions{.per_second = options_.handshakes_per_second_per_address,
                           .burst = options_.handshake_burst_per_address,
                           .max_keys = kMaxRateAddresses});
  }
  if (!options_.dial_from.empty()) {
    std::error_code ec;
    (void)asio::ip::make_address(options_.dial_from, ec);
    if (ec) return InvalidArgument("dial_from '" + options_.dial_from + "' is not an IP address");
  }
  for (const Multiaddr& addr : options_.listen) {
    if (!addr.is_ip()) {
      return InvalidArgument("cannot listen on " + addr.ToString() +
                             ": use an /ip4/ or /ip6/ address (e.g. /ip4/0.0.0.0/tcp/0)");
    }
    if (addr.peer_id() && *addr.peer_id() != peer_id()) {
      return InvalidArgument("listen address " + addr.ToString() + " names another peer id");
    }
    std::error_code ec;
    auto ip = asio::ip::make_address(addr.host(), ec);
    if (ec) return InvalidArgument("cannot listen on " + addr.ToString() + ": bad IP address");
    asio::ip::tcp::endpoint ep(ip, addr.port());
    auto acceptor = std::make_shared<asio::ip::tcp::acceptor>(io_);
    acceptor->open(ep.protocol(), ec);
    if (!ec) acceptor->set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec && ip.is_v6()) acceptor->set_option(asio::ip::v6_only(true), ec);
    if (!ec) acceptor->bind(ep, ec);
    if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      std::string hint =
          ec == asio::error::address_in_use
              ? "; another process uses that port: choose another, or 0 for any free port"
              : "";
      return Unavailable("cannot listen on " + addr.ToString() + ": " + ec.message() + hint);
    }
    auto bound = acceptor->local_endpoint(ec);
    bound_.push_back(EndpointAddress(bound));
    acceptors_.push_back(acceptor);
  }
  work_.emplace(io_.get_executor());
  for (auto& acceptor : acceptors_) {
    asio::co_spawn(io_, AcceptLoop(acceptor), asio::detached);
  }
  for (size_t i = 0; i < options_.io_threads; ++i) {
    threads_.emplace_back([this] { io_.run(); });
  }
  started_ = true;
  return Status::Ok();
}

void Host::Shutdown() {
  std::vector<std::shared_ptr<Connection>> conns;
  {
    std::lock_guard lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    for (auto& [peer, lanes] : pool_) {
      for (auto& c : lanes) {
        if (c) conns.push_back(c);
      }
    }
  }
  if (!started_) return;
  asio::post(io_, [acceptors = acceptors_] {
    for (auto& a : acceptors) {
      std::error_code ignored;
      a->close(ignored);
    }
  });
  for (auto& c : conns) c->Shutdown("peer is shutting down");
  {
    // Open connections get a moment to close cleanly (GOAWAY); handshakes still in progress do
    // not hold shutdown up (they end with the I/O threads), and one that completes meanwhile is
    // shut down as it joins the pool (AddConnection).
    std::unique_lock lock(mu_);
    all_closed_.wait_for(lock, std::chrono::seconds(3), [this] { return pool_.empty(); });
  }
  work_.reset();
  io_.stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
  // The posted close above may not have run before stop(); no thread runs now, so close here too.
  for (auto& a : acceptors_) {
    std::error_code ignored;
    a->close(ignored);
  }
  std::lock_guard lock(mu_);
  pool_.clear();
}

std::vector<Multiaddr> Host::ListenAddresses() const {
  std::vector<Multiaddr> out;
  for (const Multiaddr& b : bound_) {
    bool wildcard = b.host() == "0.0.0.0" || b.host() == "::";
    if (!wildcard) {
      out.push_back(b.WithPeerId(peer_id()));
      continue;
    }
    for (const std::string& ip : InterfaceAddresses(b.kind() == Multiaddr::HostKind::kIp6)) {
      auto m = Multiaddr::FromIp(ip, b.port(), peer_id());
      if (m.ok()) out.push_back(*m);
    }
  }
  return out;
}

ConnectionOptions Host::ConnectionOptionsFor(const std::string& key) {
  ConnectionOptions o = options_.connection;
  if (key.empty()) return o;
  o.budget_key = key;
  std::lock_guard lock(mu_);
  if (address_budgets_.size() > std::max(budget_sweep_at_, options_.max_connections)) {
    std::erase_if(address_budgets_,
                  [](const auto& entry) { return entry.second.replies.expired(); });
    budget_sweep_at_ = 2 * address_budgets_.size();  // amortized: not a scan per connection
  }
  AddressBudgets& b = address_budgets_[key];
  o.address_reply_budget = b.replies.lock();
  o.address_received_budget = b.received.lock();
  if (!o.address_reply_budget) {
    o.address_reply_budget = std::make_shared<ByteBudget>(options_.max_reply_bytes_per_address);
    o.address_received_budget =
        std::make_shared<ByteBudget>(options_.max_received_bytes_per_address);
    b = {o.address_reply_budget, o.address_received_budget};
  }
  return o;
}

std::string Host::RelayedKey(const asio::ip::address& relay_ip) const {
  const std::string relay = SourceKey(relay_ip, options_.limit_loopback_addresses);
  return relay.empty() ? relay : "peers relayed by " + relay;
}

Host::MemoryUsage Host::memory_usage() const {
  const ByteBudget& replies = *options_.connection.host_reply_budget;
  const ByteBudget& received = *options_.connection.host_received_budget;
  return {replies.used(), replies.peak(), received.used(), received.peak()};
}

std::vector<std::string> Host::ObservedAddresses() const {
  std::lock_guard lock(mu_);
  return observed_.Ranked();
}

void Host::RegisterStream(const std::string& method, StreamHandler handler) {
  std::lock_guard lock(mu_);
  handlers_[method] = std::move(handler);
}

StreamHandler Host::LookupHandler(const std::string& method) const {
  std::lock_guard lock(mu_);
  auto it = handlers_.find(method);
  return it == handlers_.end() ? StreamHandler() : it->second;
}

void Host::RegisterUnary(const std::string& method, UnaryHandler handler) {
  RegisterStream(method,
                 [handler = std::move(handler)](CallContext& ctx) -> asio::awaitable<Status> {
                   auto request = co_await ReadRequest(ctx);
                   if (!request.ok()) co_return request.status();
                   auto response = co_await handler(ctx, std::move(*request));
                   if (!response.ok()) co_return response.status();
                   co_return co_await ctx.stream().Write(*response);
                 });
}

void Host::RegisterServerStreaming(const std::string& method, ServerStreamingHandler handler) {
  RegisterStream(method,
                 [handler = std::move(handler)](CallContext& ctx) -> asio::awaitable<Status> {
                   auto request = co_await ReadRequest(ctx);
                   if (!request.ok()) co_return request.status();
                   co_return co_await handler(ctx, std::move(*request));
                 });
}

void Host::RegisterClientStreaming(const std::string& method, ClientStreamingHandler handler) {
  RegisterStream(method,
                 [handler = std::move(handler)](CallContext& ctx) -> asio::awaitable<Status> {
                   auto response = co_await handler(ctx);
                   if (!response.ok()) co_return response.status();
                   co_return co_await ctx.stream().Write(*response);
                 });
}

void Host::RegisterBidiStreaming(const std::string& method, BidiStreamingHandler handler) {
  RegisterStream(method, std::move(handler));
}

HandshakeOptions Host::MakeHandshakeOptions(Role role, std::optional<PeerId> expected,
                                            const std::string& observed) const {
  HandshakeOptions h;
  h.role = role;
  h.identity = &identity_;
  h.expected_peer = expected;
  h.observed_addr = observed;
  for (const auto& a : bound_) h.listen_addrs.push_back(a.ToString());
  h.limits = options_.connection.limits;
  h.version_major = options_.protocol_major;
  h.agent = options_.agent;
  h.access = options_.access;
  return h;
}

Status Host::SetAccessToken(Bytes token) {
  if (!options_.access) {
    return FailedPrecondition("this host is not in a private swarm (no HostOptions::access)");
  }
  COLONY_RETURN_IF_ERROR(options_.access->SetOwnToken(peer_id(), token));
  std::vector<std::shared_ptr<Connection>> open;
  {
    std::lock_guard lock(mu_);
    for (const auto& [peer, lanes] : pool_) {
      for (const auto& c : lanes) {
        if (c && !c->closed()) open.push_back(c);
      }
    }
  }
  for (const auto& c : open) c->SendAccessToken(token);
  return Status::Ok();
}

Host::AccessRefusals Host::access_refusals() const {
  std::lock_guard lock(mu_);
  return refusals_;
}

const PeerId& Host::DialedBy(const Connection& conn) const {
  return conn.role() == Role::kInitiator ? peer_id() : conn.peer();
}

std::shared_ptr<Connection> Host::AddConnection(const std::shared_ptr<Connection>& conn,
                                                size_t lane) {
  std::unique_lock lock(mu_);
  if (shut_down_) {
    lock.unlock();
    conn->Shutdown("peer is shutting down");
    return conn;
  }
  if (!conn->observed_by_peer().empty()) observed_.Add(conn->observed_by_peer(), conn->peer());
  auto& lanes = pool_[conn->peer()];
  if (lane >= lanes.size()) lanes.resize(lane + 1);
  if (!lanes[lane] || lanes[lane]->closing()) {
    lanes[lane] = conn;
    return conn;
  }
  if (lanes[lane]->remote_address().is_relayed() && !conn->remote_address().is_relayed()) {
    // A direct connection (a hole punched) replaces a relayed one for new streams; the relayed
    // one leaves the pool and closes when its streams are done.
    lanes[lane]->Retire("replaced by a direct connection", std::chrono::seconds(2));
    lanes[lane] = conn;
    return conn;
  }
  // Lane taken by a concurrent dial or accept: one of the two moves to the first free lane.
  // When this peer and the other dialed each other at the same moment (both start an
  // all-reduce, say), each end would otherwise keep the one it completed first and open its
  // streams on a different one: two TCP flows per pair, each carrying one direction's share,
  // which compete for the same links and end at different times (8 peers averaging over a 50 ms,
  // 25 Mbit/s lab were 5% slower than over one flow per pair; docs/benchmarks.md, "wan"). Both
  // ends see both connections and keep the one dialed by the smaller peer id; the other finishes
  // the streams it carries and leaves with the idle timeout.
  std::shared_ptr<Connection> kept = lanes[lane];
  std::shared_ptr<Connection> spare = conn;
  const bool simultaneous = !conn->remote_address().is_relayed() &&
                            !kept->remote_address().is_relayed() && conn->role() != kept->role();
  if (simultaneous && DialedBy(*conn) < DialedBy(*kept)) std::swap(kept, spare);
  lanes[lane] = kept;
  auto free =
      std::find_if(lanes.begin(), lanes.end(), [](const auto& c) { return !c || c->closing(); });
  if (free != lanes.end())
    *free = std::move(spare);
  else
    lanes.push_back(std::move(spare));
  return simultaneous ? kept : conn;
}

void Host::OnConnectionClosed(Connection* conn) {
  std::lock_guard lock(mu_);
  auto it = pool_.find(conn->peer());
  if (it != pool_.end()) {
    for (auto& c : it->second) {
      if (c.get() == conn) c.reset();
    }
    while (!it->second.empty() && !it->second.back()) it->second.pop_back();
    if (it->second.empty()) pool_.erase(it);
  }
  if (auto a = inbound_address_of_.find(conn); a != inbound_address_of_.end()) {
    if (auto in = inbound_.find(a->second); in != inbound_.end()) {
      std::erase_if(in->second.open, [conn](const std::weak_ptr<Connection>& c) {
        auto locked = c.lock();
        return !locked || locked.get() == conn;
      });
      if (in->second.handshakes == 0 && in->second.open.empty()) inbound_.erase(in);
    }
    inbound_address_of_.erase(a);
  }
  auto stats = conn->stats();
  closed_bytes_sent_ += stats.bytes_sent;
  closed_bytes_received_ += stats.bytes_received;
  if (connection_count_ > 0) --connection_count_;
  all_closed_.notify_all();
}

size_t Host::connection_count() const {
  std::lock_guard lock(mu_);
  return connection_count_;
}

Connection::Stats Host::TotalStats() const {
  std::lock_guard lock(mu_);
  Connection::Stats total{closed_bytes_sent_, closed_bytes_received_};
  for (const auto& [peer, lanes] : pool_) {
    for (const auto& c : lanes) {
      if (!c) continue;
      auto s = c->stats();
      total.bytes_sent += s.bytes_sent;
      total.bytes_received += s.bytes_received;
    }
  }
  return total;
}

std::shared_ptr<Connection> Host::FindConnection(const PeerId& peer, size_t lane) const {
  std::lock_guard lock(mu_);
  auto it = pool_.find(peer);
  if (it == pool_.end() || lane >= it->second.size()) return nullptr;
  const auto& c = it->second[lane];
  return c && !c->closing() ? c : nullptr;
}

asio::awaitable<void> Host::AcceptLoop(std::shared_ptr<asio::ip::tcp::acceptor> acceptor) {
  for (;;) {
    Strand strand = asio::make_strand(io_);
    auto [ec, socket] = co_await acceptor->async_accept(strand, kUse);
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor->is_open()) co_return;
      COLONY_LOG_WARN("accept failed: {}", ec.message());
      // Out of file descriptors and the like: back off instead of spinning.
      asio::steady_timer t(io_, std::chrono::milliseconds(100));
      co_await t.async_wait(kUse);
      continue;
    }
    std::string key;
    std::shared_ptr<Connection> evict;
    {
      std::lock_guard lock(mu_);
      if (shut_down_) co_return;
      std::error_code ep_error;
      const auto remote = socket.remote_endpoint(ep_error);
      Status reserved = ep_error ? Unavailable("the connection closed at once")
                                 : ReserveInbound(remote.address(), &key, &evict);
      if (!reserved.ok()) {
        // A flood may knock often: log the first refusals, then every 1000th.
        const uint64_t n = slot_refusals_.per_address + slot_refusals_.handshakes +
                           slot_refusals_.rate + slot_refusals_.full;
        if (n <= 10 || n % 1000 == 0) {
          COLONY_LOG_WARN("refusing a connection: {} (refusal {})", reserved.message(), n);
        }
        std::error_code ignored;
        socket.close(ignored);
        continue;
      }
    }
    if (evict) {
      evict->Shutdown("evicted: its address holds the most connections and the host is full");
    }
    auto handle = HandleIncoming(std::move(socket), strand, std::nullopt, std::move(key));
    asio::co_spawn(strand, std::move(handle), asio::detached);
  }
}

Status Host::ReserveInbound(const asio::ip::address& ip, std::string* key,
                            std::shared_ptr<Connection>* evict) {
  // An IPv4 peer on a dual-stack listener is the same address as on an IPv4 one.
  const std::string address = SourceKey(ip, options_.limit_loopback_addresses);
  if (address.empty()) {
    if (connection_count_ >= options_.max_connections) {
      ++slot_refusals_.full;
      return ResourceExhausted("already " + std::to_string(connection_count_) +
                               " connections open (max_connections)");
    }
    ++connection_count_;  // reserved during the handshake
    return Status::Ok();
  }
  auto held = [](InboundAddress& a) {
    std::erase_if(a.open, [](const std::weak_ptr<Connection>& c) { return c.expired(); });
    return a.handshakes + a.open.size();
  };
  InboundAddress& mine = inbound_[address];
  const size_t own = held(mine);
  if (own >= options_.max_connections_per_address) {
    ++slot_refusals_.per_address;
    return ResourceExhausted(address + " already holds " + std::to_string(own) +
                             " connections (max_connections_per_address)");
  }
  if (mine.handshakes >= options_.max_handshakes_per_address) {
    ++slot_refusals_.handshakes;
    return ResourceExhausted(address + " already has " + std::to_string(mine.handshakes) +
                             " handshakes running (max_handshakes_per_address)");
  }
  if (handshake_rate_) {
    if (const auto wait = handshake_rate_->Take(address, std::chrono::steady_clock::now())) {
      ++slot_refusals_.rate;
      if (own == 0) inbound_.erase(address);
      return ResourceExhausted(
          fmt::format("{} started more handshakes than its rate of {:g} per second allows "
                      "(handshakes_per_second_per_address); its next is allowed in {:.2f} s",
                      address, options_.handshakes_per_second_per_address, *wait));
    }
  }
  if (connection_count_ >= options_.max_connections) {
    // Fair eviction: the address holding the most inbound connections gives one up, when it
    // holds at least two more than the newcomer's (so that two addresses cannot evict each
    // other back and forth).
    InboundAddress* heaviest = nullptr;
    size_t most = own + 1;
    for (auto& [other, a] : inbound_) {
      if (other == address || a.open.empty()) continue;
      if (const size_t n = held(a); n > most) {
        most = n;
        heaviest = &a;
      }
    }
    std::shared_ptr<Connection> victim;
    if (heaviest) {
      for (auto it = heaviest->open.rbegin(); it != heaviest->open.rend() && !victim; ++it) {
        victim = it->lock();
      }
    }
    if (!victim) {
      ++slot_refusals_.full;
      if (held(mine) == 0) inbound_.erase(address);
      return ResourceExhausted("already " + std::to_string(connection_count_) +
                               " connections open (max_connections)");
    }
    ++slot_refusals_.evicted;
    *evict = std::move(victim);
  }
  ++mine.handshakes;
  ++connection_count_;  // reserved during the handshake
  *key = address;
  return Status::Ok();
}

void Host::EndInboundHandshake(const std::string& key, const std::shared_ptr<Connection>& conn) {
  if (key.empty()) return;
  std::lock_guard lock(mu_);
  auto it = inbound_.find(key);
  if (it == inbound_.end()) return;
  if (it->second.handshakes > 0) --it->second.handshakes;
  // A connection that closed already was not counted by OnConnectionClosed: leave it out.
  if (conn && !conn->closed()) {
    it->second.open.push_back(conn);
    inbound_address_of_[conn.get()] = key;
  }
  if (it->second.handshakes == 0 && it->second.open.empty()) inbound_.erase(it);
}

Host::SlotRefusals Host::slot_refusals() const {
  std::lock_guard lock(mu_);
  return slot_refusals_;
}

void Host::AdoptRelayed(asio::ip::tcp::socket socket, Strand strand, Multiaddr relay) {
  {
    std::lock_guard lock(mu_);
    if (shut_down_ || connection_count_ >= options_.max_connections) {
      std::error_code ignored;
      socket.close(ignored);
      return;
    }
    ++connection_count_;  // reserved during the handshake
  }
  auto handle = HandleIncoming(std::move(socket), strand, std::move(relay));
  asio::co_spawn(strand, std::move(handle), asio::detached);
}

asio::awaitable<void> Host::HandleIncoming(asio::ip::tcp::socket socket, Strand strand,
                                           std::optional<Multiaddr> relay,
                                           std::string inbound_key) {
  std::error_code ec;
  auto remote_ep = socket.remote_endpoint(ec);
  Multiaddr remote = ec ? Multiaddr() : EndpointAddress(remote_ep);
  // Through a relay, the socket's far end is the relay: it cannot tell us our address.
  const std::string observed = relay ? std::string() : remote.ToString();
  if (relay) remote = *relay;
  // The handshake must finish in time; closing the socket aborts it.
  // `finished` keeps a late timer callback (queued just as the handshake completed) from touching
  // the socket after it has moved into the connection.
  auto finished = std::make_shared<bool>(false);
  asio::steady_timer timer(strand, options_.connection.handshake_timeout);
  timer.async_wait([&socket, finished](std::error_code e) {
    if (!e && !*finished) {
      std::error_code ignored;
      socket.close(ignored);
    }
  });
  const HandshakeOptions options = MakeHandshakeOptions(Role::kResponder, std::nullopt, observed);
  const std::string desc = "incoming connection from " + remote.ToString();
  bool refused = false;
  auto hs = co_await RunHandshake(socket, options, desc, &refused);
  *finished = true;
  timer.cancel();
  if (!hs.ok()) {
    if (refused) {
      uint64_t n = 0;
      {
        std::lock_guard lock(mu_);
        n = ++refusals_.count;
        refusals_.last = hs.status().message();
      }
      // A swarm's outsiders may knock often: log the first ones, then every 1000th.
      if (n <= 10 || n % 1000 == 0) {
        COLONY_LOG_WARN("private swarm: {} (refusal {})", hs.status().message(), n);
      }
    } else {
      COLONY_LOG_DEBUG("handshake failed: {}", hs.status().ToString());
    }
    std::error_code ignored;
    socket.close(ignored);
    EndInboundHandshake(inbound_key, nullptr);
    std::lock_guard lock(mu_);
    --connection_count_;
    all_closed_.notify_all();
    co_return;
  }
  PeerId peer = hs->peer.peer;
  const bool probe = hs->peer.probe;
  if (relay) remote = relay->Relaying(peer);
  // Memory budgets per source address: through a relay we see only the relay's.
  const std::string budget_key =
      relay ? (ec ? std::string() : RelayedKey(remote_ep.address())) : inbound_key;
  auto conn = Connection::Start(
      std::move(socket), strand, Role::kResponder, std::move(*hs), remote,
      ConnectionOptionsFor(budget_key), [this](const std::string& m) { return LookupHandler(m); },
      [this](Connection* c) { OnConnectionClosed(c); });
  if (probe) {
    // A dial-back testing whether we are reachable: its handshake is the answer, and the dialer
    // closes it at once. Pooled, it could win over our own connection to that peer (of two
    // connections between a pair, the one dialed by the smaller peer id stays), and our next
    // call would fail as the dialer closes it. It stays out of the pool and carries nothing.
    EndInboundHandshake(inbound_key, conn);
    conn->Shutdown(kProbeDone);
    co_return;
  }
  size_t lanes_in_use = 0;  // before this one joins
  std::optional<std::string> blocked = BlockedReason(peer);
  {
    std::lock_guard lock(mu_);
    auto it = pool_.find(peer);
    if (it != pool_.end()) {
      for (auto& c : it->second) lanes_in_use += c && !c->closed();
    }
  }
  AddConnection(conn, 0);
  EndInboundHandshake(inbound_key, conn);
  if (blocked) {
    conn->Shutdown("this peer refuses you: " + *blocked);
  } else if (lanes_in_use >= options_.max_connections_per_peer) {
    conn->Shutdown("too many connections from one peer (limit " +
                   std::to_string(options_.max_connections_per_peer) + ")");
  } else if (relay && options_.hole_punching) {
    auto punch = PunchThroughRelay(conn);
    asio::co_spawn(io_, std::move(punch), asio::detached);
  }
}

asio::awaitable<Result<std::shared_ptr<Connection>>> Host::Connect(
    Multiaddr address, size_t lane, std::chrono::milliseconds timeout) {
  const auto wait_until = timeout.count() > 0 ? std::chrono::steady_clock::now() + timeout
                                              : std::chrono::steady_clock::time_point::max();
  if (address.peer_id()) {
    if (auto why = BlockedReason(*address.peer_id())) {
      co_return PermissionDenied("peer " + address.peer_id()->ToString() +
                                 " is blocked here: " + *why);
    }
    if (auto c = FindConnection(*address.peer_id(), lane)) co_return c;
    std::vector<Multiaddr> announced;
    {
      std::lock_guard lock(mu_);
      announced = peer_addresses_.Get(*address.peer_id());
    }
    if (!announced.empty() && !(announced.size() == 1 && announced[0] == address)) {
      announced.insert(announced.begin(), address);
      co_return co_await ConnectAny(*address.peer_id(), std::move(announced), lane, timeout);
    }
  }
  COLONY_CO_RETURN_IF_ERROR(DialPrecondition(lane));
  auto fn = [this, address = std::move(address), lane, wait_until] {
    return ConnectOnDialStrand(address, lane, wait_until);
  };
  co_return co_await RunOnStrand<Result<std::shared_ptr<Connection>>>(dial_strand_, std::move(fn));
}

Status Host::DialPrecondition(size_t lane) const {
  std::lock_guard lock(mu_);
  if (shut_down_) return Closed("host is shut down");
  if (!started_) return FailedPrecondition("host not started; call Start() first");
  if (lane >= options_.max_connections_per_peer) {
    return InvalidArgument("lane " + std::to_string(lane) +
                           " exceeds the per-peer connection limit");
  }
  return Status::Ok();
}

asio::awaitable<Result<std::shared_ptr<Connection>>> Host::ConnectOnDialStrand(
    Multiaddr address, size_t lane, std::chrono::steady_clock::time_point wait_until) {
  std::optional<PeerId> peer = address.peer_id();
  if (!peer) {
    std::lock_guard lock(mu_);
    auto it = peer_at_address_.find(address.ToString());
    if (it != peer_at_address_.end()) peer = it->second;
  }
  if (peer) {
    if (auto c = FindConnection(*peer, lane)) co_return c;
  }
  // One dial per address and lane, whoever asks during it. The dial runs on its own and is not
  // cancelled when a waiter gives up (its deadline passed, or its caller was cancelled): the other
  // waiters still get its connection, and it stays pooled for the next call.
  const std::string key = address.ToString() + "#" + std::to_string(lane);
  std::shared_ptr<PendingDial> pending;
  if (auto it = pending_dials_.find(key); it != pending_dials_.end()) {
    pending = it->second;
  } else {
    pending = std::make_shared<PendingDial>(dial_strand_);
    pending_dials_.emplace(key, pending);
    auto run = RunPendingDial(pending, key, address, lane);
    asio::co_spawn(dial_strand_, std::move(run), asio::detached);
  }
  while (!pending->result) {
    auto cancel = co_await asio::this_coro::cancellation_state;
    if (cancel.cancelled() != asio::cancellation_type::none) {
      co_return Cancelled("connecting to " + address.ToString() + " was cancelled");
    }
    if (std::chrono::steady_clock::now() >= wait_until) {
      co_return DeadlineExceeded("peer " + address.ToString() +
                                 " was not connected within the call's timeout");
    }
    co_await pending->done.WaitUntil(wait_until);
  }
  co_return *pending->result;
}

asio::awaitable<void> Host::RunPendingDial(std::shared_ptr<PendingDial> pending, std::string key,
                                           Multiaddr address, size_t lane) {
  Strand strand = asio::make_strand(io_);
  auto dial = Dial(address, lane);
  auto result = co_await asio::co_spawn(strand, std::move(dial), asio::use_awaitable);
  if (result.ok() && !address.peer_id()) {
    std::lock_guard lock(mu_);
    if (peer_at_address_.size() < 4096) peer_at_address_[address.ToString()] = (*result)->peer();
  }
  pending->result = std::move(result);
  pending_dials_.erase(key);
  pending->done.Notify();
}

asio::awaitable<Result<std::shared_ptr<Connection>>> Host::Dial(Multiaddr address, size_t lane) {
  auto ex = co_await asio::this_coro::executor;
  // The executor is a strand made for this connection (see Connect).
  Strand strand = *ex.target<Strand>();
  const std::string desc = address.ToString();
  const auto deadline = std::chrono::steady_clock::now() + options_.dial_timeout;
  const std::string timeout_text =
      std::to_string(options_.dial_timeout.count() / 1000.0).substr(0, 4) + " s";

  std::vector<asio::ip::tcp::endpoint> endpoints;
  if (address.is_ip()) {
    endpoints.emplace_back(asio::ip::make_address(address.host()), address.port());
  } else {
    asio::ip::tcp::resolver resolver(strand);
    asio::steady_timer timer(strand, options_.dial_timeout);
    auto resolved = std::make_shared<bool>(false);
    timer.async_wait([&resolver, resolved](std::error_code e) {
      if (!e && !*resolved) resolver.cancel();
    });
    auto [ec, results] =
        co_await resolver.async_resolve(address.host(), std::to_string(address.port()), kUse);
    *resolved = true;
    timer.cancel();
    if (ec)
      co_return Unavailable("cannot resolve " + address.host() + " (in " + desc +
                            "): " + ec.message());
    for (const auto& r : results) {
      bool v4 = r.endpoint().address().is_v4();
      if (address.kind() == Multiaddr::HostKind::kDns4 && !v4) continue;
      if (address.kind() == Multiaddr::HostKind::kDns6 && v4) continue;
      endpoints.push_back(r.endpoint());
    }
    if (endpoints.empty())
      co_return Unavailable("no usable address for " + address.host() + " in " + desc);
  }

  asio::ip::tcp::socket socket(strand);
  asio::steady_timer timer(strand, deadline);
  // Shared with the timer callback, which may run after this frame is gone (see HandleIncoming).
  struct DialState {
    bool finished = false;
    bool timed_out = false;
  };
  auto state = std::make_shared<DialState>();
  timer.async_wait([&socket, state](std::error_code e) {
    if (!e && !state->finished) {
      state->timed_out = true;
      std::error_code ignored;
      socket.close(ignored);
    }
  });
  std::error_code ec;
  asio::ip::tcp::endpoint ep;
  if (options_.dial_from.empty()) {
    std::tie(ec, ep) = co_await asio::async_connect(socket, endpoints, kUse);
  } else {
    // From a chosen local address: each endpoint of its family on a socket bound to it.
    std::error_code bad;
    const asio::ip::address from = asio::ip::make_address(options_.dial_from, bad);
    ec = bad ? bad : std::error_code(asio::error::address_family_not_supported);
    for (size_t i = 0; !bad && i < endpoints.size() && !state->timed_out; ++i) {
      if (endpoints[i].address().is_v4() != from.is_v4()) continue;
      std::error_code ignored;
      socket.close(ignored);
      socket.open(endpoints[i].protocol(), ec);
      if (!ec) socket.bind({from, 0}, ec);
      if (!ec) std::tie(ec) = co_await socket.async_connect(endpoints[i], kUse);
      if (!ec) {
        ep = endpoints[i];
        break;
      }
    }
  }
  if (ec) {
    state->finished = true;
    timer.cancel();
    if (state->timed_out) {
      co_return DeadlineExceeded("peer " + desc + " did not answer within " + timeout_text +
                                 "; check the address or firewall");
    }
    co_return Unavailable("cannot connect to " + desc + ": " + ConnectErrorText(ec));
  }
  {
    std::lock_guard lock(mu_);
    if (shut_down_) {
      state->finished = true;
      co_return Closed("host is shut down");
    }
    ++connection_count_;
  }
  // A dial that fails after the TCP connection: stop the timer, close, release the slot.
  auto abandon = [&] {
    state->finished = true;
    timer.cancel();
    std::error_code ignored;
    socket.close(ignored);
    std::lock_guard lock(mu_);
    --connection_count_;
    all_closed_.notify_all();
  };
  if (address.is_relayed()) {
    // Through a relay: ask it for the peer first; the handshake then runs end to end.
    const PeerId& target = *address.peer_id();
    Status relayed = co_await RequestCircuit(socket, target, desc);
    if (!relayed.ok()) {
      abandon();
      if (state->timed_out) {
        co_return DeadlineExceeded("relay " + desc + " did not connect us within " + timeout_text +
                                   "; is the peer still reserved there?");
      }
      co_return relayed;
    }
  }
  const std::string observed =
      address.is_relayed() ? std::string() : EndpointAddress(ep).ToString();
  HandshakeOptions handshake = MakeHandshakeOptions(Role::kInitiator, address.peer_id(), observed);
  handshake.probe = lane == kProbeLane;
  auto hs = co_await RunHandshake(socket, handshake, "peer " + desc);
  if (!hs.ok()) {
    abandon();
    if (state->timed_out) {
      co_return DeadlineExceeded("peer " + desc + " did not complete the handshake within " +
                                 timeout_text + "; is it a Colony peer?");
    }
    co_return hs.status();
  }
  state->finished = true;
  timer.cancel();
  // The peer we dialed can withhold credit from our replies to its calls too (through a relay,
  // `ep` is the relay's).
  const std::string budget_key = address.is_relayed()
                                     ? RelayedKey(ep.address())
                                     : SourceKey(ep.address(), options_.limit_loopback_addresses);
  if (auto why = BlockedReason(hs->peer.peer)) {  // a dial without /p2p/ reached it
    abandon();
    co_return PermissionDenied("peer " + hs->peer.peer.ToString() + " at " + desc +
                               " is blocked here: " + *why);
  }
  auto conn = Connection::Start(
      std::move(socket), strand, Role::kInitiator, std::move(*hs), address,
      ConnectionOptionsFor(budget_key), [this](const std::string& m) { return LookupHandler(m); },
      [this](Connection* c) { OnConnectionClosed(c); });
  if (lane == kProbeLane) co_return conn;
  co_return AddConnection(conn, lane);
}

bool Host::Block(const PeerId& peer, std::string reason) {
  std::vector<std::shared_ptr<Connection>> open;
  {
    std::lock_guard lock(mu_);
    if (!blocked_.contains(peer) && blocked_.size() >= kMaxBlockedPeers) return false;
    blocked_[peer] = reason;
    if (auto it = pool_.find(peer); it != pool_.end()) open = it->second;
  }
  for (auto& c : open) {
    if (c) c->Shutdown("this peer refuses you: " + reason);
  }
  return true;
}

std::optional<std::string> Host::BlockedReason(const PeerId& peer) const {
  std::lock_guard lock(mu_);
  auto it = blocked_.find(peer);
  if (it == blocked_.end()) return std::nullopt;
  return it->second;
}

asio::awaitable<Status> Host::Probe(Multiaddr address) {
  if (!address.peer_id())
    co_return InvalidArgument("a probe needs the peer's id: " + address.ToString());
  Strand strand = asio::make_strand(io_);
  auto dial = Dial(std::move(address), kProbeLane);
  auto result = co_await asio::co_spawn(strand, std::move(dial), asio::use_awaitable);
  if (!result.ok()) co_return result.status();
  (*result)->Shutdown(kProbeDone);
  co_return Status();
}

asio::awaitable<Result<Message>> Host::ServeDialback(CallContext& ctx, Message request) {
  auto ports = ParseDialbackPorts(request.meta);
  if (!ports.ok()) co_return ports.status();
  const Multiaddr seen = ctx.remote_address();
  if (!seen.is_ip() || seen.port() == 0) {
    co_return FailedPrecondition("cannot tell where this call comes from");
  }
  {
    std::lock_guard lock(mu_);
    if (dialbacks_in_flight_ >= kMaxDialbacks) {
      co_return ResourceExhausted("this peer is busy dialing others back; ask another");
    }
    ++dialbacks_in_flight_;
  }
  // Only the caller's own IP is dialed (never a third party's), at the ports it names.
  Status last = Unavailable("no port given");
  std::string reached;
  for (uint16_t port : *ports) {
    Multiaddr target = Multiaddr(seen.kind(), seen.host(), port).WithPeerId(ctx.peer());
    const std::string text = target.ToString();
    last = co_await Probe(std::move(target));
    if (last.ok()) {
      reached = text;
      break;
    }
  }
  {
    std::lock_guard lock(mu_);
    --dialbacks_in_flight_;
  }
  if (!reached.empty()) co_return Message("reachable " + reached);
  // Only the kind of failure: the error's text may quote bytes read from the dialled port, and
  // behind a shared NAT that port may be someone else's service.
  co_return Message("unreachable " + std::string(StatusCodeName(last.code())));
}

asio::awaitable<Result<std::optional<Multiaddr>>> Host::CheckReachability(Multiaddr helper) {
  std::vector<uint16_t> ports;
  for (const Multiaddr& a : ListenAddresses()) {
    if (std::find(ports.begin(), ports.end(), a.port()) == ports.end()) ports.push_back(a.port());
  }
  if (ports.empty()) co_return std::nullopt;  // not listening: nobody can dial in
  if (ports.size() > kMaxDialbackPorts) ports.resize(kMaxDialbackPorts);
  // Dialing back takes the helper up to its dial timeout per port.
  CallOptions options{.timeout = options_.dial_timeout * static_cast<int64_t>(ports.size() + 1)};
  std::string method = kDialbackMethod;
  Message request(FormatDialbackPorts(ports));
  auto reply = co_await Call(std::move(helper), std::move(method), std::move(request), options);
  if (!reply.ok()) co_return reply.status();
  if (reply->meta.rfind("reachable ", 0) == 0) {
    // The helper dialed the IP it saw and one of our ports, and found us there.
    auto reached = Multiaddr::Parse(reply->meta.substr(10));
    if (!reached.ok() || !reached->is_ip() || reached->is_relayed() ||
        reached->peer_id() != peer_id() ||
        std::find(ports.begin(), ports.end(), reached->port()) == ports.end()) {
      co_return ProtocolError("the dial-back reply names an address we did not ask about: " +
                              reply->meta.substr(10, 120));
    }
    co_return std::optional<Multiaddr>(std::move(*reached));
  }
  if (reply->meta.rfind("unreachable", 0) == 0) {
    COLONY_LOG_DEBUG("dial-back failed: {}", reply->meta);
    co_return std::nullopt;
  }
  co_return ProtocolError("malformed dial-back reply");
}

Result<std::optional<Multiaddr>> Host::CheckReachabilitySync(const Multiaddr& helper) {
  auto fut = asio::co_spawn(io_, CheckReachability(helper), asio::use_future);
  return fut.get();
}

std::chrono::milliseconds Host::TimeoutFor(const CallOptions& options) const {
  return options.timeout.count() > 0 ? options.timeout : options_.default_call_timeout;
}

asio::awaitable<Result<Message>> Host::Call(Multiaddr address, std::string method, Message request,
                                            CallOptions options) {
  auto timeout = TimeoutFor(options);
  auto opened = co_await OpenStream(std::move(address), std::move(method), options);
  if (!opened.ok()) co_return opened.status();
  auto stream = *opened;
  auto fn = [stream, request = std::move(request)]() -> asio::awaitable<Result<Message>> {
    Status st = co_await stream->Write(request);
    if (!st.ok()) co_return st;
    st = co_await stream->CloseWrite();
    if (!st.ok()) co_return st;
    co_return co_await stream->ReadFinal();
  };
  co_return co_await RunOnStrand<Result<Message>>(stream->strand(), std::move(fn));
}

asio::awaitable<Result<std::shared_ptr<Stream>>> Host::OpenStream(Multiaddr address,
                                                                  std::string method,
                                                                  CallOptions options) {
  // A pooled connection may start closing (idle timeout, peer shutdown) just as we pick it; then
  // dial once more rather than fail the call.
  const auto deadline = std::chrono::steady_clock::now() + TimeoutFor(options);
  for (int attempt = 0;; ++attempt) {
    auto conn = co_await Connect(address, options.lane, TimeLeft(deadline));
    if (!conn.ok()) co_return conn.status();
    auto stream = co_await (*conn)->OpenStream(method, TimeLeft(deadline));
    if (stream.ok() || attempt > 0 || !(*conn)->closing()) co_return stream;
  }
}

asio::awaitable<Result<PingResult>> Host::Ping(Multiaddr address,
                                               std::chrono::milliseconds timeout) {
  // Connect reads 0 as "no bound but dial_timeout", which a ping's deadline must not become.
  if (timeout.count() <= 0) {
    co_return InvalidArgument("ping timeout must be positive, not " +
                              std::to_string(timeout.count()) + " ms");
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto conn = co_await Connect(address, 0, timeout);
  if (!conn.ok()) co_return conn.status();
  auto rtt = co_await (*conn)->Ping(TimeLeft(deadline));
  if (!rtt.ok()) co_return rtt.status();
  PingResult r;
  r.peer = (*conn)->peer();
  r.version_major = (*conn)->peer_hello().version_major;
  r.version_minor = (*conn)->peer_hello().version_minor;
  r.agent = (*conn)->peer_hello().agent;
  r.rtt = *rtt;
  r.address = (*conn)->remote_address();
  co_return r;
}

Result<Message> Host::CallSync(const Multiaddr& address, const std::string& method, Message request,
                               CallOptions options) {
  return asio::co_spawn(io_, Call(address, method, std::move(request), options), asio::use_future)
      .get();
}

Result<PingResult> Host::PingSync(const Multiaddr& address, std::chrono::milliseconds timeout) {
  return asio::co_spawn(io_, Ping(address, timeout), asio::use_future).get();
}

}  // namespace colony::net
