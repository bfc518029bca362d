// The HTTP server over TLS, with a client built on OpenSSL directly that verifies the server's
// certificate (a self-signed one made here for 127.0.0.1), and clients that play the attacker:
// plain HTTP and junk sent to the TLS port, a handshake that never comes, handshakes started in a
// loop from one address (its rate), certificate files that do not load. A renewed certificate
// is served to the connections that come after it.
#include <gtest/gtest.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <memory>
#include <string>
#include <thread>

#include "http/server.h"
#include "loopback_socket.h"
#include "self_signed.h"
#include "test_support.h"

namespace colony::http {
namespace {

using namespace std::chrono_literals;

using test::MakeSelfSigned;
using test::Pem;
using Ctx = std::unique_ptr<SSL_CTX, test::OpenSslDeleter<SSL_CTX_free>>;
using Ssl = std::unique_ptr<SSL, test::OpenSslDeleter<SSL_free>>;

struct TlsAnswer {
  bool handshake = false;  // completed, with the certificate verified
  std::string error;       // OpenSSL's, when not
  std::string response;    // everything read until the server closed
};

// Sends `request` over TLS 1.2+ to 127.0.0.1:port (from `from`, as test::ConnectLoopback), trusting
// only `trusted_pem` (a file), and reads until the server closes the connection.
TlsAnswer TlsFetch(uint16_t port, const std::string& trusted_pem, const std::string& request,
                   const std::string& from = {}) {
  TlsAnswer out;
  Ctx ctx(SSL_CTX_new(TLS_client_method()));
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  if (SSL_CTX_load_verify_locations(ctx.get(), trusted_pem.c_str(), nullptr) != 1) {
    out.error = "cannot load " + trusted_pem;
    return out;
  }
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  const int fd = test::ConnectLoopback(port, 10s, from);
  if (fd < 0) {
    out.error = "cannot connect";
    return out;
  }
  Ssl ssl(SSL_new(ctx.get()));
  SSL_set_fd(ssl.get(), fd);
  X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()), "127.0.0.1");
  ERR_clear_error();
  if (SSL_connect(ssl.get()) != 1) {
    char buf[256];
    ERR_error_string_n(ERR_get_error(), buf, sizeof buf);
    out.error = buf;
    ::close(fd);
    return out;
  }
  out.handshake = SSL_get_verify_result(ssl.get()) == X509_V_OK;
  if (SSL_write(ssl.get(), request.data(), static_cast<int>(request.size())) !=
      static_cast<int>(request.size())) {
    out.error = "write failed";
  }
  char buf[4096];
  for (;;) {
    const int n = SSL_read(ssl.get(), buf, sizeof buf);
    if (n <= 0) break;
    out.response.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

const std::string kGetHello = "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

Router Routes() {
  Router r;
  r.Add("GET", "/hello", [](const Request&) { return Json(200, R"({"hello":"tls"})"); });
  r.Add("GET", "/count", [](const Request&) {
    Reply reply;
    reply.content_type = "text/event-stream";
    reply.stream = [](StreamWriter& out) {
      for (int i = 0; i < 5; ++i) out.Write("data: " + std::to_string(i) + "\n\n");
    };
    return reply;
  });
  return r;
}

struct Files {
  test::TempDir dir;
  std::string certificate = dir.File("cert.pem"), key = dir.File("key.pem");
  void Write(const Pem& pem) {
    test::WriteFile(certificate, pem.certificate);
    test::WriteFile(key, pem.key);
  }
  // A server of Routes() with this certificate.
  Result<std::unique_ptr<Server>> Serve(const Pem& pem, ServerOptions options = {}) {
    Write(pem);
    options.tls_certificate = certificate;
    options.tls_private_key = key;
    return Server::Start(std::move(options), Routes());
  }
  // The certificate alone, for a client to trust.
  std::string Trust(const Pem& pem, const std::string& name) const {
    const std::string path = dir.File(name);
    test::WriteFile(path, pem.certificate);
    return path;
  }
};

TEST(HttpsServer, AVerifyingClientGetsAnswersAndStreamsOverTls) {
  Files files;
  const Pem pem = MakeSelfSigned("colony-test");
  auto server = files.Serve(pem);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_TRUE((*server)->tls());
  EXPECT_EQ((*server)->BaseUrl(), "https://127.0.0.1:" + std::to_string((*server)->port()));
  const std::string trusted = files.Trust(pem, "trusted.pem");

  const TlsAnswer hello = TlsFetch((*server)->port(), trusted, kGetHello);
  ASSERT_TRUE(hello.handshake) << hello.error;
  EXPECT_TRUE(hello.response.starts_with("HTTP/1.1 200")) << hello.response;
  EXPECT_TRUE(hello.response.ends_with(R"({"hello":"tls"})")) << hello.response;

  // Two requests on one connection, and a chunked stream.
  const TlsAnswer two = TlsFetch(
      (*server)->port(), trusted,
      "GET /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /count HTTP/1.1\r\nHost: x\r\nConnection: "
      "close\r\n\r\n");
  ASSERT_TRUE(two.handshake) << two.error;
  const auto second = two.response.find("HTTP/1.1 200", 1);
  ASSERT_NE(second, std::string::npos) << two.response;
  size_t at = second;
  for (int i = 0; i < 5; ++i) {
    const auto next = two.response.find("data: " + std::to_string(i) + "\n\n", at);
    ASSERT_NE(next, std::string::npos) << "event " << i << " missing:\n" << two.response;
    at = next;
  }
  EXPECT_TRUE(two.response.ends_with("0\r\n\r\n")) << "no last chunk";

  // A client that trusts another certificate refuses this server.
  const std::string other = files.Trust(MakeSelfSigned("someone-else"), "other.pem");
  const TlsAnswer refused = TlsFetch((*server)->port(), other, kGetHello);
  EXPECT_FALSE(refused.handshake);
  EXPECT_TRUE(refused.response.empty());
  EXPECT_EQ((*server)->stats().requests, 3);
}

TEST(HttpsServer, PlainHttpAndJunkOnTheTlsPortGetNoAnswerAndTheServerKeepsServing) {
  Files files;
  const Pem pem = MakeSelfSigned("colony-test");
  auto server = files.Serve(pem);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  for (const std::string& attack :
       {kGetHello, std::string("\x16\x03\x01\x00\x05", 5) + "not a client hello",
        std::string(20000, '\x16')}) {
    const int fd = test::ConnectLoopback((*server)->port(), 20s);
    ASSERT_GE(fd, 0);
    // The server may close before all of it is sent.
    (void)::send(fd, attack.data(), attack.size(), MSG_NOSIGNAL);
    std::string got;
    char buf[4096];
    ssize_t n = 0;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, static_cast<size_t>(n));
    const bool closed = n == 0 || errno == ECONNRESET;  // not our receive deadline
    ::close(fd);
    EXPECT_TRUE(closed) << "the server did not close the connection";
    EXPECT_EQ(got.find("HTTP/1.1"), std::string::npos) << "a plain answer over a TLS port";
  }
  EXPECT_EQ((*server)->stats().tls_handshake_failures, 3);
  EXPECT_EQ((*server)->stats().requests, 0);
  const TlsAnswer hello = TlsFetch((*server)->port(), files.Trust(pem, "trusted.pem"), kGetHello);
  ASSERT_TRUE(hello.handshake) << hello.error;
  EXPECT_TRUE(hello.response.starts_with("HTTP/1.1 200")) << hello.response;
}

TEST(HttpsServer, AHandshakeThatNeverComesIsCutAndFreesItsConnectionSlot) {
  Files files;
  const Pem pem = MakeSelfSigned("colony-test");
  auto server = files.Serve(pem, {.max_connections = 1, .handshake_timeout = 300ms});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int fd = test::ConnectLoopback((*server)->port(), 60s);  // connects, then says nothing
  ASSERT_GE(fd, 0);
  char buf[64];
  const auto t0 = std::chrono::steady_clock::now();
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  ::close(fd);
  // Closed by the server (not our own 60 s receive deadline).
  EXPECT_EQ(n, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
  EXPECT_TRUE(test::WaitUntil([&] { return (*server)->stats().tls_handshake_failures == 1; }, 10s));
  // Its slot (the only one) is free again.
  const TlsAnswer hello = TlsFetch((*server)->port(), files.Trust(pem, "trusted.pem"), kGetHello);
  ASSERT_TRUE(hello.handshake) << hello.error;
  EXPECT_TRUE(hello.response.starts_with("HTTP/1.1 200")) << hello.response;
  EXPECT_EQ((*server)->stats().refused_connections, 0);
}

// A TLS client that leaves while its request runs says goodbye first (close_notify, then its
// FIN, here 300 ms later): its handler is told at once, as a plain client's is, not at the
// request's deadline (an hour here). The alert waits unread before the FIN, so the socket never
// reads as ended; the FIN is seen by itself (POLLRDHUP).
TEST(HttpsServer, ATlsClientThatSaysGoodbyeCancelsItsRunningRequest) {
  Files files;
  const Pem pem = MakeSelfSigned("colony-test");
  std::atomic<bool> entered{false}, saw_cancel{false};
  Router r;
  r.Add("POST", "/slow", [&](const Request& q) {
    entered = true;
    const auto guard = std::chrono::steady_clock::now() + test::HangGuard(60s);
    while (!q.cancelled() && std::chrono::steady_clock::now() < guard) {
      std::this_thread::sleep_for(1ms);
    }
    saw_cancel = q.cancelled();
    return Json(200, "{}");
  });
  files.Write(pem);
  auto server = Server::Start({.request_timeout = std::chrono::hours(1),
                               .tls_certificate = files.certificate,
                               .tls_private_key = files.key},
                              std::move(r));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Ctx ctx(SSL_CTX_new(TLS_client_method()));
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
  // TLS 1.2: no session tickets arrive after the handshake, so nothing is left unread here and
  // closing sends a FIN (unread bytes would make it a reset, which the server sees at once).
  SSL_CTX_set_max_proto_version(ctx.get(), TLS1_2_VERSION);
  const int fd = test::ConnectLoopback((*server)->port(), 10s);
  ASSERT_GE(fd, 0);
  Ssl ssl(SSL_new(ctx.get()));
  SSL_set_fd(ssl.get(), fd);
  ASSERT_EQ(SSL_connect(ssl.get()), 1);
  const std::string request = "POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
  ASSERT_EQ(SSL_write(ssl.get(), request.data(), static_cast<int>(request.size())),
            static_cast<int>(request.size()));
  ASSERT_TRUE(test::WaitUntil([&] { return entered.load(); }, 10s));
  SSL_shutdown(ssl.get());             // close_notify
  std::this_thread::sleep_for(300ms);  // the server sees the alert alone first
  ::close(fd);
  EXPECT_TRUE(test::WaitUntil([&] { return saw_cancel.load(); }, 30s))
      << "the handler was not told that its client left";
  EXPECT_TRUE(test::WaitUntil([&] { return (*server)->stats().abandoned_requests == 1; }, 10s));
}

// With the cap on connections per address and without it (0): the rate holds either way.
class HttpsHandshakeRate : public testing::TestWithParam<int> {};

TEST_P(HttpsHandshakeRate, TlsHandshakesFromOneAddressKeepToItsRate) {
  Files files;
  const Pem pem = MakeSelfSigned("colony-test");
  constexpr double kRate = 0.5;  // per second
  constexpr int kBurst = 3;
  ServerOptions options;
  options.cap_loopback = true;  // 127.0.0.2 plays the attacker's machine, 127.0.0.1 another
  options.max_connections_per_address = GetParam();
  options.tls_handshakes_per_second_per_address = kRate;
  options.tls_handshake_burst_per_address = kBurst;
  auto server = files.Serve(pem, options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const uint16_t port = (*server)->port();
  const std::string trusted = files.Trust(pem, "trusted.pem");
  // A refused client's ClientHello meets a closed socket: an error to it, not a signal.
  std::signal(SIGPIPE, SIG_IGN);
  // One handshake after another, each with a request, as fast as the client can.
  constexpr int kAttempts = 12;
  int answered = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kAttempts; ++i) {
    const TlsAnswer a = TlsFetch(port, trusted, kGetHello, "127.0.0.2");
    answered += a.handshake && a.response.starts_with("HTTP/1.1 200");
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Its burst, then at most its rate over the time the attempts took.
  EXPECT_GE(answered, kBurst);
  EXPECT_LE(answered, kBurst + static_cast<int>(kRate * seconds) + 1) << seconds << " s";
  EXPECT_EQ((*server)->stats().tls_rate_refused, kAttempts - answered);
  EXPECT_EQ((*server)->stats().refused_connections, kAttempts - answered);
  // Another address is served at once.
  const TlsAnswer other = TlsFetch(port, trusted, kGetHello, "127.0.0.1");
  ASSERT_TRUE(other.handshake) << other.error;
  EXPECT_TRUE(other.response.starts_with("HTTP/1.1 200")) << other.response;
  // The attacker's address is served again a token's time later.
  std::this_thread::sleep_for(std::chrono::duration<double>(1.1 / kRate));
  const TlsAnswer again = TlsFetch(port, trusted, kGetHello, "127.0.0.2");
  ASSERT_TRUE(again.handshake) << again.error;
  EXPECT_TRUE(again.response.starts_with("HTTP/1.1 200")) << again.response;
}

INSTANTIATE_TEST_SUITE_P(HttpsServer, HttpsHandshakeRate, testing::Values(32, 0),
                         [](const testing::TestParamInfo<int>& param) {
                           return param.param > 0 ? "ConnectionsCapped" : "ConnectionsUncapped";
                         });

TEST(HttpsServer, AHandshakeRateThatIsNoRateIsRefusedByName) {
  Files files;
  const Pem pem = MakeSelfSigned("colony-test");
  ServerOptions options;
  options.tls_handshakes_per_second_per_address = -1;
  auto negative = files.Serve(pem, options);
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("tls_handshakes_per_second_per_address"),
            std::string::npos);
  options.tls_handshakes_per_second_per_address = 20;
  options.tls_handshake_burst_per_address = 0;
  auto no_burst = files.Serve(pem, options);
  ASSERT_FALSE(no_burst.ok());
  EXPECT_NE(no_burst.status().message().find("tls_handshake_burst_per_address"), std::string::npos);
}

TEST(HttpsServer, CertificateFilesThatDoNotLoadAreRefusedByName) {
  Files files;
  const Pem a = MakeSelfSigned("a"), b = MakeSelfSigned("b");
  files.Write(a);
  auto start = [](const std::string& cert, const std::string& key) {
    return Server::Start({.tls_certificate = cert, .tls_private_key = key}, Routes()).status();
  };
  Status st = start(files.dir.File("missing.pem"), files.key);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("missing.pem"), std::string::npos) << st.ToString();

  const std::string junk = files.dir.File("junk.pem");
  test::WriteFile(junk,
                  "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n");
  st = start(junk, files.key);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("certificate chain from " + junk), std::string::npos)
      << st.ToString();
  st = start(files.certificate, junk);
  EXPECT_NE(st.message().find("private key from " + junk), std::string::npos) << st.ToString();

  const std::string other_key = files.dir.File("b.key");
  test::WriteFile(other_key, b.key);
  st = start(files.certificate, other_key);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("is not the key of the certificate"), std::string::npos)
      << st.ToString();

  st = Server::Start({.tls_certificate = files.certificate}, Routes()).status();
  EXPECT_NE(st.message().find("needs its private key"), std::string::npos) << st.ToString();
  st = Server::Start({.tls_private_key = files.key}, Routes()).status();
  EXPECT_NE(st.message().find("needs its certificate"), std::string::npos) << st.ToString();
  EXPECT_TRUE(start(files.certificate, files.key).ok());
}

TEST(HttpsServer, ARenewedCertificateIsServedToLaterConnectionsAndABrokenOneIsNot) {
  Files files;
  const Pem a = MakeSelfSigned("first"), b = MakeSelfSigned("renewed"),
            c = MakeSelfSigned("broken");
  const std::string trust_a = files.Trust(a, "a.pem"), trust_b = files.Trust(b, "b.pem");
  auto server = files.Serve(a);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const uint16_t port = (*server)->port();
  ASSERT_TRUE(TlsFetch(port, trust_a, kGetHello).handshake);

  files.Write(b);  // renewed while serving
  ASSERT_TRUE(test::WaitUntil([&] { return TlsFetch(port, trust_b, kGetHello).handshake; }, 20s))
      << "the renewed certificate was never served";
  EXPECT_FALSE(TlsFetch(port, trust_a, kGetHello).handshake);
  EXPECT_EQ((*server)->stats().tls_reloads, 1);

  // A certificate whose key is not there: B stays in use.
  test::WriteFile(files.certificate, c.certificate);
  std::this_thread::sleep_for(1500ms);  // past the next look at the files
  const TlsAnswer still = TlsFetch(port, trust_b, kGetHello);
  ASSERT_TRUE(still.handshake) << still.error;
  EXPECT_TRUE(still.response.starts_with("HTTP/1.1 200")) << still.response;
  EXPECT_EQ((*server)->stats().tls_reloads, 1);
}

}  // namespace
}  // namespace colony::http
