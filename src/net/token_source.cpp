// Fetching access tokens from a file or a command, and renewing them before they expire.
#include "net/token_source.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "core/clock.h"
#include "core/log.h"
#include "core/subprocess.h"

namespace colony::net {
namespace {

// The file's modification time in nanoseconds (0 when it cannot be read).
int64_t ModifiedAt(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

}  // namespace

Result<Bytes> FetchAccessToken(const TokenSource& source, const PeerId& self) {
  if (!source.file.empty()) {
    std::ifstream in(source.file);
    if (!in) return NotFound("cannot read the access token file " + source.file);
    std::stringstream text;
    text << in.rdbuf();
    auto token = ParseAccessTokenText(text.str());
    if (!token.ok()) return token.status().WithContext(source.file);
    return token;
  }
  if (source.command.empty()) return InvalidArgument("no access token file or command given");
  COLONY_ASSIGN_OR_RETURN(Subprocess child,
                          Subprocess::Spawn({"/usr/bin/env", "COLONY_PEER_ID=" + self.ToString(),
                                             "/bin/sh", "-c", source.command}));
  auto line = child.ReadLine(source.command_timeout);
  auto code = child.Wait(source.command_timeout);
  if (!line.ok()) {
    return Unavailable("the access token command printed no token (" + line.status().message() +
                       "): " + source.command);
  }
  if (code.ok() && *code != 0) {
    return Unavailable("the access token command exited with code " + std::to_string(*code) + ": " +
                       source.command);
  }
  auto token = ParseAccessTokenText(*line);
  if (!token.ok()) return token.status().WithContext("the access token command's output");
  return token;
}

TokenRefresher::TokenRefresher(Host& host, TokenSource source)
    : host_(host), source_(std::move(source)), thread_([this] { Run(); }) {}

TokenRefresher::~TokenRefresher() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t TokenRefresher::renewals() const {
  std::lock_guard lock(mu_);
  return renewals_;
}

void TokenRefresher::Run() {
  const auto& access = host_.access();
  int64_t file_seen = source_.file.empty() ? 0 : ModifiedAt(source_.file);
  for (;;) {
    {
      std::unique_lock lock(mu_);
      if (cv_.wait_for(lock, source_.poll, [this] { return stop_; })) return;
    }
    const auto current = access ? access->own_token_info() : std::nullopt;
    const double now = SystemClock::Instance().WallSeconds();
    bool due = !current;
    if (current) {
      const double lifetime = current->expires_at - current->issued_at;
      due = current->expires_at - now < lifetime / 3;
    }
    if (!source_.file.empty()) {
      const int64_t modified = ModifiedAt(source_.file);
      due = due || (modified != 0 && modified != file_seen);
      file_seen = modified;
    }
    if (!due) continue;
    auto token = FetchAccessToken(source_, host_.peer_id());
    if (token.ok() && access && access->own_token() == *token) {
      if (current && current->expires_at - now < 3 * source_.poll.count() / 1000.0) {
        COLONY_LOG_WARN(
            "private swarm: this peer's access token expires in {:.0f} s and {} "
            "still holds the same one",
            current->expires_at - now, source_.file);
      }
      continue;
    }
    Status set = token.ok() ? host_.SetAccessToken(std::move(*token)) : token.status();
    if (!set.ok()) {
      COLONY_LOG_WARN("private swarm: could not renew this peer's access token: {}",
                      set.ToString());
      continue;
    }
    std::lock_guard lock(mu_);
    ++renewals_;
  }
}

}  // namespace colony::net
