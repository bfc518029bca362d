// WAN all-reduce benchmark: averaging across the network lab (scripts/lab), i.e. real processes
// in network namespaces joined by rate-limited links with a real round-trip time.
//
// For each N in --peers (default 4 and 8) the benchmark builds a star: a bootstrap host and N
// peers, every uplink `rate R delay D` with D = RTT / 4 one way (a packet between two peers
// crosses two uplinks each way, so the RTT between any two peers is 4 D; default 100 Mbit/s and
// 50 ms RTT, as lab/wan8.lab). In that lab, in the same run:
//   (a) the reference: raw TCP all-to-all (this program in --raw-peer mode, one process per
//       peer host). Every peer holds one TCP connection to every other peer and sends, at the
//       same time on all of them, exactly the bytes a butterfly all-reduce sends: 2 (N-1)/N of
//       the payload in total (reduce-scatter, then all-gather), split evenly over the N-1 others
//       (2/N of the payload each), while receiving as much. Plain sockets driven by one thread
//       per peer (poll), no encryption, no dependencies between the phases:
//       the best this lab lets TCP do with that traffic. A peer's time runs from the common
//       start time to when it has sent and received everything;
//   (b) Colony: a bootstrap `colony dht` on the "boot" host and N `colony average` processes
//       that meet over the DHT and run the butterfly all-reduce over encrypted connections, once
//       per codec in --codecs (default none and blockwise8). The time is what the peers report
//       for the all-reduce itself (allreduce_s; matchmaking excluded).
// Every system runs one warm-up round and then --rounds timed rounds; the time of a round is the
// slowest peer's, and the median is taken over the timed rounds.
//
// The bandwidth floor is the time each peer needs to push its bytes through its uplink:
//   uncompressed: 2 (N-1)/N x payload x 8 / rate (the bytes are the same for every system);
//   compressed:   the bytes a peer actually sent (colony's bytes_sent: encoded parts, framing,
//                 encryption and its few DHT messages; median over peers and timed rounds)
//                 x 8 / rate, so the ratio says how well the link is used; the table also gives
//                 the time relative to the uncompressed floor (what compression buys).
// The floor counts payload bytes only: TCP/IP and Ethernet headers add ~4.5% on the wire (1514
// bytes per 1448 of payload), so even the raw TCP reference cannot go below ~1.05x.
//
// On a 2-core machine the lab itself is expensive: every byte crosses two userspace delay relays
// (colony-lab-link) and the peers encrypt everything; at 8 x 100 Mbit/s the cores, not the links,
// can set the pace. The raw TCP reference shows how much of that is the lab's; the CPU-feasible
// variant is `--rate-mbit 25 --mib 16`.
//
// Needs root and network namespaces (`scripts/lab check`); exits with 77 otherwise. The lab is
// torn down at the end, on errors and on SIGINT/SIGTERM (unless --keep-lab).
// The last lines are RESULT key=value pairs (see scripts/bench).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "average_check.h"
#include "bench_support.h"
#include "core/subprocess.h"
#include "lab_support.h"

using namespace colony;
namespace fs = std::filesystem;
using Steady = std::chrono::steady_clock;

namespace {

using colony::bench::CannotRunLab;
using colony::bench::ColonyBinary;
using colony::bench::Fixed;
using colony::bench::Lab;
using colony::bench::Median;
using colony::bench::Millis;
using colony::bench::ReadUntil;
using colony::bench::Tail;
using colony::bench::WallNow;

constexpr int kSkipExit = 77;   // "cannot run here", as ctest's SKIP_RETURN_CODE
constexpr int kRawPort = 4100;  // the raw TCP reference's port on every peer host

void SleepUntilWall(double t) {
  const double left = t - WallNow();
  if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
}

std::string Join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// =============================================================================================
// Raw TCP peer (--raw-peer): runs inside a peer host's namespace.

bool SendAll(int fd, const char* data, size_t len) {
  while (len > 0) {
    const ssize_t n = ::send(fd, data, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool RecvAll(int fd, char* data, size_t len) {
  while (len > 0) {
    const ssize_t n = ::recv(fd, data, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

void SetNonBlocking(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

// One round of all-to-all on `fds` (-1: none): `bytes` out on each and `bytes` in from each, on
// this one thread with non-blocking sockets and poll(), as an event loop would (a Colony peer
// has one I/O thread). A thread per socket and direction (2 (N-1) per peer) starved the lab's
// delay relays of CPU on a 2-core machine and made the reference slower than Colony. The error,
// or empty.
std::string AllToAll(const std::vector<int>& fds, uint64_t bytes, const std::vector<char>& chunk,
                     std::vector<char>& scratch) {
  std::vector<uint64_t> sent(fds.size(), 0), received(fds.size(), 0);
  std::vector<pollfd> polls(fds.size());
  for (int fd : fds) {
    if (fd >= 0) SetNonBlocking(fd, true);
  }
  std::string error;
  for (;;) {
    bool pending = false;
    for (size_t i = 0; i < fds.size(); ++i) {
      short events = 0;
      if (fds[i] >= 0 && sent[i] < bytes) events |= POLLOUT;
      if (fds[i] >= 0 && received[i] < bytes) events |= POLLIN;
      polls[i] = {events != 0 ? fds[i] : -1, events, 0};
      pending = pending || events != 0;
    }
    if (!pending) break;
    const int rc = ::poll(polls.data(), polls.size(), 60000);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) {
      error = rc == 0 ? "no progress for 60 s" : std::string("poll: ") + std::strerror(errno);
      break;
    }
    for (size_t i = 0; i < fds.size() && error.empty(); ++i) {
      const short ev = polls[i].revents;
      if (ev == 0) continue;
      if ((ev & POLLIN) != 0 || (ev & (POLLERR | POLLHUP)) != 0) {
        const size_t want =
            static_cast<size_t>(std::min<uint64_t>(bytes - received[i], scratch.size()));
        if (want > 0) {
          const ssize_t n = ::recv(fds[i], scratch.data(), want, 0);
          if (n > 0) {
            received[i] += static_cast<uint64_t>(n);
          } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            error = n == 0 ? "connection closed" : std::string("recv: ") + std::strerror(errno);
          }
        }
      }
      if ((ev & POLLOUT) != 0 && sent[i] < bytes && error.empty()) {
        const size_t len = static_cast<size_t>(std::min<uint64_t>(bytes - sent[i], chunk.size()));
        const ssize_t n = ::send(fds[i], chunk.data(), len, MSG_NOSIGNAL);
        if (n > 0) {
          sent[i] += static_cast<uint64_t>(n);
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
          error = std::string("send: ") + std::strerror(errno);
        }
      }
    }
    if (!error.empty()) break;
  }
  for (int fd : fds) {
    if (fd >= 0) SetNonBlocking(fd, false);
  }
  return error;
}

sockaddr_in Address(const std::string& ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  return a;
}

// Peer `self` of addrs.size(): connects to every peer with a higher index, accepts every lower
// one, then runs `rounds` rounds of all-to-all: `bytes` to every other peer and as many from each.
// Round 0 starts at `start_at`; each later round `gap` seconds after the slowest peer finished
// the previous one (the peers exchange their finish times over the same connections, so they all
// compute the same start; the gap must cover the one-way delay of that exchange, and short gaps
// keep the connections from idling into TCP's slow-start restart, as back-to-back all-reduce
// rounds would). Prints "RAW_ROUND r seconds" per round, then "RAW_DONE".
int RunRawPeer(int self, const std::vector<std::string>& addrs, uint64_t bytes, int rounds,
               double start_at, double gap) {
  const int n = static_cast<int>(addrs.size());
  if (self < 0 || self >= n || n < 2) {
    std::fprintf(stderr, "raw peer: bad index %d of %d\n", self, n);
    return 2;
  }
  const double connect_deadline = start_at + 30;
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in own = Address(addrs[static_cast<size_t>(self)], kRawPort);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&own), sizeof(own)) != 0 ||
      ::listen(listener, 64) != 0) {
    std::fprintf(stderr, "raw peer %d: cannot listen on %s:%d: %s\n", self,
                 addrs[static_cast<size_t>(self)].c_str(), kRawPort, std::strerror(errno));
    return 1;
  }
  std::vector<int> fds(static_cast<size_t>(n), -1);
  std::thread connector([&] {
    for (int j = self + 1; j < n; ++j) {
      sockaddr_in to = Address(addrs[static_cast<size_t>(j)], kRawPort);
      while (WallNow() < connect_deadline) {
        int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (::connect(s, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0) {
          const int32_t me = self;
          if (SendAll(s, reinterpret_cast<const char*>(&me), sizeof(me))) {
            fds[static_cast<size_t>(j)] = s;
            break;
          }
        }
        ::close(s);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  });
  for (int accepted = 0; accepted < self;) {
    pollfd p{listener, POLLIN, 0};
    const double left = connect_deadline - WallNow();
    if (left <= 0) break;
    if (::poll(&p, 1, static_cast<int>(left * 1000) + 1) <= 0) continue;
    int s = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (s < 0) continue;
    int32_t from = -1;
    if (!RecvAll(s, reinterpret_cast<char*>(&from), sizeof(from)) || from < 0 || from >= self ||
        fds[static_cast<size_t>(from)] >= 0) {
      ::close(s);
      continue;
    }
    fds[static_cast<size_t>(from)] = s;
    ++accepted;
  }
  connector.join();
  ::close(listener);
  for (int j = 0; j < n; ++j) {
    if (j != self && fds[static_cast<size_t>(j)] < 0) {
      std::fprintf(stderr, "raw peer %d: no connection with peer %d\n", self, j);
      return 1;
    }
  }
  std::printf("RAW_CONNECTED %.3f\n", WallNow() - start_at);
  std::fflush(stdout);

  const std::vector<char> chunk(1 << 20, 'x');
  std::vector<char> scratch(1 << 20);
  fds[static_cast<size_t>(self)] = -1;
  double start = start_at;
  for (int r = 0; r < rounds; ++r) {
    SleepUntilWall(start);
    const std::string error = AllToAll(fds, bytes, chunk, scratch);
    const double finished = WallNow();
    if (!error.empty()) {
      std::fprintf(stderr, "raw peer %d: round %d: %s\n", self, r, error.c_str());
      return 1;
    }
    std::printf("RAW_ROUND %d %.6f\n", r, finished - start);
    std::fflush(stdout);
    // Barrier: everyone's finish time to everyone; the next round starts after the last one.
    double latest = finished;
    for (int j = 0; j < n; ++j) {
      if (j != self && !SendAll(fds[static_cast<size_t>(j)],
                                reinterpret_cast<const char*>(&finished), sizeof(finished))) {
        std::fprintf(stderr, "raw peer %d: barrier send failed\n", self);
        return 1;
      }
    }
    for (int j = 0; j < n; ++j) {
      double t = 0;
      if (j == self) continue;
      if (!RecvAll(fds[static_cast<size_t>(j)], reinterpret_cast<char*>(&t), sizeof(t))) {
        std::fprintf(stderr, "raw peer %d: barrier receive failed\n", self);
        return 1;
      }
      latest = std::max(latest, t);
    }
    start = latest + gap;
  }
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
  std::printf("RAW_DONE\n");
  std::fflush(stdout);
  return 0;
}

// =============================================================================================
// Measurements.

struct Config {
  std::vector<int> peers{4, 8};
  double rate_mbit = 100;
  double rtt_ms = 50;
  double mib = 64;
  int rounds = 3;  // timed, after one warm-up round
  std::vector<std::string> codecs{"none", "blockwise8"};
  double matchmaking_time = 5;
  double timeout = 300;
  unsigned part_size_kib = 512;  // colony average --part-size-kib
  bool keep_lab = false, keep_logs = false, no_raw = false;
  // derived
  size_t values = 0;
  double payload = 0;  // bytes per peer
  std::string dir;     // logs
};

// Seconds for each peer to send `bytes` through its uplink.
double FloorSeconds(const Config& c, double bytes) { return bytes * 8 / (c.rate_mbit * 1e6); }

// Payload bytes each peer sends in a butterfly all-reduce of n peers.
double MustSend(const Config& c, int n) { return 2.0 * (n - 1) / n * c.payload; }

struct Measure {
  bool ok = false;
  double seconds = 0;          // median over timed rounds of the slowest peer
  std::vector<double> rounds;  // per timed round, the slowest peer
  double sent = 0;             // bytes per peer per timed round (median)
  std::string error, note;
  bool wrong_result = false;  // the rounds said ok but the values were not the mean
};

Measure Fail(std::string error) {
  Measure m;
  m.error = std::move(error);
  return m;
}

// ---- raw TCP all-to-all ---------------------------------------------------------------------

Measure RunRaw(const Config& c, const Lab& lab, int n) {
  const uint64_t per_peer = static_cast<uint64_t>(std::ceil(2.0 * c.payload / n));
  std::vector<std::string> addrs;
  for (int i = 1; i <= n; ++i) addrs.push_back(lab.addr("p" + std::to_string(i)));
  const double start_at = WallNow() + 2 + 0.2 * n;
  std::vector<Subprocess> procs;
  std::vector<std::string> errs;
  for (int i = 0; i < n; ++i) {
    errs.push_back(c.dir + "/" + lab.name() + "-raw-" + std::to_string(i) + ".err");
    auto p =
        Subprocess::Spawn(lab.In("p" + std::to_string(i + 1),
                                 {SelfExecutable(), "--raw-peer", std::to_string(i), "--raw-addrs",
                                  Join(addrs, ","), "--raw-bytes", std::to_string(per_peer),
                                  "--raw-rounds", std::to_string(c.rounds + 1), "--start-at",
                                  Fixed(start_at), "--raw-gap", Fixed(c.rtt_ms / 1000 + 0.05)}),
                          errs.back());
    if (!p.ok()) return Fail(p.status().ToString());
    procs.push_back(std::move(*p));
  }
  // Generous: every round at a quarter of the floor's speed, plus the barriers.
  const double budget =
      (start_at - WallNow()) + 60 + (c.rounds + 1) * (4 * FloorSeconds(c, MustSend(c, n)) + 5);
  const auto deadline = Steady::now() + Millis(budget);
  std::vector<std::map<int, double>> times(static_cast<size_t>(n));
  std::vector<std::string> problems(static_cast<size_t>(n));
  std::vector<std::thread> readers;
  for (size_t i = 0; i < procs.size(); ++i) {
    readers.emplace_back([&, i] {
      bool done = false;
      Status st = ReadUntil(procs[i], deadline, [&](const std::string& line) {
        std::istringstream in(line);
        std::string tag;
        in >> tag;
        int r = 0;
        double s = 0;
        if (tag == "RAW_ROUND" && (in >> r >> s)) times[i][r] = s;
        if (tag == "RAW_DONE") done = true;
        return done;
      });
      if (!st.ok()) problems[i] = st.ToString();
    });
  }
  for (auto& t : readers) t.join();
  std::string failures;
  for (size_t i = 0; i < procs.size(); ++i) {
    if (!procs[i].Wait(std::chrono::seconds(5)).ok()) procs[i].Signal(SIGKILL);
    if (!problems[i].empty()) {
      failures += "\n    raw peer " + std::to_string(i) + ": " + problems[i] + Tail(errs[i], 4);
    }
  }
  if (!failures.empty()) return Fail("raw TCP peers failed:" + failures);
  Measure m;
  auto slowest = [&](int r) {
    double s = -1;
    for (const auto& t : times) {
      auto it = t.find(r);
      if (it == t.end()) return -1.0;
      s = std::max(s, it->second);
    }
    return s;
  };
  for (int r = 1; r <= c.rounds; ++r) {
    if (slowest(r) < 0) return Fail("raw TCP: round " + std::to_string(r) + " not reported");
    m.rounds.push_back(slowest(r));
  }
  m.ok = true;
  m.seconds = Median(m.rounds);
  m.sent = static_cast<double>(per_peer) * (n - 1);
  const double first = slowest(0);
  m.note = "warm-up round " + Fixed(first) + " s";
  return m;
}

// ---- Colony ---------------------------------------------------------------------------------

struct Round {
  bool ok = false;
  int group_size = 0;
  double matchmaking_s = 0, allreduce_s = -1, bytes_sent = 0;
  std::string error;
  std::vector<colony::bench::AveragedPart> parts;  // whose data each part of the result holds
};

struct Peer {
  bool ready = false, done = false;
  double ready_at = 0;
  std::map<int, Round> rounds;
  std::string problem, err_path;
  std::string output_path;  // the averaged values after the last round
};

void ParseLine(Peer& peer, const std::string& line) {
  auto j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return;
  try {
    const std::string event = j.value("event", "");
    if (event == "ready") {
      peer.ready = true;
      peer.ready_at = WallNow();
    } else if (event == "round") {
      Round r;
      r.ok = j.value("ok", false);
      r.group_size = j.value("group_size", 0);
      r.matchmaking_s = j.value("matchmaking_s", 0.0);
      r.allreduce_s = j.value("allreduce_s", -1.0);
      r.bytes_sent = j.value("bytes_sent", 0.0);
      r.error = j.value("error", "");
      r.parts = colony::bench::PartsOfRoundEvent(j);
      peer.rounds[j.value("round", static_cast<int>(peer.rounds.size()))] = r;
    } else if (event == "done") {
      peer.done = true;
    }
  } catch (const nlohmann::json::exception& e) {
    peer.problem = std::string("unexpected event: ") + e.what() + ": " + line;
  }
}

Measure RunColony(const Config& c, const Lab& lab, const std::string& bootstrap, int n,
                  const std::string& codec) {
  const int rounds = c.rounds + 1;
  const double start_at = WallNow() + 3 + 0.5 * n;
  const std::string prefix = "bench.wan." + lab.name() + "." + codec;
  std::vector<Subprocess> procs;
  std::vector<Peer> peers(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const std::string host = "p" + std::to_string(i + 1);
    Peer& peer = peers[static_cast<size_t>(i)];
    peer.err_path = c.dir + "/" + lab.name() + "-" + codec + "-" + host + ".err";
    peer.output_path = c.dir + "/" + lab.name() + "-" + codec + "-" + host + ".bin";
    auto p = Subprocess::Spawn(lab.In(host, {ColonyBinary(),
                                             "--log-level",
                                             "warn",
                                             "average",
                                             "--initial-peers",
                                             bootstrap,
                                             "--listen",
                                             "/ip4/" + lab.addr(host) + "/tcp/0",
                                             "--prefix",
                                             prefix,
                                             "--values",
                                             std::to_string(c.values),
                                             "--seed",
                                             std::to_string(i + 1),
                                             "--target-group-size",
                                             std::to_string(n),
                                             "--min-group-size",
                                             std::to_string(n),
                                             "--matchmaking-time",
                                             Fixed(c.matchmaking_time),
                                             "--timeout",
                                             Fixed(c.timeout),
                                             "--rounds",
                                             std::to_string(rounds),
                                             "--codec",
                                             codec,
                                             "--part-size-kib",
                                             std::to_string(c.part_size_kib),
                                             "--start-at",
                                             Fixed(start_at),
                                             "--output-last-round-only",
                                             "--output",
                                             peer.output_path}),
                               peer.err_path);
    if (!p.ok()) return Fail(p.status().ToString());
    procs.push_back(std::move(*p));
  }
  const auto deadline = Steady::now() + Millis((start_at - WallNow()) +
                                               rounds * (c.matchmaking_time + c.timeout + 10) + 30);
  std::vector<std::thread> readers;
  for (size_t i = 0; i < procs.size(); ++i) {
    readers.emplace_back([&, i] {
      Peer& peer = peers[i];
      Status st = ReadUntil(procs[i], deadline, [&](const std::string& line) {
        ParseLine(peer, line);
        return peer.done;
      });
      if (!st.ok()) {
        peer.problem = st.code() == StatusCode::kNotFound ? "exited before printing \"done\""
                                                          : "no \"done\" before the deadline";
      }
    });
  }
  for (auto& t : readers) t.join();
  for (auto& p : procs) {
    if (!p.Wait(std::chrono::seconds(10)).ok()) p.Signal(SIGKILL);
  }

  Measure m;
  std::string failures;
  std::vector<double> sent;
  double first = 0;
  for (int r = 0; r < rounds; ++r) {
    double slowest = 0;
    bool all_ok = true;
    for (size_t i = 0; i < peers.size(); ++i) {
      auto it = peers[i].rounds.find(r);
      if (it == peers[i].rounds.end() || !it->second.ok || it->second.allreduce_s < 0) {
        all_ok = false;
        continue;
      }
      const Round& round = it->second;
      if (round.group_size != n) {
        failures += " round " + std::to_string(r) + ": peer " + std::to_string(i) +
                    " in a group of " + std::to_string(round.group_size) + ";";
        all_ok = false;
      }
      slowest = std::max(slowest, round.allreduce_s);
      if (r > 0) sent.push_back(round.bytes_sent);
    }
    if (r == 0) {
      first = all_ok ? slowest : -1;
    } else if (all_ok) {
      m.rounds.push_back(slowest);
    }
  }
  std::string problems;
  for (size_t i = 0; i < peers.size(); ++i) {
    const Peer& p = peers[i];
    std::string what;
    if (!p.ready) what += " never printed \"ready\";";
    if (p.ready && p.ready_at > start_at) {
      what += " ready " + Fixed(p.ready_at - start_at, 2) + " s after the start time;";
    }
    for (const auto& [r, round] : p.rounds) {
      if (!round.ok) what += " round " + std::to_string(r) + " failed: " + round.error + ";";
    }
    if (!p.problem.empty()) what += " " + p.problem + ";";
    if (!what.empty())
      problems += "\n    peer " + std::to_string(i) + ":" + what + Tail(p.err_path, 4);
  }
  if (m.rounds.empty())
    return Fail("no timed round completed on every peer:" + failures + problems);
  std::string summary;
  if (std::string wrong = colony::bench::CheckColonyMeans(c.values, n, codec, peers, summary);
      !wrong.empty()) {
    Measure bad = Fail("wrong result: " + wrong);
    bad.wrong_result = true;
    return bad;
  }
  std::printf("      %s\n", summary.c_str());
  m.ok = true;
  m.seconds = Median(m.rounds);
  m.sent = Median(sent);
  m.note = first >= 0 ? "warm-up round " + Fixed(first) + " s" : "warm-up round failed";
  if (static_cast<int>(m.rounds.size()) < c.rounds || !failures.empty() || !problems.empty()) {
    m.note += "; " + std::to_string(m.rounds.size()) + " of " + std::to_string(c.rounds) +
              " timed rounds completed on every peer:" + failures + problems;
  }
  return m;
}

// ---- one lab per N --------------------------------------------------------------------------

struct Row {
  double floor_s = 0;  // uncompressed floor
  Measure raw;
  std::map<std::string, Measure> colony;  // by codec
  std::string error;                      // the lab itself failed
};

std::string StarTopology(const Config& c, int n) {
  const std::string link =
      " rate " + Fixed(c.rate_mbit, 3) + "mbit delay " + Fixed(c.rtt_ms / 4, 3) + "ms\n";
  std::string t = "# bench_wan: bootstrap + " + std::to_string(n) + " peers\nhost boot" + link;
  for (int i = 1; i <= n; ++i) t += "host p" + std::to_string(i) + link;
  return t;
}

void Show(int n, const std::string& name, const Measure& m) {
  if (m.ok) {
    std::string per_round;
    for (double s : m.rounds) per_round += " " + Fixed(s);
    std::printf("  N=%d %-22s %.3f s (rounds:%s)\n", n, name.c_str(), m.seconds, per_round.c_str());
  } else {
    std::printf("  N=%d %-22s FAILED: %s\n", n, name.c_str(), m.error.c_str());
  }
  if (!m.note.empty()) std::printf("      %s\n", m.note.c_str());
  std::fflush(stdout);
}

Row RunLab(const Config& c, int n) {
  Row row;
  row.floor_s = FloorSeconds(c, MustSend(c, n));
  const std::string name = "wan" + std::to_string(::getpid() % 100000) + "n" + std::to_string(n);
  Lab lab(name, c.dir, c.keep_lab);
  const auto t0 = Steady::now();
  row.error = lab.Up(StarTopology(c, n));
  if (!row.error.empty()) return row;
  std::printf(
      "N=%d: lab %s up in %.1f s (%d peers + bootstrap, %s Mbit/s, %s ms one way per "
      "uplink)\n",
      n, name.c_str(), std::chrono::duration<double>(Steady::now() - t0).count(), n,
      Fixed(c.rate_mbit, 1).c_str(), Fixed(c.rtt_ms / 4, 2).c_str());
  std::fflush(stdout);

  if (c.no_raw) {
    row.raw = Fail("skipped (--no-raw)");
  } else {
    row.raw = RunRaw(c, lab, n);
  }
  Show(n, "raw TCP all-to-all", row.raw);

  const std::string boot_err = c.dir + "/" + name + "-boot.err";
  auto boot =
      Subprocess::Spawn(lab.In("boot", {ColonyBinary(), "--log-level", "warn", "dht", "--listen",
                                        "/ip4/" + lab.addr("boot") + "/tcp/4001"}),
                        boot_err);
  std::string bootstrap, boot_problem;
  if (!boot.ok()) {
    boot_problem = boot.status().ToString();
  } else {
    auto line = boot->ReadLine(std::chrono::seconds(30));
    if (line.ok() && !line->empty()) {
      bootstrap = *line;
    } else {
      boot_problem = "the bootstrap DHT node printed no address: " +
                     (line.ok() ? std::string("empty line") : line.status().ToString()) +
                     Tail(boot_err);
    }
  }
  for (const auto& codec : c.codecs) {
    Measure m = bootstrap.empty() ? Fail(boot_problem) : RunColony(c, lab, bootstrap, n, codec);
    Show(n, "Colony (" + codec + ")", m);
    if (m.ok) {
      std::printf("      sent per peer per round: %.1f MB (uncompressed payload floor: %.1f MB)\n",
                  m.sent / 1e6, MustSend(c, n) / 1e6);
    }
    row.colony[codec] = std::move(m);
  }
  if (boot.ok()) {
    boot->Signal(SIGTERM);
    if (!boot->Wait(std::chrono::seconds(5)).ok()) boot->Signal(SIGKILL);
  }
  return row;  // ~Lab tears it down
}

std::string Key(const std::string& codec) {
  std::string k = codec;
  std::replace(k.begin(), k.end(), '-', '_');
  return k;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "Averaging across the network lab (rate-limited links, real RTT): Colony's all-reduce, "
      "uncompressed and compressed, vs raw TCP all-to-all and the bandwidth floor");
  Config c;
  int raw_peer = -1;
  std::vector<std::string> raw_addrs;
  uint64_t raw_bytes = 0;
  int raw_rounds = 1;
  double start_at = 0, raw_gap = 0.1;
  app.add_option("--peers", c.peers, "numbers of peers (one lab each), e.g. 4,8")
      ->delimiter(',')
      ->check(CLI::Range(2, 60))
      ->capture_default_str();
  app.add_option("--rate-mbit", c.rate_mbit, "rate of every uplink, Mbit/s (each direction)")
      ->check(CLI::Range(0.1, 10000.0))
      ->capture_default_str();
  app.add_option("--rtt-ms", c.rtt_ms,
                 "round-trip time between two peers, ms (one-way delay per uplink: RTT/4)")
      ->check(CLI::Range(0.1, 2000.0))
      ->capture_default_str();
  app.add_option("--mib", c.mib, "MiB of float32 per peer")
      ->check(CLI::Range(0.001, 4096.0))
      ->capture_default_str();
  app.add_option("--rounds", c.rounds, "timed rounds per system (after one warm-up round)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--codecs", c.codecs, "colony average codecs to run")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--matchmaking-time", c.matchmaking_time, "colony average --matchmaking-time")
      ->capture_default_str();
  app.add_option("--timeout", c.timeout, "colony average --timeout, seconds per step")
      ->capture_default_str();
  app.add_option("--part-size-kib", c.part_size_kib, "colony average --part-size-kib")
      ->check(CLI::Range(1u, 65536u))
      ->capture_default_str();
  app.add_flag("--no-raw", c.no_raw, "skip the raw TCP reference");
  app.add_flag("--keep-lab", c.keep_lab, "leave the labs up at the end (debugging)");
  app.add_flag("--keep-logs", c.keep_logs, "keep the children's stderr logs (path printed)");
  // Internal: the raw TCP reference's peers (run by this program inside the lab).
  // Internal options are hidden (empty group) from --help.
  app.add_option("--raw-peer", raw_peer, "internal: run as raw TCP peer I")->group("");
  app.add_option("--raw-addrs", raw_addrs, "internal: the raw peers' addresses")
      ->delimiter(',')
      ->group("");
  app.add_option("--raw-bytes", raw_bytes, "internal: bytes to every other raw peer per round")
      ->group("");
  app.add_option("--raw-rounds", raw_rounds, "internal: raw rounds")->group("");
  app.add_option("--start-at", start_at, "internal: wall-clock start of the first raw round")
      ->group("");
  app.add_option("--raw-gap", raw_gap, "internal: seconds from a raw round's end to the next")
      ->group("");
  CLI11_PARSE(app, argc, argv);
  if (raw_peer >= 0)
    return RunRawPeer(raw_peer, raw_addrs, raw_bytes, raw_rounds, start_at, raw_gap);

  colony::bench::StartSignalThread("bench_wan");
  c.codecs.erase(std::remove(c.codecs.begin(), c.codecs.end(), std::string()), c.codecs.end());
  std::sort(c.peers.begin(), c.peers.end());
  c.peers.erase(std::unique(c.peers.begin(), c.peers.end()), c.peers.end());
  c.values = std::max<size_t>(1, static_cast<size_t>(c.mib * (1 << 20) / sizeof(float)));
  c.payload = static_cast<double>(c.values) * sizeof(float);

  colony::test::TempDir tmp("bench-wan");
  c.dir = tmp.path().string();
  if (c.keep_logs) {
    tmp.keep();
    std::printf("logs are kept in %s\n", c.dir.c_str());
  }
  if (!c.keep_logs) colony::bench::SetScratchDir(c.dir);

  if (const std::string why = CannotRunLab(c.dir); !why.empty()) {
    std::fprintf(stderr, "bench_wan: cannot run: %s\n", why.c_str());
    return kSkipExit;
  }
  colony::bench::UseLabLinkNextToColony();

  std::printf(
      "WAN all-reduce: %.1f MiB float32 per peer (%zu values), peers %s, %s Mbit/s per uplink, "
      "%s ms RTT between peers; median of %d timed rounds after 1 warm-up; %u cores\n",
      c.payload / (1 << 20), c.values,
      Join(
          [&] {
            std::vector<std::string> s;
            for (int n : c.peers) s.push_back(std::to_string(n));
            return s;
          }(),
          ",")
          .c_str(),
      Fixed(c.rate_mbit, 1).c_str(), Fixed(c.rtt_ms, 1).c_str(), c.rounds,
      std::thread::hardware_concurrency());
  std::fflush(stdout);

  std::map<int, Row> rows;
  for (int n : c.peers) {
    rows[n] = RunLab(c, n);
    if (!rows[n].error.empty()) std::printf("N=%d: FAILED: %s\n", n, rows[n].error.c_str());
  }

  // Tables.
  for (const auto& [n, row] : rows) {
    std::printf(
        "\nN=%d peers, %.1f MiB each, %s Mbit/s, %s ms RTT; uncompressed floor 2(N-1)/N x "
        "payload = %.1f MB per peer -> %.3f s\n",
        n, c.payload / (1 << 20), Fixed(c.rate_mbit, 1).c_str(), Fixed(c.rtt_ms, 1).c_str(),
        MustSend(c, n) / 1e6, row.floor_s);
    std::printf("  %-24s %9s %14s %10s %9s %18s\n", "system", "time (s)", "sent/peer (MB)",
                "floor (s)", "vs floor", "vs uncompr. floor");
    auto line = [&](const std::string& name, const Measure& m, double floor_s) {
      if (!m.ok) {
        std::printf("  %-24s %9s\n", name.c_str(), "n/a");
        return;
      }
      std::printf("  %-24s %9.3f %14.1f %10.3f %9.3f %18.3f\n", name.c_str(), m.seconds,
                  m.sent / 1e6, floor_s, m.seconds / floor_s, m.seconds / row.floor_s);
    };
    if (!row.error.empty()) {
      std::printf("  the lab failed: %s\n", row.error.c_str());
      continue;
    }
    line("raw TCP all-to-all", row.raw, row.floor_s);
    for (const auto& codec : c.codecs) {
      auto it = row.colony.find(codec);
      if (it == row.colony.end()) continue;
      const Measure& m = it->second;
      // Uncompressed: the payload floor; compressed: the bytes actually sent.
      const double floor_s = codec == "none" ? row.floor_s : FloorSeconds(c, m.sent);
      line("Colony (" + codec + ")", m, floor_s);
    }
  }
  std::printf("\n");

  // RESULT lines: per N, then the headline at the largest N.
  bool headline_ok = false;
  const int rn = c.peers.back();
  auto ratio_to_floor = [&](int n, const std::string& codec) -> std::optional<double> {
    const Row& row = rows[n];
    auto it = row.colony.find(codec);
    if (it == row.colony.end() || !it->second.ok) return std::nullopt;
    const double floor_s = codec == "none" ? row.floor_s : FloorSeconds(c, it->second.sent);
    return it->second.seconds / floor_s;
  };
  auto result = [](const std::string& key, std::optional<double> v, const std::string& why) {
    if (v) {
      std::printf("RESULT %s=%.3f\n", key.c_str(), *v);
    } else {
      std::printf("(RESULT %s not available: %s)\n", key.c_str(), why.c_str());
    }
  };
  // Absolute times at the largest N.
  const Row& top = rows[rn];
  if (top.raw.ok) std::printf("RESULT wan_raw_tcp_s=%.3f\n", top.raw.seconds);
  for (const auto& codec : c.codecs) {
    auto it = top.colony.find(codec);
    if (it == top.colony.end()) continue;
    const Measure& m = it->second;
    if (m.ok) {
      std::printf(
          "RESULT %s=%.3f\n",
          (codec == "none" ? std::string("wan_allreduce_s") : "wan_allreduce_" + Key(codec) + "_s")
              .c_str(),
          m.seconds);
    }
  }
  for (int n : c.peers) {
    const std::string suffix = "_" + std::to_string(n) + "peers";
    const Row& row = rows[n];
    if (row.raw.ok) result("wan_raw_tcp_vs_floor" + suffix, row.raw.seconds / row.floor_s, "");
    for (const auto& codec : c.codecs) {
      const std::string key =
          codec == "none" ? "wan_allreduce_vs_floor" : "wan_allreduce_" + Key(codec) + "_vs_floor";
      if (auto v = ratio_to_floor(n, codec)) result(key + suffix, v, "");
    }
  }
  const std::string why_top = !top.error.empty() ? top.error.substr(0, top.error.find('\n'))
                                                 : std::string("failed at N=") + std::to_string(rn);
  // The headline last: compressed and reference first, then Colony vs raw TCP and vs the floor.
  for (const auto& codec : c.codecs) {
    if (codec == "none") continue;
    result("wan_allreduce_" + Key(codec) + "_vs_floor", ratio_to_floor(rn, codec), why_top);
  }
  result("wan_raw_tcp_vs_floor",
         top.raw.ok ? std::optional<double>(top.raw.seconds / top.floor_s) : std::nullopt,
         top.raw.ok ? "" : top.raw.error.substr(0, top.raw.error.find('\n')));
  if (std::find(c.codecs.begin(), c.codecs.end(), "none") != c.codecs.end()) {
    auto it = top.colony.find("none");
    const bool both = it != top.colony.end() && it->second.ok && top.raw.ok;
    result("wan_allreduce_vs_raw_tcp",
           both ? std::optional<double>(it->second.seconds / top.raw.seconds) : std::nullopt,
           why_top);
    auto v = ratio_to_floor(rn, "none");
    headline_ok = v.has_value();
    result("wan_allreduce_vs_floor", v, why_top);
  } else {
    headline_ok = true;
  }
  std::fflush(stdout);
  for (const auto& [n, row] : rows) {
    for (const auto& [codec, m] : row.colony) {
      if (m.wrong_result) {
        std::fprintf(stderr, "bench_wan: Colony (%s) at N=%d computed a wrong mean: %s\n",
                     codec.c_str(), n, m.error.c_str());
        return 1;
      }
    }
  }
  return headline_ok ? 0 : 1;
}
