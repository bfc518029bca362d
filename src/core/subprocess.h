// Child processes with a line-oriented stdout pipe, for the demo, integration tests and
// benchmarks that run real peers as real processes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace colony {

class Subprocess {
 public:
  // Starts `argv[0]` (a path) with the given arguments. stdout is captured; stderr is inherited
  // unless `stderr_path` names a file to write it to. The child is killed (SIGKILL) when the thread
  // that started it exits, so no peer process outlives a crashed test or demo.
  static Result<Subprocess> Spawn(const std::vector<std::string>& argv,
                                  const std::string& stderr_path = {});
  // Starts `argv[0]` (a path) with stdin from /dev/null and stdout and stderr both written to
  // `log_path` (for a process whose output nobody reads as it goes); killed like Spawn's.
  static Result<Subprocess> SpawnLogged(const std::vector<std::string>& argv,
                                        const std::string& log_path);
  // Runs `argv[0]` (a path) to completion with stdin from /dev/null and stdout and stderr both
  // written to `log_path`; returns its exit code (128+signal when killed). A program still
  // running after `timeout` is killed (SIGKILL): DeadlineExceeded.
  static Result<int> Run(const std::vector<std::string>& argv, const std::string& log_path,
                         std::chrono::milliseconds timeout);
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  // Kills (SIGKILL) and reaps the process if it is still running.
  ~Subprocess();

  pid_t pid() const { return pid_; }
  // Next line of stdout without the newline; DeadlineExceeded after `timeout`, NotFound at EOF.
  Result<std::string> ReadLine(std::chrono::milliseconds timeout);
  void Signal(int sig);
  // Waits for exit; returns the exit code, or 128+signal. DeadlineExceeded after `timeout`.
  Result<int> Wait(std::chrono::milliseconds timeout);
  bool running();

 private:
  Subprocess() = default;
  // stdout to a pipe (ReadLine), or with `log_path` stdout and stderr to that file and stdin
  // from /dev/null.
  static Result<Subprocess> Start(const std::vector<std::string>& argv,
                                  const std::string& stderr_path, const std::string& log_path);
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string buffer_;
  std::optional<int> exit_code_;
};

// Path of the running executable (/proc/self/exe).
std::string SelfExecutable();
// The first executable `name` in $PATH (/usr/local/bin:/usr/bin:/bin when unset), or empty.
std::string FindProgram(const std::string& name);

}  // namespace colony
