// All-reduce benchmark: N peer processes on loopback (default N = 2, 4, 8) average 64 MiB of
// float32 each, through
//   (a) Colony: one bootstrap DHT process (`colony dht`) and N `colony average` processes, which
//       meet over the DHT (matchmaking) and run the butterfly all-reduce over encrypted
//       connections, uncompressed (--codec none) and with 8-bit blockwise quantization
//       (--codec blockwise8). The time is what the peers report for the all-reduce itself
//       (allreduce_s, matchmaking excluded): the slowest peer per round, median over rounds;
//   (b) OpenMPI: MPI_Allreduce(MPI_SUM) under mpirun, forced onto TCP over loopback (pml ob1,
//       btl tcp,self; no shared memory), bench/mpi_allreduce.cpp;
//   (c) Gloo: gloo::allreduce (ring) over Gloo's TCP transport on loopback,
//       bench/gloo_allreduce.cpp, ranks spawned by this program, rendezvous through a file store.
// Every system gets one warm-up round and then --rounds timed rounds; each reports the slowest
// peer's time per round, and the median is taken over rounds.
//
// Fault scenario (skip with --no-fault): at N=4, one Colony peer is SIGKILLed in the middle of
// the all-reduce (at start + the normal first round's matchmaking time + half its all-reduce
// time); reports whether the 3 survivors completed the round and how long it took them. The
// deadline for a silent peer is `colony average --part-timeout` (--fault-part-timeout); a killed
// peer's connections close, so the survivors usually exclude it well before that.
//
// Colony and the references all run on the same 2 cores here, so compare ratios.
// The last lines are RESULT key=value pairs (see scripts/bench).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "average_check.h"
#include "bench_support.h"
#include "core/subprocess.h"

using namespace colony;
namespace fs = std::filesystem;
using Steady = std::chrono::steady_clock;

namespace {

using colony::bench::ColonyBinary;
using colony::bench::Fixed;
using colony::bench::Median;
using colony::bench::Millis;
using colony::bench::ReadUntil;
using colony::bench::Tail;
using colony::bench::WallNow;

std::string BinDir() { return fs::path(SelfExecutable()).parent_path().string(); }

// execv does not search PATH: find `name` in it.
std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream in(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(in, dir, ':');) {
    if (dir.empty()) continue;
    fs::path p = fs::path(dir) / name;
    if (::access(p.c_str(), X_OK) == 0) return p.string();
  }
  return {};
}

// A measurement: the median over timed rounds of the slowest peer's time, or an error.
struct Measure {
  bool ok = false;
  double seconds = 0;
  std::vector<double> rounds;
  std::string error;
  std::string note;  // extra information printed with the table
};

constexpr char kSkipped[] = "skipped";

Measure Fail(std::string error) {
  Measure m;
  m.error = std::move(error);
  return m;
}

// Stops a child that may have its own children (mpirun): SIGTERM first, then SIGKILL.
void Stop(Subprocess& p) {
  if (!p.running()) return;
  p.Signal(SIGTERM);
  if (!p.Wait(std::chrono::seconds(5)).ok()) {
    p.Signal(SIGKILL);
    (void)p.Wait(std::chrono::seconds(5));
  }
}

struct Config {
  size_t values = 0;
  int rounds = 3;   // timed rounds, after one warm-up
  std::string dir;  // scratch: logs, Gloo's file store
  std::string mpirun;
  // Colony
  std::string bootstrap;
  double matchmaking_time = 3;
  double timeout = 60;
  double startup = 0;  // 0: automatic
  int run_id = 0;
  bool wrong_results = false;  // a Colony round reported success but its values were wrong
};

// ---------------------------------------------------------------------------------------------
// OpenMPI

Measure RunMpi(Config& c, int n) {
  const std::string program = (fs::path(BinDir()) / "bench_mpi_allreduce").string();
  if (c.mpirun.empty()) return Fail("mpirun not found in PATH (openmpi-bin)");
  const std::string err = c.dir + "/mpi-" + std::to_string(n) + ".err";
  // pml ob1 + btl tcp,self: TCP over loopback for every byte (no shared memory, no UCX).
  auto p = Subprocess::Spawn({c.mpirun,
                              "--allow-run-as-root",
                              "--oversubscribe",
                              "--bind-to",
                              "none",
                              "--mca",
                              "pml",
                              "ob1",
                              "--mca",
                              "btl",
                              "tcp,self",
                              "--mca",
                              "btl_tcp_if_include",
                              "lo",
                              "--mca",
                              "oob_tcp_if_include",
                              "lo",
                              "-np",
                              std::to_string(n),
                              program,
                              std::to_string(c.values),
                              std::to_string(c.rounds)},
                             err);
  if (!p.ok()) return Fail(p.status().ToString());
  Measure m;
  bool checked = false;
  const auto deadline = Steady::now() + std::chrono::seconds(60 + 20 * c.rounds * n);
  Status st = ReadUntil(*p, deadline, [&](const std::string& line) {
    std::istringstream in(line);
    std::string tag;
    in >> tag;
    if (tag == "MPI_ROUND") {
      int r = 0;
      double s = 0;
      if (in >> r >> s) m.rounds.push_back(s);
    } else if (tag == "MPI_OK") {
      checked = true;
      return true;
    } else if (tag == "MPI_BAD") {
      m.error = "wrong sums: " + line;
      return true;
    }
    return false;
  });
  if (!st.ok()) {
    Stop(*p);
    return Fail("mpirun: " + st.ToString() + Tail(err));
  }
  auto code = p->Wait(std::chrono::seconds(20));
  if (!code.ok()) Stop(*p);
  if (!m.error.empty()) return m;
  if (!checked || static_cast<int>(m.rounds.size()) != c.rounds) {
    return Fail("mpirun printed no complete result" + Tail(err));
  }
  if (!code.ok() || *code != 0) {
    m.note = "mpirun exited with " + (code.ok() ? std::to_string(*code) : code.status().ToString());
  }
  m.ok = true;
  m.seconds = Median(m.rounds);
  return m;
}

// ---------------------------------------------------------------------------------------------
// Gloo

Measure RunGloo(Config& c, int n) {
  const std::string program = (fs::path(BinDir()) / "bench_gloo_allreduce").string();
  const std::string store =
      c.dir + "/gloo-store-" + std::to_string(n) + "-" + std::to_string(++c.run_id);
  std::error_code ec;
  fs::create_directories(store, ec);
  if (ec) return Fail("cannot create " + store + ": " + ec.message());
  std::vector<Subprocess> ranks;
  std::vector<std::string> errs;
  for (int r = 0; r < n; ++r) {
    errs.push_back(c.dir + "/gloo-" + std::to_string(n) + "-" + std::to_string(r) + ".err");
    auto p = Subprocess::Spawn({program, std::to_string(r), std::to_string(n),
                                std::to_string(c.values), std::to_string(c.rounds), store},
                               errs.back());
    if (!p.ok()) return Fail(p.status().ToString());
    ranks.push_back(std::move(*p));
  }
  Measure m;
  bool checked = false;
  const auto deadline = Steady::now() + std::chrono::seconds(60 + 20 * c.rounds * n);
  Status st = ReadUntil(ranks[0], deadline, [&](const std::string& line) {
    std::istringstream in(line);
    std::string tag;
    in >> tag;
    if (tag == "GLOO_ROUND") {
      int r = 0;
      double s = 0;
      if (in >> r >> s) m.rounds.push_back(s);
    } else if (tag == "GLOO_OK") {
      checked = true;
      return true;
    } else if (tag == "GLOO_BAD") {
      m.error = "wrong sums: " + line;
      return true;
    }
    return false;
  });
  if (!st.ok()) {
    std::string why = "rank 0: " + st.ToString();
    for (int r = 0; r < n; ++r) {
      if (!ranks[static_cast<size_t>(r)].running()) why += Tail(errs[static_cast<size_t>(r)], 3);
    }
    return Fail(why);
  }
  for (auto& p : ranks) {
    if (!p.Wait(std::chrono::seconds(20)).ok()) p.Signal(SIGKILL);
  }
  if (!m.error.empty()) return m;
  if (!checked || static_cast<int>(m.rounds.size()) != c.rounds) {
    return Fail("rank 0 printed no complete result" + Tail(errs[0]));
  }
  m.ok = true;
  m.seconds = Median(m.rounds);
  return m;
}

// ---------------------------------------------------------------------------------------------
// Colony

struct Round {
  bool ok = false;
  int group_size = 0;
  std::vector<colony::bench::AveragedPart>
      parts;  // as the peer reported them: whose data each part of its result holds
  double matchmaking_s = 0, allreduce_s = -1;
  double bytes_sent = 0, bytes_received = 0;
  double at = 0;  // wall-clock time the line was read
  std::string error;
};

struct Peer {
  bool ready = false, done = false;
  double ready_at = 0;
  std::map<int, Round> rounds;
  std::string problem;  // how its output ended, if not with "done"
  std::string stderr_path;
  std::string output_path;  // the averaged values after its last round (raw float32)
  std::optional<int> exit_code;
};

struct ColonyRun {
  std::string error;  // the run as a whole failed (nothing to measure)
  double start_at = 0;
  std::vector<Peer> peers;
  std::string victim_note;
};

void ParseLine(Peer& peer, const std::string& line) {
  auto j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return;  // not a JSON event
  try {
    const std::string event = j.value("event", "");
    if (event == "ready") {
      peer.ready = true;
      peer.ready_at = WallNow();
    } else if (event == "round") {
      Round r;
      r.at = WallNow();
      r.ok = j.value("ok", false);
      r.group_size = j.value("group_size", 0);
      r.matchmaking_s = j.value("matchmaking_s", 0.0);
      r.allreduce_s = j.value("allreduce_s", -1.0);
      r.bytes_sent = j.value("bytes_sent", 0.0);
      r.bytes_received = j.value("bytes_received", 0.0);
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

// Whether `colony average` exists with the options this benchmark uses; the reason if not.
std::string ColonyUnavailable() {
  const std::string bin = ColonyBinary();
  if (::access(bin.c_str(), X_OK) != 0) return bin + " not found (build the colony target)";
  auto p = Subprocess::Spawn({bin, "average", "--help"}, "/dev/null");
  if (!p.ok()) return p.status().ToString();
  std::string help;
  (void)ReadUntil(*p, Steady::now() + std::chrono::seconds(10), [&](const std::string& line) {
    help += line + "\n";
    return false;
  });
  auto code = p->Wait(std::chrono::seconds(5));
  for (const char* option : {"--start-at", "--target-group-size", "--codec", "--rounds"}) {
    if (help.find(option) == std::string::npos) {
      return "'colony average --help' does not list " + std::string(option) +
             " (the command is not built yet?)";
    }
  }
  if (!code.ok() || *code != 0) return "'colony average --help' failed";
  return {};
}

// Runs n `colony average` peers for `rounds` rounds. With `kill_after` set, peer n-1 is
// SIGKILLed that many seconds after the common start time. `extra`: more options for every peer.
ColonyRun RunColony(Config& c, int n, const std::string& codec, int rounds, double timeout,
                    std::optional<double> kill_after = std::nullopt,
                    const std::vector<std::string>& extra = {}) {
  ColonyRun run;
  const int id = ++c.run_id;
  const std::string prefix = "bench-allreduce-" + std::to_string(::getpid()) + "-" +
                             std::to_string(id) + "-n" + std::to_string(n) + "-" + codec;
  const double startup = c.startup > 0 ? c.startup : 3 + 0.5 * n;
  run.start_at = WallNow() + startup;
  char start_at[64];
  std::snprintf(start_at, sizeof(start_at), "%.3f", run.start_at);
  std::vector<Subprocess> procs;
  run.peers.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    Peer& peer = run.peers[static_cast<size_t>(i)];
    peer.stderr_path = c.dir + "/colony-" + std::to_string(id) + "-" + std::to_string(i) + ".err";
    peer.output_path = c.dir + "/colony-" + std::to_string(id) + "-" + std::to_string(i) + ".bin";
    std::vector<std::string> args{ColonyBinary(),
                                  "--log-level",
                                  "warn",
                                  "average",
                                  "--initial-peers",
                                  c.bootstrap,
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
                                  Fixed(timeout),
                                  "--rounds",
                                  std::to_string(rounds),
                                  "--codec",
                                  codec,
                                  "--start-at",
                                  start_at,
                                  "--output-last-round-only",
                                  "--output",
                                  peer.output_path};
    args.insert(args.end(), extra.begin(), extra.end());
    auto p = Subprocess::Spawn(args, peer.stderr_path);
    if (!p.ok()) {
      run.error = p.status().ToString();
      return run;
    }
    procs.push_back(std::move(*p));
  }
  // One reader per peer, so every line is timestamped when it is printed.
  const auto deadline =
      Steady::now() + Millis(startup + rounds * (c.matchmaking_time + timeout + 10) + 30);
  std::vector<std::thread> readers;
  for (size_t i = 0; i < procs.size(); ++i) {
    readers.emplace_back([&, i] {
      Peer& peer = run.peers[i];
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
  if (kill_after) {
    const double when = run.start_at + *kill_after;
    std::this_thread::sleep_for(Millis(when - WallNow()));
    Subprocess& victim = procs.back();
    if (victim.running()) {
      victim.Signal(SIGKILL);
      run.victim_note = "peer " + std::to_string(n - 1) + " SIGKILLed " +
                        Fixed(WallNow() - run.start_at, 2) + " s after the start time";
    } else {
      run.victim_note = "peer " + std::to_string(n - 1) + " had already exited";
    }
  }
  for (auto& t : readers) t.join();
  for (size_t i = 0; i < procs.size(); ++i) {
    auto code = procs[i].Wait(std::chrono::seconds(10));
    if (code.ok()) run.peers[i].exit_code = *code;
  }
  return run;  // the destructors kill whatever still runs
}

// Everything a peer reported that went wrong, for error messages.
std::string Problems(const ColonyRun& run, size_t skip_peer = SIZE_MAX) {
  std::string out;
  for (size_t i = 0; i < run.peers.size(); ++i) {
    if (i == skip_peer) continue;
    const Peer& p = run.peers[i];
    std::string what;
    if (!p.ready) what += " never printed \"ready\";";
    if (p.ready && p.ready_at > run.start_at) {
      what += " ready " + Fixed(p.ready_at - run.start_at, 2) + " s after the start time;";
    }
    for (const auto& [r, round] : p.rounds) {
      if (!round.ok) what += " round " + std::to_string(r) + " failed: " + round.error + ";";
    }
    if (!p.problem.empty()) what += " " + p.problem + ";";
    if (p.exit_code && *p.exit_code != 0) what += " exit code " + std::to_string(*p.exit_code);
    if (!what.empty())
      out += "\n    peer " + std::to_string(i) + ":" + what + Tail(p.stderr_path, 4);
  }
  return out;
}

struct ColonyMeasure {
  Measure m;
  double first_matchmaking_s = 0;  // round 0 (warm-up), median over peers
  double first_allreduce_s = 0;    // round 0, slowest peer
  double sent_mib = 0;             // per peer per timed round, median
  double matchmaking_s = 0;        // timed rounds, median over peers and rounds
};

ColonyMeasure MeasureColony(Config& c, int n, const std::string& codec) {
  ColonyMeasure out;
  ColonyRun run = RunColony(c, n, codec, c.rounds + 1, c.timeout);
  if (!run.error.empty()) {
    out.m = Fail(run.error);
    return out;
  }
  std::vector<double> mm0, mm, sent;
  std::string failures;
  for (int r = 0; r <= c.rounds; ++r) {
    double slowest = 0;
    bool all_ok = true;
    for (size_t i = 0; i < run.peers.size(); ++i) {
      auto it = run.peers[i].rounds.find(r);
      if (it == run.peers[i].rounds.end() || !it->second.ok || it->second.allreduce_s < 0) {
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
      if (r == 0) mm0.push_back(round.matchmaking_s);
      if (r > 0) {
        sent.push_back(round.bytes_sent);
        mm.push_back(round.matchmaking_s);
      }
    }
    if (r == 0) {
      if (all_ok) out.first_allreduce_s = slowest;
    } else if (all_ok) {
      out.m.rounds.push_back(slowest);
    }
  }
  out.first_matchmaking_s = Median(mm0);
  out.sent_mib = Median(sent) / (1 << 20);
  out.matchmaking_s = Median(mm);
  if (out.m.rounds.empty()) {
    out.m.error = "no round completed on every peer:" + failures + Problems(run);
    return out;
  }
  std::string summary;
  if (std::string wrong = colony::bench::CheckColonyMeans(c.values, n, codec, run.peers, summary);
      !wrong.empty()) {
    c.wrong_results = true;
    out.m = Fail("wrong result: " + wrong);
    return out;
  }
  std::printf("  N=%d Colony (%s): %s\n", n, codec.c_str(), summary.c_str());
  std::fflush(stdout);
  out.m.ok = true;
  out.m.seconds = Median(out.m.rounds);
  if (static_cast<int>(out.m.rounds.size()) < c.rounds || !failures.empty()) {
    out.m.note = std::to_string(out.m.rounds.size()) + " of " + std::to_string(c.rounds) +
                 " timed rounds completed on every peer:" + failures + Problems(run);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------

double BusBandwidth(double bytes, int n, double seconds) {
  return seconds > 0 ? bytes * 2 * (n - 1) / n / seconds / 1e9 : 0;
}

std::string Ratio(const Measure& a, const Measure& b) {
  if (!a.ok || !b.ok || b.seconds <= 0) return "n/a";
  return Fixed(a.seconds / b.seconds, 2);
}

struct Row {
  Measure colony, colony8, mpi, gloo;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "All-reduce of float32 buffers across N peer processes on loopback: Colony (uncompressed "
      "and 8-bit) vs OpenMPI over TCP and Gloo, and a peer killed mid-round");
  std::vector<int> peers_list{2, 4, 8};
  double mib = 64;
  Config c;
  bool no_fault = false, no_colony = false, no_mpi = false, no_gloo = false, keep_logs = false;
  double fault_part_timeout = 0;
  app.add_option("--peers-list", peers_list, "numbers of peers to run (e.g. 2,4,8)")
      ->delimiter(',')
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  app.add_option("--mib", mib, "MiB of float32 per peer")
      ->check(CLI::Range(0.001, 4096.0))
      ->capture_default_str();
  app.add_option("--rounds", c.rounds, "timed rounds per system (after one warm-up round)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--matchmaking-time", c.matchmaking_time, "colony average --matchmaking-time")
      ->capture_default_str();
  app.add_option("--timeout", c.timeout, "colony average --timeout (normal rounds), seconds")
      ->capture_default_str();
  app.add_option("--fault-part-timeout", fault_part_timeout,
                 "colony average --part-timeout in the fault scenario: seconds without progress "
                 "before a peer is excluded (default: max(2 s, 3x the normal first round))");
  app.add_option("--startup", c.startup,
                 "seconds from spawning the Colony peers to their common start time (default: "
                 "3 + 0.5 per peer)");
  app.add_flag("--no-fault", no_fault, "skip the killed-peer scenario");
  app.add_flag("--no-colony", no_colony, "skip Colony (references only)");
  app.add_flag("--no-mpi", no_mpi, "skip OpenMPI");
  app.add_flag("--no-gloo", no_gloo, "skip Gloo");
  app.add_flag("--keep-logs", keep_logs, "keep the children's stderr logs (path printed)");
  CLI11_PARSE(app, argc, argv);
  std::sort(peers_list.begin(), peers_list.end());
  peers_list.erase(std::unique(peers_list.begin(), peers_list.end()), peers_list.end());
  c.values = std::max<size_t>(1, static_cast<size_t>(mib * (1 << 20) / sizeof(float)));
  const double bytes = static_cast<double>(c.values) * sizeof(float);
  c.mpirun = FindInPath("mpirun");

  colony::test::TempDir tmp("bench-allreduce");
  c.dir = tmp.path().string();
  if (keep_logs) {
    tmp.keep();
    std::printf("logs are kept in %s\n", c.dir.c_str());
  }

  std::printf(
      "all-reduce of %.1f MiB float32 per peer (%zu values), peers %s; median of %d "
      "timed rounds after 1 warm-up; loopback, %u cores\n",
      bytes / (1 << 20), c.values,
      [&] {
        std::string s;
        for (int n : peers_list) s += (s.empty() ? "" : ",") + std::to_string(n);
        return s;
      }()
          .c_str(),
      c.rounds, std::thread::hardware_concurrency());
  std::fflush(stdout);

  // Colony: is `colony average` there? Then one bootstrap DHT node for all runs.
  std::string colony_skip;
  std::optional<Subprocess> bootstrap;
  if (no_colony) {
    colony_skip = "skipped (--no-colony)";
  } else {
    colony_skip = ColonyUnavailable();
  }
  if (colony_skip.empty()) {
    const std::string err = c.dir + "/bootstrap.err";
    auto p = Subprocess::Spawn(
        {ColonyBinary(), "--log-level", "warn", "dht", "--listen", "/ip4/127.0.0.1/tcp/0"}, err);
    if (!p.ok()) {
      colony_skip = "cannot start the bootstrap DHT node: " + p.status().ToString();
    } else {
      auto line = p->ReadLine(std::chrono::seconds(20));
      if (!line.ok() || line->empty()) {
        colony_skip = "the bootstrap DHT node printed no address: " +
                      (line.ok() ? std::string("empty line") : line.status().ToString()) +
                      Tail(err);
      } else {
        c.bootstrap = *line;
        bootstrap = std::move(*p);
      }
    }
  }
  if (!colony_skip.empty()) {
    std::printf("Colony: not measured: %s\n", colony_skip.c_str());
  } else {
    std::printf("Colony: bootstrap DHT node at %s\n", c.bootstrap.c_str());
  }
  std::fflush(stdout);

  std::map<int, Row> rows;
  std::map<int, ColonyMeasure> colony_first;  // per n, the uncompressed run
  auto show = [](const char* name, int n, const Measure& m) {
    if (m.ok) {
      std::string per_round;
      for (double s : m.rounds) per_round += " " + Fixed(s);
      std::printf("  N=%d %-20s %.3f s (rounds:%s)\n", n, name, m.seconds, per_round.c_str());
    } else if (m.error == kSkipped) {
      std::printf("  N=%d %-20s skipped\n", n, name);
    } else {
      std::printf("  N=%d %-20s FAILED: %s\n", n, name, m.error.c_str());
    }
    if (!m.note.empty()) std::printf("      note: %s\n", m.note.c_str());
    std::fflush(stdout);
  };
  const Measure skipped = Fail(kSkipped);
  for (int n : peers_list) {
    Row& row = rows[n];
    row.mpi = no_mpi ? skipped : RunMpi(c, n);
    show("OpenMPI (TCP)", n, row.mpi);
    row.gloo = no_gloo ? skipped : RunGloo(c, n);
    show("Gloo (TCP, ring)", n, row.gloo);
    if (colony_skip.empty()) {
      ColonyMeasure plain = MeasureColony(c, n, "none");
      row.colony = plain.m;
      colony_first[n] = plain;
      show("Colony (none)", n, row.colony);
      if (plain.m.ok) {
        std::printf("      sent per peer per round: %.1f MiB; matchmaking %.3f s\n", plain.sent_mib,
                    plain.matchmaking_s);
      }
      ColonyMeasure q8 = MeasureColony(c, n, "blockwise8");
      row.colony8 = q8.m;
      show("Colony (blockwise8)", n, row.colony8);
      if (q8.m.ok) {
        std::printf("      sent per peer per round: %.1f MiB; matchmaking %.3f s\n", q8.sent_mib,
                    q8.matchmaking_s);
      }
    } else {
      row.colony = row.colony8 = Fail(colony_skip);
    }
  }

  // Tables.
  for (const auto& [n, row] : rows) {
    std::printf("\nN=%d peers, %.1f MiB float32 each (busbw = bytes * 2(N-1)/N / time)\n", n,
                bytes / (1 << 20));
    std::printf("  %-22s %10s %14s %14s\n", "system", "time (s)", "algbw (GB/s)", "busbw (GB/s)");
    auto line = [&](const char* name, const Measure& m) {
      if (m.ok) {
        std::printf("  %-22s %10.3f %14.3f %14.3f\n", name, m.seconds, bytes / m.seconds / 1e9,
                    BusBandwidth(bytes, n, m.seconds));
      } else {
        std::printf("  %-22s %10s\n", name, "n/a");
      }
    };
    line("Colony (uncompressed)", row.colony);
    line("Colony (blockwise8)", row.colony8);
    line("OpenMPI (TCP, ob1)", row.mpi);
    line("Gloo (TCP, ring)", row.gloo);
  }
  std::printf("\nratios (time / reference time; lower is better for Colony)\n");
  std::printf("  %4s %14s %14s %14s %14s %12s\n", "N", "colony/mpi", "colony8/mpi", "colony/gloo",
              "colony8/gloo", "gloo/mpi");
  for (const auto& [n, row] : rows) {
    std::printf("  %4d %14s %14s %14s %14s %12s\n", n, Ratio(row.colony, row.mpi).c_str(),
                Ratio(row.colony8, row.mpi).c_str(), Ratio(row.colony, row.gloo).c_str(),
                Ratio(row.colony8, row.gloo).c_str(), Ratio(row.gloo, row.mpi).c_str());
  }
  std::fflush(stdout);

  // Fault scenario: N=4, one peer SIGKILLed halfway through the all-reduce.
  constexpr int kFaultPeers = 4;
  std::optional<double> kill_round_s, fault_deadline;
  int survivors_ok = -1;
  if (no_fault) {
    std::printf("\nfault scenario: skipped (--no-fault)\n");
  } else if (!colony_skip.empty()) {
    std::printf("\nfault scenario: not run (Colony not measured)\n");
  } else {
    ColonyMeasure normal;
    if (colony_first.count(kFaultPeers) != 0) normal = colony_first[kFaultPeers];
    if (!normal.m.ok) {
      std::printf("\nfault scenario: measuring a normal N=%d round first\n", kFaultPeers);
      normal = MeasureColony(c, kFaultPeers, "none");
    }
    if (!normal.m.ok || normal.first_allreduce_s <= 0) {
      std::printf("\nfault scenario: not run (no normal N=%d round to time the kill)\n",
                  kFaultPeers);
    } else {
      const double deadline =
          fault_part_timeout > 0 ? fault_part_timeout : std::max(2.0, 3 * normal.first_allreduce_s);
      fault_deadline = deadline;
      // The run has a single round, a first one like the normal run's warm-up round 0: kill
      // when that round's all-reduce would be half done.
      const double kill_after = normal.first_matchmaking_s + normal.first_allreduce_s / 2;
      std::printf(
          "\nfault scenario: N=%d, uncompressed, --part-timeout %.1f s; normal first round: "
          "matchmaking %.3f s, all-reduce %.3f s (timed rounds: %.3f s); killing peer %d "
          "%.3f s after the start time\n",
          kFaultPeers, deadline, normal.first_matchmaking_s, normal.first_allreduce_s,
          normal.m.seconds, kFaultPeers - 1, kill_after);
      std::fflush(stdout);
      ColonyRun run = RunColony(c, kFaultPeers, "none", 1, c.timeout, kill_after,
                                {"--part-timeout", Fixed(deadline)});
      if (!run.error.empty()) {
        std::printf("  FAILED: %s\n", run.error.c_str());
      } else {
        std::printf("  %s\n", run.victim_note.c_str());
        survivors_ok = 0;
        double slowest = 0, last_report = 0;
        for (int i = 0; i + 1 < kFaultPeers; ++i) {
          const Peer& p = run.peers[static_cast<size_t>(i)];
          auto it = p.rounds.find(0);
          if (it == p.rounds.end()) {
            std::printf("  survivor %d: no round result (%s)\n", i,
                        p.problem.empty() ? "?" : p.problem.c_str());
            continue;
          }
          const Round& r = it->second;
          if (r.ok) ++survivors_ok;
          // A failed round reports no all-reduce time: count from the start time instead.
          const double round_s = r.allreduce_s >= 0 ? r.allreduce_s : r.at - run.start_at;
          slowest = std::max(slowest, round_s);
          last_report = std::max(last_report, r.at - run.start_at);
          std::printf(
              "  survivor %d: ok=%s group_size=%d matchmaking %.3f s, all-reduce %.3f s%s\n", i,
              r.ok ? "true" : "false", r.group_size, r.matchmaking_s, r.allreduce_s,
              r.ok ? "" : (", error: " + r.error).c_str());
        }
        if (last_report > 0) {
          kill_round_s = slowest;
          std::printf(
              "  survivors' round: %.3f s (slowest all-reduce_s), reported %.3f s after "
              "the start time; %d of %d survivors ok; normal round %.3f s (first) / "
              "%.3f s (timed); part timeout (deadline) %.1f s\n",
              slowest, last_report, survivors_ok, kFaultPeers - 1, normal.first_allreduce_s,
              normal.m.seconds, deadline);
        }
        const std::string problems = Problems(run, kFaultPeers - 1);
        if (!problems.empty()) std::printf("  survivors' problems:%s\n", problems.c_str());
      }
    }
  }
  std::fflush(stdout);
  if (bootstrap) Stop(*bootstrap);

  // RESULT lines, at N=4 (or the nearest N run).
  int rn = peers_list.front();
  for (int n : peers_list) {
    if (std::abs(n - 4) < std::abs(rn - 4)) rn = n;
  }
  const Row& r = rows[rn];
  std::printf("\n");
  if (rn != 4) std::printf("(no N=4 run: RESULT lines use N=%d)\n", rn);
  auto result = [](const char* key, const Measure& a, const Measure& b) {
    if (a.ok && b.ok && b.seconds > 0) {
      std::printf("RESULT %s=%.3f\n", key, a.seconds / b.seconds);
    } else {
      const std::string& why = !a.ok ? a.error : b.error;
      std::printf("(RESULT %s not available: %s)\n", key, why.substr(0, why.find('\n')).c_str());
    }
  };
  // Absolute times first; the ratios (the headline) last.
  if (r.mpi.ok) std::printf("RESULT mpi_tcp_allreduce_s=%.4f\n", r.mpi.seconds);
  if (r.gloo.ok) std::printf("RESULT gloo_allreduce_s=%.4f\n", r.gloo.seconds);
  if (r.colony.ok) std::printf("RESULT colony_allreduce_s=%.4f\n", r.colony.seconds);
  if (r.colony8.ok) std::printf("RESULT colony8_allreduce_s=%.4f\n", r.colony8.seconds);
  if (kill_round_s) {
    std::printf("RESULT allreduce_kill_round_s=%.3f\n", *kill_round_s);
    std::printf("RESULT allreduce_kill_survivors_ok=%d\n", survivors_ok);
  }
  if (fault_deadline) std::printf("RESULT allreduce_kill_deadline_s=%.1f\n", *fault_deadline);
  result("allreduce_vs_gloo", r.colony, r.gloo);
  result("allreduce8_vs_mpi_tcp", r.colony8, r.mpi);
  result("allreduce_vs_mpi_tcp", r.colony, r.mpi);
  std::fflush(stdout);
  if (c.wrong_results) {
    std::fprintf(stderr, "bench_allreduce: a Colony round computed a wrong mean (see above)\n");
    return 1;
  }
  return 0;
}
