// Where a peer of a private swarm gets its access token, and how it keeps it fresh: a file or a
// command. A file is re-read whenever it changes (a cron job may rewrite it). A command runs
// through /bin/sh with COLONY_PEER_ID set to this peer's id and prints the token on its first
// line of output (say, `curl -s https://auth.example.org/token/$COLONY_PEER_ID`).
//
// A TokenRefresher fetches a new token once a third of the current one's lifetime is left (a
// file: also whenever the file changes) and shows it to every connected peer (Host::
// SetAccessToken), so that tokens renew without failing a call. A failed fetch is retried every
// poll interval and logged; the old token stays in use until it expires.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "core/identity.h"
#include "core/periodic.h"
#include "net/host.h"

namespace colony::net {

struct TokenSource {
  std::string file;     // either this
  std::string command;  // or this
  std::chrono::milliseconds poll{2'000};
  std::chrono::milliseconds command_timeout{30'000};
};

// Reads a token file (its text form, at most a few KiB).
Result<Bytes> ReadAccessTokenFile(const std::string& path);
// Fetches a token from `source` for `self` (the text form, checked only for being text).
Result<Bytes> FetchAccessToken(const TokenSource& source, const PeerId& self);

class TokenRefresher {
 public:
  // Keeps `host`'s token fresh from `source` until destroyed. The host's first token must be set
  // already (AccessControl::SetOwnToken before the host connects to anyone).
  TokenRefresher(Host& host, TokenSource source);
  TokenRefresher(const TokenRefresher&) = delete;
  TokenRefresher& operator=(const TokenRefresher&) = delete;
  // Tokens installed since start.
  uint64_t renewals() const { return renewals_.load(); }

 private:
  void Check();

  Host& host_;
  TokenSource source_;
  int64_t file_seen_ = 0;  // the token file's modification time, as last seen
  std::atomic<uint64_t> renewals_{0};
  Periodic worker_;  // last: it stops before the members it uses go
};

}  // namespace colony::net
