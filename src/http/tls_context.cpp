// TLS contexts of the HTTP server (tls_context.h).
#include "http/tls_context.h"

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <system_error>

#include "core/log.h"

namespace colony::http {

namespace ssl = boost::asio::ssl;

namespace {

std::string Describe(const boost::system::error_code& ec) {
  std::string reason = ec.message();
  if (ec.category() == boost::asio::error::get_ssl_category()) {
    const char* lib = ::ERR_lib_error_string(static_cast<unsigned long>(ec.value()));
    if (lib != nullptr) reason += std::string(" (") + lib + ")";
  }
  return reason;
}

}  // namespace

Result<std::shared_ptr<ssl::context>> LoadTlsContext(const std::filesystem::path& certificate,
                                                     const std::filesystem::path& private_key) {
  for (const auto* file : {&certificate, &private_key}) {
    std::error_code fec;
    if (!std::filesystem::is_regular_file(*file, fec)) {
      return InvalidArgument(fmt::format("the TLS {} {} is not a readable file",
                                         file == &certificate ? "certificate" : "private key",
                                         file->string()));
    }
  }
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  boost::system::error_code ec;
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                       ssl::context::single_dh_use,
                   ec);
  SSL_CTX* native = ctx->native_handle();
  ::SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  ::SSL_CTX_set_options(
      native, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_NO_COMPRESSION);
  ::ERR_clear_error();
  ctx->use_certificate_chain_file(certificate.string(), ec);
  if (ec) {
    return InvalidArgument(fmt::format("cannot read a PEM certificate chain from {}: {}",
                                       certificate.string(), Describe(ec)));
  }
  ctx->use_private_key_file(private_key.string(), ssl::context::pem, ec);
  const bool mismatch =
      ec && ec.category() == boost::asio::error::get_ssl_category() &&
      ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == X509_R_KEY_VALUES_MISMATCH;
  if (mismatch || (!ec && ::SSL_CTX_check_private_key(native) != 1)) {
    ::ERR_clear_error();
    return InvalidArgument(
        fmt::format("the private key in {} is not the key of the certificate in {}",
                    private_key.string(), certificate.string()));
  }
  if (ec) {
    return InvalidArgument(fmt::format("cannot read a PEM private key from {}: {}",
                                       private_key.string(), Describe(ec)));
  }
  return ctx;
}

Result<std::unique_ptr<TlsCertificates>> TlsCertificates::Load(
    std::filesystem::path certificate, std::filesystem::path private_key,
    std::chrono::milliseconds check_period) {
  auto out = std::unique_ptr<TlsCertificates>(new TlsCertificates());
  out->certificate_ = std::move(certificate);
  out->private_key_ = std::move(private_key);
  out->check_period_ = check_period;
  out->loaded_ = out->Look();
  COLONY_ASSIGN_OR_RETURN(out->current_, LoadTlsContext(out->certificate_, out->private_key_));
  out->next_check_ = std::chrono::steady_clock::now() + check_period;
  return out;
}

TlsCertificates::Versions TlsCertificates::Look() const {
  auto version = [](const std::filesystem::path& p) {
    std::error_code ec;
    TlsFileVersion v;
    v.modified = std::filesystem::last_write_time(p, ec);
    if (ec) return TlsFileVersion{};
    v.size = std::filesystem::file_size(p, ec);
    return ec ? TlsFileVersion{} : v;
  };
  return {version(certificate_), version(private_key_)};
}

std::shared_ptr<ssl::context> TlsCertificates::Current() {
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (now < next_check_) return current_;
  next_check_ = now + check_period_;
  const Versions versions = Look();
  if (versions == loaded_ || versions == refused_) return current_;
  auto renewed = LoadTlsContext(certificate_, private_key_);
  if (!renewed.ok()) {
    refused_ = versions;
    COLONY_LOG_WARN("http: keeping the TLS certificate in use: {}", renewed.status().message());
    return current_;
  }
  current_ = std::move(*renewed);
  loaded_ = versions;
  ++reloads_;
  COLONY_LOG_INFO("http: serving the renewed TLS certificate from {}", certificate_.string());
  return current_;
}

int64_t TlsCertificates::reloads() const {
  std::lock_guard lock(mu_);
  return reloads_;
}

}  // namespace colony::http
