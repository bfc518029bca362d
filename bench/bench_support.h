// Helpers shared by the benchmarks that run `colony` processes (and, from tests/test_support.h,
// those the tests use too: TempDir, TempPath, Median, ColonyBinary).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/subprocess.h"
#include "test_support.h"

namespace colony::bench {

using colony::test::ColonyBinary;
using colony::test::Median;
using colony::test::TempDir;

// The last `max_lines` non-empty lines of a file (a child's stderr), indented, for error messages.
inline std::string Tail(const std::string& path, size_t max_lines = 6) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) {
    if (!l.empty()) lines.push_back(l);
  }
  std::string out;
  for (size_t i = lines.size() > max_lines ? lines.size() - max_lines : 0; i < lines.size(); ++i) {
    out += "\n    | " + lines[i];
  }
  return out;
}

// Wall-clock seconds since the Unix epoch (the time base of `colony average --start-at`).
inline double WallNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Seconds of the steady clock since `since` (what a benchmark times).
inline double SecondsSince(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

inline std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(std::max(0.0, seconds) * 1000));
}

// `v` with `digits` decimals.
inline std::string Fixed(double v, int digits = 3) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// Reads lines of `p` until `stop(line)` returns true, EOF (NotFound) or `deadline`.
template <typename F>
Status ReadUntil(Subprocess& p, std::chrono::steady_clock::time_point deadline, F stop) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return DeadlineExceeded("timed out");
    auto line = p.ReadLine(left);
    if (!line.ok()) return line.status();
    if (stop(*line)) return Status::Ok();
  }
}

}  // namespace colony::bench
