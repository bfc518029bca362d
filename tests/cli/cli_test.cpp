// End-to-end tests of the `colony` command-line tool: each test runs the real binary (from
// $COLONY_BIN, else next to this test binary) as child processes and checks exit codes, stdout
// and stderr. Every wait is bounded; a hung child fails the test instead of hanging it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/subprocess.h"
#include "test_support.h"

namespace colony {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

using test::ColonyBinary;
using test::ReadFile;
using test::WriteFile;

constexpr char kPeerIdPrefix[] = "12D3KooW";

bool StartsWith(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The peer id at the end of a multiaddr (".../p2p/<id>"), or "" if there is none.
std::string PeerIdOf(const std::string& addr) {
  auto pos = addr.rfind("/p2p/");
  return pos == std::string::npos ? "" : addr.substr(pos + 5);
}

// Checks that `err` is exactly one line, "colony: error: ...\n", containing every `parts`.
void ExpectOneErrorLine(const std::string& err, const std::vector<std::string>& parts) {
  EXPECT_TRUE(StartsWith(err, "colony: error: ")) << "stderr: " << err;
  ASSERT_FALSE(err.empty());
  EXPECT_EQ(err.back(), '\n') << "stderr: " << err;
  EXPECT_EQ(err.find('\n'), err.size() - 1) << "expected exactly one line on stderr: " << err;
  for (const auto& p : parts) EXPECT_TRUE(Contains(err, p)) << "missing '" << p << "' in: " << err;
}

using colony::test::TempDir;

struct RunResult {
  int code = -1;
  std::vector<std::string> out;  // stdout lines
  std::string err;               // stderr, verbatim
  std::string Describe() const {
    std::string s = "exit code " + std::to_string(code) + "\nstdout:\n";
    for (const auto& l : out) s += "  " + l + "\n";
    return s + "stderr:\n" + err;
  }
};

// A `colony listen` process that has printed its first address.
struct Listener {
  Subprocess proc;
  std::string addr;
  std::string peer_id;
  std::string stderr_path;
};

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Children inherit the environment; keep their logging at the default level.
    ::unsetenv("COLONY_LOG");
    bin_ = ColonyBinary();
    ASSERT_EQ(::access(bin_.c_str(), X_OK), 0)
        << "colony binary not found at " << bin_ << " (set COLONY_BIN)";
  }

  std::string NextStderrPath() { return dir_.File("stderr-" + std::to_string(++runs_)); }

  // Runs `colony args...` to completion (at most `limit`) and collects its output.
  RunResult Run(const std::vector<std::string>& args, milliseconds limit = seconds(15)) {
    RunResult r;
    std::vector<std::string> argv = {bin_};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string err_path = NextStderrPath();
    auto p = Subprocess::Spawn(argv, err_path);
    if (!p.ok()) {
      ADD_FAILURE() << p.status().ToString();
      return r;
    }
    const auto deadline = steady_clock::now() + limit;
    auto left = [&] {
      return std::max(milliseconds(0),
                      std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now()));
    };
    for (;;) {
      auto line = p->ReadLine(left());
      if (line.ok()) {
        r.out.push_back(*line);
        continue;
      }
      if (line.status().code() != StatusCode::kNotFound) {  // not EOF: it timed out
        ADD_FAILURE() << "colony " << ::testing::PrintToString(args) << ": "
                      << line.status().ToString();
      }
      break;
    }
    auto code = p->Wait(left());
    if (code.ok()) {
      r.code = *code;
    } else {
      ADD_FAILURE() << "colony " << ::testing::PrintToString(args) << ": "
                    << code.status().ToString();
    }
    r.err = ReadFile(err_path);
    return r;
  }

  // Starts `colony listen` on a loopback port with `extra` arguments; waits for its address.
  std::optional<Listener> StartListener(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {bin_, "listen", "--listen", "/ip4/127.0.0.1/tcp/0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    std::string err_path = NextStderrPath();
    auto p = Subprocess::Spawn(argv, err_path);
    if (!p.ok()) {
      ADD_FAILURE() << p.status().ToString();
      return std::nullopt;
    }
    auto line = p->ReadLine(test::HangGuard(seconds(10)));
    if (!line.ok()) {
      ADD_FAILURE() << "listener printed no address: " << line.status().ToString() << "\nstderr:\n"
                    << ReadFile(err_path);
      return std::nullopt;
    }
    Listener l{std::move(*p), *line, PeerIdOf(*line), err_path};
    return l;
  }

  // Sends `sig` and expects a clean exit (code 0) within a few seconds.
  void ExpectCleanStop(Listener& l, int sig) {
    auto start = steady_clock::now();
    l.proc.Signal(sig);
    auto code = l.proc.Wait(test::HangGuard(seconds(5)));
    ASSERT_TRUE(code.ok()) << code.status().ToString() << "\nstderr:\n" << ReadFile(l.stderr_path);
    EXPECT_EQ(*code, 0) << "stderr:\n" << ReadFile(l.stderr_path);
    // (a clean stop is prompt on any machine: no internal timeout of seconds may pass)
    EXPECT_LT(steady_clock::now() - start, seconds(10));
  }

  // Creates an identity file with `colony identity new` and returns its peer id.
  std::string NewIdentity(const std::string& path) {
    RunResult r = Run({"identity", "new", "--out", path});
    EXPECT_EQ(r.code, 0) << r.Describe();
    return r.out.empty() ? "" : r.out[0];
  }

  std::string bin_;
  TempDir dir_;
  int runs_ = 0;
};

// A TCP server on loopback that is not a Colony peer: it answers the first connection with an
// HTTP error and closes it (after the client is done sending, so the client sees no reset).
class FakeHttpServer {
 public:
  FakeHttpServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::listen(fd_, 4) != 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return;
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeHttpServer() {
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  FakeHttpServer(const FakeHttpServer&) = delete;
  FakeHttpServer& operator=(const FakeHttpServer&) = delete;

  int port() const { return port_; }

 private:
  void Serve() {
    pollfd pfd{fd_, POLLIN, 0};
    if (::poll(&pfd, 1, 15'000) != 1) return;
    int conn = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) return;
    static constexpr char kReply[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
    [[maybe_unused]] ssize_t n = ::send(conn, kReply, sizeof(kReply) - 1, MSG_NOSIGNAL);
    ::shutdown(conn, SHUT_WR);
    // Drain until the client closes (bounded), so that closing does not reset the connection.
    char buf[1024];
    pollfd cfd{conn, POLLIN, 0};
    while (::poll(&cfd, 1, 10'000) == 1 && ::read(conn, buf, sizeof(buf)) > 0) {
    }
    ::close(conn);
  }

  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

// A loopback TCP port on which nothing listens (bound, then released).
int ClosedPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

// --- version and help ------------------------------------------------------------------------

TEST_F(CliTest, VersionPrintsVersionAndExitsZero) {
  RunResult r = Run({"--version"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  ASSERT_EQ(r.out.size(), 1u) << r.Describe();
  EXPECT_TRUE(std::regex_match(r.out[0], std::regex(R"(colony \d+\.\d+\.\d+)"))) << r.out[0];
}

TEST_F(CliTest, HelpListsSubcommands) {
  RunResult r = Run({"--help"});
  EXPECT_EQ(r.code, 0) << r.Describe();
  std::string all;
  for (const auto& l : r.out) all += l + "\n";
  for (const char* cmd : {"identity", "listen", "ping", "demo"}) {
    EXPECT_TRUE(Contains(all, cmd)) << "help does not mention " << cmd << ":\n" << all;
  }
}

TEST_F(CliTest, UsageErrorsAreOneLineWithExitCodeTwo) {
  struct Case {
    std::vector<std::string> args;
    std::string expected;  // part of the message
  };
  const std::vector<Case> cases = {
      {{}, "subcommand is required; see 'colony --help'"},
      {{"ping"}, "address is required; see 'colony ping --help'"},
      {{"ping", "-c", "0", "/ip4/127.0.0.1/tcp/1"}, "--count"},
      {{"identity", "new"}, "--out is required; see 'colony identity new --help'"},
      {{"listen", "--no-such-flag"}, "--no-such-flag"},
      {{"average", "--initial-peers", "/ip4/127.0.0.1/tcp/1", "--values", "1", "--start-on-signal",
        "--start-at", "1"},
       "--start-at excludes --start-on-signal"},
      {{"average", "--initial-peers", "/ip4/127.0.0.1/tcp/1", "--output-last-round-only"},
       "--output-last-round-only requires --output"},
      {{"train", "--target-group-size", "1"}, "--target-group-size"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.args));
    RunResult r = Run(c.args);
    EXPECT_EQ(r.code, 2) << r.Describe();
    EXPECT_TRUE(r.out.empty()) << r.Describe();
    ExpectOneErrorLine(r.err, {c.expected});
  }
}

// An option of another task is an error that names it, not ignored; so is a grid that is not one,
// and a data seed for an audited peer.
TEST_F(CliTest, TrainRefusesOptionsOfAnotherTaskAndMalformedGrids) {
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"train", "--task", "lm", "--moe-grid", "8"}, "--moe-grid does not apply to --task lm"},
      {{"train", "--task", "fashion-mnist", "--moe-k-min", "1"},
       "--moe-k-min does not apply to --task fashion-mnist"},
      {{"train", "--task", "moe-lm", "--save-model", "out"},
       "--save-model does not apply to --task moe-lm"},
      {{"train", "--task", "moe-lm", "--classifier", "linear"},
       "--classifier does not apply to --task moe-lm"},
      {{"train", "--task", "moe-lm", "--moe-grid", "4y4"}, "--moe-grid '4y4'"},
      {{"train", "--task", "moe-lm", "--moe-grid", "4x0"}, "--moe-grid '4x0'"},
      // An audited peer's data is the run's to pick, not its own (docs/training.md).
      {{"train", "--task", "fashion-mnist", "--verify-rounds", "--audit-targets", "2", "--seed",
        "3"},
       "--seed does not apply with --audit-targets"},
      // A decaying schedule needs its end (by default --max-epochs) beyond the warmup.
      {{"train", "--task", "fashion-mnist", "--lr-schedule", "cosine", "--warmup-epochs", "5",
        "--max-epochs", "5"},
       "--lr-schedule cosine decays the rate to 0 at --max-epochs (5), which must be above "
       "--warmup-epochs (5)"},
      {{"train", "--task", "fashion-mnist", "--lr-schedule", "linear", "--warmup-epochs", "5",
        "--lr-decay-epochs", "3"},
       "--lr-schedule linear decays the rate to 0 at --lr-decay-epochs (3), which must be above "
       "--warmup-epochs (5)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.args));
    RunResult r = Run(c.args);
    EXPECT_NE(r.code, 0) << r.Describe();
    ExpectOneErrorLine(r.err, {c.expected});
  }
}

// An expert server's schedule runs by its experts' own steps; a decaying one needs its end beyond
// the warmup, checked before the server joins the swarm.
TEST_F(CliTest, ExpertsServeRefusesAScheduleThatEndsBeforeItsWarmup) {
  RunResult r = Run({"experts", "serve", "--expert-ids", "ffn.0.0", "--hidden-dim", "8",
                     "--lr-schedule", "linear", "--warmup-steps", "5", "--total-steps", "5"});
  EXPECT_NE(r.code, 0) << r.Describe();
  ExpectOneErrorLine(r.err, {"--lr-schedule linear decays the rate to 0 at --total-steps (5), "
                             "which must be above --warmup-steps (5)"});
}

// --- identity --------------------------------------------------------------------------------

TEST_F(CliTest, IdentityNewCreatesPrivateFileAndShowPrintsSameId) {
  const std::string file = dir_.File("id.key");
  RunResult r = Run({"identity", "new", "--out", file});
  ASSERT_EQ(r.code, 0) << r.Describe();
  ASSERT_EQ(r.out.size(), 1u) << r.Describe();
  const std::string id = r.out[0];
  EXPECT_TRUE(StartsWith(id, kPeerIdPrefix)) << id;

  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0) << file;
  EXPECT_EQ(st.st_mode & 0777, 0600u) << std::oct << (st.st_mode & 0777);

  RunResult show = Run({"identity", "show", file});
  EXPECT_EQ(show.code, 0) << show.Describe();
  ASSERT_EQ(show.out.size(), 1u) << show.Describe();
  EXPECT_EQ(show.out[0], id);
  EXPECT_EQ(show.err, "") << "no warning expected for a 0600 file";
}

TEST_F(CliTest, IdentityNewRefusesToOverwriteUnlessForced) {
  const std::string file = dir_.File("id.key");
  const std::string first = NewIdentity(file);
  ASSERT_TRUE(StartsWith(first, kPeerIdPrefix)) << first;

  RunResult again = Run({"identity", "new", "--out", file});
  EXPECT_NE(again.code, 0) << again.Describe();
  EXPECT_EQ(again.code, 1) << again.Describe();
  EXPECT_TRUE(again.out.empty()) << again.Describe();
  ExpectOneErrorLine(again.err, {file, "exists"});
  RunResult show = Run({"identity", "show", file});
  ASSERT_EQ(show.out.size(), 1u) << show.Describe();
  EXPECT_EQ(show.out[0], first) << "a refused overwrite must leave the file unchanged";

  RunResult forced = Run({"identity", "new", "--out", file, "--force"});
  ASSERT_EQ(forced.code, 0) << forced.Describe();
  ASSERT_EQ(forced.out.size(), 1u) << forced.Describe();
  EXPECT_TRUE(StartsWith(forced.out[0], kPeerIdPrefix));
  EXPECT_NE(forced.out[0], first);
  show = Run({"identity", "show", file});
  ASSERT_EQ(show.out.size(), 1u) << show.Describe();
  EXPECT_EQ(show.out[0], forced.out[0]);

  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(CliTest, IdentityShowMissingFileFails) {
  const std::string file = dir_.File("does-not-exist.key");
  RunResult r = Run({"identity", "show", file});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_TRUE(r.out.empty()) << r.Describe();
  ExpectOneErrorLine(r.err, {file});
}

TEST_F(CliTest, IdentityShowGarbageFileFails) {
  const std::string file = dir_.File("garbage.key");
  WriteFile(file, "this is not an identity file\n\x01\x02\x03 junk\n");
  ::chmod(file.c_str(), 0600);
  RunResult r = Run({"identity", "show", file});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_TRUE(r.out.empty()) << r.Describe();
  ExpectOneErrorLine(r.err, {file});

  // Well-formed lines, but no key.
  WriteFile(file, "# comment\npeer_id: 12D3KooWabc\n");
  r = Run({"identity", "show", file});
  EXPECT_EQ(r.code, 1) << r.Describe();
  ExpectOneErrorLine(r.err, {file, "ed25519_seed"});
}

// --- listen and ping -------------------------------------------------------------------------

TEST_F(CliTest, ListenPrintsAddressAndAnswersPing) {
  auto start = steady_clock::now();
  auto l = StartListener();
  ASSERT_TRUE(l.has_value());
  EXPECT_LT(steady_clock::now() - start, test::HangGuard(seconds(5)))
      << "listen took too long to print its address";
  EXPECT_TRUE(StartsWith(l->addr, "/ip4/127.0.0.1/tcp/")) << l->addr;
  EXPECT_TRUE(Contains(l->addr, std::string("/p2p/") + kPeerIdPrefix)) << l->addr;
  ASSERT_TRUE(StartsWith(l->peer_id, kPeerIdPrefix)) << l->addr;

  RunResult r = Run({"ping", l->addr});
  ASSERT_EQ(r.code, 0) << r.Describe();
  ASSERT_EQ(r.out.size(), 3u) << r.Describe();
  EXPECT_EQ(r.out[0], "peer " + l->peer_id);
  EXPECT_TRUE(StartsWith(r.out[1], "protocol 1.0")) << r.out[1];
  EXPECT_TRUE(std::regex_match(r.out[2], std::regex(R"(rtt \d+\.\d+ ms)"))) << r.out[2];
  EXPECT_EQ(r.err, "");

  ExpectCleanStop(*l, SIGTERM);
}

TEST_F(CliTest, PingCountPrintsOneRttLinePerPing) {
  auto l = StartListener();
  ASSERT_TRUE(l.has_value());
  RunResult r = Run({"ping", "-c", "3", l->addr});
  ASSERT_EQ(r.code, 0) << r.Describe();
  int rtt_lines = 0;
  for (const auto& line : r.out) {
    rtt_lines += std::regex_match(line, std::regex(R"(rtt \d+\.\d+ ms)"));
  }
  EXPECT_EQ(rtt_lines, 3) << r.Describe();
  ASSERT_FALSE(r.out.empty());
  EXPECT_EQ(r.out[0], "peer " + l->peer_id);
  ExpectCleanStop(*l, SIGTERM);
}

TEST_F(CliTest, ListenExitsCleanlyOnSigterm) {
  auto l = StartListener();
  ASSERT_TRUE(l.has_value());
  ExpectCleanStop(*l, SIGTERM);
  EXPECT_TRUE(Contains(ReadFile(l->stderr_path), "SIGTERM")) << ReadFile(l->stderr_path);
}

TEST_F(CliTest, ListenExitsCleanlyOnSigint) {
  auto l = StartListener();
  ASSERT_TRUE(l.has_value());
  ExpectCleanStop(*l, SIGINT);
  EXPECT_TRUE(Contains(ReadFile(l->stderr_path), "SIGINT")) << ReadFile(l->stderr_path);
}

TEST_F(CliTest, ListenUsesIdentityFile) {
  const std::string file = dir_.File("listener.key");
  const std::string id = NewIdentity(file);
  ASSERT_TRUE(StartsWith(id, kPeerIdPrefix)) << id;
  auto l = StartListener({"--identity", file});
  ASSERT_TRUE(l.has_value());
  EXPECT_TRUE(EndsWith(l->addr, "/p2p/" + id)) << l->addr;
  RunResult r = Run({"ping", l->addr});
  ASSERT_EQ(r.code, 0) << r.Describe();
  ASSERT_FALSE(r.out.empty());
  EXPECT_EQ(r.out[0], "peer " + id);
  ExpectCleanStop(*l, SIGTERM);
}

TEST_F(CliTest, ListenWithMissingIdentityFileFails) {
  const std::string file = dir_.File("missing.key");
  RunResult r = Run({"listen", "--listen", "/ip4/127.0.0.1/tcp/0", "--identity", file});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_TRUE(r.out.empty()) << r.Describe();
  ExpectOneErrorLine(r.err, {file});
}

// Every command that joins a swarm runs as the --identity it is given (a token file names it):
// a missing file is an error that names it, before anything connects.
TEST_F(CliTest, SwarmCommandsWithAMissingIdentityFileFailNamingIt) {
  const std::string file = dir_.File("missing.key");
  const std::vector<std::vector<std::string>> commands = {
      {"servers", "--model-name", "m", "--num-blocks", "2", "--initial-peers",
       "/ip4/127.0.0.1/tcp/1"},
      {"monitor", "--initial-peers", "/ip4/127.0.0.1/tcp/1", "--http", "127.0.0.1:0"},
      {"dht", "get", "k", "--initial-peers", "/ip4/127.0.0.1/tcp/1"},
  };
  for (auto args : commands) {
    SCOPED_TRACE(args[0]);
    args.insert(args.end(), {"--identity", file});
    RunResult r = Run(args);
    EXPECT_EQ(r.code, 1) << r.Describe();
    ExpectOneErrorLine(r.err, {file});
  }
}

TEST_F(CliTest, PingWrongPeerIdFails) {
  auto l = StartListener();
  ASSERT_TRUE(l.has_value());
  const std::string other = NewIdentity(dir_.File("other.key"));
  ASSERT_TRUE(StartsWith(other, kPeerIdPrefix)) << other;
  ASSERT_NE(other, l->peer_id);
  std::string addr = l->addr.substr(0, l->addr.size() - l->peer_id.size()) + other;

  RunResult r = Run({"ping", addr});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_TRUE(r.out.empty()) << r.Describe();
  ExpectOneErrorLine(r.err, {l->peer_id, other});
  ExpectCleanStop(*l, SIGTERM);
}

TEST_F(CliTest, PingClosedPortFails) {
  int port = ClosedPort();
  ASSERT_GT(port, 0);
  RunResult r = Run({"ping", "/ip4/127.0.0.1/tcp/" + std::to_string(port)});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_TRUE(r.out.empty()) << r.Describe();
  ExpectOneErrorLine(r.err, {"refused"});
}

TEST_F(CliTest, PingNonColonyServerFails) {
  FakeHttpServer server;
  ASSERT_GT(server.port(), 0);
  RunResult r = Run({"ping", "/ip4/127.0.0.1/tcp/" + std::to_string(server.port())});
  EXPECT_EQ(r.code, 1) << r.Describe();
  EXPECT_TRUE(r.out.empty()) << r.Describe();
  ExpectOneErrorLine(r.err, {"does not speak the Colony protocol"});
}

TEST_F(CliTest, PingJunkAddressFails) {
  struct Case {
    std::string addr;
    std::string bad_part;  // the message must name what is wrong
  };
  const std::vector<Case> cases = {
      {"/ip4/999.1.1.1/tcp/1", "'999.1.1.1' is not an IPv4 address"},
      {"/ip4/127.0.0.1/tcp/70000", "70000"},
      {"/ip4/127.0.0.1/tcp/http", "'http'"},
      {"/ip4/127.0.0.1/udp/1", "/udp"},
      {"/ip4/127.0.0.1", "/tcp/<port>"},
      {"/ip9/1.2.3.4/tcp/1", "/ip9"},
      {"127.0.0.1:4001", "must start with '/'"},
      {"/ip4/127.0.0.1/tcp/1/p2p/notapeerid", "notapeerid"},
      {"/ip4/127.0.0.1/tcp/1/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", "Qm"},
      {"/ip4/127.0.0.1/tcp/1/extra", "/extra"},
      {"/dns4/bad..name/tcp/1", "bad..name"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.addr);
    RunResult r = Run({"ping", c.addr});
    EXPECT_EQ(r.code, 2) << r.Describe();  // checked as the command line is parsed
    EXPECT_TRUE(r.out.empty()) << r.Describe();
    ExpectOneErrorLine(r.err, {c.bad_part});
  }
}

// Every address option is checked as a multiaddr when the command line is parsed: the error
// names the option and what is wrong, before anything starts (exit code 2: a usage error).
TEST_F(CliTest, EveryAddressOptionRejectsWhatIsNotAMultiaddr) {
  struct Case {
    std::vector<std::string> args;
    std::string option;
  };
  const std::vector<Case> cases = {
      {{"dht", "get", "k", "--initial-peers", "127.0.0.1:4001"}, "--initial-peers"},
      {{"dht", "--listen", "/ip4/127.0.0.1/udp/1"}, "--listen"},
      {{"dht", "--relay", "127.0.0.1:4001"}, "--relay"},
      {{"dht", "--relay-listen", "/ip9/1.2.3.4/tcp/1"}, "--relay-listen"},
      {{"listen", "--initial-peers", "127.0.0.1:4001"}, "--initial-peers"},
      {{"listen", "--bootstrap", "127.0.0.1:4001"}, "--initial-peers"},
      {{"average", "--initial-peers", "127.0.0.1:4001", "--values", "1"}, "--initial-peers"},
      {{"servers", "--initial-peers", "/ip4/1.2.3.4/tcp/http"}, "--initial-peers"},
      {{"train", "--initial-peers", "127.0.0.1:4001"}, "--initial-peers"},
      {{"serve", "--model", "m", "--listen", "127.0.0.1:4001"}, "--listen"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args[0] + " " + c.option);
    RunResult r = Run(c.args);
    EXPECT_EQ(r.code, 2) << r.Describe();
    EXPECT_TRUE(r.out.empty()) << r.Describe();
    ExpectOneErrorLine(r.err, {c.option});
  }
}

TEST_F(CliTest, ListenWithBootstrapFindsBootstrapPeer) {
  auto boot = StartListener();
  ASSERT_TRUE(boot.has_value());
  auto peer = StartListener({"--bootstrap", boot->addr});
  ASSERT_TRUE(peer.has_value());
  EXPECT_NE(peer->peer_id, boot->peer_id);
  auto found = peer->proc.ReadLine(seconds(10));
  ASSERT_TRUE(found.ok()) << found.status().ToString() << "\nstderr:\n"
                          << ReadFile(peer->stderr_path);
  EXPECT_TRUE(StartsWith(*found, "found " + boot->peer_id + ": rtt ")) << *found;
  ExpectCleanStop(*peer, SIGTERM);
  ExpectCleanStop(*boot, SIGTERM);
}

// --- demo ------------------------------------------------------------------------------------

// The quick demo end to end: discovery, echo, exact averaging, then 3 training processes that
// must lower the held-out loss of the language model by 0.5 nats in 20 global steps (the demo
// checks it), a loss curve PNG and a saved model. The run takes about 40 s here; its deadline
// only guards against a hang.
TEST_F(CliTest, QuickDemoWithThreePeersTrainsTheLanguageModel) {
  const std::string out = dir_.File("demo");
  RunResult r = Run({"demo", "--quick", "--peers", "3", "--train-steps", "20", "--out-dir", out,
                     "--cache-dir", dir_.File("cache")},
                    seconds(1200));
  ASSERT_EQ(r.code, 0) << r.Describe();
  bool finished = false, trained = false;
  for (const auto& line : r.out) {
    finished |= Contains(line, "Demo finished successfully");
    trained |= Contains(line, "LM trained by 3 peers");
  }
  EXPECT_TRUE(finished && trained) << r.Describe();
  EXPECT_TRUE(std::filesystem::exists(out + "/loss.png"));
  EXPECT_TRUE(std::filesystem::exists(out + "/model/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(out + "/model/tokenizer.model"));
}

}  // namespace
}  // namespace colony
