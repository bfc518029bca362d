// The HTTP server: Boost.Beast on one I/O thread (a coroutine per connection) and a bounded pool of
// worker threads for the handlers. A handler's answer or stream chunks cross from its worker to the
// connection's coroutine through an Exchange (a queue, and a timer the worker cancels to wake the
// coroutine). Over TLS the same request loop runs on a Beast ssl_stream after the handshake.
#include "http/server.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "core/address_key.h"
#include "core/log.h"
#include "core/token_buckets.h"
#include "http/tls_context.h"

namespace colony::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

std::string_view Request::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return v;
  }
  return {};
}

Reply Json(int status, std::string body) {
  Reply r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

Reply JsonError(int status, std::string_view message, std::string_view type,
                std::string_view code) {
  nlohmann::json e = {{"message", message}, {"type", type}, {"param", nullptr}};
  e["code"] = code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code);
  return Json(status, nlohmann::json({{"error", e}})
                          .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void Router::Add(std::string method, std::string path, Handler handler) {
  routes_.push_back({std::move(method), std::move(path), false, std::move(handler)});
}

void Router::AddPrefix(std::string method, std::string prefix, Handler handler) {
  routes_.push_back({std::move(method), std::move(prefix), true, std::move(handler)});
}

Router::Match Router::Find(std::string_view method, std::string_view path) const {
  std::string allowed;
  for (const auto& r : routes_) {
    const bool hit =
        r.prefix ? path.starts_with(r.path) && path.size() > r.path.size() : path == r.path;
    if (!hit) continue;
    if (r.method == method) return {&r.handler, {}};
    allowed += (allowed.empty() ? "" : ", ") + r.method;
  }
  if (allowed.empty()) {
    return {nullptr, JsonError(404, "no such endpoint: " + std::string(path), "not_found_error")};
  }
  Reply r = JsonError(405, std::string(method) + " is not allowed on " + std::string(path) +
                               "; allowed: " + allowed);
  r.headers.emplace_back("Allow", allowed);
  return {nullptr, std::move(r)};
}

namespace {

// What a handler's worker and the connection's coroutine share for one request.
class Exchange : public StreamWriter, public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(asio::io_context& io, size_t max_queue) : wake_(io), max_queue_(max_queue) {
    wake_.expires_at(Clock::time_point::max());
  }

  // Worker side.
  void SetReply(Reply reply) {
    {
      std::lock_guard lock(mu_);
      reply_ = std::move(reply);
    }
    Wake();
  }
  void Finish() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    Wake();
  }
  bool Write(std::string_view bytes) override {
    if (bytes.empty()) return !cancelled();
    std::unique_lock lock(mu_);
    cv_.wait(lock,
             [&] { return cancelled_ || queued_ + bytes.size() <= max_queue_ || queued_ == 0; });
    if (cancelled_) return false;
    chunks_.emplace_back(bytes);
    queued_ += bytes.size();
    lock.unlock();
    Wake();
    return true;
  }
  bool cancelled() const override {
    std::lock_guard lock(mu_);
    return cancelled_;
  }

  // Either side.
  void Cancel() {
    {
      std::lock_guard lock(mu_);
      cancelled_ = true;
    }
    cv_.notify_all();
    Wake();
  }

  // Coroutine side: waits until the worker has something (or the deadline passes); false at the
  // deadline.
  asio::awaitable<bool> WaitUntil(Clock::time_point deadline) {
    wake_.expires_at(deadline);
    beast::error_code ec;
    co_await wake_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    co_return ec == asio::error::operation_aborted;  // woken (or stopping), not timed out
  }
  std::optional<Reply> TakeReply() {
    std::lock_guard lock(mu_);
    std::optional<Reply> r = std::move(reply_);
    reply_.reset();
    return r;
  }
  bool has_reply() {
    std::lock_guard lock(mu_);
    return reply_.has_value();
  }
  // Takes the queued chunks; `done` says whether the stream has ended.
  std::string TakeChunks(bool& done) {
    std::string out;
    {
      std::lock_guard lock(mu_);
      for (auto& c : chunks_) out += c;
      chunks_.clear();
      done = done_;
    }
    return out;
  }
  bool pending() {
    std::lock_guard lock(mu_);
    return !chunks_.empty() || done_;
  }
  // The answer is written and the hang-up watch must not touch the socket again (the I/O
  // thread's only: set and read there).
  void EndWatch() { watch_ended_ = true; }
  bool watch_ended() const { return watch_ended_; }
  void Written(size_t bytes) {
    {
      std::lock_guard lock(mu_);
      queued_ -= std::min(queued_, bytes);
    }
    cv_.notify_all();
  }

 private:
  void Wake() {
    asio::post(wake_.get_executor(), [self = shared_from_this()] { self->wake_.cancel(); });
  }

  asio::steady_timer wake_;
  const size_t max_queue_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Reply> reply_;
  std::deque<std::string> chunks_;
  size_t queued_ = 0;
  bool done_ = false;
  bool cancelled_ = false;
  bool watch_ended_ = false;
};

// How often a connection whose client sent bytes during its request (a pipelined request, or a
// TLS client's close_notify alert before its FIN) is looked at for a hang-up.
constexpr auto kHangUpPoll = std::chrono::milliseconds(100);

// Whether the client of `fd` hung up: its FIN came (with or without bytes still waiting to be
// read before it: POLLRDHUP), or the connection failed.
bool HungUp(int fd) {
  pollfd p{.fd = fd, .events = POLLIN | POLLRDHUP, .revents = 0};
  if (::poll(&p, 1, 0) < 0) return false;
  if ((p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) return true;
  char byte = 0;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace

struct Server::Impl {
  ServerOptions options;
  Router router;
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::unique_ptr<asio::thread_pool> workers;
  std::thread io_thread;
  std::atomic<int> connections{0};
  std::atomic<int> active{0};
  std::atomic<bool> stopped{false};
  std::mutex mu;  // guards the members below
  std::set<std::shared_ptr<Exchange>> exchanges;
  std::set<tcp::socket*> sockets;                  // of the connections open, cancelled at Stop()
  std::map<std::string, int> per_address;          // connections open per capped SourceAddressKey
  std::map<std::string, int> running_per_address;  // handlers running, likewise
  std::optional<TokenBuckets> tls_rate;            // TLS handshakes started per address
  ServerStats stats;
  uint16_t port = 0;
  std::unique_ptr<TlsCertificates> tls;  // HTTPS when set

  void Count(int64_t ServerStats::*field) {
    std::lock_guard lock(mu);
    ++(stats.*field);
  }

  asio::awaitable<void> Accept();
  // Who a connection's client is counted as, found once at accept: its capped key (CappedKey;
  // "" when exempt), and whether it holds one of its address's connection slots.
  struct Client {
    std::string key;
    bool counted = false;
  };
  asio::awaitable<void> Serve(tcp::socket socket, Client client);
  asio::awaitable<void> ServeTls(tcp::socket socket, Client client);
  // The key `socket`'s client is capped under (SourceAddressKey: an IPv6 client's /64), or ""
  // when it is exempt (loopback, unless options.cap_loopback) or gone.
  std::string CappedKey(const tcp::socket& socket) const;
  // Takes a connection slot for a new connection (and one of its address's when its address is
  // capped, said in `client`); false when it must be refused.
  bool Admit(const tcp::socket& socket, Client& client);
  // Gives a connection's slots back.
  void Release(const Client& client);
  // The request loop of one connection, plain (beast::tcp_stream) or TLS (beast::ssl_stream).
  template <class Stream>
  asio::awaitable<void> ServeRequests(Stream& stream, const std::string& source);
  template <class Stream>
  // `client`: the connection's capped key (Client::key).
  asio::awaitable<bool> Answer(Stream& stream, bhttp::request<bhttp::string_body>& req,
                               const Handler& handler, const std::string& client);
  template <class Stream>
  asio::awaitable<bool> WriteReply(Stream& stream, unsigned version, bool keep_alive,
                                   const Reply& reply);
  template <class Stream>
  asio::awaitable<bool> WriteStream(Stream& stream, unsigned version, const Reply& head,
                                    Exchange& ex, Clock::time_point deadline);
  // Cancels `exchange` when its client hangs up: its FIN comes or the connection fails. Bytes
  // that arrive before (a pipelined request, a TLS client's close_notify) stay unread for the
  // next request, and the watch then looks for the FIN every kHangUpPoll. Ends when the socket's
  // operations are cancelled after the exchange's EndWatch().
  asio::awaitable<void> WatchForHangUp(tcp::socket& socket, std::weak_ptr<Exchange> exchange);
  void Track(tcp::socket& socket, bool open) {
    std::lock_guard lock(mu);
    if (open) {
      sockets.insert(&socket);
    } else {
      sockets.erase(&socket);
    }
  }
};

asio::awaitable<void> Server::Impl::Accept() {
  for (;;) {
    beast::error_code ec;
    tcp::socket socket =
        co_await acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      if (!acceptor.is_open()) co_return;
      // Out of descriptors and the like: back off a little instead of spinning.
      asio::steady_timer pause(io, std::chrono::milliseconds(50));
      co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    Client client;
    if (!Admit(socket, client)) {
      Count(&ServerStats::refused_connections);
      // A best-effort answer that cannot block the acceptor, then close (a TLS client could not
      // read a plain answer: it is only closed).
      static constexpr std::string_view kBusy =
          "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
      socket.non_blocking(true, ec);
      if (!tls) socket.write_some(asio::buffer(kBusy.data(), kBusy.size()), ec);
      socket.close(ec);
      continue;
    }
    // Each write goes out at once: with Nagle's algorithm, a streamed event written while the
    // headers (or the previous event) were unacknowledged waited for the client's delayed
    // acknowledgement, up to 40 ms on Linux, on every keep-alive connection.
    socket.set_option(tcp::no_delay(true), ec);
    if (tls) {
      asio::co_spawn(io, ServeTls(std::move(socket), std::move(client)), asio::detached);
    } else {
      asio::co_spawn(io, Serve(std::move(socket), std::move(client)), asio::detached);
    }
  }
}

std::string Server::Impl::CappedKey(const tcp::socket& socket) const {
  beast::error_code ec;
  const auto remote = socket.remote_endpoint(ec);
  if (ec) return {};  // already gone
  const asio::ip::address address = remote.address();
  // An IPv6 client counts under its /64: the addresses of one subscriber's prefix are free.
  // (An IPv4 client on a dual-stack listener, ::ffff:a.b.c.d, under its IPv4 address.)
  std::string key = SourceAddressKey(address.to_string());
  const bool loopback = address.is_loopback() || key.starts_with("127.");
  return options.cap_loopback || !loopback ? key : std::string();
}

bool Server::Impl::Admit(const tcp::socket& socket, Client& client) {
  if (connections.load() >= options.max_connections) return false;
  client.key = CappedKey(socket);
  // The handshake rate holds whether or not connections per address are capped.
  if (!client.key.empty()) {
    std::lock_guard lock(mu);
    if (tls_rate && tls_rate->Take(client.key, Clock::now())) {
      ++stats.tls_rate_refused;
      return false;
    }
    if (options.max_connections_per_address > 0) {
      int& open = per_address[client.key];
      if (open >= options.max_connections_per_address) return false;
      ++open;
      client.counted = true;
    }
  }
  ++connections;
  return true;
}

void Server::Impl::Release(const Client& client) {
  if (client.counted) {
    std::lock_guard lock(mu);
    auto it = per_address.find(client.key);
    if (it != per_address.end() && --it->second <= 0) per_address.erase(it);
  }
  --connections;
}

asio::awaitable<void> Server::Impl::Serve(tcp::socket socket, Client client) {
  beast::tcp_stream stream(std::move(socket));
  Track(stream.socket(), true);
  co_await ServeRequests(stream, client.key);
  Track(stream.socket(), false);
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream.close();
  Release(client);
}

asio::awaitable<void> Server::Impl::ServeTls(tcp::socket socket, Client client) {
  // The connection keeps the context it began with when a renewed certificate replaces it.
  const std::shared_ptr<asio::ssl::context> context = tls->Current();
  beast::ssl_stream<beast::tcp_stream> stream(std::move(socket), *context);
  tcp::socket& raw = beast::get_lowest_layer(stream).socket();
  Track(raw, true);
  beast::get_lowest_layer(stream).expires_after(options.handshake_timeout);
  beast::error_code ec;
  co_await stream.async_handshake(asio::ssl::stream_base::server,
                                  asio::redirect_error(asio::use_awaitable, ec));
  if (ec) {
    Count(&ServerStats::tls_handshake_failures);
  } else {
    co_await ServeRequests(stream, client.key);
    // close_notify, so that a client can tell the end of a body that ends with the connection
    // (HTTP/1.0 streams) from a cut; a client that does not answer it gets little time.
    beast::get_lowest_layer(stream).expires_after(
        std::min<std::chrono::milliseconds>(options.write_timeout, std::chrono::seconds(2)));
    co_await stream.async_shutdown(asio::redirect_error(asio::use_awaitable, ec));
  }
  Track(raw, false);
  raw.shutdown(tcp::socket::shutdown_both, ec);
  beast::get_lowest_layer(stream).close();
  Release(client);
}

template <class Stream>
asio::awaitable<void> Server::Impl::ServeRequests(Stream& stream, const std::string& source) {
  beast::flat_buffer buffer;
  for (bool keep_alive = true; keep_alive && !stopped.load();) {
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(options.max_header_bytes));
    parser.body_limit(options.max_body_bytes);
    beast::get_lowest_layer(stream).expires_after(options.read_timeout);
    beast::error_code ec;
    co_await bhttp::async_read_header(stream, buffer, parser,
                                      asio::redirect_error(asio::use_awaitable, ec));
    if (!ec && parser.get()[bhttp::field::expect] == "100-continue") {
      bhttp::response<bhttp::empty_body> cont{bhttp::status::continue_, parser.get().version()};
      co_await bhttp::async_write(stream, cont, asio::redirect_error(asio::use_awaitable, ec));
    }
    if (!ec && !parser.is_done()) {
      co_await bhttp::async_read(stream, buffer, parser,
                                 asio::redirect_error(asio::use_awaitable, ec));
    }
    if (ec) {
      const bool quiet = ec == bhttp::error::end_of_stream || ec == beast::error::timeout ||
                         ec == asio::error::eof || ec == asio::error::connection_reset ||
                         ec == asio::error::operation_aborted;
      if (quiet) break;
      Count(&ServerStats::bad_requests);
      Reply error = ec == bhttp::error::body_limit
                        ? JsonError(413, "the request body is larger than the limit of " +
                                             std::to_string(options.max_body_bytes) + " bytes")
                    : ec == bhttp::error::header_limit
                        ? JsonError(431, "the request headers are larger than the limit of " +
                                             std::to_string(options.max_header_bytes) + " bytes")
                        : JsonError(400, "malformed HTTP request: " + ec.message());
      co_await WriteReply(stream, 11, /*keep_alive=*/false, error);
      break;
    }
    bhttp::request<bhttp::string_body> req = parser.release();
    keep_alive = req.keep_alive();
    const std::string target(req.target());
    const std::string path = target.substr(0, target.find('?'));
    auto match = router.Find(std::string_view(req.method_string()), path);
    if (match.handler == nullptr) {
      Count(&ServerStats::requests);
      keep_alive =
          co_await WriteReply(stream, req.version(), keep_alive, match.error) && keep_alive;
      continue;
    }
    Count(&ServerStats::requests);
    keep_alive = co_await Answer(stream, req, *match.handler, source) && keep_alive;
  }
}

template <class Stream>
asio::awaitable<bool> Server::Impl::Answer(Stream& stream, bhttp::request<bhttp::string_body>& req,
                                           const Handler& handler, const std::string& client) {
  const auto deadline = Clock::now() + options.request_timeout;
  // One address may run only its share of the handlers, so that its requests (16 connections'
  // worth, under its connection cap) cannot take every slot from other clients.
  const int share = std::max(
      1, static_cast<int>(options.request_share_per_address * options.max_concurrent_requests));
  const std::string source = share < options.max_concurrent_requests ? client : std::string();
  auto busy = [](const std::string& why) {
    Reply reply = JsonError(503, why + "; retry later", "server_busy");
    reply.headers.emplace_back("Retry-After", "1");
    return reply;
  };
  if (active.fetch_add(1) >= options.max_concurrent_requests) {
    --active;
    Count(&ServerStats::busy);
    co_return co_await WriteReply(
        stream, req.version(), req.keep_alive(),
        busy("the server is busy: " + std::to_string(options.max_concurrent_requests) +
             " requests are running"));
  }
  if (!source.empty()) {
    std::unique_lock lock(mu);
    int& mine = running_per_address[source];
    if (mine >= share) {
      ++stats.busy;
      ++stats.busy_per_address;
      lock.unlock();
      --active;
      co_return co_await WriteReply(
          stream, req.version(), req.keep_alive(),
          busy(fmt::format("{} has {} requests running, its share of the server's {}", source,
                           share, options.max_concurrent_requests)));
    }
    ++mine;
  }
  auto ex = std::make_shared<Exchange>(io, options.max_stream_queue_bytes);
  {
    std::lock_guard lock(mu);
    exchanges.insert(ex);
  }
  auto request = std::make_shared<Request>();
  request->method = std::string(req.method_string());
  request->target = std::string(req.target());
  const auto q = request->target.find('?');
  request->path = request->target.substr(0, q);
  if (q != std::string::npos) request->query = request->target.substr(q + 1);
  for (const auto& field : req) {
    std::string name(field.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    request->headers.emplace_back(std::move(name), std::string(field.value()));
  }
  request->body = std::move(req.body());
  beast::error_code ec;
  const auto remote = beast::get_lowest_layer(stream).socket().remote_endpoint(ec);
  if (!ec)
    request->remote_address = remote.address().to_string() + ":" + std::to_string(remote.port());
  std::weak_ptr<Exchange> weak = ex;
  request->cancelled = [weak] {
    auto e = weak.lock();
    return !e || e->cancelled();
  };
  asio::post(*workers, [this, ex, request, &handler, source] {
    // The request's slot, and its address's, are given back once its work is done and before
    // its reply (or a stream's end) is handed over: a client that has read it may send its next
    // request at once.
    auto give_back = [this, &source] {
      if (!source.empty()) {
        std::lock_guard lock(mu);
        auto it = running_per_address.find(source);
        if (it != running_per_address.end() && --it->second <= 0) running_per_address.erase(it);
      }
      --active;
    };
    Reply reply;
    try {
      reply = handler(*request);
    } catch (const std::exception& e) {
      COLONY_LOG_ERROR("http: handler for {} {} threw: {}", request->method, request->path,
                       e.what());
      reply = JsonError(500, std::string("internal error: ") + e.what(), "server_error");
    }
    auto stream_fn = std::move(reply.stream);
    const bool streaming = static_cast<bool>(stream_fn);
    reply.stream = streaming ? [](StreamWriter&) {} : std::function<void(StreamWriter&)>{};
    if (!streaming) give_back();
    ex->SetReply(std::move(reply));
    if (streaming) {
      try {
        stream_fn(*ex);
      } catch (const std::exception& e) {
        COLONY_LOG_ERROR("http: stream for {} {} threw: {}", request->method, request->path,
                         e.what());
      }
      give_back();
    }
    ex->Finish();
  });

  // A client that leaves while its request runs cancels it, as one that leaves a stream does:
  // the handler sees cancelled() instead of working on until the request's deadline.
  auto& socket = beast::get_lowest_layer(stream).socket();
  asio::co_spawn(io, WatchForHangUp(socket, weak), asio::detached);
  bool ok = true;
  std::optional<Reply> reply;
  while (!(reply = ex->TakeReply())) {
    if (stopped.load() || !co_await ex->WaitUntil(deadline)) {
      if (ex->has_reply()) continue;
      ex->Cancel();
      ok = false;
      break;
    }
  }
  if (!reply) {
    Reply timeout = JsonError(stopped.load() ? 503 : 504,
                              stopped.load() ? "the server is stopping"
                                             : "the request took longer than the server's limit",
                              "timeout");
    co_await WriteReply(stream, req.version(), false, timeout);
  } else if (!reply->stream) {
    ok = co_await WriteReply(stream, req.version(), req.keep_alive(), *reply);
  } else {
    ok = co_await WriteStream(stream, req.version(), *reply, *ex, deadline);
  }
  if (!ok) ex->Cancel();
  ex->EndWatch();
  socket.cancel(ec);  // ends the watch (nothing else is pending on the socket here)
  {
    std::lock_guard lock(mu);
    exchanges.erase(ex);
  }
  co_return ok;
}

asio::awaitable<void> Server::Impl::WatchForHangUp(tcp::socket& socket,
                                                   std::weak_ptr<Exchange> exchange) {
  beast::error_code ec;
  co_await socket.async_wait(tcp::socket::wait_read, asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return;  // the answer was written (the watch cancelled), or the server stopped
  asio::steady_timer poll(io);
  for (;;) {
    {
      // The socket is touched only while its exchange lasts and its answer is not written.
      auto e = exchange.lock();
      if (!e || e->cancelled() || e->watch_ended()) co_return;
      if (HungUp(socket.native_handle())) {
        e->Cancel();
        Count(&ServerStats::abandoned_requests);
        co_return;
      }
    }
    poll.expires_after(kHangUpPoll);
    co_await poll.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (stopped.load()) co_return;
  }
}

template <class Stream>
asio::awaitable<bool> Server::Impl::WriteReply(Stream& stream, unsigned version, bool keep_alive,
                                               const Reply& reply) {
  bhttp::response<bhttp::string_body> res{static_cast<bhttp::status>(reply.status), version};
  res.set(bhttp::field::server, "colony");
  res.set(bhttp::field::content_type, reply.content_type);
  for (const auto& [k, v] : reply.headers) res.set(k, v);
  res.keep_alive(keep_alive);
  res.body() = reply.body;
  res.prepare_payload();
  beast::get_lowest_layer(stream).expires_after(options.write_timeout);
  beast::error_code ec;
  co_await bhttp::async_write(stream, res, asio::redirect_error(asio::use_awaitable, ec));
  co_return !ec;
}

template <class Stream>
asio::awaitable<bool> Server::Impl::WriteStream(Stream& stream, unsigned version, const Reply& head,
                                                Exchange& ex, Clock::time_point deadline) {
  const bool chunked = version >= 11;
  bhttp::response<bhttp::empty_body> res{static_cast<bhttp::status>(head.status), version};
  res.set(bhttp::field::server, "colony");
  res.set(bhttp::field::content_type, head.content_type);
  res.set(bhttp::field::cache_control, "no-cache");
  for (const auto& [k, v] : head.headers) res.set(k, v);
  res.keep_alive(chunked);
  if (chunked) res.chunked(true);
  bhttp::response_serializer<bhttp::empty_body> sr{res};
  beast::get_lowest_layer(stream).expires_after(options.write_timeout);
  beast::error_code ec;
  co_await bhttp::async_write_header(stream, sr, asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return false;
  for (;;) {
    bool done = false;
    std::string data = ex.TakeChunks(done);
    // Checked after taking: a stream cancelled (its client hung up, the server stops) is cut,
    // also when its handler ended because of the cancel, not ended with a last chunk as if whole.
    if (stopped.load() || ex.cancelled()) break;
    if (!data.empty()) {
      beast::get_lowest_layer(stream).expires_after(options.write_timeout);
      if (chunked) {
        co_await asio::async_write(stream, bhttp::make_chunk(asio::buffer(data)),
                                   asio::redirect_error(asio::use_awaitable, ec));
      } else {
        co_await asio::async_write(stream, asio::buffer(data),
                                   asio::redirect_error(asio::use_awaitable, ec));
      }
      ex.Written(data.size());
      if (ec) break;
      continue;
    }
    if (done) {
      if (!chunked) co_return false;  // HTTP/1.0: the end of the body is the connection's
      beast::get_lowest_layer(stream).expires_after(options.write_timeout);
      co_await asio::async_write(stream, bhttp::make_chunk_last(),
                                 asio::redirect_error(asio::use_awaitable, ec));
      co_return !ec;
    }
    if (ex.pending()) continue;
    if (!co_await ex.WaitUntil(deadline) && !ex.pending()) break;  // past the request's deadline
  }
  Count(&ServerStats::cancelled_streams);
  co_return false;
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { Stop(); }

Result<std::unique_ptr<Server>> Server::Start(ServerOptions options, Router router) {
  if (options.max_concurrent_requests < 1 || options.max_connections < 1 ||
      options.max_connections_per_address < 0) {
    return InvalidArgument(
        "max_concurrent_requests and max_connections must be at least 1, and "
        "max_connections_per_address at least 0");
  }
  if (!(options.request_share_per_address > 0 && options.request_share_per_address <= 1)) {
    return InvalidArgument(fmt::format("request_share_per_address {} must be in (0, 1]",
                                       options.request_share_per_address));
  }
  COLONY_RETURN_IF_ERROR(CheckTokenRate(
      "tls_handshakes_per_second_per_address", options.tls_handshakes_per_second_per_address,
      "tls_handshake_burst_per_address", options.tls_handshake_burst_per_address));
  if (options.tls_certificate.empty() != options.tls_private_key.empty()) {
    return InvalidArgument(options.tls_certificate.empty()
                               ? "a TLS private key needs its certificate"
                               : "a TLS certificate needs its private key");
  }
  auto impl = std::make_unique<Impl>();
  if (!options.tls_certificate.empty()) {
    COLONY_ASSIGN_OR_RETURN(
        impl->tls, TlsCertificates::Load(options.tls_certificate, options.tls_private_key));
  }
  if (impl->tls && options.tls_handshakes_per_second_per_address > 0) {
    impl->tls_rate.emplace(
        TokenBucketOptions{.per_second = options.tls_handshakes_per_second_per_address,
                           .burst = options.tls_handshake_burst_per_address});
  }
  impl->options = std::move(options);
  impl->router = std::move(router);
  beast::error_code ec;
  const auto address = asio::ip::make_address(impl->options.host, ec);
  if (ec) return InvalidArgument("'" + impl->options.host + "' is not an IP address");
  const tcp::endpoint endpoint(address, impl->options.port);
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Unavailable("cannot listen on " + impl->options.host + ":" +
                       std::to_string(impl->options.port) + ": " + ec.message());
  }
  impl->port = impl->acceptor.local_endpoint().port();
  impl->workers = std::make_unique<asio::thread_pool>(
      static_cast<size_t>(impl->options.max_concurrent_requests));
  Impl* raw = impl.get();
  asio::co_spawn(raw->io, raw->Accept(), asio::detached);
  raw->io_thread = std::thread([raw] { raw->io.run(); });
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

uint16_t Server::port() const { return impl_->port; }

std::string Server::host() const { return impl_->options.host; }

bool Server::tls() const { return impl_->tls != nullptr; }

std::string Server::BaseUrl() const {
  const std::string& host = impl_->options.host;
  return (tls() ? "https://" : "http://") +
         (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(impl_->port);
}

ServerStats Server::stats() const {
  ServerStats out;
  {
    std::lock_guard lock(impl_->mu);
    out = impl_->stats;
  }
  if (impl_->tls) out.tls_reloads = impl_->tls->reloads();
  return out;
}

void Server::Stop() {
  if (impl_->stopped.exchange(true)) return;
  Impl* impl = impl_.get();
  asio::post(impl->io, [impl] {
    beast::error_code ec;
    impl->acceptor.close(ec);
    std::lock_guard lock(impl->mu);
    for (auto* s : impl->sockets) s->cancel(ec);
  });
  {
    std::lock_guard lock(impl->mu);
    for (const auto& ex : impl->exchanges) ex->Cancel();
  }
  // Handlers see cancelled() and return; their streams' writes fail at once.
  impl->workers->join();
  impl->io.stop();
  if (impl->io_thread.joinable()) impl->io_thread.join();
}

}  // namespace colony::http
