// The network lab (scripts/lab) for the benchmarks that run in it (bench_wan, bench_inference's
// WAN phase) and for the lab tests (tests/lab): building and tearing down a topology, running
// commands inside its hosts, tearing it down on SIGINT/SIGTERM/SIGHUP (benchmarks), and saying
// why this machine cannot run it.
//
// Needs COLONY_SOURCE_DIR (the repository, for scripts/lab) defined by the build.
#pragma once

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "bench_support.h"
#include "core/files.h"
#include "core/subprocess.h"

namespace colony::bench {

inline std::string LabScript() { return std::string(COLONY_SOURCE_DIR) + "/scripts/lab"; }

inline std::string IpBinary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "ip";
}

struct CommandResult {
  int code = -1;
  std::vector<std::string> lines;  // stdout
};

// Runs argv to completion (stdout captured, stderr into `err_path` when given).
inline CommandResult RunCommand(const std::vector<std::string>& argv, std::chrono::seconds timeout,
                                const std::string& err_path = {}) {
  CommandResult r;
  auto p = Subprocess::Spawn(argv, err_path);
  if (!p.ok()) return r;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    auto line = p->ReadLine(left);
    if (!line.ok()) break;
    r.lines.push_back(*line);
  }
  auto code = p->Wait(std::chrono::seconds(5));
  r.code = code.ok() ? *code : -1;
  return r;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The lab that is up now, for the signal handler thread.
inline std::mutex g_lab_mutex;
inline std::string g_lab_up;       // guarded by g_lab_mutex
inline std::string g_scratch_dir;  // removed on a signal too (guarded by g_lab_mutex)

inline void LabDown(const std::string& name) {
  RunCommand({"/bin/bash", LabScript(), "down", name}, std::chrono::seconds(60));
}

// A directory the signal thread removes too (empty: none).
inline void SetScratchDir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(g_lab_mutex);
  g_scratch_dir = dir;
}

// Tears down the current lab on SIGINT, SIGTERM or SIGHUP, then exits with 128 + the signal.
// Blocks the signals in the calling thread, so call it from main before starting any thread:
// every later thread inherits the mask and this thread receives them. `program` prefixes the
// message.
inline void StartSignalThread(const std::string& program) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set, program] {
    int sig = 0;
    if (::sigwait(&set, &sig) != 0) return;
    // The main thread's runs fail as their processes die: silence its reports.
    const int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null_fd >= 0) ::dup2(null_fd, STDOUT_FILENO);
    std::lock_guard<std::mutex> lock(g_lab_mutex);
    std::fprintf(stderr, "\n%s: interrupted (signal %d)%s%s\n", program.c_str(), sig,
                 g_lab_up.empty() ? "" : "; tearing down lab ", g_lab_up.c_str());
    if (!g_lab_up.empty()) LabDown(g_lab_up);
    if (!g_scratch_dir.empty()) colony::RemoveTree(g_scratch_dir);
    std::_Exit(128 + sig);  // the children die with us (PR_SET_PDEATHSIG)
  }).detach();
}

// One lab, built from a topology in Up and torn down in the destructor (unless kept).
class Lab {
 public:
  Lab(std::string name, std::string dir, bool keep)
      : name_(std::move(name)), dir_(std::move(dir)), keep_(keep) {}
  ~Lab() { Down(); }
  Lab(const Lab&) = delete;
  Lab& operator=(const Lab&) = delete;

  // Builds the topology; the error (with the script's stderr) if it fails.
  std::string Up(const std::string& topology) {
    const std::string file = dir_ + "/" + name_ + ".lab";
    std::ofstream(file) << topology;
    const std::string err = dir_ + "/" + name_ + ".up.err";
    if (!keep_) {
      std::lock_guard<std::mutex> lock(g_lab_mutex);
      g_lab_up = name_;
    }
    up_ = true;
    auto r =
        RunCommand({"/bin/bash", LabScript(), "up", file, name_}, std::chrono::seconds(120), err);
    if (r.code != 0) {
      return "scripts/lab up failed (exit " + std::to_string(r.code) + "): " + ReadFile(err);
    }
    for (const auto& line : r.lines) {
      const auto space = line.find(' ');
      if (space != std::string::npos) addr_[line.substr(0, space)] = line.substr(space + 1);
    }
    return {};
  }

  void Down() {
    if (!up_) return;
    up_ = false;
    std::lock_guard<std::mutex> lock(g_lab_mutex);
    g_lab_up.clear();
    if (keep_) {
      std::printf("lab %s kept (--keep-lab); remove it with: scripts/lab down %s\n", name_.c_str(),
                  name_.c_str());
      return;
    }
    LabDown(name_);
  }

  const std::string& name() const { return name_; }
  // A host's address (scripts/lab prints them when the lab comes up); empty if unknown.
  std::string addr(const std::string& host) const {
    auto it = addr_.find(host);
    return it == addr_.end() ? std::string() : it->second;
  }
  // argv run inside `host`.
  std::vector<std::string> In(const std::string& host, std::vector<std::string> argv) const {
    std::vector<std::string> out = {IpBinary(), "netns", "exec", "cl-" + name_ + "-" + host};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }
  // Namespaces of this lab that exist now.
  std::vector<std::string> Namespaces() const {
    auto r = RunCommand({IpBinary(), "netns", "list"}, std::chrono::seconds(10));
    std::vector<std::string> out;
    for (const auto& line : r.lines) {
      if (line.rfind("cl-" + name_ + "-", 0) == 0) out.push_back(line.substr(0, line.find(' ')));
    }
    return out;
  }

 private:
  std::string name_, dir_;
  bool keep_ = false, up_ = false;
  std::map<std::string, std::string> addr_;
};

// Why this machine cannot build labs (no root, no network namespaces, ...), or empty. `dir`:
// where to put the check's stderr.
inline std::string LabUnavailable(const std::string& dir) {
  if (::geteuid() != 0)
    return "the network lab needs root (network namespaces, veth, tc, iptables)";
  const std::string err = dir + "/check.err";
  auto r = RunCommand({"/bin/bash", LabScript(), "check"}, std::chrono::seconds(30), err);
  if (r.code != 0) return "the network lab cannot run here: " + ReadFile(err);
  return {};
}

// The same, and also when the binaries that run in it are not built.
inline std::string CannotRunLab(const std::string& dir) {
  if (std::string why = LabUnavailable(dir); !why.empty()) return why;
  const std::string bin_dir = std::filesystem::path(ColonyBinary()).parent_path().string();
  for (const std::string& bin : {ColonyBinary(), bin_dir + "/colony-lab-link"}) {
    if (::access(bin.c_str(), X_OK) != 0) return bin + " not found (build the colony target)";
  }
  return {};
}

// scripts/lab finds the delay relay in build/bin; point it at the one next to the colony binary.
inline void UseLabLinkNextToColony() {
  ::setenv(
      "COLONY_LAB_LINK",
      (std::filesystem::path(ColonyBinary()).parent_path() / "colony-lab-link").string().c_str(),
      1);
}

}  // namespace colony::bench
