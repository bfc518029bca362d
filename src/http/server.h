// An HTTP/1.1 server for Colony's outward-facing endpoints (`colony api`, `colony monitor`):
// Boost.Beast parses and writes HTTP on one I/O thread; handlers run on a bounded pool of worker
// threads and may stream their response (chunked transfer encoding, as server-sent events need).
// Given a certificate and its key it speaks HTTPS (TLS 1.2 or later, OpenSSL through Boost.Asio).
//
//   http::Router router;
//   router.Add("GET", "/v1/models", [](const http::Request&) { return http::Json(200, models); });
//   auto server = http::Server::Start({.port = 8000}, std::move(router));
//
// Every request is bounded: header bytes, body bytes, the time to read it, the time to write each
// chunk of the answer, the bytes a streamed answer may queue, the handlers running at once and the
// connections open at once, and the time a TLS client may take over its handshake. A request past
// a bound gets a 4xx/5xx JSON error and the server keeps serving. It listens on loopback unless
// told otherwise.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace colony::http {

struct Request {
  std::string method;                                        // "GET", "POST", ...
  std::string target;                                        // as sent: the path and the query
  std::string path;                                          // the target without the query
  std::string query;                                         // after '?', undecoded
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case
  std::string body;
  std::string remote_address;  // "ip:port"
  // True once the client went away, the request's deadline passed or the server is stopping.
  std::function<bool()> cancelled = [] { return false; };

  // The first header with this (lower-case) name; empty when absent.
  std::string_view Header(std::string_view name) const;
};

// The writing end of a streamed response, used by the handler's stream function on its worker
// thread.
class StreamWriter {
 public:
  virtual ~StreamWriter() = default;
  // Queues bytes for the client, waiting while more than the stream's budget is queued. False
  // once the client is gone, a write missed its deadline or the server is stopping: the handler
  // should stop producing.
  virtual bool Write(std::string_view bytes) = 0;
  virtual bool cancelled() const = 0;
};

struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;  // ignored when `stream` is set
  std::vector<std::pair<std::string, std::string>> headers;
  // When set, the headers are sent at once and this runs on the worker thread to write the body
  // (chunked transfer encoding on HTTP/1.1).
  std::function<void(StreamWriter&)> stream;
};

// A JSON reply; JsonError's body is {"error": {"message", "type", "code"}} (the OpenAI API's error
// shape, also used by the monitor).
Reply Json(int status, std::string body);
Reply JsonError(int status, std::string_view message,
                std::string_view type = "invalid_request_error", std::string_view code = {});

using Handler = std::function<Reply(const Request&)>;

// Maps method and path to a handler: exact paths, or prefixes (a path ending in '/' given to
// AddPrefix matches every path below it). Unknown paths get 404; known paths with another method
// 405.
class Router {
 public:
  void Add(std::string method, std::string path, Handler handler);
  void AddPrefix(std::string method, std::string prefix, Handler handler);

  // The handler for a request, or an error reply (404/405).
  struct Match {
    const Handler* handler = nullptr;
    Reply error;
  };
  Match Find(std::string_view method, std::string_view path) const;

 private:
  struct Route {
    std::string method, path;
    bool prefix = false;
    Handler handler;
  };
  std::vector<Route> routes_;
};

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  uint16_t port = 0;               // 0: any free port (see Server::port())
  size_t max_header_bytes = 16 << 10;
  size_t max_body_bytes = 1 << 20;
  int max_concurrent_requests = 16;  // handlers running at once; more get 503 at once
  // The share of those one IP address (an IPv6 /64) may run at once (at least one); its further
  // requests get 503 at once. Loopback as for max_connections_per_address (cap_loopback).
  double request_share_per_address = 0.5;
  int max_connections = 256;  // open at once; more are refused at accept
  // To read one request (and the idle time allowed between requests on a kept-alive connection).
  std::chrono::milliseconds read_timeout{30'000};
  std::chrono::milliseconds write_timeout{30'000};  // to write one response or one chunk
  // From the request's arrival to the end of its answer; past it a waiting request gets 504 and
  // a stream is cut.
  std::chrono::milliseconds request_timeout{600'000};
  size_t max_stream_queue_bytes = 1 << 20;  // per streamed response
  // HTTPS when set: a PEM certificate chain (the server's certificate first, then its issuers)
  // and the PEM private key it certifies; both or neither. Start fails naming a file that cannot
  // be read or a key that is not the certificate's. Files that change on disk (a renewed
  // certificate) are read again within a second, for the connections that come after; a pair
  // that no longer loads is logged and the previous one stays in use.
  std::filesystem::path tls_certificate = {};
  std::filesystem::path tls_private_key = {};
  // For a TLS client to complete its handshake (a client that stalls holds a connection slot).
  std::chrono::milliseconds handshake_timeout{10'000};
  // Connections open at once from one IP address, so that one client cannot hold every slot;
  // more from it are refused at accept. Loopback clients (a TLS proxy in front) are not counted
  // unless cap_loopback. 0: no cap.
  int max_connections_per_address = 32;
  bool cap_loopback = false;
  // TLS handshakes one IP address may start: tls_handshake_burst_per_address at once, then
  // tls_handshakes_per_second_per_address on average (a token bucket); its further connections
  // are closed at accept. A handshake costs the one I/O thread a key exchange and a signature, so
  // an address starting them in a loop would hold up every other client's requests. Loopback as
  // for max_connections_per_address (cap_loopback); applied with or without that cap (0 there
  // leaves this rate on). 0 per second: no limit.
  double tls_handshakes_per_second_per_address = 20;
  double tls_handshake_burst_per_address = 64;
};

struct ServerStats {
  int64_t requests = 0;                // parsed and routed
  int64_t bad_requests = 0;            // malformed or over a size bound
  int64_t busy = 0;                    // refused with 503: max_concurrent_requests were running
  int64_t busy_per_address = 0;        // of those, because their address ran its share
  int64_t refused_connections = 0;     // closed at accept: max_connections were open,
                                       // max_connections_per_address from that address, or
                                       // its TLS handshake rate was spent
  int64_t tls_rate_refused = 0;        // of those, for the TLS handshake rate
  int64_t cancelled_streams = 0;       // streams cut: the client went away or a deadline passed
  int64_t abandoned_requests = 0;      // requests (streamed or not) whose client hung up while
                                       // they ran: their handlers were told (cancelled())
  int64_t tls_handshake_failures = 0;  // TLS connections closed before a request: plain HTTP,
                                       // a stalled or failed handshake
  int64_t tls_reloads = 0;             // renewed certificates taken up
};

class Server {
 public:
  // Binds and starts serving. InvalidArgument for a bad host; Unavailable when the port is taken.
  static Result<std::unique_ptr<Server>> Start(ServerOptions options, Router router);
  ~Server();  // Stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const;
  std::string host() const;
  bool tls() const;
  // "http://host:port" or "https://host:port" (an IPv6 host in brackets).
  std::string BaseUrl() const;
  ServerStats stats() const;
  // Stops accepting, cancels every request and stream in flight, and waits for the handlers to
  // return. Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace colony::http
