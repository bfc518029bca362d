// presence_penalty, frequency_penalty and logit_bias against OpenAI's formula applied apart: a
// small random model's whole forward pass over each sequence so far (no KV cache), the logits
// changed by the formula here, and the token then drawn, must give what GenerateRows gives
// through AdjustedLogits, row by row.
#include "api/logit_adjustments.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "model/llama.h"
#include "serve/generation.h"
#include "serve/small_model.h"

namespace colony::api {
namespace {

// OpenAI's rule, written out: logit + bias - count * frequency - (count > 0) * presence, over
// the tokens the answer has had so far.
std::vector<int64_t> Reference(model::LlamaModel& model, const std::vector<int64_t>& prompt,
                               const model::SamplingOptions& options,
                               const LogitAdjustments& adjust) {
  std::mt19937_64 rng(options.seed);
  std::vector<int64_t> all = prompt, answer;
  std::map<int64_t, int64_t> counts;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    at::Tensor logits =
        model->forward(at::tensor(all, at::kLong).unsqueeze(0))[0][-1].to(at::kDouble);
    for (const auto& [token, bias] : adjust.logit_bias) logits[token] += bias;
    for (const auto& [token, count] : counts) {
      logits[token] -= static_cast<double>(count) * adjust.frequency_penalty;
      logits[token] -= adjust.presence_penalty;
    }
    // Rounded to float32 once, as the backend returns them.
    logits = logits.to(at::kFloat);
    const int64_t next = model::SampleNextToken(logits, all, options, rng);
    all.push_back(next);
    answer.push_back(next);
    ++counts[next];
  }
  return answer;
}

TEST(AdjustedLogits, RowsGetOpenAisPenaltiesAndBiasesEachOverItsOwnAnswer) {
  at::manual_seed(11);
  const model::LlamaConfig config = serve::test::SmallLlamaConfig(/*tie_word_embeddings=*/false);
  model::LlamaModel model(config);
  at::NoGradGuard no_grad;
  const std::vector<int64_t> prompt = {3, 17, 99, 42, 5};
  const std::vector<model::SamplingOptions> rows = {{.max_new_tokens = 24,
                                                     .temperature = 0,
                                                     .top_k = 0,
                                                     .top_p = 1,
                                                     .repetition_penalty = 1,
                                                     .seed = 0},
                                                    {.max_new_tokens = 24,
                                                     .temperature = 0.8,
                                                     .top_k = 0,
                                                     .top_p = 1,
                                                     .repetition_penalty = 1,
                                                     .seed = 5},
                                                    {.max_new_tokens = 24,
                                                     .temperature = 1.3,
                                                     .top_k = 20,
                                                     .top_p = 0.9,
                                                     .repetition_penalty = 1,
                                                     .seed = 9}};

  // Unchanged greedy answers of a random model repeat themselves: the penalties must show.
  const std::vector<int64_t> plain = Reference(model, prompt, rows[0], {});
  const LogitAdjustments adjust{.presence_penalty = 0.75,
                                .frequency_penalty = 1.5,
                                .logit_bias = {{plain[0], -100}, {plain[3], 0.5}, {200, -2.25}}};
  std::vector<std::vector<int64_t>> want;
  for (const auto& o : rows) want.push_back(Reference(model, prompt, o, adjust));
  EXPECT_NE(want[0], plain);
  EXPECT_NE(want[0][0], plain[0]);  // -100 bans the token
  EXPECT_NE(want[0], Reference(model, prompt, rows[0], {.logit_bias = adjust.logit_bias}));

  serve::LocalBackend local(model);
  AdjustedLogits adjusted(local, adjust);
  auto got = serve::GenerateRows(adjusted, prompt, rows);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, want);

  // The presence penalty alone, once per token whatever its count: not the frequency penalty's
  // answer of the same size (a small one, so that tokens still repeat), nor the plain one.
  model::SamplingOptions longer = rows[0];
  longer.max_new_tokens = 80;
  const LogitAdjustments presence{
      .presence_penalty = 0.1, .frequency_penalty = 0, .logit_bias = {}};
  const std::vector<int64_t> once = Reference(model, prompt, longer, presence);
  EXPECT_NE(once, Reference(model, prompt, longer, {}));
  EXPECT_NE(once, Reference(model, prompt, longer,
                            {.presence_penalty = 0, .frequency_penalty = 0.1, .logit_bias = {}}));
  serve::LocalBackend fresh(model);
  AdjustedLogits present(fresh, presence);
  auto alone = serve::GenerateWith(present, prompt, longer);
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  EXPECT_EQ(*alone, once);
}

TEST(AdjustedLogits, ABiasOfAHundredChoosesItsTokenEveryTime) {
  at::manual_seed(12);
  model::LlamaModel model(serve::test::SmallLlamaConfig(/*tie_word_embeddings=*/true));
  at::NoGradGuard no_grad;
  serve::LocalBackend local(model);
  AdjustedLogits adjusted(local, {.logit_bias = {{77, 100}}});
  auto got = serve::GenerateWith(adjusted, {1, 2, 3},
                                 {.max_new_tokens = 6,
                                  .temperature = 1.0,
                                  .top_k = 0,
                                  .top_p = 1,
                                  .repetition_penalty = 1,
                                  .seed = 3});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, std::vector<int64_t>(6, 77));
}

TEST(AdjustedLogits, RefusesStepsItCannotCountAndTokensOutsideTheVocabulary) {
  at::manual_seed(13);
  const model::LlamaConfig config = serve::test::SmallLlamaConfig(/*tie_word_embeddings=*/true);
  model::LlamaModel model(config);
  at::NoGradGuard no_grad;
  serve::LocalBackend local(model);
  const at::Tensor prompt = at::tensor(std::vector<int64_t>{1, 2, 3}, at::kLong).unsqueeze(0);
  const at::Tensor one = at::tensor(std::vector<int64_t>{4}, at::kLong).unsqueeze(0);

  serve::LocalBackend other(model);
  AdjustedLogits outside(other, {.logit_bias = {{config.vocab_size, 1}}});
  auto st = outside.Step(prompt, 0, {}, serve::StepLogits::kLast);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().message(), "'logit_bias.256' is outside the vocabulary [0, 256)");

  AdjustedLogits adjusted(local, {.presence_penalty = 1, .frequency_penalty = 0, .logit_bias = {}});
  auto refused = [&](const at::Tensor& tokens, int64_t position, const at::Tensor& hypo_ids,
                     serve::StepLogits logits, const std::string& why) {
    auto r = adjusted.Step(tokens, position, hypo_ids, logits);
    ASSERT_FALSE(r.ok()) << why;
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().ToString();
  };
  refused(prompt, 0, {}, serve::StepLogits::kAll, "the last position's logits only");
  ASSERT_TRUE(adjusted.Step(prompt, 0, {}, serve::StepLogits::kLast).ok());
  refused(one, 3, at::zeros({1}, at::kLong), serve::StepLogits::kLast, "reordered rows");
  refused(one, 1, {}, serve::StepLogits::kLast, "a step at 1 after 3");  // a rollback
  refused(prompt, 0, {}, serve::StepLogits::kLast, "a step at 0 after 3");
  refused(one.repeat({2, 1}), 3, {}, serve::StepLogits::kLast, "a step of 2 rows after");
  auto next = adjusted.Step(one, 3, {}, serve::StepLogits::kLast);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->sizes(), (std::vector<int64_t>{1, 1, config.vocab_size}));
}

}  // namespace
}  // namespace colony::api
