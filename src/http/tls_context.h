// The TLS side of the HTTP server (server.h): a server context made from a PEM certificate chain
// and its private key, and the renewal of those files while the server runs.
//
//   auto certs = http::TlsCertificates::Load("cert.pem", "key.pem");
//   std::shared_ptr<asio::ssl::context> ctx = (*certs)->Current();  // for each new connection
//
// Every context allows TLS 1.2 and later only, prefers the server's cipher order and refuses
// renegotiation. A renewed pair (another modification time or size of either file) is read at the
// first Current() a check_period after the last look; a pair that does not load (a key that is not
// the certificate's, a file half written) is logged once and the previous context stays.
#pragma once

#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <utility>

#include "core/status.h"

namespace colony::http {

// A server context for this pair; the error names the file that cannot be read or says that the
// key is not the certificate's.
Result<std::shared_ptr<boost::asio::ssl::context>> LoadTlsContext(
    const std::filesystem::path& certificate, const std::filesystem::path& private_key);

// When a file last changed, as far as a renewal needs to know.
struct TlsFileVersion {
  std::filesystem::file_time_type modified{};
  uintmax_t size = 0;
  bool operator==(const TlsFileVersion&) const = default;
};

class TlsCertificates {
 public:
  static Result<std::unique_ptr<TlsCertificates>> Load(
      std::filesystem::path certificate, std::filesystem::path private_key,
      std::chrono::milliseconds check_period = std::chrono::seconds(1));

  // The context for a new connection (the renewed one once the files changed and load).
  std::shared_ptr<boost::asio::ssl::context> Current();
  int64_t reloads() const;

 private:
  using Versions = std::pair<TlsFileVersion, TlsFileVersion>;  // certificate, key
  TlsCertificates() = default;
  Versions Look() const;

  std::filesystem::path certificate_, private_key_;
  std::chrono::milliseconds check_period_{1'000};
  mutable std::mutex mu_;
  std::shared_ptr<boost::asio::ssl::context> current_;
  Versions loaded_, refused_;
  std::chrono::steady_clock::time_point next_check_{};
  int64_t reloads_ = 0;
};

}  // namespace colony::http
