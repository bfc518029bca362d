// Helpers shared by the tests (tests/) and the benchmarks (bench/): temporary files, the colony
// binary under test, medians, waiting for a condition.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/files.h"
#include "core/subprocess.h"

namespace colony::test {

// A fresh directory under the system's temporary directory ("<tmp>/colony-<name>-XXXXXX"),
// removed with its contents on destruction unless keep() was called.
class TempDir {
 public:
  explicit TempDir(const std::string& name = "test") {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / ("colony-" + name + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      throw std::filesystem::filesystem_error("mkdtemp", tmpl,
                                              std::error_code(errno, std::generic_category()));
    }
    path_ = tmpl;
  }
  ~TempDir() {
    if (keep_) return;
    RemoveTree(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The path of `name` inside the directory, as a string (what most APIs and argv take).
  std::string File(const std::string& name) const { return (path_ / name).string(); }
  void keep() { keep_ = true; }

 private:
  std::filesystem::path path_;
  bool keep_ = false;
};

// This program's scratch directory ("<tmp>/colony-scratch-XXXXXX"), removed with everything in
// it when the program exits: the logs, outputs and lab files of the processes its tests start.
inline const TempDir& ScratchDir() {
  static const TempDir dir("scratch");
  return dir;
}

// A fresh path in ScratchDir() ("<n>_<name>"); nothing is created.
inline std::string ScratchPath(const std::string& name) {
  static std::atomic<uint64_t> counter{0};
  return ScratchDir().File(std::to_string(counter.fetch_add(1)) + "_" + name);
}

// A path in the system's temporary directory that no other process or call picks
// ("<tmp>/colony-<name>-<pid>-<n>"); nothing is created.
inline std::filesystem::path TempPath(const std::string& name) {
  static std::atomic<uint64_t> counter{0};
  return std::filesystem::temp_directory_path() /
         ("colony-" + name + "-" + std::to_string(::getpid()) + "-" +
          std::to_string(counter.fetch_add(1)));
}

// Resident set size in KiB of process `pid` (0: this process); 0 if unknown.
inline long VmRssKb(pid_t pid = 0) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/status")
                            : "/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return 0;
}

// Median of the values (0 when empty).
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

// A file of raw float32 values (what `colony average --output` writes).
inline std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

// The colony binary: $COLONY_BIN (set by ctest), else the one next to the running test or
// benchmark.
inline std::string ColonyBinary() {
  const char* env = std::getenv("COLONY_BIN");
  if (env != nullptr && *env != '\0') return env;
  return (std::filesystem::path(SelfExecutable()).parent_path() / "colony").string();
}

// A `colony dht` process listening on loopback (a swarm's first node, or a victim), with the
// address it printed.
struct LocalDht {
  Subprocess process;
  std::string address;
  // Ends it with SIGTERM: its exit code (DeadlineExceeded when it did not exit within 10 s).
  Result<int> Stop() {
    process.Signal(SIGTERM);
    return process.Wait(std::chrono::seconds(10));
  }
};
inline Result<LocalDht> SpawnLocalDht(const std::string& log_level = "warn") {
  auto p = Subprocess::Spawn(
      {ColonyBinary(), "--log-level", log_level, "dht", "--listen", "/ip4/127.0.0.1/tcp/0"});
  if (!p.ok()) return p.status();
  auto line = p->ReadLine(std::chrono::seconds(20));
  if (!line.ok()) return line.status();
  return LocalDht{std::move(*p), std::move(*line)};
}

// What one run of the colony binary printed and returned.
struct CliResult {
  int code = -1;  // -1: it could not be started or did not exit within the limit
  std::string out, err;
};

// Runs `colony ARGS...` to completion (each stdout line within 30 s, the exit within 30 s more).
inline CliResult RunCli(std::vector<std::string> args) {
  using namespace std::chrono_literals;
  static std::atomic<int> counter{0};
  const std::filesystem::path err_path =
      std::filesystem::temp_directory_path() /
      ("colony_cli_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".err");
  args.insert(args.begin(), ColonyBinary());
  CliResult r;
  auto p = Subprocess::Spawn(args, err_path.string());
  if (!p.ok()) return r;
  for (;;) {
    auto line = p->ReadLine(30s);
    if (!line.ok()) break;
    r.out += *line + "\n";
  }
  auto code = p->Wait(30s);
  r.code = code.ok() ? *code : -1;
  r.err = ReadFile(err_path.string());
  std::filesystem::remove(err_path);
  return r;
}

// Whether this build runs under AddressSanitizer.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// A deadline that guards against a hang, for work whose pace is the machine's. `limit` is ample
// on the 2-core development machine; the guard is 4x that, because CI has run this suite at a
// quarter of that machine's speed (the training tests a sixth), and 12x under AddressSanitizer,
// whose allocator slows LibTorch's allocation-heavy training about 5-fold more (measured: 4.8 s
// per epoch of the 4-peer Fashion-MNIST swarm against about 0.75 s). A passing test never waits
// for it.
inline std::chrono::milliseconds HangGuard(std::chrono::milliseconds limit) {
  return (kSanitized ? 12 : 4) * limit;
}

// Polls `cond` until it holds or `limit` passes; returns its last value. For conditions that
// another thread or process makes true, so that tests wait for them instead of sleeping.
template <typename F>
bool WaitUntil(F cond, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (cond()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return cond();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// The last `max_chars` of a file (a process's log, for failure messages).
inline std::string TailOf(const std::string& path, size_t max_chars = 3000) {
  const std::string text = ReadFile(path);
  return text.size() <= max_chars ? text : text.substr(text.size() - max_chars);
}

// `colony` processes a test runs (a swarm), each with its stderr in a file of `dir`; on
// destruction they get SIGTERM in reverse order of start (SIGKILL after 15 s).
class ProcessGroup {
 public:
  explicit ProcessGroup(std::filesystem::path dir) : dir_(std::move(dir)) {
    std::filesystem::create_directories(dir_);
  }
  ~ProcessGroup() { StopAll(); }
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Starts `colony --log-level LEVEL ARGS...` and returns the first line it prints (an address
  // or a URL); the error says why not, with the end of its log.
  Result<std::string> Start(const std::string& label, std::vector<std::string> args,
                            const std::string& log_level = "info",
                            std::chrono::milliseconds first_line = std::chrono::seconds(60)) {
    const std::string log = LogPath(label);
    args.insert(args.begin(), {ColonyBinary(), "--log-level", log_level});
    auto p = Subprocess::Spawn(args, log);
    if (!p.ok()) return p.status().WithContext(label);
    auto line = p->ReadLine(first_line);
    order_.push_back(label);
    procs_.emplace(label, std::move(*p));
    if (!line.ok()) return line.status().WithContext(label + " printed nothing\n" + TailOf(log));
    return *line;
  }
  // Starts `colony --log-level LEVEL ARGS...` with its stdout and stderr both in its log (for
  // processes whose output nobody reads: a pipe nobody drains would stall them).
  Status StartLogged(const std::string& label, std::vector<std::string> args,
                     const std::string& log_level = "info") {
    args.insert(args.begin(), {ColonyBinary(), "--log-level", log_level});
    auto p = Subprocess::SpawnLogged(args, LogPath(label));
    if (!p.ok()) return p.status().WithContext(label);
    order_.push_back(label);
    procs_.emplace(label, std::move(*p));
    return Status::Ok();
  }
  Subprocess& operator[](const std::string& label) { return procs_.at(label); }
  std::string LogPath(const std::string& label) const { return (dir_ / (label + ".log")).string(); }
  std::string Tail(const std::string& label) const { return TailOf(LogPath(label)); }
  // SIGKILL, and waits for the exit.
  void Kill(const std::string& label) {
    auto& p = procs_.at(label);
    p.Signal(SIGKILL);
    (void)p.Wait(std::chrono::seconds(10));
  }
  // SIGTERM to each process still running, newest first; the labels of those that did not exit
  // within 15 s (then killed).
  std::vector<std::string> StopAll() {
    std::vector<std::string> stuck;
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      auto found = procs_.find(*it);
      if (found == procs_.end() || !found->second.running()) continue;
      found->second.Signal(SIGTERM);
      if (!found->second.Wait(std::chrono::seconds(15)).ok()) {
        stuck.push_back(*it);
        found->second.Signal(SIGKILL);
        (void)found->second.Wait(std::chrono::seconds(5));
      }
    }
    procs_.clear();
    order_.clear();
    return stuck;
  }

 private:
  std::filesystem::path dir_;
  std::vector<std::string> order_;
  std::map<std::string, Subprocess> procs_;
};

}  // namespace colony::test
