// A plain TCP connection to a server on 127.0.0.1, for tests that speak raw bytes to it (HTTP
// clients written by hand, attackers that send junk or stall): a receive deadline, so that no read
// can hang a test, and an optional loopback source address, so that tests can play several
// addresses (127.0.0.2, ...) against the servers' per-address limits.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace colony::test {

// A connected socket (the caller closes it), or -1 when binding to `from` or connecting failed.
// `from` empty: the kernel picks the source address.
inline int ConnectLoopback(uint16_t port, std::chrono::milliseconds receive_deadline,
                           const std::string& from = {}) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (!from.empty()) {
    sockaddr_in local{};
    local.sin_family = AF_INET;
    if (::inet_pton(AF_INET, from.c_str(), &local.sin_addr) != 1 ||
        ::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
      ::close(fd);
      return -1;
    }
  }
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(receive_deadline.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((receive_deadline.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace colony::test
