// presence_penalty, frequency_penalty, logit_bias and min_tokens against OpenAI's formula and
// vLLM's mask applied apart: a small random model's whole forward pass over each sequence so far
// (no KV cache), the logits changed here, and the token then drawn, must give what GenerateRows
// gives through AdjustedLogits, row by row.
#include "api/logit_adjustments.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "model/llama.h"
#include "serve/generation.h"
#include "serve/small_model.h"

namespace colony::api {
namespace {

// OpenAI's rule, written out: logit + bias - count * frequency - (count > 0) * presence, over
// the tokens the answer has had so far, with HF's repetition penalty (over the prompt's tokens
// and the answer's) between the bias and the other penalties, as vLLM orders them; and vLLM's:
// the end tokens' logits are -inf while the answer has fewer than min_tokens tokens, and min_p
// drops the tokens whose probability at the temperature is below min_p times the highest.
std::vector<int64_t> Reference(model::LlamaModel& model, const std::vector<int64_t>& prompt,
                               const model::SamplingOptions& options,
                               const LogitAdjustments& adjust) {
  std::mt19937_64 rng(options.seed);
  std::vector<int64_t> all = prompt, answer;
  std::map<int64_t, int64_t> counts;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    at::Tensor logits =
        model->forward(at::tensor(all, at::kLong).unsqueeze(0))[0][-1].to(at::kDouble);
    if (!adjust.allowed_tokens.empty()) {
      at::Tensor keep = at::zeros_like(logits, at::kBool);
      for (int64_t token : adjust.allowed_tokens) keep[token] = true;
      logits.masked_fill_(keep.logical_not(), -std::numeric_limits<double>::infinity());
    }
    for (const auto& [token, bias] : adjust.logit_bias) logits[token] += bias;
    if (adjust.repetition_penalty != 1) {
      for (int64_t token : std::set<int64_t>(all.begin(), all.end())) {
        const double x = logits[token].item<double>();
        logits[token] = x > 0 ? x / adjust.repetition_penalty : x * adjust.repetition_penalty;
      }
    }
    for (const auto& [token, count] : counts) {
      logits[token] -= static_cast<double>(count) * adjust.frequency_penalty;
      logits[token] -= adjust.presence_penalty;
    }
    // Rounded to float32 once, as the backend returns them.
    logits = logits.to(at::kFloat);
    if (step < adjust.min_tokens) {
      for (int64_t end : adjust.end_tokens) {
        if (end < logits.size(0)) logits[end] = -std::numeric_limits<float>::infinity();
      }
    }
    if (adjust.min_p > 0 && adjust.temperature > 0) {
      const at::Tensor probs = at::softmax(logits.to(at::kDouble) / adjust.temperature, -1);
      logits.masked_fill_(probs < adjust.min_p * probs.max().item<double>(),
                          -std::numeric_limits<float>::infinity());
    }
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
                                .logit_bias = {{plain[0], -100}, {plain[3], 0.5}, {200, -2.25}},
                                .min_tokens = 0,
                                .end_tokens = {}};
  std::vector<std::vector<int64_t>> want;
  for (const auto& o : rows) want.push_back(Reference(model, prompt, o, adjust));
  EXPECT_NE(want[0], plain);
  EXPECT_NE(want[0][0], plain[0]);  // -100 bans the token
  EXPECT_NE(want[0], Reference(model, prompt, rows[0],
                               {.presence_penalty = 0,
                                .frequency_penalty = 0,
                                .logit_bias = adjust.logit_bias,
                                .min_tokens = 0,
                                .end_tokens = {}}));

  serve::LocalBackend local(model);
  AdjustedLogits adjusted(local, adjust);
  auto got = serve::GenerateRows(adjusted, prompt, rows);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, want);

  // The presence penalty alone, once per token whatever its count: not the frequency penalty's
  // answer of the same size (a small one, so that tokens still repeat), nor the plain one.
  model::SamplingOptions longer = rows[0];
  longer.max_new_tokens = 80;
  const LogitAdjustments presence{.presence_penalty = 0.1,
                                  .frequency_penalty = 0,
                                  .logit_bias = {},
                                  .min_tokens = 0,
                                  .end_tokens = {}};
  const std::vector<int64_t> once = Reference(model, prompt, longer, presence);
  EXPECT_NE(once, Reference(model, prompt, longer, {}));
  EXPECT_NE(once, Reference(model, prompt, longer,
                            {.presence_penalty = 0,
                             .frequency_penalty = 0.1,
                             .logit_bias = {},
                             .min_tokens = 0,
                             .end_tokens = {}}));
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
  AdjustedLogits adjusted(local, {.presence_penalty = 0,
                                  .frequency_penalty = 0,
                                  .logit_bias = {{77, 100}},
                                  .min_tokens = 0,
                                  .end_tokens = {}});
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

TEST(AdjustedLogits, MinTokensKeepsTheEndTokensOutUntilTheAnswerHasThem) {
  at::manual_seed(14);
  model::LlamaModel model(serve::test::SmallLlamaConfig(/*tie_word_embeddings=*/false));
  at::NoGradGuard no_grad;
  const std::vector<int64_t> prompt = {9, 4, 31, 2};
  std::vector<model::SamplingOptions> rows = {{.max_new_tokens = 16,
                                               .temperature = 0,
                                               .top_k = 0,
                                               .top_p = 1,
                                               .repetition_penalty = 1,
                                               .seed = 0},
                                              {.max_new_tokens = 16,
                                               .temperature = 1.1,
                                               .top_k = 0,
                                               .top_p = 1,
                                               .repetition_penalty = 1,
                                               .seed = 21}};
  // End tokens the unmasked answers choose early: the greedy row's first and third tokens and
  // the sampled row's second, so that the mask has something to keep out; a bias lifts the
  // first, and the mask still wins; and one outside the vocabulary, never chosen anyway.
  const std::vector<int64_t> greedy = Reference(model, prompt, rows[0], {});
  const std::vector<int64_t> sampled = Reference(model, prompt, rows[1], {});
  const LogitAdjustments adjust{.presence_penalty = 0,
                                .frequency_penalty = 0,
                                .logit_bias = {{greedy[0], 2.5}},
                                .min_tokens = 6,
                                .end_tokens = {greedy[0], greedy[2], sampled[1], 100000}};
  std::vector<std::vector<int64_t>> want;
  for (const auto& o : rows) want.push_back(Reference(model, prompt, o, adjust));
  for (const auto& w : want) {
    for (int64_t i = 0; i < adjust.min_tokens; ++i) {
      EXPECT_EQ(std::ranges::count(adjust.end_tokens, w[static_cast<size_t>(i)]), 0) << i;
    }
  }
  EXPECT_NE(want[0][0], greedy[0]);
  EXPECT_NE(want[1], sampled);
  // After min_tokens the end tokens may come again: the mask is not for the whole answer.
  LogitAdjustments always = adjust;
  always.min_tokens = rows[0].max_new_tokens;
  EXPECT_NE(want, (std::vector<std::vector<int64_t>>{Reference(model, prompt, rows[0], always),
                                                     Reference(model, prompt, rows[1], always)}));

  serve::LocalBackend local(model);
  AdjustedLogits adjusted(local, adjust);
  auto got = serve::GenerateRows(adjusted, prompt, rows);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, want);

  // With a bias of 100 an end token is chosen at once unless masked: the answer is exactly
  // min_tokens other tokens and then the end token, for each min_tokens.
  const int64_t end = 42;
  for (int64_t min_tokens = 0; min_tokens <= 4; ++min_tokens) {
    serve::LocalBackend fresh(model);
    AdjustedLogits forced(fresh, {.presence_penalty = 0,
                                  .frequency_penalty = 0,
                                  .logit_bias = {{end, 100}},
                                  .min_tokens = min_tokens,
                                  .end_tokens = {end}});
    auto answer = serve::GenerateWith(forced, prompt, rows[1], /*eos_id=*/end);
    ASSERT_TRUE(answer.ok()) << answer.status().ToString();
    ASSERT_EQ(std::ssize(*answer), min_tokens + 1) << min_tokens;
    EXPECT_EQ(answer->back(), end);
    EXPECT_EQ(std::ranges::count(*answer, end), 1) << min_tokens;
  }
}

TEST(AdjustedLogits, MinPAndTheRepetitionPenaltyApplyInVllmsOrder) {
  at::manual_seed(15);
  model::LlamaModel model(serve::test::SmallLlamaConfig(/*tie_word_embeddings=*/false));
  at::NoGradGuard no_grad;
  const std::vector<int64_t> prompt = {7, 3, 3, 50, 8};
  constexpr double kTemperature = 1.4;
  std::vector<model::SamplingOptions> rows;
  for (uint64_t seed : {31, 32, 33}) {
    rows.push_back({.max_new_tokens = 20,
                    .temperature = kTemperature,
                    .top_k = 0,
                    .top_p = seed == 33 ? 0.8 : 1.0,
                    .repetition_penalty = 1,  // applied by AdjustedLogits
                    .seed = seed});
  }
  const LogitAdjustments adjust{.presence_penalty = 0.3,
                                .frequency_penalty = 0,
                                .logit_bias = {{11, 1.5}},
                                .min_tokens = 0,
                                .end_tokens = {},
                                .min_p = 0.2,
                                .temperature = kTemperature,
                                .repetition_penalty = 1.6};
  std::vector<std::vector<int64_t>> want;
  for (const auto& o : rows) want.push_back(Reference(model, prompt, o, adjust));
  // Each part must show: without min_p, or without the repetition penalty, the answers differ.
  LogitAdjustments no_min_p = adjust;
  no_min_p.min_p = 0;
  LogitAdjustments no_penalty = adjust;
  no_penalty.repetition_penalty = 1;
  EXPECT_NE(want[0], Reference(model, prompt, rows[0], no_min_p));
  EXPECT_NE(want[0], Reference(model, prompt, rows[0], no_penalty));
  serve::LocalBackend local(model);
  AdjustedLogits adjusted(local, adjust);
  auto got = serve::GenerateRows(adjusted, prompt, rows);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, want);

  // min_p 1 keeps only the most likely token: sampling at any temperature is greedy decoding,
  // and with the repetition penalty it is the sampler's own greedy decoding with that penalty.
  const model::SamplingOptions greedy{.max_new_tokens = 20,
                                      .temperature = 0,
                                      .top_k = 0,
                                      .top_p = 1,
                                      .repetition_penalty = 1.6,
                                      .seed = 0};
  serve::LocalBackend fresh(model);
  AdjustedLogits only_top(fresh, {.presence_penalty = 0,
                                  .frequency_penalty = 0,
                                  .logit_bias = {},
                                  .min_tokens = 0,
                                  .end_tokens = {},
                                  .min_p = 1,
                                  .temperature = kTemperature,
                                  .repetition_penalty = 1.6});
  auto top = serve::GenerateWith(only_top, prompt, rows[0]);
  ASSERT_TRUE(top.ok()) << top.status().ToString();
  EXPECT_EQ(*top, model::Generate(model, prompt, greedy));
}

TEST(AdjustedLogits, AllowedTokensAreTheOnlyOnesGenerated) {
  at::manual_seed(16);
  model::LlamaModel model(serve::test::SmallLlamaConfig(/*tie_word_embeddings=*/true));
  at::NoGradGuard no_grad;
  const std::vector<int64_t> prompt = {4, 8, 15, 16};
  const std::vector<int64_t> allowed = {3, 23, 42, 77, 101};
  std::vector<model::SamplingOptions> rows;
  for (uint64_t seed : {0, 41, 42}) {
    rows.push_back({.max_new_tokens = 16,
                    .temperature = seed == 0 ? 0.0 : 1.2,
                    .top_k = 0,
                    .top_p = 1,
                    .repetition_penalty = 1,
                    .seed = seed});
  }
  // With a bias and min_p among them (min_p's most likely token is an allowed one).
  const LogitAdjustments adjust{.presence_penalty = 0,
                                .frequency_penalty = 0,
                                .logit_bias = {{23, 0.5}},
                                .min_tokens = 0,
                                .end_tokens = {},
                                .min_p = 0.1,
                                .temperature = 1.2,
                                .repetition_penalty = 1,
                                .allowed_tokens = allowed};
  std::vector<std::vector<int64_t>> want;
  for (const auto& o : rows) want.push_back(Reference(model, prompt, o, adjust));
  for (const auto& w : want) {
    for (int64_t t : w) EXPECT_NE(std::ranges::find(allowed, t), allowed.end()) << t;
  }
  EXPECT_NE(want[0], Reference(model, prompt, rows[0], {}));
  serve::LocalBackend local(model);
  AdjustedLogits adjusted(local, adjust);
  auto got = serve::GenerateRows(adjusted, prompt, rows);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, want);
  // A token outside the vocabulary is refused at the first step.
  serve::LocalBackend fresh(model);
  AdjustedLogits outside(fresh, {.presence_penalty = 0,
                                 .frequency_penalty = 0,
                                 .logit_bias = {},
                                 .min_tokens = 0,
                                 .end_tokens = {},
                                 .min_p = 0,
                                 .temperature = 0,
                                 .repetition_penalty = 1,
                                 .allowed_tokens = {3, 1 << 20}});
  auto refused = serve::GenerateWith(outside, prompt, rows[0]);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("'allowed_token_ids': token 1048576"),
            std::string::npos)
      << refused.status().ToString();
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
  AdjustedLogits outside(other, {.presence_penalty = 0,
                                 .frequency_penalty = 0,
                                 .logit_bias = {{config.vocab_size, 1}},
                                 .min_tokens = 0,
                                 .end_tokens = {}});
  auto st = outside.Step(prompt, 0, {}, serve::StepLogits::kLast);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().message(), "'logit_bias.256' is outside the vocabulary [0, 256)");

  AdjustedLogits adjusted(local, {.presence_penalty = 1,
                                  .frequency_penalty = 0,
                                  .logit_bias = {},
                                  .min_tokens = 0,
                                  .end_tokens = {}});
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
