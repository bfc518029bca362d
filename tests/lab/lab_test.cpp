// Tests in the network lab (scripts/lab): real `colony` processes in network namespaces joined by
// rate-limited, delayed links and NAT routers. They need root and network namespaces; elsewhere
// they skip, saying why.
//
//   Lab.*       the lab itself: delays and rates as configured, NATs that block inbound
//               connections, nothing left behind by teardown;
//   LabWan.*    scenarios: peers behind two NATs use the DHT and average through a public peer;
//               8 peers average near the bandwidth floor at 50 ms RTT; averaging survives 1%
//               packet loss.
//   LabSwarm.*  SWARM training across 100 Mbit/s links at 50 ms RTT: the bytes 8-bit stage
//               boundaries save.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "averaging/averager.h"
#include "core/subprocess.h"
#include "dht/node.h"
#include "lab_support.h"
#include "test_support.h"

namespace colony {
namespace {

using namespace std::chrono_literals;
using colony::test::ColonyBinary;
using colony::test::ReadFloats;
using colony::test::ScratchPath;
using nlohmann::json;
namespace fs = std::filesystem;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

using bench::IpBinary;
using bench::LabScript;
using bench::RunCommand;

// Why this machine cannot run the lab, or empty.
std::string CannotRunLab() { return bench::LabUnavailable(::testing::TempDir()); }

#define SKIP_WITHOUT_LAB()                  \
  do {                                      \
    const std::string why = CannotRunLab(); \
    if (!why.empty()) GTEST_SKIP() << why;  \
  } while (0)

// One lab, built from a topology in the constructor and torn down in the destructor (also when
// the test fails: every process in its namespaces is killed and the namespaces deleted).
class Lab : public bench::Lab {
 public:
  explicit Lab(const std::string& topology_text)
      : bench::Lab(UniqueName(), test::ScratchDir().path().string(), /*keep=*/false) {
    bench::UseLabLinkNextToColony();
    error_ = Up(topology_text);
  }
  const std::string& error() const { return error_; }

 private:
  static std::string UniqueName() {
    static int counter = 0;
    return "t" + std::to_string(::getpid() % 100000) + "x" + std::to_string(counter++);
  }
  std::string error_;
};

// `colony <args>` in `host`, stdout captured.
Subprocess StartColony(const Lab& lab, const std::string& host, std::vector<std::string> args,
                       const std::string& err_path) {
  std::vector<std::string> argv = {ColonyBinary(), "--log-level", "warn"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto p = Subprocess::Spawn(lab.In(host, argv), err_path);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(*p);
}

// A DHT bootstrap peer on `host`; returns its address.
std::string StartBootstrap(const Lab& lab, const std::string& host,
                           std::optional<Subprocess>& process) {
  process.emplace(StartColony(lab, host,
                              {"dht", "--listen", "/ip4/" + lab.addr(host) + "/tcp/4001"},
                              ScratchPath("boot.err")));
  auto line = process->ReadLine(20s);
  EXPECT_TRUE(line.ok()) << line.status().ToString();
  return line.ok() ? *line : std::string();
}

// Averaging peers (`colony average`) in a lab.
struct AveragePeer {
  std::optional<Subprocess> process;
  std::string output, err;
  uint64_t seed = 0;
  json ready;  // its "ready" event
};

void StartAveragePeer(const Lab& lab, const std::string& host, uint64_t seed,
                      const std::string& bootstrap, std::vector<std::string> extra,
                      AveragePeer& peer) {
  peer.seed = seed;
  peer.output = ScratchPath(host + ".out");
  peer.err = ScratchPath(host + ".err");
  std::vector<std::string> args = {
      "average", "--initial-peers",    bootstrap,  "--listen", "/ip4/" + lab.addr(host) + "/tcp/0",
      "--seed",  std::to_string(seed), "--output", peer.output};
  args.insert(args.end(), extra.begin(), extra.end());
  peer.process.emplace(StartColony(lab, host, args, peer.err));
  auto ready = peer.process->ReadLine(30s);
  ASSERT_TRUE(ready.ok()) << host << ": " << ready.status().ToString() << "\n"
                          << test::ReadFile(peer.err);
  peer.ready = json::parse(*ready);
  ASSERT_EQ(peer.ready["event"], "ready") << *ready;
}

Result<json> NextRound(AveragePeer& peer, std::chrono::milliseconds timeout) {
  for (;;) {
    auto line = peer.process->ReadLine(timeout);
    if (!line.ok()) return line.status();
    auto j = json::parse(*line, nullptr, false);
    if (!j.is_discarded() && j["event"] == "round") return j;
  }
}

// The output of a peer equals the plain mean of the synthetic values of `seeds`.
void ExpectMeanOf(const AveragePeer& peer, const std::vector<uint64_t>& seeds, size_t values) {
  const auto out = ReadFloats(peer.output);
  ASSERT_EQ(out.size(), values);
  std::vector<double> expect(values, 0.0);
  std::vector<float> v(values);
  for (uint64_t s : seeds) {
    averaging::SyntheticValues(s, 0, v);
    for (size_t k = 0; k < values; ++k) expect[k] += v[k];
  }
  for (size_t k = 0; k < values; ++k) {
    ASSERT_NEAR(out[k], expect[k] / static_cast<double>(seeds.size()), 1e-5)
        << "peer " << peer.seed << ", value " << k;
  }
}

std::string StartAt(double seconds_from_now) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3f", dht::Now() + seconds_from_now);
  return buf;
}

using colony::test::Median;

// Every scenario checks that each result is the exact mean of every peer's data, so no peer may
// be excluded for being slow: on 2 shared cores (and under the sanitizers) a peer can stall for
// longer than the 5 s default without being faulty.
constexpr char kPartTimeout[] = "30";

// ---- the lab itself -----------------------------------------------------------------------

TEST(Lab, DelayRateAndNatAreAsConfiguredAndTeardownLeavesNothing) {
  SKIP_WITHOUT_LAB();
  std::optional<Lab> lab(std::in_place,
                         "host server rate 50mbit delay 10ms\n"
                         "nat home rate 50mbit delay 10ms\n"
                         "host laptop behind home\n");
  ASSERT_TRUE(lab->error().empty()) << lab->error();
  const std::string name = lab->name();
  ASSERT_EQ(lab->Namespaces().size(), 6u);  // core, server, home, laptop and 2 link relays

  // Delay: laptop -> server crosses both 10 ms links each way, so the RTT is 40 ms.
  std::optional<Subprocess> server;
  server.emplace(StartColony(*lab, "server",
                             {"listen", "--listen", "/ip4/" + lab->addr("server") + "/tcp/4000"},
                             ScratchPath("server.err")));
  auto server_addr = server->ReadLine(20s);
  ASSERT_TRUE(server_addr.ok()) << server_addr.status().ToString();
  auto ping =
      RunCommand(lab->In("laptop", {ColonyBinary(), "ping", "--count", "7", *server_addr}), 60s);
  ASSERT_EQ(ping.code, 0);
  std::vector<double> rtts;
  std::regex rtt_line(R"(rtt ([0-9.]+) ms)");
  for (const auto& line : ping.lines) {
    std::smatch m;
    if (std::regex_search(line, m, rtt_line)) rtts.push_back(std::stod(m[1]));
  }
  ASSERT_EQ(rtts.size(), 7u);
  const double rtt = Median(rtts);
  std::printf("[lab] laptop -> server: median RTT %.2f ms (configured 40 ms)\n", rtt);
  EXPECT_GE(rtt, 40.0);
  // The relays are about 1 ms late at most per crossing; ping's own processing is slower under
  // the sanitizers.
  EXPECT_LE(rtt, kSanitized ? 48.0 : 44.0);

  // NAT: the laptop reaches the server, but nothing reaches the laptop from outside: neither its
  // private address nor its router's public address.
  std::optional<Subprocess> laptop;
  laptop.emplace(StartColony(*lab, "laptop",
                             {"listen", "--listen", "/ip4/" + lab->addr("laptop") + "/tcp/4000"},
                             ScratchPath("laptop.err")));
  auto laptop_addr = laptop->ReadLine(20s);
  ASSERT_TRUE(laptop_addr.ok());
  auto direct = RunCommand(lab->In("server", {ColonyBinary(), "ping", *laptop_addr}), 30s);
  EXPECT_NE(direct.code, 0) << "the server reached a peer behind NAT directly";
  const std::string via_router =
      std::regex_replace(*laptop_addr, std::regex(lab->addr("laptop")), lab->addr("home"));
  auto through =
      RunCommand(lab->In("server", {ColonyBinary(), "ping", "--timeout", "3", via_router}), 30s);
  EXPECT_NE(through.code, 0) << "the NAT forwarded an inbound connection";

  // Teardown: every namespace (and with it every link) and every process is gone.
  lab.reset();
  auto left = RunCommand({IpBinary(), "netns", "list"}, 10s);
  for (const auto& line : left.lines) {
    EXPECT_NE(line.rfind("cl-" + name + "-", 0), 0u) << "left behind: " << line;
  }
  EXPECT_FALSE(server->running()) << "a process of the lab survived its teardown";
  EXPECT_FALSE(laptop->running()) << "a process of the lab survived its teardown";
  EXPECT_FALSE(fs::exists("/run/colony-lab/" + name));
}

// ---- scenarios ----------------------------------------------------------------------------

// Two peers behind two different NATs and a public bootstrap peer (lab/nat2.lab): the NATed
// peers join the DHT as clients, a record one stores the other reads, and they average their
// tensors through an auxiliary averager on the public host (client-mode peers cannot accept
// connections, so a group needs one peer that can).
TEST(LabWan, TwoPeersBehindNatsUseTheDhtAndAverage) {
  SKIP_WITHOUT_LAB();
  Lab lab(test::ReadFile(std::string(COLONY_SOURCE_DIR) + "/lab/nat2.lab"));
  ASSERT_TRUE(lab.error().empty()) << lab.error();
  std::optional<Subprocess> boot;
  const std::string bootstrap = StartBootstrap(lab, "boot", boot);
  ASSERT_FALSE(bootstrap.empty());

  auto store =
      RunCommand(lab.In("a", {ColonyBinary(), "--log-level", "warn", "dht", "store", "lab.greeting",
                              "hello from behind a NAT", "--initial-peers", bootstrap}),
                 60s);
  ASSERT_EQ(store.code, 0);
  auto get = RunCommand(lab.In("b", {ColonyBinary(), "--log-level", "warn", "dht", "get",
                                     "lab.greeting", "--initial-peers", bootstrap}),
                        60s);
  ASSERT_EQ(get.code, 0);
  std::string got;
  for (const auto& l : get.lines) got += l;
  EXPECT_NE(got.find("hello from behind a NAT"), std::string::npos) << got;

  constexpr size_t kValues = 1 << 20;  // 4 MiB of float32
  const std::vector<std::string> common = {"--values",
                                           std::to_string(kValues),
                                           "--target-group-size",
                                           "3",
                                           "--min-group-size",
                                           "3",
                                           "--timeout",
                                           "60",
                                           "--part-timeout",
                                           kPartTimeout,
                                           "--start-at",
                                           StartAt(4)};
  AveragePeer aux, a, b;
  auto aux_args = common;
  aux_args.insert(aux_args.end(), {"--mode", "aux"});
  ASSERT_NO_FATAL_FAILURE(StartAveragePeer(lab, "boot", 100, bootstrap, aux_args, aux));
  auto client_args = common;
  client_args.insert(client_args.end(), {"--mode", "client"});
  ASSERT_NO_FATAL_FAILURE(StartAveragePeer(lab, "a", 1, bootstrap, client_args, a));
  ASSERT_NO_FATAL_FAILURE(StartAveragePeer(lab, "b", 2, bootstrap, client_args, b));
  for (AveragePeer* p : {&a, &b}) {
    auto round = NextRound(*p, 90s);
    ASSERT_TRUE(round.ok()) << "peer " << p->seed << ": " << round.status().ToString() << "\n"
                            << test::ReadFile(p->err);
    ASSERT_TRUE((*round)["ok"].get<bool>()) << round->dump();
    EXPECT_EQ((*round)["group_size"].get<int>(), 3);
    ASSERT_NO_FATAL_FAILURE(ExpectMeanOf(*p, {1, 2}, kValues)) << round->dump();
  }
}

// A `colony dht` node on `host` listening on every interface at port 4001; returns the address
// it printed for the lab's network (it prints its loopback address first). Its stderr goes to
// `err`.
std::string StartWildcardNode(const Lab& lab, const std::string& host, const std::string& bootstrap,
                              std::optional<Subprocess>& process, const std::string& err) {
  std::vector<std::string> args = {"dht", "--listen", "/ip4/0.0.0.0/tcp/4001"};
  if (!bootstrap.empty()) args.insert(args.end(), {"--initial-peers", bootstrap});
  process.emplace(StartColony(lab, host, args, err));
  std::string printed;
  for (int i = 0; i < 5; ++i) {
    auto line = process->ReadLine(20s);
    if (!line.ok()) {
      printed += line.status().ToString() + "\n";
      break;
    }
    if (line->find("/ip4/" + lab.addr(host) + "/") != std::string::npos) return *line;
    printed += *line + "\n";
  }
  auto exit = process->Wait(1s);
  ADD_FAILURE() << host << " printed no address on the lab's network (" << lab.addr(host)
                << "); it printed:\n"
                << printed
                << "exit: " << (exit.ok() ? std::to_string(*exit) : exit.status().ToString())
                << "\n"
                << test::ReadFile(err);
  return {};
}

// Peers that listen on every interface announce all their addresses, loopback ones first. From
// another machine those lead elsewhere: 127.0.0.1:4001 to the dialer's own node (every node uses
// port 4001), and `a`'s second loopback address, 10.99.0.1 (as a VPN's or another LAN's would
// be), nowhere: the other hosts drop packets to it, so a dial there waits for its timeout. A
// store from `b` must reach `a` at its lab address without waiting for that timeout; with `a`
// the only node left, the record is read back from it.
TEST(LabWan, PeersListeningOnEveryInterfaceAreReachedFromOtherMachines) {
  SKIP_WITHOUT_LAB();
  Lab lab("host boot\nhost a\nhost b\n");
  ASSERT_TRUE(lab.error().empty()) << lab.error();
  ASSERT_EQ(RunCommand(lab.In("a", {"ip", "addr", "add", "10.99.0.1/32", "dev", "lo"}), 10s).code,
            0);
  for (const char* host : {"boot", "b"}) {
    ASSERT_EQ(
        RunCommand(lab.In(host, {"iptables", "-A", "OUTPUT", "-d", "10.99.0.1", "-j", "DROP"}), 10s)
            .code,
        0);
  }
  std::optional<Subprocess> boot, a, b;
  const std::string a_err = ScratchPath("a.err");
  const std::string bootstrap = StartWildcardNode(lab, "boot", "", boot, ScratchPath("boot.err"));
  ASSERT_FALSE(bootstrap.empty());
  const std::string at_a = StartWildcardNode(lab, "a", bootstrap, a, a_err);
  ASSERT_FALSE(StartWildcardNode(lab, "b", bootstrap, b, ScratchPath("b.err")).empty());
  ASSERT_FALSE(at_a.empty());
  // Each request may take 30 s, a dial 10 s (the host's default): a dial that waited at
  // 10.99.0.1 until its timeout would still leave time for the next address, but would show.
  const auto start = std::chrono::steady_clock::now();
  auto store = RunCommand(lab.In("b", {ColonyBinary(), "--log-level", "warn", "dht", "store",
                                       "lab.wildcard", "reached across machines", "--initial-peers",
                                       bootstrap, "--request-timeout", "30"}),
                          120s);
  ASSERT_EQ(store.code, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s)
      << "a request waited for the dial to the address that leads nowhere to time out";
  boot.reset();  // killed
  b.reset();
  auto get = RunCommand(lab.In("boot", {ColonyBinary(), "--log-level", "warn", "dht", "get",
                                        "lab.wildcard", "--initial-peers", at_a}),
                        60s);
  std::string got;
  for (const auto& l : get.lines) got += l;
  EXPECT_EQ(get.code, 0) << got;
  EXPECT_NE(got.find("reached across machines"), std::string::npos)
      << "the store did not reach the node on another machine: " << got << "\n"
      << test::ReadFile(a_err);
}

// The first address `process` prints that starts with `prefix` (among its first few lines,
// each waited for up to `per_line`).
std::string ReadAddress(Subprocess& process, const std::string& prefix,
                        std::chrono::seconds per_line = 20s) {
  for (int i = 0; i < 5; ++i) {
    auto line = process.ReadLine(per_line);
    if (!line.ok()) break;
    if (line->rfind(prefix, 0) == 0) return *line;
  }
  return {};
}

// `colony dht get key` on `host`, joining the swarm through `through` alone: its exit code and
// its output lines joined.
std::pair<int, std::string> DhtGetThrough(const Lab& lab, const std::string& host,
                                          const std::string& key, const std::string& through) {
  auto get = RunCommand(lab.In(host, {ColonyBinary(), "--log-level", "warn", "dht", "get", key,
                                      "--initial-peers", through}),
                        60s);
  std::string got;
  for (const auto& l : get.lines) got += l;
  return {get.code, got};
}

// Peers behind home routers that forward a port to them. `a`'s router forwards the port it
// listens on: the bootstrap peer's dial-back reaches it at the router's address, which none of
// its interfaces has, so it gives others that address and serves the DHT. `b`'s router forwards
// another port (5000 to its 4001), where no dial-back looks: it says so with --announce. A public
// peer then reaches both directly at those addresses, with the bootstrap peer gone.
TEST(LabWan, PeersBehindForwardedPortsGiveOthersTheirRoutersAddresses) {
  SKIP_WITHOUT_LAB();
  Lab lab(
      "host boot\nnat homea\nnat homeb\nhost a behind homea forward 4001\n"
      "host b behind homeb forward 5000:4001\nhost c\n");
  ASSERT_TRUE(lab.error().empty()) << lab.error();
  std::optional<Subprocess> boot, a, b;
  const std::string a_err = ScratchPath("a.err"), b_err = ScratchPath("b.err");
  const std::string bootstrap = StartWildcardNode(lab, "boot", "", boot, ScratchPath("boot.err"));
  ASSERT_FALSE(bootstrap.empty());
  a.emplace(StartColony(
      lab, "a", {"dht", "--listen", "/ip4/0.0.0.0/tcp/4001", "--initial-peers", bootstrap}, a_err));
  const std::string at_a = ReadAddress(*a, "/ip4/" + lab.addr("homea") + "/tcp/4001/p2p/");
  ASSERT_FALSE(at_a.empty()) << "a did not give the address its router forwards\n"
                             << test::ReadFile(a_err);
  b.emplace(StartColony(lab, "b",
                        {"dht", "--listen", "/ip4/0.0.0.0/tcp/4001", "--announce",
                         "/ip4/" + lab.addr("homeb") + "/tcp/5000", "--initial-peers", bootstrap},
                        b_err));
  auto at_b = b->ReadLine(20s);
  ASSERT_TRUE(at_b.ok()) << test::ReadFile(b_err);
  // The announced address only: none of b's own.
  ASSERT_EQ(at_b->rfind("/ip4/" + lab.addr("homeb") + "/tcp/5000/p2p/", 0), 0u) << *at_b;
  auto store = RunCommand(
      lab.In("c", {ColonyBinary(), "--log-level", "warn", "dht", "store", "lab.forwarded",
                   "behind a router", "--initial-peers", bootstrap, "--request-timeout", "30"}),
      120s);
  ASSERT_EQ(store.code, 0);
  boot.reset();  // killed
  for (const std::string& through : {at_a, *at_b}) {
    // Joining through the address alone: a dial there must reach a DHT server with that id.
    const auto [code, got] = DhtGetThrough(lab, "c", "lab.forwarded", through);
    EXPECT_EQ(code, 0) << through << ": " << got;
    EXPECT_NE(got.find("behind a router"), std::string::npos) << through << ": " << got;
  }
}

// A peer behind a home router that forwards its port, whose public address then changes (as an
// ISP's does now and then). The peer's next dial-back finds it at the new address: it prints its
// addresses again, and gives the DHT the new one, so that a public peer reaches it there through
// what the bootstrap peer tells it: a record the public peer stores reaches it, and is found
// through its new address alone once the bootstrap peer is gone.
TEST(LabWan, APeerWhoseRoutersPublicAddressChangesGivesOthersTheNewOne) {
  SKIP_WITHOUT_LAB();
  Lab lab("host boot\nnat home\nhost a behind home forward 4001\nhost c\n");
  ASSERT_TRUE(lab.error().empty()) << lab.error();
  std::optional<Subprocess> boot, a;
  const std::string a_err = ScratchPath("a.err");
  const std::string bootstrap = StartWildcardNode(lab, "boot", "", boot, ScratchPath("boot.err"));
  ASSERT_FALSE(bootstrap.empty());
  a.emplace(StartColony(lab, "a",
                        {"dht", "--listen", "/ip4/0.0.0.0/tcp/4001", "--initial-peers", bootstrap,
                         "--reachability-recheck", "1"},
                        a_err));
  const std::string old_ip = lab.addr("home");  // 198.18.N.2 on the router's uplink
  const std::string at_old = ReadAddress(*a, "/ip4/" + old_ip + "/tcp/4001/p2p/");
  ASSERT_FALSE(at_old.empty()) << test::ReadFile(a_err);
  const std::string net = old_ip.substr(0, old_ip.rfind('.'));
  const std::string new_ip = net + ".3";
  // The router's uplink gets another address; the old one is gone, with the connections that
  // were translated to it, and leads nowhere (the ISP gave it to someone else: the core's
  // neighbour cache would still deliver it here, and the port forwarding takes any address).
  auto moved =
      RunCommand(lab.In("home", {"sh", "-c",
                                 "iptables -t mangle -A PREROUTING -i eth0 -d " + old_ip +
                                     " -j DROP && ip addr flush dev eth0 && ip addr add " + new_ip +
                                     "/24 dev eth0 && ip route add default via " + net + ".1"}),
                 10s);
  ASSERT_EQ(moved.code, 0);
  const std::string at_new = ReadAddress(*a, "/ip4/" + new_ip + "/tcp/4001/p2p/");
  ASSERT_FALSE(at_new.empty()) << "a did not give its router's new address\n"
                               << test::ReadFile(a_err);
  auto store = RunCommand(
      lab.In("c", {ColonyBinary(), "--log-level", "warn", "dht", "store", "lab.moved",
                   "at the new address", "--initial-peers", bootstrap, "--request-timeout", "30"}),
      120s);
  ASSERT_EQ(store.code, 0);
  boot.reset();  // killed
  const auto [code, got] = DhtGetThrough(lab, "c", "lab.moved", at_new);
  EXPECT_EQ(code, 0) << got << "\n" << test::ReadFile(a_err);
  EXPECT_NE(got.find("at the new address"), std::string::npos) << got;
}

// A peer behind a home router whose port forwarding comes and goes, with a bootstrap peer that
// runs a relay. With `forwarding_at_start` the peer starts public, at its router's address, and
// the router then stops forwarding (as a router reset to its defaults does): at its next
// dial-back check its initial peer cannot reach it (each helper's dial waits for its 10 s
// timeout). Without, the router forwards nothing when the peer starts. Either way it reserves
// with the relay and prints its relayed address, where another machine reaches it. Once the
// forwarding is there, it prints its router's address and serves the DHT there: a public peer
// that stored a record finds it through that address alone, with the initial peer gone.
void RouterForwardingComesAndGoes(bool forwarding_at_start) {
  Lab lab("host boot\nnat home\nhost a behind home forward 4001\nhost c\n");
  ASSERT_TRUE(lab.error().empty()) << lab.error();
  std::optional<Subprocess> boot, a;
  const std::string boot_err = ScratchPath("boot.err"), a_err = ScratchPath("a.err");
  const std::string at_boot = "/ip4/" + lab.addr("boot");
  boot.emplace(StartColony(
      lab, "boot",
      {"dht", "--listen", at_boot + "/tcp/4001", "--relay-listen", at_boot + "/tcp/4002"},
      boot_err));
  auto bootstrap = boot->ReadLine(30s);
  ASSERT_TRUE(bootstrap.ok()) << bootstrap.status().ToString() << test::ReadFile(boot_err);
  // The router's port forwarding rule (scripts/lab), deleted ("-D") or added back ("-A").
  const auto forwarding = [&](const std::string& op) {
    return RunCommand(lab.In("home", {"iptables", "-t", "nat", op, "PREROUTING", "-i", "eth0", "-p",
                                      "tcp", "--dport", "4001", "-j", "DNAT", "--to-destination",
                                      lab.addr("a") + ":4001"}),
                      10s);
  };
  if (!forwarding_at_start) {
    ASSERT_EQ(forwarding("-D").code, 0);
  }
  a.emplace(StartColony(lab, "a",
                        {"dht", "--listen", "/ip4/0.0.0.0/tcp/4001", "--initial-peers", *bootstrap,
                         "--reachability-recheck", "1"},
                        a_err));
  const std::string at_router = "/ip4/" + lab.addr("home") + "/tcp/4001/p2p/";
  if (forwarding_at_start) {
    ASSERT_FALSE(ReadAddress(*a, at_router).empty()) << test::ReadFile(a_err);
    ASSERT_EQ(forwarding("-D").code, 0);
  }
  const std::string relayed = ReadAddress(*a, at_boot + "/tcp/4002/p2p/", 90s);
  ASSERT_FALSE(relayed.empty()) << "a did not move behind the relay\n" << test::ReadFile(a_err);
  EXPECT_NE(relayed.find("/p2p-circuit/"), std::string::npos) << relayed;
  auto ping = RunCommand(
      lab.In("c", {ColonyBinary(), "--log-level", "warn", "ping", relayed, "--count", "1"}), 60s);
  std::string pinged;
  for (const auto& l : ping.lines) pinged += l + "\n";
  EXPECT_EQ(ping.code, 0) << pinged;
  ASSERT_EQ(forwarding("-A").code, 0);
  const std::string direct = ReadAddress(*a, at_router, 90s);
  ASSERT_FALSE(direct.empty()) << "a did not serve the DHT at its router's address\n"
                               << test::ReadFile(a_err);
  auto store = RunCommand(
      lab.In("c", {ColonyBinary(), "--log-level", "warn", "dht", "store", "lab.back",
                   "served again", "--initial-peers", *bootstrap, "--request-timeout", "30"}),
      120s);
  ASSERT_EQ(store.code, 0);
  boot.reset();  // killed
  const auto [code, got] = DhtGetThrough(lab, "c", "lab.back", direct);
  EXPECT_EQ(code, 0) << got << "\n" << test::ReadFile(a_err);
  EXPECT_NE(got.find("served again"), std::string::npos) << got;
}

TEST(LabWan, APeerWhoseRouterStopsForwardingMovesBehindARelayAndBack) {
  SKIP_WITHOUT_LAB();
  RouterForwardingComesAndGoes(true);
}

TEST(LabWan, APeerWhoseRouterForwardsOnlyAfterItStartedServesTheDhtThere) {
  SKIP_WITHOUT_LAB();
  RouterForwardingComesAndGoes(false);
}

// Bytes sent plus received on `host`'s uplink so far.
uint64_t UplinkBytes(const Lab& lab, const std::string& host) {
  uint64_t total = 0;
  for (const char* dir : {"rx_bytes", "tx_bytes"}) {
    auto r = RunCommand(lab.In(host, {"cat", std::string("/sys/class/net/eth0/statistics/") + dir}),
                        10s);
    EXPECT_EQ(r.code, 0);
    if (!r.lines.empty()) total += std::stoull(r.lines[0]);
  }
  return total;
}

// The two NATed peers without any public averager: each holds a reservation with the relay that
// the bootstrap peer runs and announces its relayed address, and they average with each other,
// end-to-end encrypted, in two rounds. With hole punching off the data goes through the relay.
// With it on (the default), the first connection through the relay is replaced by a direct one
// through both NATs: the first round's data may still start on the relay while the punch runs,
// the second round's crosses no relay (the bootstrap host sees none of it).
void AverageBehindTwoNats(bool hole_punching) {
  Lab lab(test::ReadFile(std::string(COLONY_SOURCE_DIR) + "/lab/nat2.lab"));
  ASSERT_TRUE(lab.error().empty()) << lab.error();
  std::optional<Subprocess> boot;
  boot.emplace(StartColony(lab, "boot",
                           {"dht", "--listen", "/ip4/" + lab.addr("boot") + "/tcp/4001",
                            "--relay-listen", "/ip4/" + lab.addr("boot") + "/tcp/4002"},
                           ScratchPath("boot.err")));
  auto bootstrap = boot->ReadLine(20s);
  ASSERT_TRUE(bootstrap.ok()) << bootstrap.status().ToString();

  constexpr size_t kValues = 1 << 20;  // 4 MiB per peer
  std::vector<std::string> args = {"--values",
                                   std::to_string(kValues),
                                   "--target-group-size",
                                   "2",
                                   "--min-group-size",
                                   "2",
                                   "--timeout",
                                   "60",
                                   "--part-timeout",
                                   kPartTimeout,
                                   "--rounds",
                                   "2",
                                   "--relay",
                                   *bootstrap,
                                   "--start-at",
                                   StartAt(4)};
  if (!hole_punching) args.push_back("--no-hole-punching");
  AveragePeer a, b;
  ASSERT_NO_FATAL_FAILURE(StartAveragePeer(lab, "a", 1, *bootstrap, args, a));
  ASSERT_NO_FATAL_FAILURE(StartAveragePeer(lab, "b", 2, *bootstrap, args, b));
  for (AveragePeer* p : {&a, &b}) {
    ASSERT_EQ(p->ready["addrs"].size(), 1u) << p->ready.dump();
    EXPECT_NE(p->ready["addrs"][0].get<std::string>().find("/p2p-circuit/"), std::string::npos)
        << p->ready.dump();
  }
  uint64_t boot_bytes = 0;
  for (int round = 0; round < 2; ++round) {
    for (AveragePeer* p : {&a, &b}) {
      auto r = NextRound(*p, 90s);
      ASSERT_TRUE(r.ok()) << "peer " << p->seed << ": " << r.status().ToString() << "\n"
                          << test::ReadFile(p->err);
      ASSERT_TRUE((*r)["ok"].get<bool>()) << r->dump();
      EXPECT_EQ((*r)["group_size"].get<int>(), 2);
      for (const auto& m : (*r)["members"]) EXPECT_EQ(m["mode"], "node") << r->dump();
    }
    // Both reported the round; the next one's data moves only after its matchmaking, which
    // takes several round trips, so this reading splits the rounds.
    const uint64_t now = UplinkBytes(lab, "boot");
    if (round == 1) {
      // Each peer sends half of its 4 MiB and gets as much back: through the relay, 8 MiB enter
      // the bootstrap host and leave it again; direct, it sees only DHT and matchmaking bytes.
      const uint64_t second_round = now - boot_bytes;
      if (hole_punching) {
        EXPECT_LT(second_round, 1u << 20) << "the data went through the relay, not the hole";
      } else {
        EXPECT_GT(second_round, 14u << 20) << "the data did not go through the relay";
      }
    }
    boot_bytes = now;
  }
  for (AveragePeer* p : {&a, &b}) ASSERT_NO_FATAL_FAILURE(ExpectMeanOf(*p, {1, 2}, kValues));
}

TEST(LabWan, TwoPeersBehindNatsAverageThroughARelay) {
  SKIP_WITHOUT_LAB();
  AverageBehindTwoNats(/*hole_punching=*/false);
}

TEST(LabWan, TwoPeersBehindNatsPunchAHoleAndAverageDirectly) {
  SKIP_WITHOUT_LAB();
  AverageBehindTwoNats(/*hole_punching=*/true);
}

// Nobody tells the NATed peers that they are behind NAT or which relay to use: each asks the
// bootstrap peer to dial it back, learns that it cannot, looks up the relays announced in the DHT,
// reserves a slot with one (on a public host of its own, not the bootstrap), and announces its
// relayed address; a public peer asked the same question stays public.
TEST(LabWan, PeersBehindNatFindOutAndPickARelayByThemselves) {
  SKIP_WITHOUT_LAB();
  Lab lab(
      "host boot rate 100mbit delay 5ms\n"
      "host relay rate 100mbit delay 5ms\n"
      "nat homea rate 100mbit delay 5ms\n"
      "nat homeb rate 100mbit delay 5ms\n"
      "host a behind homea\n"
      "host b behind homeb\n");
  ASSERT_TRUE(lab.error().empty()) << lab.error();
  std::optional<Subprocess> boot, relay;
  const std::string bootstrap = StartBootstrap(lab, "boot", boot);
  ASSERT_FALSE(bootstrap.empty());
  const std::string relay_err = ScratchPath("relay.err");
  relay.emplace(
      StartColony(lab, "relay",
                  {"dht", "--listen", "/ip4/" + lab.addr("relay") + "/tcp/4001", "--relay-listen",
                   "/ip4/" + lab.addr("relay") + "/tcp/4002", "--initial-peers", bootstrap},
                  relay_err));
  auto relay_addr = relay->ReadLine(30s);
  ASSERT_TRUE(relay_addr.ok()) << relay_addr.status().ToString() << test::ReadFile(relay_err);
  // The relay's host is public: it printed its own address, not a relayed one.
  EXPECT_EQ(relay_addr->find("/p2p-circuit/"), std::string::npos) << *relay_addr;
  // Wait until the relay's announcement is in the DHT.
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  bool announced = false;
  while (!announced && std::chrono::steady_clock::now() < deadline) {
    auto get = RunCommand(lab.In("boot", {ColonyBinary(), "--log-level", "error", "dht", "get",
                                          dht::kRelaysKey, "--initial-peers", bootstrap}),
                          30s);
    for (const auto& l : get.lines) announced = announced || l.find(lab.addr("relay")) != l.npos;
  }
  ASSERT_TRUE(announced) << "the relay never appeared under " << dht::kRelaysKey;

  constexpr size_t kValues = 1 << 18;
  const std::vector<std::string> args = {"--values",
                                         std::to_string(kValues),
                                         "--target-group-size",
                                         "2",
                                         "--min-group-size",
                                         "2",
                                         "--timeout",
                                         "60",
                                         "--part-timeout",
                                         kPartTimeout,
                                         "--start-at",
                                         StartAt(6)};
  AveragePeer a, b;
  ASSERT_NO_FATAL_FAILURE(StartAveragePeer(lab, "a", 1, bootstrap, args, a));
  ASSERT_NO_FATAL_FAILURE(StartAveragePeer(lab, "b", 2, bootstrap, args, b));
  for (AveragePeer* p : {&a, &b}) {
    ASSERT_EQ(p->ready["addrs"].size(), 1u) << p->ready.dump() << test::ReadFile(p->err);
    const std::string addr = p->ready["addrs"][0];
    EXPECT_NE(addr.find("/p2p-circuit/"), std::string::npos) << addr;
    EXPECT_EQ(addr.rfind("/ip4/" + lab.addr("relay") + "/tcp/4002/", 0), 0u) << addr;
  }
  for (AveragePeer* p : {&a, &b}) {
    auto round = NextRound(*p, 90s);
    ASSERT_TRUE(round.ok()) << "peer " << p->seed << ": " << round.status().ToString() << "\n"
                            << test::ReadFile(p->err);
    ASSERT_TRUE((*round)["ok"].get<bool>()) << round->dump();
    ASSERT_NO_FATAL_FAILURE(ExpectMeanOf(*p, {1, 2}, kValues)) << round->dump();
  }
}

std::string StarTopology(int peers, const std::string& rate, const std::string& delay,
                         const std::string& lossy_peer_loss = {}) {
  std::string t = "host boot rate " + rate + " delay " + delay + "\n";
  for (int i = 1; i <= peers; ++i) {
    t += "host p" + std::to_string(i) + " rate " + rate + " delay " + delay;
    if (i == 1 && !lossy_peer_loss.empty()) t += " loss " + lossy_peer_loss;
    t += "\n";
  }
  return t;
}

struct WanRound {
  double allreduce_s = 0;   // the slowest peer's
  uint64_t bytes_sent = 0;  // the most any peer sent
};

// n peers average `values` floats in one group; checks every result and returns the round.
void AverageInLab(Lab& lab, int n, size_t values, WanRound& out) {
  std::optional<Subprocess> boot;
  const std::string bootstrap = StartBootstrap(lab, "boot", boot);
  ASSERT_FALSE(bootstrap.empty());
  const std::string start = StartAt(2.0 + 0.5 * n);
  std::vector<AveragePeer> peers(static_cast<size_t>(n));
  std::vector<uint64_t> seeds;
  for (int i = 0; i < n; ++i) {
    seeds.push_back(static_cast<uint64_t>(i + 1));
    ASSERT_NO_FATAL_FAILURE(
        StartAveragePeer(lab, "p" + std::to_string(i + 1), seeds.back(), bootstrap,
                         {"--values", std::to_string(values), "--target-group-size",
                          std::to_string(n), "--min-group-size", std::to_string(n), "--timeout",
                          "120", "--part-timeout", kPartTimeout, "--start-at", start},
                         peers[static_cast<size_t>(i)]));
  }
  for (auto& p : peers) {
    auto round = NextRound(p, 150s);
    ASSERT_TRUE(round.ok()) << "peer " << p.seed << ": " << round.status().ToString() << "\n"
                            << test::ReadFile(p.err);
    ASSERT_TRUE((*round)["ok"].get<bool>()) << round->dump();
    ASSERT_EQ((*round)["group_size"].get<int>(), n);
    out.allreduce_s = std::max(out.allreduce_s, (*round)["allreduce_s"].get<double>());
    out.bytes_sent = std::max(out.bytes_sent, (*round)["bytes_sent"].get<uint64_t>());
    ASSERT_NO_FATAL_FAILURE(ExpectMeanOf(p, seeds, values));
  }
}

// 8 peers, 50 ms RTT between any two (12.5 ms one way on each uplink), average 16 MiB each. The
// bandwidth floor is what each peer must send (2 x 7/8 of its data: reduce-scatter and
// all-gather) at its link's rate. The links are 25 Mbit/s, not the issue's 100: the lab moves
// every byte through two userspace relays and the peers encrypt everything, and at 8 x 100
// Mbit/s the 2 cores of the test machine, not the links, set the pace (measured 1.6x the floor
// with relays, 1.15x without; scripts/bench wan runs the 100 Mbit/s case).
TEST(LabWan, EightPeersAverageNearTheBandwidthFloor) {
  SKIP_WITHOUT_LAB();
  constexpr int kPeers = 8;
  constexpr double kMbit = 25;
  constexpr size_t kValues = 4 << 20;  // 16 MiB of float32
  Lab lab(StarTopology(kPeers, "25mbit", "12.5ms"));
  ASSERT_TRUE(lab.error().empty()) << lab.error();
  WanRound round;
  ASSERT_NO_FATAL_FAILURE(AverageInLab(lab, kPeers, kValues, round));
  const double must_send = 2.0 * (kPeers - 1) / kPeers * kValues * sizeof(float);
  const double floor_s = must_send * 8 / (kMbit * 1e6);
  const double ratio = round.allreduce_s / floor_s;
  std::printf(
      "[lab] %d peers, %.0f Mbit/s, 50 ms RTT: %.2f s for %.1f MB each (sent at most %.1f "
      "MB), floor %.2f s, %.2fx the floor\n",
      kPeers, kMbit, round.allreduce_s, must_send / 1e6,
      static_cast<double>(round.bytes_sent) / 1e6, floor_s, ratio);
  RecordProperty("ratio_to_floor", std::to_string(ratio));
  // Framing and encryption add about 0.1% to the bytes, the DHT and keepalives a little more the
  // longer the round takes (0.9% under ASan).
  EXPECT_LT(static_cast<double>(round.bytes_sent), must_send * 1.02);
  if (kSanitized) {
    std::printf("[lab] sanitizer build: the time is not checked\n");
  } else {
    EXPECT_LE(ratio, 1.3);
  }
}

// One peer's link drops 1% of the packets in each direction: the round still completes, with
// every peer's result the exact mean.
TEST(LabWan, AveragingCompletesWithOnePercentLoss) {
  SKIP_WITHOUT_LAB();
  Lab lab(StarTopology(4, "25mbit", "12.5ms", "1%"));
  ASSERT_TRUE(lab.error().empty()) << lab.error();
  WanRound round;
  ASSERT_NO_FATAL_FAILURE(AverageInLab(lab, 4, 1 << 20, round));
  std::printf("[lab] 4 peers, one link with 1%% loss: %.2f s\n", round.allreduce_s);
}

// ---- SWARM ------------------------------------------------------------------------------

// The next JSON event of a process in the lab, skipping other lines.
Result<json> NextEvent(Subprocess& p, std::chrono::milliseconds timeout) {
  for (;;) {
    auto line = p.ReadLine(timeout);
    if (!line.ok()) return line.status();
    auto j = json::parse(*line, nullptr, false);
    if (j.is_object() && j.contains("event")) return j;
  }
}

// SWARM training across the lab (100 Mbit/s, 50 ms RTT between hosts): one stage peer per stage
// on two hosts and a trainer on a third, which routes every microbatch, so that its link carries
// all of the traffic between stages. The same 10 epochs are trained with hidden states and their
// gradients in float32, then (a run of its own) in blockwise 8-bit: the trainer's traffic falls
// to under 40% of float32's (a quarter, plus the scales, the requests and the DHT), and both runs
// train every sample.
TEST(LabSwarm, EightBitStageBoundariesCutTheTrainersTraffic) {
  SKIP_WITHOUT_LAB();
  constexpr int64_t kEpochs = 10, kTarget = 16;
  Lab lab(StarTopology(3, "100mbit", "12.5ms"));
  ASSERT_TRUE(lab.error().empty()) << lab.error();
  std::optional<Subprocess> boot;
  const std::string bootstrap = StartBootstrap(lab, "boot", boot);
  ASSERT_FALSE(bootstrap.empty());
  const std::string model = ScratchPath("swarm-init"), cache = ScratchPath("swarm-cache");
  const std::vector<std::string> data = {"--cache-dir",  cache, "--corpus-bytes", "300000",
                                         "--vocab-size", "512", "--seq-len",      "32"};
  std::vector<std::string> init_args = {"swarm-train",   "init", "--out",    model,
                                        "--hidden-size", "64",   "--layers", "4",
                                        "--init-seed",   "2"};
  init_args.insert(init_args.end(), data.begin(), data.end());
  const std::string init_err = ScratchPath("init.err");
  Subprocess init = StartColony(lab, "boot", init_args, init_err);
  auto made = NextEvent(init, 120s);
  ASSERT_TRUE(made.ok() && (*made)["event"] == "initialized") << test::ReadFile(init_err);
  std::map<std::string, double> bytes;
  for (const std::string codec : {"none", "blockwise8"}) {
    const std::string run = "lab-swarm-" + codec;
    std::vector<Subprocess> stages;
    for (const auto& [host, blocks] :
         std::vector<std::pair<std::string, std::string>>{{"p1", "0:2"}, {"p2", "2:4"}}) {
      const std::string err = ScratchPath(host + "-" + codec + ".err");
      stages.push_back(StartColony(lab, host,
                                   {"swarm-train",
                                    "stage",
                                    "--model",
                                    model,
                                    "--blocks",
                                    blocks,
                                    "--run-id",
                                    run,
                                    "--initial-peers",
                                    bootstrap,
                                    "--listen",
                                    "/ip4/" + lab.addr(host) + "/tcp/0",
                                    "--threads",
                                    "1",
                                    "--target-batch-size",
                                    std::to_string(kTarget),
                                    "--matchmaking-time",
                                    "2",
                                    "--rebalance-period",
                                    "0"},
                                   err));
      auto ready = NextEvent(stages.back(), 60s);
      ASSERT_TRUE(ready.ok() && (*ready)["event"] == "ready") << test::ReadFile(err);
    }
    const uint64_t before = UplinkBytes(lab, "p3");
    std::vector<std::string> args = {"swarm-train",
                                     "trainer",
                                     "--swarm-model",
                                     model,
                                     "--run-id",
                                     run,
                                     "--initial-peers",
                                     bootstrap,
                                     "--listen",
                                     "/ip4/" + lab.addr("p3") + "/tcp/0",
                                     "--json",
                                     "--threads",
                                     "1",
                                     "--batch-size",
                                     "8",
                                     "--target-batch-size",
                                     std::to_string(kTarget),
                                     "--max-epochs",
                                     std::to_string(kEpochs),
                                     "--eval-every",
                                     "0",
                                     "--progress-interval",
                                     "0",
                                     "--boundary-codec",
                                     codec};
    args.insert(args.end(), data.begin(), data.end());
    const std::string err = ScratchPath("trainer-" + codec + ".err");
    Subprocess trainer = StartColony(lab, "p3", args, err);
    json done;
    while (done.is_null()) {
      auto e = NextEvent(trainer, 300s);
      ASSERT_TRUE(e.ok()) << e.status().ToString() << "\n" << test::ReadFile(err);
      if ((*e)["event"] == "done") done = *e;
    }
    EXPECT_EQ(done["skipped_batches"], 0) << done.dump();
    EXPECT_EQ(done["samples"].get<int64_t>(), kEpochs * kTarget) << done.dump();
    auto code = trainer.Wait(30s);
    ASSERT_TRUE(code.ok() && *code == 0) << test::ReadFile(err);
    bytes[codec] = static_cast<double>(UplinkBytes(lab, "p3") - before);
    for (auto& s : stages) {
      s.Signal(SIGTERM);
      (void)s.Wait(15s);
    }
  }
  const double ratio = bytes["blockwise8"] / bytes["none"];
  std::printf(
      "[lab] SWARM, 2 stages, 100 Mbit/s, 50 ms RTT, %lld epochs: the trainer's link carried "
      "%.2f MB with float32 boundaries, %.2f MB with 8-bit ones (x%.3f)\n",
      static_cast<long long>(kEpochs), bytes["none"] / 1e6, bytes["blockwise8"] / 1e6, ratio);
  RecordProperty("boundary8_bytes_ratio", std::to_string(ratio));
  EXPECT_LT(ratio, 0.4);
}

}  // namespace
}  // namespace colony
