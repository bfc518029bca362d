// Fetching access tokens from a file or a command, and renewing them before they expire.
#include "net/token_source.h"

#include <sys/stat.h>

#include "core/clock.h"
#include "core/files.h"
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

Result<Bytes> ReadAccessTokenFile(const std::string& path) {
  COLONY_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 4 * kMaxTokenBytes));
  auto token = ParseAccessTokenText(text);
  if (!token.ok()) return token.status().WithContext(path);
  return token;
}

Result<Bytes> FetchAccessToken(const TokenSource& source, const PeerId& self) {
  if (!source.file.empty()) return ReadAccessTokenFile(source.file);
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
    // What it printed instead of a token says why (e.g. an issuer's refusal), in printable
    // characters and cut short.
    std::string said = line->substr(0, 200);
    for (char& c : said) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    }
    return Unavailable("the access token command exited with code " + std::to_string(*code) +
                       (said.empty() ? std::string() : ", printing '" + said + "'") + ": " +
                       source.command);
  }
  auto token = ParseAccessTokenText(*line);
  if (!token.ok()) return token.status().WithContext("the access token command's output");
  return token;
}

TokenRefresher::TokenRefresher(Host& host, TokenSource source)
    : host_(host),
      source_(std::move(source)),
      file_seen_(source_.file.empty() ? 0 : ModifiedAt(source_.file)),
      worker_(
          source_.poll, [this] { Check(); }, Periodic::Start::kAfterInterval) {}

void TokenRefresher::Check() {
  const auto& access = host_.access();
  const auto current = access ? access->own_token_info() : std::nullopt;
  const double now = SystemClock::Instance().WallSeconds();
  bool due = !current;
  if (current) {
    const double lifetime = current->expires_at - current->issued_at;
    due = current->expires_at - now < lifetime / 3;
  }
  if (!source_.file.empty()) {
    const int64_t modified = ModifiedAt(source_.file);
    due = due || (modified != 0 && modified != file_seen_);
    file_seen_ = modified;
  }
  if (!due) return;
  auto token = FetchAccessToken(source_, host_.peer_id());
  if (token.ok() && access && access->own_token() == *token) {
    if (current && current->expires_at - now < 3 * source_.poll.count() / 1000.0) {
      COLONY_LOG_WARN(
          "private swarm: this peer's access token expires in {:.0f} s and its source still "
          "gives the same one",
          current->expires_at - now);
    }
    return;
  }
  Status set = token.ok() ? host_.SetAccessToken(std::move(*token)) : token.status();
  if (!set.ok()) {
    COLONY_LOG_WARN("private swarm: could not renew this peer's access token: {}", set.ToString());
    return;
  }
  ++renewals_;
}

}  // namespace colony::net
