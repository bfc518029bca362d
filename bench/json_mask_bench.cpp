// JSON mode's mask (response_format json_object, api/json_mode.h) with masks kept by each
// answer's state (api/json_masks.h, kept for every request as the service keeps them) against
// reading the whole vocabulary for every row at every step, in the same run.
//
// A vocabulary of --vocab tokens (default 152,064, Qwen2's): tokens 1-255 are single bytes
// (0 is the end token, without text), the rest texts of 1-3 random pieces of JSON and words, as
// a BPE vocabulary trained on code has. A backend answers every step with zero logits (the
// model's cost is not what is measured here). --rows answers, each a different JSON document of
// --records records (an array of objects with a number, strings, a list and a literal; checked
// with nlohmann::json), are fed a byte a step through two JsonObjectLogits, one keeping masks
// (the default) and one not, and each step of each is timed; then a next request's answers
// (other documents) through a JsonObjectLogits that starts with the masks the first one kept. At
// every step the two masks must be equal and must allow the byte each answer takes next, and a
// few tokens each row's mask allows, drawn at random, must (checked after the timed steps) leave
// the answer an object's start to nlohmann (fuzz/json_prefix_checks.h); else the benchmark exits
// non-zero before any RESULT line. RESULT
// json_mask_cached_ms and json_mask_uncached_ms are the first request's means per step (all
// rows; a state first met costs a vocabulary read, which a median could leave out),
// json_mask_next_request_ms the next request's, the _vs_uncached figures ratios to the
// vocabulary read in the same request.
//
// --schema: response_format json_schema instead, the documents' schema (the records' fields typed
// and bounded, all required), each request's compilation interned as the service interns it
// (api/json_schema_cache.h), so the next request reads its states' masks from the first one's
// (each state first met costs a vocabulary read per request otherwise: the first request's cost
// again). The next request is also fed through a compilation of its own, as before the service
// interned them: RESULT json_mask_next_request_fresh_schema_ms, its _vs_uncached against the
// vocabulary read in the same pass, and json_mask_next_request_interned_vs_fresh. Each drawn
// token must leave its answer the start of a document the validator written from the
// specification accepts (fuzz/json_schema_checks.h): the answer and the token, closed by the
// reader's Closing(), valid against the schema.
#include <ATen/ATen.h>
#include <malloc.h>

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

#include "../fuzz/json_prefix_checks.h"
#include "../fuzz/json_schema_checks.h"
#include "api/json_masks.h"
#include "api/json_mode.h"
#include "api/json_schema.h"
#include "api/json_schema_cache.h"
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

// What Document() writes, as a pydantic model's schema says it.
constexpr const char* kSchema = R"({"type": "object", "properties": {"items": {"type": "array",
  "items": {"$ref": "#/$defs/Record"}}}, "required": ["items"], "additionalProperties": false,
  "$defs": {"Record": {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0},
    "name": {"type": "string", "maxLength": 32},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
    "score": {"type": "number", "minimum": 0, "maximum": 1000},
    "ok": {"type": "boolean"}},
    "required": ["id", "name", "tags", "score", "ok"], "additionalProperties": false}}})";

struct Options {
  int64_t vocab = 152064;
  int rows = 4;
  int records = 6;
  bool schema = false;
};

// A request: rows answers, each a document, fed a byte a step.
std::vector<std::string> Documents(uint64_t first_seed, int rows, int records) {
  std::vector<std::string> docs;
  for (int r = 0; r < rows; ++r)
    docs.push_back(Document(first_seed + static_cast<uint64_t>(r), records));
  return docs;
}

// A token a row's mask allowed at a step, to be checked against nlohmann after the timed steps.
struct Allowed {
  size_t step;
  size_t row;
  int64_t token;
};

// Feeds `docs` (up to the shortest one's length) through `timed` and `read`, timing each step of
// each into timed_ms and read_ms. Every step's two masks must be equal and must allow each
// answer's next byte (false, with the error printed, when not); of the tokens `timed` allows, up
// to 2 single bytes and 2 of 64 other tokens drawn at random go into `allowed` (a few reads of
// the logits between the timed steps, which a scan of the vocabulary or nlohmann's parses would
// disturb: caches, the allocator).
bool Feed(const std::vector<std::string>& docs, api::JsonObjectLogits& timed,
          api::JsonObjectLogits& read, std::mt19937_64& rng, std::vector<double>& timed_ms,
          std::vector<double>& read_ms, std::vector<Allowed>& allowed) {
  const auto rows = static_cast<int64_t>(docs.size());
  size_t steps = SIZE_MAX;
  for (const auto& d : docs) steps = std::min(steps, d.size());
  at::Tensor tokens = at::ones({rows, 1}, at::kLong);  // the "prompt": one token
  for (size_t step = 0; step < steps; ++step) {
    const auto position = static_cast<int64_t>(step);
    auto t0 = SteadyClock::now();
    auto a = timed.Step(tokens, position, {}, serve::StepLogits::kLast);
    auto t1 = SteadyClock::now();
    auto b = read.Step(tokens, position, {}, serve::StepLogits::kLast);
    auto t2 = SteadyClock::now();
    if (!a.ok() || !b.ok()) {
      std::fprintf(stderr, "error: step %zu failed: %s\n", step,
                   (!a.ok() ? a.status() : b.status()).ToString().c_str());
      return false;
    }
    timed_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    read_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    if (!at::equal(*a, *b)) {
      std::fprintf(stderr, "error: step %zu: the kept masks differ from the vocabulary read\n",
                   step);
      return false;
    }
    std::vector<int64_t> next;
    for (int64_t r = 0; r < rows; ++r) {
      const at::Tensor logits = (*a)[r][0].contiguous();
      const float* l = logits.data_ptr<float>();
      const auto byte = static_cast<unsigned char>(docs[static_cast<size_t>(r)][step]);
      if (!std::isfinite(l[byte])) {
        std::fprintf(stderr, "error: step %zu: row %lld's next byte '%c' is masked\n", step,
                     static_cast<long long>(r), static_cast<char>(byte));
        return false;
      }
      next.push_back(byte);
      std::vector<int64_t> bytes, others;
      for (int64_t t = 0; t < 256; ++t) {
        if (std::isfinite(l[t])) bytes.push_back(t);
      }
      const auto vocab = static_cast<uint64_t>(logits.size(0));
      for (int k = 0; k < 64 && vocab > 256; ++k) {
        const auto t = static_cast<int64_t>(256 + rng() % (vocab - 256));
        if (std::isfinite(l[t])) others.push_back(t);
      }
      for (const auto* drawn : {&bytes, &others}) {
        for (int k = 0; k < 2 && !drawn->empty(); ++k) {
          allowed.push_back({step, static_cast<size_t>(r), (*drawn)[rng() % drawn->size()]});
        }
      }
    }
    tokens = at::tensor(next, at::kLong).unsqueeze(1);
  }
  return true;
}

// Whether each allowed token leaves its answer the start of an object to nlohmann
// (fuzz/json_prefix_checks.h, written apart from JsonObjectPrefix) and, with a schema, the start
// of a valid document (the answer and token closed by the reader's Closing(), then validated by
// fuzz/json_schema_checks.h, written from the specification); false, with the error printed,
// when one does not.
bool CheckedByNlohmann(const std::vector<std::string>& docs, const api::TokenTextTable& table,
                       const std::vector<Allowed>& allowed, const nlohmann::json* schema,
                       const api::JsonSchema* compiled) {
  for (const Allowed& a : allowed) {
    const std::string answer = docs[a.row].substr(0, a.step);
    const auto token = static_cast<size_t>(a.token);
    bool fine = false;
    if (a.token == 0) {  // the end token
      fine = ReadWithNlohmann(answer).complete &&
             (schema == nullptr ||
              schema_checks::SchemaValid(*schema, nlohmann::json::parse(answer), *schema));
    } else {
      const std::string text =
          answer + (a.step == 0 ? table.first.at(token) : table.within.at(token));
      fine = text[0] == '{' && NlohmannStartsAnObject(text);
      if (fine && schema != nullptr) {
        api::JsonSchemaPrefix read(compiled);
        const bool taken = read.Feed(text);
        const auto doc = nlohmann::json::parse(text + read.Closing(), nullptr, false);
        if (!taken || doc.is_discarded() || !schema_checks::SchemaValid(*schema, doc, *schema)) {
          std::fprintf(stderr,
                       "error: step %zu: row %zu's mask allows token %lld, after which the answer "
                       "cannot become a document valid against the schema\n",
                       a.step, a.row, static_cast<long long>(a.token));
          return false;
        }
      }
    }
    if (!fine) {
      std::fprintf(stderr,
                   "error: step %zu: row %zu's mask allows token %lld, after which nlohmann reads "
                   "no object's start\n",
                   a.step, a.row, static_cast<long long>(a.token));
      return false;
    }
  }
  return true;
}

// Means (a state first met costs a vocabulary read: the mean counts it, the median may not).
double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

int Run(const Options& o) {
  const int64_t vocab = o.vocab;
  const int rows = o.rows;
  at::set_num_threads(1);

  // A request's documents, and the next request's (other records, the same kinds of states).
  const std::vector<std::string> docs = Documents(1, rows, o.records);
  const std::vector<std::string> next_docs =
      Documents(1 + static_cast<uint64_t>(rows), rows, o.records);
  size_t steps = SIZE_MAX;
  for (const auto& d : docs) steps = std::min(steps, d.size());
  for (const auto* request : {&docs, &next_docs}) {
    for (const auto& d : *request) {
      if (nlohmann::json::accept(d)) continue;
      std::fprintf(stderr, "error: a document is not JSON: %s\n", d.c_str());
      return 1;
    }
  }
  // Each request's schema as the service has it: compiled from the request, interned.
  const nlohmann::json schema = nlohmann::json::parse(kSchema);
  api::JsonSchemaCache schemas;
  auto request_schema = [&]() -> std::shared_ptr<const api::JsonSchema> {
    if (!o.schema) return nullptr;
    auto compiled = api::JsonSchema::Compile(schema);
    if (!compiled.ok()) return nullptr;
    return schemas.Intern(nlohmann::json(schema).dump(), *compiled);
  };
  const std::shared_ptr<const api::JsonSchema> first_schema = request_schema();
  const std::shared_ptr<const api::JsonSchema> next_schema = request_schema();
  if (o.schema) {
    for (const auto* request : {&docs, &next_docs}) {
      for (const auto& d : *request) {
        if (first_schema && schema_checks::SchemaValid(schema, nlohmann::json::parse(d), schema)) {
          continue;
        }
        std::fprintf(stderr, "error: the schema does not compile or a document is not valid\n");
        return 1;
      }
    }
    if (next_schema != first_schema) {
      std::fprintf(stderr, "error: the next request's schema is not the first one's compilation\n");
      return 1;
    }
  }
  const auto table = Vocabulary(vocab);
  std::printf(
      "vocabulary %lld tokens, %d rows, %zu steps (bytes of the shortest document), %s\n",
      static_cast<long long>(vocab), rows, steps,
      o.schema ? "json_schema (interned, one compilation for both requests)" : "json_object");
  // The masks kept for every request, as the service keeps them (32 MiB).
  auto masks = std::make_shared<api::JsonMasks>(table, size_t{32} << 20);
  const api::JsonModeOptions kept{
      .texts = table, .schema = first_schema, .end_tokens = {0}, .min_tokens = 0, .masks = masks};
  const api::JsonModeOptions reads{.texts = table,
                                   .schema = first_schema,
                                   .end_tokens = {0},
                                   .min_tokens = 0,
                                   .cache_masks = false};
  std::mt19937_64 rng(7);
  std::vector<Allowed> allowed, next_allowed;
  int64_t next_read = 0;
  std::vector<double> cached_ms, read_ms, next_ms, next_read_ms;
  int64_t first_kept = 0;
  {
    ZeroLogits cached_model(vocab), read_model(vocab);
    api::JsonObjectLogits cached(cached_model, kept), read(read_model, reads);
    if (!Feed(docs, cached, read, rng, cached_ms, read_ms, allowed)) return 1;
    first_kept = cached.cached_masks();
  }
  const api::JsonMasks::Counts after_first = masks->counts();
  {
    ZeroLogits next_model(vocab), read_model(vocab);
    api::JsonObjectLogits next(next_model, kept), read(read_model, reads);
    if (!Feed(next_docs, next, read, rng, next_ms, next_read_ms, next_allowed)) return 1;
    next_read = next.read_masks();
  }
  const api::JsonMasks::Counts after_next = masks->counts();
  // The next request through a compilation of its own (its states' masks are not the first
  // one's: each state first met is read again).
  std::vector<double> fresh_ms, fresh_read_ms;
  std::vector<Allowed> fresh_allowed;
  if (o.schema) {
    auto fresh = api::JsonSchema::Compile(schema);
    if (!fresh.ok()) return 1;
    api::JsonModeOptions own = kept, own_reads = reads;
    own.schema = *fresh;
    own_reads.schema = *fresh;
    ZeroLogits fresh_model(vocab), read_model(vocab);
    api::JsonObjectLogits next(fresh_model, own), read(read_model, own_reads);
    if (!Feed(next_docs, next, read, rng, fresh_ms, fresh_read_ms, fresh_allowed)) return 1;
  }
  const nlohmann::json* checked = o.schema ? &schema : nullptr;
  if (!CheckedByNlohmann(docs, *table, allowed, checked, first_schema.get()) ||
      !CheckedByNlohmann(next_docs, *table, next_allowed, checked, first_schema.get()) ||
      !CheckedByNlohmann(next_docs, *table, fresh_allowed, checked, first_schema.get())) {
    return 1;
  }
  const double c = Mean(cached_ms), u = Mean(read_ms), n = Mean(next_ms), nu = Mean(next_read_ms);
  std::printf(
      "per step (%d rows), mean (median): kept masks %.3f (%.3f) ms, vocabulary read %.3f "
      "(%.3f) ms; %lld of %zu row masks after the first step from the %zu kept states\n",
      rows, c, Median(cached_ms), u, Median(read_ms), static_cast<long long>(first_kept),
      (steps - 1) * static_cast<size_t>(rows), after_first.masks);
  std::printf(
      "the next request (other documents, the masks kept): %.3f (%.3f) ms a step against %.3f "
      "(%.3f) ms reading the vocabulary; it read %lld masks and found %lld (%zu states now)\n",
      n, Median(next_ms), nu, Median(next_read_ms), static_cast<long long>(next_read),
      static_cast<long long>(after_next.hits - after_first.hits), after_next.masks);
  if (o.schema) {
    std::printf(
        "the next request through a compilation of its own: %.3f (%.3f) ms a step against %.3f "
        "(%.3f) ms reading the vocabulary\n",
        Mean(fresh_ms), Median(fresh_ms), Mean(fresh_read_ms), Median(fresh_read_ms));
  }
  std::printf("%zu allowed tokens checked against nlohmann%s\n",
              allowed.size() + next_allowed.size() + fresh_allowed.size(),
              o.schema ? " and the schema's validator" : "");
  std::printf("RESULT json_mask_cached_ms=%.3f\n", c);
  std::printf("RESULT json_mask_uncached_ms=%.3f\n", u);
  std::printf("RESULT json_mask_next_request_ms=%.3f\n", n);
  std::printf("RESULT json_mask_next_request_vs_uncached=%.3f\n", n / nu);
  if (o.schema) {
    std::printf("RESULT json_mask_next_request_fresh_schema_ms=%.3f\n", Mean(fresh_ms));
    std::printf("RESULT json_mask_next_request_fresh_schema_vs_uncached=%.3f\n",
                Mean(fresh_ms) / Mean(fresh_read_ms));
    std::printf("RESULT json_mask_next_request_interned_vs_fresh=%.3f\n", n / Mean(fresh_ms));
  }
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
  app.add_flag("--schema", o.schema,
               "response_format json_schema (the documents' schema, interned as the service "
               "does) instead of json_object");
  CLI11_PARSE(app, argc, argv);
  // Each step's logits (rows x vocabulary floats, MiBs) from the heap, not fresh mappings: on the
  // development VM a fresh mapping's page faults cost up to 10 ms a step, in some passes and not
  // others, which is the allocator's and the VM's cost, not the masks'.
  if (mallopt(M_MMAP_THRESHOLD, 32 << 20) == 0 || mallopt(M_TRIM_THRESHOLD, 64 << 20) == 0) {
    std::fprintf(stderr, "warning: mallopt refused the thresholds: steps may fault fresh pages\n");
  }
  return Run(o);
}
