// Regex: a compiled Oniguruma regular expression over UTF-8 text, as Hugging Face tokenizers
// compile the patterns of tokenizer.json (Ruby syntax, Unicode classes such as \p{L}, \s, and
// lookahead; the same engine, so the same matches). Patterns come from downloaded files: compiling
// a bad or oversized one is an error, and each search has a backtracking budget so that a
// pathological pattern cannot hang a server.
//
//   auto re = Regex::Compile(R"('s|'t| ?\p{L}+| ?\p{N}+|\s+(?!\S)|\s+)");
//   std::vector<Regex::Match> m;
//   Status st = re->FindAll(" hello  world", m);  // [0,6) [6,7) [7,13)
//
// Threading: FindAll is const and safe from several threads at once (each call has its own
// region and match parameters).
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace colony::model {

class Regex {
 public:
  struct Match {
    size_t begin;
    size_t end;
  };
  // Longer patterns are refused (Llama 3's and Qwen2's are under 200 bytes).
  static constexpr size_t kMaxPatternBytes = 16 << 10;

  static Result<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the non-empty, non-overlapping matches in `text` (valid UTF-8), left to right; an
  // empty match moves the search on by one character. Fails when a search exceeds its
  // backtracking budget (the matches found before are kept).
  Status FindAll(std::string_view text, std::vector<Match>& out) const;

 private:
  struct Impl;
  explicit Regex(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace colony::model
