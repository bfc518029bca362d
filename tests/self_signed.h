// Self-signed certificates for tests of HTTPS: made with OpenSSL's API, so that no test needs the
// openssl program.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>
#include <string>

namespace colony::test {

template <auto Free>
struct OpenSslDeleter {
  template <class T>
  void operator()(T* p) const {
    Free(p);
  }
};

struct Pem {
  std::string certificate, key;
};

// A self-signed P-256 certificate for 127.0.0.1 and localhost, valid for a day, and its key.
inline Pem MakeSelfSigned(const std::string& common_name) {
  std::unique_ptr<EVP_PKEY, OpenSslDeleter<EVP_PKEY_free>> key(EVP_EC_gen("P-256"));
  std::unique_ptr<X509, OpenSslDeleter<X509_free>> x(X509_new());
  X509_set_version(x.get(), 2);
  static long serial = 1;
  ASN1_INTEGER_set(X509_get_serialNumber(x.get()), serial++);
  X509_gmtime_adj(X509_getm_notBefore(x.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x.get()), 86400);
  X509_set_pubkey(x.get(), key.get());
  X509_NAME* name = X509_get_subject_name(x.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1,
                             0);
  X509_set_issuer_name(x.get(), name);
  X509V3_CTX v3;
  X509V3_set_ctx_nodb(&v3);
  X509V3_set_ctx(&v3, x.get(), x.get(), nullptr, nullptr, 0);
  X509_EXTENSION* san =
      X509V3_EXT_conf_nid(nullptr, &v3, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
  X509_add_ext(x.get(), san, -1);
  X509_EXTENSION_free(san);
  X509_sign(x.get(), key.get(), EVP_sha256());
  auto text = [](auto write) {
    std::unique_ptr<BIO, OpenSslDeleter<BIO_free>> bio(BIO_new(BIO_s_mem()));
    write(bio.get());
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio.get(), &data);
    return std::string(data, static_cast<size_t>(n));
  };
  return {text([&](BIO* b) { PEM_write_bio_X509(b, x.get()); }), text([&](BIO* b) {
            PEM_write_bio_PrivateKey(b, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
          })};
}

}  // namespace colony::test
