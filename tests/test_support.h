// Small helpers shared by test suites: files and the colony binary under test.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

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

// The colony binary: $COLONY_BIN (set by ctest), else the one next to the test binary.
inline std::string ColonyBinary() {
  const char* env = std::getenv("COLONY_BIN");
  if (env != nullptr && *env != '\0') return env;
  return (std::filesystem::path(SelfExecutable()).parent_path() / "colony").string();
}

}  // namespace colony::test
