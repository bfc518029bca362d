// Small helpers shared by test suites: files and the colony binary under test.
#pragma once

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/subprocess.h"

namespace colony::test {

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

// The colony binary: $COLONY_BIN (set by ctest), else the one next to the test binary.
inline std::string ColonyBinary() {
  const char* env = std::getenv("COLONY_BIN");
  if (env != nullptr && *env != '\0') return env;
  return (std::filesystem::path(SelfExecutable()).parent_path() / "colony").string();
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

}  // namespace colony::test
