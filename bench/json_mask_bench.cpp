// JSON mode's mask (response_format json_object, api/json_mode.h) with masks kept by each
// answer's state against reading the whole vocabulary for every row at every step, in the same
// run.
//
// A vocabulary of --vocab tokens (default 152,064, Qwen2's): tokens 1-255 are single bytes
// (0 is the end token, without text), the rest texts of 1-3 random pieces of JSON and words, as
// a BPE vocabulary trained on code has. A backend answers every step with zero logits (the
// model's cost is not what is measured here). --rows answers, each a different JSON document of
// --records records (an array of objects with a number, strings, a list and a literal; checked
// with nlohmann::json), are fed a byte a step through two JsonObjectLogits, one keeping masks
// (the default) and one not, and each step of each is timed. At every step the two masks must
// be equal and must allow the byte each answer takes next; else the benchmark exits non-zero
// before any RESULT line. RESULT json_mask_cached_ms and json_mask_uncached_ms are the means per
// step (all rows; a state first met costs a vocabulary read, which a median could leave out),
// json_mask_cached_vs_uncached their ratio.
#include <ATen/ATen.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "api/json_mode.h"
#include "serve/generation.h"
#include "test_support.h"

namespace {

using namespace colony;
using colony::test::Median;
using SteadyClock = std::chrono::steady_clock;

// Zero logits for every row, at whatever position it is asked for.
class ZeroLogits : public serve::DecoderBackend {
 public:
  explicit ZeroLogits(int64_t vocab) : vocab_(vocab) {}
  Result<at::Tensor> Step(const at::Tensor& tokens, int64_t position, const at::Tensor&,
                          serve::StepLogits) override {
    position_ = position + tokens.size(1);
    return at::zeros({tokens.size(0), 1, vocab_});
  }
  int64_t position() const override { return position_; }
  int64_t max_length() const override { return int64_t{1} << 30; }

 private:
  int64_t vocab_;
  int64_t position_ = 0;
};

std::shared_ptr<const api::TokenTextTable> Vocabulary(int64_t size) {
  const std::vector<std::string> pieces = {
      "{",     "}",     "[",    "]",     ",",    ":",    "\"",   "\": ",     ", \"",
      "\":\"", " ",     "\n",   "  ",    "\n  ", "0",    "1",    "12",       "3.5",
      "-",     "e-",    "true", "false", "null", "name", " the", "id",       " data",
      "val",   "ue",    "ing",  "\\n",   "\\\"", "\\u",  "00e9", "\xC3\xA9", "\xE2\x82\xAC",
      "tags",  "score", " of",  "x"};
  std::mt19937_64 rng(1);
  std::vector<std::string> texts = {""};  // the end token
  for (int b = 1; b < 256 && static_cast<int64_t>(texts.size()) < size; ++b)
    texts.push_back(std::string(1, static_cast<char>(b)));
  while (static_cast<int64_t>(texts.size()) < size) {
    std::string t;
    for (size_t k = 1 + rng() % 3; k > 0; --k) t += pieces[rng() % pieces.size()];
    texts.push_back(t);
  }
  return std::make_shared<const api::TokenTextTable>(api::TokenTextTable::From(std::move(texts)));
}

std::string Document(uint64_t seed, int records) {
  std::mt19937_64 rng(seed);
  const std::vector<std::string> words = {"alpha", "beta", "gamma", "delta", "caf\xC3\xA9", "x y"};
  std::string d = "{\"items\": [";
  for (int r = 0; r < records; ++r) {
    if (r > 0) d += ", ";
    d += "{\"id\": " + std::to_string(rng() % 100000) + ", \"name\": \"" +
         words[rng() % words.size()] + "\", \"tags\": [\"" + words[rng() % words.size()] +
         "\", \"" + words[rng() % words.size()] +
         "\"], \"score\": " + std::to_string(rng() % 1000) + "." + std::to_string(rng() % 100) +
         ", \"ok\": " + (rng() % 2 == 0 ? "true" : "false") + "}";
  }
  return d + "]}";
}

struct Options {
  int64_t vocab = 152064;
  int rows = 4;
  int records = 6;
};

int Run(const Options& o) {
  const int64_t vocab = o.vocab;
  const int rows = o.rows;
  const int records = o.records;
  at::set_num_threads(1);

  std::vector<std::string> docs;
  size_t steps = SIZE_MAX;
  for (int r = 0; r < rows; ++r) {
    docs.push_back(Document(static_cast<uint64_t>(r) + 1, records));
    if (!nlohmann::json::accept(docs.back())) {
      std::fprintf(stderr, "error: document %d is not JSON: %s\n", r, docs.back().c_str());
      return 1;
    }
    steps = std::min(steps, docs.back().size());
  }
  const auto table = Vocabulary(vocab);
  std::printf("vocabulary %lld tokens, %d rows, %zu steps (bytes of the shortest document)\n",
              static_cast<long long>(vocab), rows, steps);
  ZeroLogits cached_model(vocab), read_model(vocab);
  api::JsonObjectLogits cached(cached_model, {.texts = table, .end_tokens = {0}, .min_tokens = 0});
  api::JsonObjectLogits read(
      read_model, {.texts = table, .end_tokens = {0}, .min_tokens = 0, .cache_masks = false});
  at::Tensor tokens = at::ones({rows, 1}, at::kLong);  // the "prompt": one token
  std::vector<double> cached_ms, read_ms;
  for (size_t step = 0; step < steps; ++step) {
    const int64_t position = step == 0 ? 0 : static_cast<int64_t>(step);
    auto t0 = SteadyClock::now();
    auto a = cached.Step(tokens, position, {}, serve::StepLogits::kLast);
    auto t1 = SteadyClock::now();
    auto b = read.Step(tokens, position, {}, serve::StepLogits::kLast);
    auto t2 = SteadyClock::now();
    if (!a.ok() || !b.ok()) {
      std::fprintf(stderr, "error: step %zu failed: %s\n", step,
                   (!a.ok() ? a.status() : b.status()).ToString().c_str());
      return 1;
    }
    cached_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    read_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    if (!at::equal(*a, *b)) {
      std::fprintf(stderr, "error: step %zu: the kept masks differ from the vocabulary read\n",
                   step);
      return 1;
    }
    std::vector<int64_t> next;
    for (int r = 0; r < rows; ++r) {
      const auto byte = static_cast<unsigned char>(docs[static_cast<size_t>(r)][step]);
      if (!std::isfinite((*a)[r][0][byte].item<float>())) {
        std::fprintf(stderr, "error: step %zu: row %d's next byte '%c' is masked\n", step, r,
                     static_cast<char>(byte));
        return 1;
      }
      next.push_back(byte);
    }
    tokens = at::tensor(next, at::kLong).unsqueeze(1);
  }
  // Means (a state first met costs a vocabulary read: the mean counts it, the median may not).
  const auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return v.empty() ? 0 : sum / static_cast<double>(v.size());
  };
  const double c = mean(cached_ms), u = mean(read_ms);
  std::printf(
      "per step (%d rows), mean (median): kept masks %.3f (%.3f) ms, vocabulary read %.3f "
      "(%.3f) ms; %lld of %zu row masks after the first step from the %zu kept states\n",
      rows, c, Median(cached_ms), u, Median(read_ms), static_cast<long long>(cached.cached_masks()),
      (steps - 1) * rows, cached.kept_masks());
  std::printf("RESULT json_mask_cached_ms=%.3f\n", c);
  std::printf("RESULT json_mask_uncached_ms=%.3f\n", u);
  std::printf("RESULT json_mask_cached_vs_uncached=%.3f\n", c / u);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"JSON mode's mask with masks kept by state vs the whole vocabulary read each step"};
  Options o;
  app.add_option("--vocab", o.vocab, "tokens in the vocabulary")
      ->check(CLI::Range(int64_t{256}, int64_t{1} << 20));
  app.add_option("--rows", o.rows, "answers generated together")->check(CLI::Range(1, 8));
  app.add_option("--records", o.records, "records in each answer's document")
      ->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  return Run(o);
}
