// colony-lab-link: a userspace link emulator for the network lab (scripts/lab).
//
// The kernel here has no netem, so latency comes from this program. It runs inside a link's own
// network namespace, which holds the two inner ends of the link's veth pairs (--a and --b), and
// copies every Ethernet frame from one to the other after the configured one-way delay, at most
// at the configured rate (per direction), dropping frames when more than --queue-ms of them wait
// to be serialized (a tail-drop router queue). Frames are read and written through AF_PACKET
// sockets with virtio-net headers (PACKET_VNET_HDR), so TCP segmentation offload survives the
// trip: a 64 KB TSO frame costs one read and one write instead of 45, and checksums left for
// the hardware stay valid.
//
// Accuracy: a frame leaves at max(arrival, previous departure) + size / rate + delay, waited for
// with ppoll on CLOCK_MONOTONIC (about 0.1 ms late on an idle machine, a few ms on a loaded one).
// Loss is not done here: scripts/lab drops packets with iptables `statistic`.
//
// Output: one line "ready" on stdout once both sockets are bound; counters on stderr at exit
// (SIGINT/SIGTERM).
#include <arpa/inet.h>
#include <linux/ethtool.h>
#include <linux/if_packet.h>
#include <linux/sockios.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <string>
#include <vector>

#ifndef PACKET_IGNORE_OUTGOING
#define PACKET_IGNORE_OUTGOING 23
#endif

namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

constexpr size_t kVnetHeader = 10;  // struct virtio_net_hdr
constexpr size_t kMaxFrame = 65536 + kVnetHeader + 64;
constexpr size_t kMaxQueuedFrames = 200000;

int64_t NowNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

struct Frame {
  int64_t release_ns = 0;
  std::vector<uint8_t> bytes;  // virtio-net header + Ethernet frame
};

struct Direction {
  std::string name;
  int in = -1;
  int out = -1;
  int64_t delay_ns = 0;
  double rate_bps = 0;  // 0: unlimited
  int64_t queue_ns = 0;
  int64_t busy_until_ns = 0;  // when the last accepted frame finishes serializing
  std::deque<Frame> queue;
  bool out_blocked = false;
  uint64_t frames = 0, bytes = 0, dropped = 0, send_errors = 0;
  int64_t max_late_ns = 0;
  int64_t total_late_ns = 0;
};

// Turns on generic receive offload for `ifname` (veth leaves it off): the frames of a TCP flow
// that arrive together are merged before this program reads them, several times fewer reads and
// writes at 100 Mbit/s. Failure only costs speed.
void EnableGro(int fd, const std::string& ifname) {
  ifreq ifr{};
  std::snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", ifname.c_str());
  ethtool_value value{};
  value.cmd = ETHTOOL_SGRO;
  value.data = 1;
  ifr.ifr_data = reinterpret_cast<char*>(&value);
  if (::ioctl(fd, SIOCETHTOOL, &ifr) != 0) {
    std::fprintf(stderr, "colony-lab-link: enabling GRO on %s: %s (continuing without)\n",
                 ifname.c_str(), std::strerror(errno));
  }
}

int OpenPacketSocket(const std::string& ifname) {
  const unsigned index = ::if_nametoindex(ifname.c_str());
  if (index == 0) {
    std::fprintf(stderr, "colony-lab-link: no interface %s in this namespace: %s\n", ifname.c_str(),
                 std::strerror(errno));
    return -1;
  }
  const int fd = ::socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(ETH_P_ALL));
  if (fd < 0) {
    std::fprintf(stderr, "colony-lab-link: AF_PACKET socket: %s (needs root or CAP_NET_RAW)\n",
                 std::strerror(errno));
    return -1;
  }
  const int one = 1;
  if (::setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof(one)) != 0 ||
      ::setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof(one)) != 0) {
    std::fprintf(stderr, "colony-lab-link: packet socket options on %s: %s\n", ifname.c_str(),
                 std::strerror(errno));
    ::close(fd);
    return -1;
  }
  const int buf = 16 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof(buf));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof(buf));
  sockaddr_ll addr{};
  addr.sll_family = AF_PACKET;
  addr.sll_protocol = htons(ETH_P_ALL);
  addr.sll_ifindex = static_cast<int>(index);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::fprintf(stderr, "colony-lab-link: bind to %s: %s\n", ifname.c_str(), std::strerror(errno));
    ::close(fd);
    return -1;
  }
  EnableGro(fd, ifname);
  packet_mreq mreq{};
  mreq.mr_ifindex = static_cast<int>(index);
  mreq.mr_type = PACKET_MR_PROMISC;
  ::setsockopt(fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mreq, sizeof(mreq));
  return fd;
}

// Reads every frame waiting on d.in and schedules it.
void Receive(Direction& d, std::vector<uint8_t>& buffer) {
  for (int i = 0; i < 256; ++i) {
    const ssize_t n = ::recv(d.in, buffer.data(), buffer.size(), MSG_DONTWAIT);
    if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ++d.send_errors;
      return;
    }
    if (static_cast<size_t>(n) <= kVnetHeader) continue;
    const int64_t now = NowNs();
    const auto wire = static_cast<double>(static_cast<size_t>(n) - kVnetHeader);
    int64_t depart = now;
    if (d.rate_bps > 0) {
      const int64_t start = std::max(now, d.busy_until_ns);
      if (start - now > d.queue_ns || d.queue.size() >= kMaxQueuedFrames) {
        ++d.dropped;  // the router queue is full: tail drop
        continue;
      }
      depart = start + static_cast<int64_t>(wire * 8.0 * 1e9 / d.rate_bps);
      d.busy_until_ns = depart;
    } else if (d.queue.size() >= kMaxQueuedFrames) {
      ++d.dropped;
      continue;
    }
    Frame f;
    f.release_ns = depart + d.delay_ns;
    f.bytes.assign(buffer.begin(), buffer.begin() + n);
    d.queue.push_back(std::move(f));
  }
}

// Sends every frame whose time has come.
void Release(Direction& d) {
  const int64_t now = NowNs();
  while (!d.queue.empty() && d.queue.front().release_ns <= now) {
    Frame& f = d.queue.front();
    const ssize_t n = ::send(d.out, f.bytes.data(), f.bytes.size(), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)) {
      d.out_blocked = true;  // wait for POLLOUT, keep the frame
      return;
    }
    if (n < 0 && errno != EINTR) ++d.send_errors;
    d.max_late_ns = std::max(d.max_late_ns, now - f.release_ns);
    d.total_late_ns += now - f.release_ns;
    ++d.frames;
    d.bytes += f.bytes.size() - kVnetHeader;
    d.queue.pop_front();
  }
  d.out_blocked = false;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "colony-lab-link: copy Ethernet frames between two interfaces after a delay, at a rate "
      "(the network lab's latency emulator; see scripts/lab)"};
  std::string a, b;
  double delay_ab = 0, delay_ba = 0, rate_ab = 0, rate_ba = 0, queue_ms = 50;
  app.add_option("--a", a, "first interface (in this namespace)")->required();
  app.add_option("--b", b, "second interface (in this namespace)")->required();
  app.add_option("--delay-ab", delay_ab, "one-way delay a -> b, milliseconds")
      ->check(CLI::Range(0.0, 10000.0));
  app.add_option("--delay-ba", delay_ba, "one-way delay b -> a, milliseconds")
      ->check(CLI::Range(0.0, 10000.0));
  app.add_option("--rate-ab", rate_ab, "rate a -> b, Mbit/s (0: unlimited)")
      ->check(CLI::Range(0.0, 100000.0));
  app.add_option("--rate-ba", rate_ba, "rate b -> a, Mbit/s (0: unlimited)")
      ->check(CLI::Range(0.0, 100000.0));
  app.add_option("--queue-ms", queue_ms, "drop frames that would wait longer to be sent")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 10000.0));
  CLI11_PARSE(app, argc, argv);

  const int fa = OpenPacketSocket(a);
  const int fb = OpenPacketSocket(b);
  if (fa < 0 || fb < 0) return 1;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);

  Direction dirs[2];
  dirs[0].name = a + "->" + b;
  dirs[0].in = fa;
  dirs[0].out = fb;
  dirs[0].delay_ns = static_cast<int64_t>(delay_ab * 1e6);
  dirs[0].rate_bps = rate_ab * 1e6;
  dirs[1].name = b + "->" + a;
  dirs[1].in = fb;
  dirs[1].out = fa;
  dirs[1].delay_ns = static_cast<int64_t>(delay_ba * 1e6);
  dirs[1].rate_bps = rate_ba * 1e6;
  for (auto& d : dirs) d.queue_ns = static_cast<int64_t>(queue_ms * 1e6);

  std::printf("ready\n");
  std::fflush(stdout);

  std::vector<uint8_t> buffer(kMaxFrame);
  while (g_stop == 0) {
    for (auto& d : dirs) Release(d);
    int64_t next = -1;
    for (auto& d : dirs) {
      if (!d.queue.empty() && !d.out_blocked) {
        const int64_t r = d.queue.front().release_ns;
        next = next < 0 ? r : std::min(next, r);
      }
    }
    pollfd fds[2] = {{fa, POLLIN, 0}, {fb, POLLIN, 0}};
    // A direction blocked on its output waits for POLLOUT on that socket.
    if (dirs[0].out_blocked) fds[1].events |= POLLOUT;
    if (dirs[1].out_blocked) fds[0].events |= POLLOUT;
    timespec timeout{};
    timespec* tp = nullptr;
    if (next >= 0) {
      const int64_t wait = std::max<int64_t>(0, next - NowNs());
      timeout.tv_sec = static_cast<time_t>(wait / 1'000'000'000);
      timeout.tv_nsec = static_cast<long>(wait % 1'000'000'000);
      tp = &timeout;
    } else {
      timeout.tv_sec = 1;  // wake now and then to notice signals
      tp = &timeout;
    }
    const int r = ::ppoll(fds, 2, tp, nullptr);
    if (r < 0 && errno != EINTR) {
      std::perror("colony-lab-link: ppoll");
      return 1;
    }
    if (r > 0) {
      if ((fds[0].revents & POLLIN) != 0) Receive(dirs[0], buffer);
      if ((fds[1].revents & POLLIN) != 0) Receive(dirs[1], buffer);
      if ((fds[1].revents & POLLOUT) != 0) dirs[0].out_blocked = false;
      if ((fds[0].revents & POLLOUT) != 0) dirs[1].out_blocked = false;
    }
  }
  for (const auto& d : dirs) {
    std::fprintf(
        stderr,
        "colony-lab-link: %s: %llu frames, %llu bytes, %llu dropped (queue full), %llu "
        "errors, frames %.3f ms late on average and %.2f ms at most, %zu still queued\n",
        d.name.c_str(), static_cast<unsigned long long>(d.frames),
        static_cast<unsigned long long>(d.bytes), static_cast<unsigned long long>(d.dropped),
        static_cast<unsigned long long>(d.send_errors),
        d.frames > 0 ? static_cast<double>(d.total_late_ns) / 1e6 / static_cast<double>(d.frames)
                     : 0.0,
        static_cast<double>(d.max_late_ns) / 1e6, d.queue.size());
  }
  ::close(fa);
  ::close(fb);
  return 0;
}
