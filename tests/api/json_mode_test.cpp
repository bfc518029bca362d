// response_format json_object's mask against the rule applied apart: a small random model over
// a vocabulary of single bytes, its whole forward pass over each sequence so far (no KV cache),
// and at each step only the tokens after which nlohmann::json (fuzz/json_prefix_checks.h) can
// still read the answer as the start of a JSON object, then the token drawn, must give what
// GenerateRows gives through JsonObjectLogits, row by row. (No answer here has a run of
// whitespace long enough for JsonObjectPrefix's bound on them to matter: checked.)
#include "api/json_mode.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../../fuzz/json_prefix_checks.h"
#include "api/logit_adjustments.h"
#include "model/llama.h"
#include "serve/generation.h"
#include "serve/small_model.h"

namespace colony::api {
namespace {

constexpr int64_t kEnd = 0;  // the end token: a byte no JSON text has

bool IsSpace(int64_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }

// The rule, written out over bytes: the end token only once the answer is a whole object and
// min_tokens are generated (and then nothing else); no whitespace before the object; else the
// bytes after which the answer still starts an object; then the biases, then the draw.
std::vector<int64_t> Reference(model::LlamaModel& model, const std::vector<int64_t>& prompt,
                               const model::SamplingOptions& options, int64_t min_tokens,
                               const std::vector<std::pair<int64_t, double>>& bias) {
  std::mt19937_64 rng(options.seed);
  std::vector<int64_t> all = prompt, answer;
  std::string text;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    at::Tensor logits = model->forward(at::tensor(all, at::kLong).unsqueeze(0))[0][-1];
    const bool end_now = step >= min_tokens && ReadWithNlohmann(text).complete;
    for (int64_t v = 0; v < logits.size(0); ++v) {
      bool keep = false;
      if (v == kEnd || end_now) {
        keep = v == kEnd && end_now;
      } else {
        keep = text.empty() ? v == '{' : NlohmannStartsAnObject(text + static_cast<char>(v));
      }
      if (!keep) logits[v] = -std::numeric_limits<float>::infinity();
    }
    at::Tensor wide = logits.to(at::kDouble);
    for (const auto& [token, b] : bias) wide[token] += b;
    const int64_t next = model::SampleNextToken(wide.to(at::kFloat), all, options, rng);
    all.push_back(next);
    answer.push_back(next);
    if (next == kEnd) break;
    text += static_cast<char>(next);
  }
  return answer;
}

std::shared_ptr<const std::vector<std::string>> ByteTexts() {
  auto texts = std::make_shared<std::vector<std::string>>();
  texts->emplace_back();  // kEnd
  for (int b = 1; b < 256; ++b) texts->push_back(std::string(1, static_cast<char>(b)));
  return texts;
}

std::vector<model::SamplingOptions> Rows(int64_t max_new_tokens) {
  std::vector<model::SamplingOptions> rows;
  for (const auto& [temperature, seed] :
       std::vector<std::pair<double, uint64_t>>{{0.0, 0}, {0.8, 5}, {1.3, 9}}) {
    rows.push_back({.max_new_tokens = max_new_tokens,
                    .temperature = temperature,
                    .top_k = 0,
                    .top_p = 1,
                    .repetition_penalty = 1,
                    .seed = seed});
  }
  return rows;
}

std::string Text(const std::vector<int64_t>& answer) {
  std::string text;
  for (int64_t t : answer) {
    if (t != kEnd) text += static_cast<char>(t);
  }
  // (A run of whitespace as long as JsonObjectPrefix's bound would make the reference wrong.)
  int run = 0;
  for (char c : text) {
    run = IsSpace(c) ? run + 1 : 0;
    EXPECT_LT(run, JsonObjectPrefix::kMaxSpaces) << text;
  }
  return text;
}

TEST(JsonObjectLogits, RowsAreTheModelsAnswersKeptToAJsonObject) {
  at::manual_seed(11);
  model::LlamaModel model(serve::test::SmallLlamaConfig(/*tie_word_embeddings=*/false));
  at::NoGradGuard no_grad;
  const std::vector<int64_t> prompt = {3, 17, 99, 42, 5};
  const auto rows = Rows(24);
  std::vector<std::vector<int64_t>> want;
  for (const auto& o : rows) want.push_back(Reference(model, prompt, o, 0, {}));
  serve::LocalBackend local(model);
  JsonObjectLogits json(local, {.token_texts = ByteTexts(), .end_tokens = {kEnd}, .min_tokens = 0});
  auto got = serve::GenerateRows(json, prompt, rows, kEnd);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, want);
  for (const auto& answer : *got) {
    EXPECT_FALSE(ReadWithNlohmann(Text(answer)).refused) << Text(answer);
    EXPECT_EQ(Text(answer).front(), '{');  // the random model's own answer is no JSON at all
  }
  // Unmasked, the model writes something else.
  auto plain = serve::GenerateRows(local, prompt, rows, kEnd);
  ASSERT_TRUE(plain.ok());
  EXPECT_NE((*plain)[0], want[0]);
}

// Biased toward closing, answers become whole objects: then whitespace until min_tokens, then the
// end token and nothing else.
TEST(JsonObjectLogits, AWholeObjectEndsTheAnswerOnceMinTokensAreGenerated) {
  at::manual_seed(11);
  model::LlamaModel model(serve::test::SmallLlamaConfig(/*tie_word_embeddings=*/false));
  at::NoGradGuard no_grad;
  const std::vector<int64_t> prompt = {3, 17, 99, 42, 5};
  const std::vector<std::pair<int64_t, double>> bias = {{'}', 6}, {'"', 5}, {'1', 4}, {':', 4}};
  const auto rows = Rows(40);
  for (const int64_t min_tokens : {0, 16}) {
    std::vector<std::vector<int64_t>> want;
    for (const auto& o : rows) want.push_back(Reference(model, prompt, o, min_tokens, bias));
    serve::LocalBackend local(model);
    JsonObjectLogits json(
        local, {.token_texts = ByteTexts(), .end_tokens = {kEnd}, .min_tokens = min_tokens});
    AdjustedLogits biased(json, {.presence_penalty = 0,
                                 .frequency_penalty = 0,
                                 .logit_bias = bias,
                                 .min_tokens = 0,
                                 .end_tokens = {}});
    auto got = serve::GenerateRows(biased, prompt, rows, kEnd);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, want) << "min_tokens " << min_tokens;
    for (const auto& answer : *got) {
      ASSERT_EQ(answer.back(), kEnd) << Text(answer);
      EXPECT_GE(static_cast<int64_t>(answer.size()), min_tokens + 1);
      EXPECT_TRUE(nlohmann::json::parse(Text(answer)).is_object()) << Text(answer);
    }
  }
}

TEST(JsonObjectLogits, AVocabularyThatCannotContinueTheObjectFailsTheStep) {
  at::manual_seed(11);
  model::LlamaModel model(serve::test::SmallLlamaConfig(/*tie_word_embeddings=*/false));
  at::NoGradGuard no_grad;
  auto texts = std::make_shared<std::vector<std::string>>(256, "x");  // no '{'
  serve::LocalBackend local(model);
  JsonObjectLogits json(local, {.token_texts = texts, .end_tokens = {kEnd}, .min_tokens = 0});
  auto got = serve::GenerateRows(json, {3, 17}, Rows(4), kEnd);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace colony::api
