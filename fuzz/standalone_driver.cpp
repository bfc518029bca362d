// Runs a libFuzzer target without libFuzzer (g++ builds): every file of the given corpus
// directories, then --iterations deterministic inputs — random bytes, and corpus entries with
// random bit flips, truncations and splices. A crash, sanitizer report or hang fails the ctest.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  long iterations = 10000;
  std::vector<std::vector<uint8_t>> corpus;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--iterations=", 0) == 0) {
      iterations = std::stol(arg.substr(13));
      continue;
    }
    std::error_code ec;
    if (!std::filesystem::is_directory(arg, ec)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(arg)) {
      std::ifstream in(entry.path(), std::ios::binary);
      corpus.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  for (const auto& input : corpus) LLVMFuzzerTestOneInput(input.data(), input.size());

  std::mt19937_64 rng(0xC010A1);
  std::vector<uint8_t> buf;
  for (long it = 0; it < iterations; ++it) {
    buf.clear();
    if (corpus.empty() || it % 4 == 0) {
      size_t len = rng() % 512;
      for (size_t i = 0; i < len; ++i) buf.push_back(static_cast<uint8_t>(rng()));
    } else {
      buf = corpus[rng() % corpus.size()];
      int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits && !buf.empty(); ++e) {
        switch (rng() % 4) {
          case 0:
            buf[rng() % buf.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
            break;
          case 1:
            buf.resize(rng() % buf.size());
            break;
          case 2:
            buf[rng() % buf.size()] = static_cast<uint8_t>(rng());
            break;
          case 3: {
            const auto& other = corpus[rng() % corpus.size()];
            if (!other.empty()) {
              size_t from = rng() % other.size();
              buf.insert(buf.begin() + static_cast<std::ptrdiff_t>(rng() % (buf.size() + 1)),
                         other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
            }
            break;
          }
        }
      }
    }
    LLVMFuzzerTestOneInput(buf.data(), buf.size());
  }
  std::printf("fuzz smoke: %zu corpus inputs and %ld generated inputs, no failure\n", corpus.size(),
              iterations);
  return 0;
}
