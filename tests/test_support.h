// Small helpers shared by test suites: files and the colony binary under test.
#pragma once

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <iterator>
#include <string>
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

}  // namespace colony::test
