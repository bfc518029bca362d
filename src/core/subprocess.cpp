#include "core/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

extern char** environ;

namespace colony {

Result<Subprocess> Subprocess::Spawn(const std::vector<std::string>& argv,
                                     const std::string& stderr_path) {
  return Start(argv, stderr_path, {});
}

Result<int> Subprocess::Run(const std::vector<std::string>& argv, const std::string& log_path,
                            std::chrono::milliseconds timeout) {
  if (log_path.empty()) return InvalidArgument("Subprocess::Run needs a log file");
  COLONY_ASSIGN_OR_RETURN(Subprocess p, Start(argv, {}, log_path));
  auto code = p.Wait(timeout);
  if (!code.ok()) {
    p.Signal(SIGKILL);
    (void)p.Wait(std::chrono::seconds(10));
    return DeadlineExceeded(argv[0] + " did not finish within " +
                            std::to_string(timeout.count() / 1000) + " s (killed)");
  }
  return code;
}

Result<Subprocess> Subprocess::SpawnLogged(const std::vector<std::string>& argv,
                                           const std::string& log_path) {
  return Start(argv, {}, log_path);
}

Result<Subprocess> Subprocess::Start(const std::vector<std::string>& argv,
                                     const std::string& stderr_path, const std::string& log_path) {
  if (argv.empty()) return InvalidArgument("no program to run");
  // Opened here, before fork, so that an unwritable log is an error of the caller's.
  int log_fd = -1;
  if (!log_path.empty()) {
    log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return PermissionDenied("cannot create " + log_path + ": " + std::strerror(errno));
    }
  }
  int fds[2] = {-1, -1};
  if (log_fd < 0 && pipe2(fds, O_CLOEXEC) != 0) {
    return Internal(std::string("pipe: ") + std::strerror(errno));
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // fork + exec rather than posix_spawn, to set PR_SET_PDEATHSIG: a child (a test's peer, the
  // demo's swarm) dies with its parent even when the parent crashes or is killed. Between fork
  // and exec the child calls only async-signal-safe functions.
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    for (int fd : {fds[0], fds[1], log_fd}) {
      if (fd >= 0) ::close(fd);
    }
    return Unavailable("cannot start " + argv[0] + ": " + std::strerror(err));
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
    sigset_t empty;
    sigemptyset(&empty);
    ::sigprocmask(SIG_SETMASK, &empty, nullptr);
    for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);
    if (log_fd >= 0) {
      int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
    } else {
      ::dup2(fds[1], STDOUT_FILENO);
    }
    if (log_fd < 0 && !stderr_path.empty()) {
      int fd = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) ::dup2(fd, STDERR_FILENO);
    }
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  if (log_fd >= 0) ::close(log_fd);
  if (fds[1] >= 0) ::close(fds[1]);
  Subprocess p;
  p.pid_ = pid;
  p.stdout_fd_ = fds[0];
  return p;
}

Subprocess::Subprocess(Subprocess&& o) noexcept
    : pid_(o.pid_),
      stdout_fd_(o.stdout_fd_),
      buffer_(std::move(o.buffer_)),
      exit_code_(o.exit_code_) {
  o.pid_ = -1;
  o.stdout_fd_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& o) noexcept {
  if (this != &o) {
    this->~Subprocess();
    new (this) Subprocess(std::move(o));
  }
  return *this;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !exit_code_) {
    ::kill(pid_, SIGKILL);
    int status;
    ::waitpid(pid_, &status, 0);
  }
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
}

Result<std::string> Subprocess::ReadLine(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    if (stdout_fd_ < 0) return NotFound("process " + std::to_string(pid_) + " closed its output");
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return DeadlineExceeded("process " + std::to_string(pid_) + " printed no line within " +
                              std::to_string(timeout.count()) + " ms");
    }
    pollfd pfd{stdout_fd_, POLLIN, 0};
    int rc = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno != EINTR) return Internal(std::string("poll: ") + std::strerror(errno));
    if (rc <= 0) continue;
    char chunk[4096];
    ssize_t n = ::read(stdout_fd_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(stdout_fd_);
      stdout_fd_ = -1;
      if (!buffer_.empty()) {
        std::string line = std::move(buffer_);
        buffer_.clear();
        return line;
      }
      continue;
    }
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

void Subprocess::Signal(int sig) {
  if (pid_ > 0 && !exit_code_) ::kill(pid_, sig);
}

Result<int> Subprocess::Wait(std::chrono::milliseconds timeout) {
  if (exit_code_) return *exit_code_;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return *exit_code_;
    }
    if (r < 0 && errno != EINTR) return Internal(std::string("waitpid: ") + std::strerror(errno));
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceeded("process " + std::to_string(pid_) + " did not exit within " +
                              std::to_string(timeout.count()) + " ms");
    }
    // No portable way to wait for a child with a timeout; poll at a short interval.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool Subprocess::running() {
  if (exit_code_) return false;
  auto r = Wait(std::chrono::milliseconds(0));
  return !r.ok();
}

std::string SelfExecutable() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return {};
  return std::string(buf, static_cast<size_t>(n));
}

std::string FindProgram(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos) return {};
  const char* path = std::getenv("PATH");
  const std::string dirs = path != nullptr && *path != '\0' ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= dirs.size()) {
    size_t end = dirs.find(':', pos);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > pos ? dirs.substr(pos, end - pos) : ".";
    const std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    pos = end + 1;
  }
  return {};
}

}  // namespace colony
