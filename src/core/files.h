// Files that several processes share: an advisory lock that serializes their creation, writes
// that readers see whole or not at all, and content hashes that name cached files.
//
//   COLONY_ASSIGN_OR_RETURN(FileLock lock, FileLock::Acquire(path.string() + ".lock"));
//   if (!exists(path)) COLONY_RETURN_IF_ERROR(WriteFileAtomically(path, bytes));
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "core/status.h"

namespace colony {

// 64-bit FNV-1a, chainable through `state`.
uint64_t Fnv1a64(std::string_view bytes, uint64_t state = 0xcbf29ce484222325ULL);
std::string Hex64(uint64_t v);  // 16 lowercase hex digits
// Hash of a file's contents (FNV-1a), as 16 hex digits.
Result<std::string> HashFile(const std::filesystem::path& file);

// The whole contents of a file of at most `max_bytes`. A larger one is refused with an error
// that says so: a regular file before anything is read, anything else (a pipe, a file that grows)
// as soon as it passes the limit.
Result<std::string> ReadFileToString(const std::filesystem::path& file, uint64_t max_bytes);

// An exclusive advisory lock (flock) on `path` (created if missing), held until destruction.
// It serializes both processes and threads of one process (each lock opens its own file).
class FileLock {
 public:
  static Result<FileLock> Acquire(const std::filesystem::path& path);
  FileLock(FileLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// Removes `path` and everything under it, without following symbolic links (a link is removed,
// not its target); a missing path is not an error. What std::filesystem::remove_all does, on
// libc's nftw: a PyTorch wheel's LibTorch exports its own copy of remove_all (it links part of
// libstdc++ statically, pytorch/pytorch#133437), programs that link it may bind their calls to
// that copy, and with PyTorch 2.11 it called a null pointer (docs/architecture.md). Colony's
// code calls this instead.
std::error_code RemoveTree(const std::filesystem::path& path);

// A path next to `final_path` that no other process or thread will pick:
// "<final_path>.tmp-<pid>-<counter>".
std::filesystem::path UniqueTempPath(const std::filesystem::path& final_path);
// Removes "<final_path>.tmp-*" left by crashed processes; call it while holding the lock that
// guards the creation of `final_path` (then no live process is writing such a file).
void RemoveStaleTemps(const std::filesystem::path& final_path);
// Writes `data` to a temporary file next to `path` and renames it into place, so that readers
// see either no file or the whole file.
Status WriteFileAtomically(const std::filesystem::path& path, std::string_view data);

}  // namespace colony
