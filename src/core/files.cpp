#include "core/files.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <system_error>

namespace colony {

uint64_t Fnv1a64(std::string_view bytes, uint64_t state) {
  for (unsigned char c : bytes) {
    state ^= c;
    state *= 0x100000001b3ULL;
  }
  return state;
}

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Result<std::string> HashFile(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return NotFound("cannot open " + file.string() + ": " + std::strerror(errno));
  uint64_t h = Fnv1a64({});
  std::string buf(1 << 20, '\0');
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h = Fnv1a64(std::string_view(buf.data(), static_cast<size_t>(in.gcount())), h);
  }
  if (in.bad()) return DataLoss("error reading " + file.string());
  return Hex64(h);
}

Result<std::string> ReadFileToString(const std::filesystem::path& file, uint64_t max_bytes) {
  auto too_large = [&] {
    return ResourceExhausted(file.string() + " is larger than " + std::to_string(max_bytes) +
                             " bytes");
  };
  std::error_code ec;
  if (std::filesystem::is_regular_file(file, ec) &&
      std::filesystem::file_size(file, ec) > max_bytes && !ec) {
    return too_large();
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return NotFound("cannot open " + file.string() + ": " + std::strerror(errno));
  std::string out;
  std::string buf(64 << 10, '\0');
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = static_cast<size_t>(in.gcount());
    if (out.size() + n > max_bytes) return too_large();  // it grew, or it is not a file
    out.append(buf.data(), n);
  }
  if (in.bad()) return DataLoss("error reading " + file.string());
  return out;
}

Result<FileLock> FileLock::Acquire(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return PermissionDenied("cannot create lock file " + path.string() + ": " +
                            std::strerror(errno));
  }
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    int err = errno;
    ::close(fd);
    return Internal("flock " + path.string() + ": " + std::strerror(err));
  }
  return FileLock(fd);
}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

std::filesystem::path UniqueTempPath(const std::filesystem::path& final_path) {
  static std::atomic<uint64_t> counter{0};
  std::filesystem::path p = final_path;
  p += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
  return p;
}

namespace {
int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  return ::remove(path) == 0 || errno == ENOENT ? 0 : errno;
}
}  // namespace

std::error_code RemoveTree(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? std::error_code() : std::error_code(errno, std::generic_category());
  }
  // Depth first (children before their folder), links not followed, up to 64 open folders.
  const int rc = ::nftw(path.c_str(), RemoveEntry, 64, FTW_DEPTH | FTW_PHYS);
  if (rc == 0) return {};
  return std::error_code(rc > 0 ? rc : (errno != 0 ? errno : EIO), std::generic_category());
}

void RemoveStaleTemps(const std::filesystem::path& final_path) {
  const std::string prefix = final_path.filename().string() + ".tmp-";
  std::error_code ec;
  const std::filesystem::path dir =
      final_path.has_parent_path() ? final_path.parent_path() : std::filesystem::path(".");
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (it->path().filename().string().starts_with(prefix)) {
      RemoveTree(it->path());
    }
  }
}

Status WriteFileAtomically(const std::filesystem::path& path, std::string_view data) {
  std::filesystem::path tmp = UniqueTempPath(path);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      return PermissionDenied("cannot create " + tmp.string() + ": " + std::strerror(errno));
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.close();
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      return ResourceExhausted("cannot write " + tmp.string() + " (disk full?)");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return Internal("cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message());
  }
  return Status::Ok();
}

}  // namespace colony
