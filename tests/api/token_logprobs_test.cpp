// LogprobRecorder against the whole model's forward pass computed apart: a scored prompt goes
// to the backend in steps bounded by the recorder's element budget, and what it records equals
// the log-softmax of the full forward's logits.
#include "api/token_logprobs.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "model/llama.h"
#include "serve/generation.h"
#include "serve/small_model.h"

namespace colony::api {
namespace {

// Passes every step on and remembers how many tokens each had.
class CountingBackend : public serve::DecoderBackend {
 public:
  explicit CountingBackend(serve::DecoderBackend& inner) : inner_(inner) {}
  Result<at::Tensor> Step(const at::Tensor& tokens, int64_t position, const at::Tensor& hypo_ids,
                          serve::StepLogits logits) override {
    steps.push_back(tokens.size(1));
    return inner_.Step(tokens, position, hypo_ids, logits);
  }
  int64_t position() const override { return inner_.position(); }
  int64_t max_length() const override { return inner_.max_length(); }

  std::vector<int64_t> steps;

 private:
  serve::DecoderBackend& inner_;
};

TEST(LogprobRecorder, AScoredPromptGoesInBoundedStepsAndEqualsTheWholeForward) {
  at::manual_seed(7);
  const model::LlamaConfig config = serve::test::SmallLlamaConfig(/*tie_word_embeddings=*/false);
  model::LlamaModel model(config);
  at::NoGradGuard no_grad;
  const int64_t t = 11, vocab = config.vocab_size;
  const at::Tensor tokens = at::randint(vocab, {1, t}, at::kLong);
  const at::Tensor logits = model->forward(tokens);  // [1, T, V]: the reference
  const at::Tensor ref = at::log_softmax(logits[0], -1);

  serve::LocalBackend local(model);
  CountingBackend counted(local);
  // Three positions' logits per step: the first token alone, then 3, 3, 3 and the last one.
  LogprobRecorder recorder(counted, /*top=*/3, /*score_prompt=*/true,
                           /*max_scored_elements=*/3 * vocab);
  auto last = recorder.Step(tokens, 0, {}, serve::StepLogits::kLast);
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(counted.steps, (std::vector<int64_t>{1, 3, 3, 3, 1}));
  EXPECT_EQ(local.position(), t);
  EXPECT_TRUE(at::allclose(*last, logits.narrow(1, t - 1, 1), 0, 1e-4));

  const auto entries = recorder.Take();
  ASSERT_EQ(entries.size(), static_cast<size_t>(t));
  EXPECT_EQ(entries[0].token, tokens[0][0].item<int64_t>());
  EXPECT_FALSE(entries[0].logprob.has_value());
  for (int64_t i = 1; i < t; ++i) {
    const auto& e = entries[static_cast<size_t>(i)];
    const int64_t token = tokens[0][i].item<int64_t>();
    EXPECT_EQ(e.token, token);
    ASSERT_TRUE(e.logprob.has_value()) << "position " << i;
    EXPECT_NEAR(*e.logprob, ref[i - 1][token].item<double>(), 1e-4) << "position " << i;
    const auto [values, ids] = ref[i - 1].topk(3);
    ASSERT_EQ(e.top.size(), 3u);
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_EQ(e.top[static_cast<size_t>(j)].token, ids[j].item<int64_t>()) << "position " << i;
      EXPECT_NEAR(e.top[static_cast<size_t>(j)].logprob, values[j].item<double>(), 1e-4);
    }
  }
  // The prompt's last position scores the token chosen after it.
  recorder.Chose(5);
  const auto chosen = recorder.Take();
  ASSERT_EQ(chosen.size(), 1u);
  ASSERT_TRUE(chosen[0].logprob.has_value());
  EXPECT_NEAR(*chosen[0].logprob, ref[t - 1][5].item<double>(), 1e-4);

  // Asked for every position's logits, the caller gets them whole, from steps of two.
  serve::LocalBackend again(model);
  CountingBackend counted_again(again);
  LogprobRecorder whole(counted_again, /*top=*/0, /*score_prompt=*/true, 2 * vocab);
  auto every = whole.Step(tokens, 0, {}, serve::StepLogits::kAll);
  ASSERT_TRUE(every.ok()) << every.status().ToString();
  EXPECT_EQ(counted_again.steps, (std::vector<int64_t>{1, 2, 2, 2, 2, 2}));
  ASSERT_EQ(every->sizes(), logits.sizes());
  EXPECT_TRUE(at::allclose(*every, logits, 0, 1e-4));
  EXPECT_EQ(whole.Take().size(), static_cast<size_t>(t));
}

// Rows of one backend are recorded each for itself: two different prompts scored side by side
// (in steps that budget the elements of both rows), then a token chosen for one row only, equal
// the log-softmax of each prompt's own forward pass; a step that changes the rows, or reorders
// them, is refused.
TEST(LogprobRecorder, EachRowOfABatchIsRecordedForItself) {
  at::manual_seed(8);
  const model::LlamaConfig config = serve::test::SmallLlamaConfig(/*tie_word_embeddings=*/false);
  model::LlamaModel model(config);
  at::NoGradGuard no_grad;
  const int64_t t = 7, vocab = config.vocab_size;
  const at::Tensor tokens = at::randint(vocab, {2, t}, at::kLong);
  std::vector<at::Tensor> ref;
  for (int64_t r = 0; r < 2; ++r)
    ref.push_back(at::log_softmax(model->forward(tokens.narrow(0, r, 1))[0], -1));

  serve::LocalBackend local(model);
  CountingBackend counted(local);
  // 6 x V elements: 3 positions of 2 rows per step.
  LogprobRecorder recorder(counted, /*top=*/2, /*score_prompt=*/true,
                           /*max_scored_elements=*/6 * vocab);
  auto last = recorder.Step(tokens, 0, {}, serve::StepLogits::kLast);
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(counted.steps, (std::vector<int64_t>{1, 3, 3}));
  ASSERT_EQ(last->sizes(), (std::vector<int64_t>{2, 1, vocab}));
  for (int64_t r = 0; r < 2; ++r) {
    const auto entries = recorder.Take(r);
    ASSERT_EQ(entries.size(), static_cast<size_t>(t)) << "row " << r;
    for (int64_t i = 1; i < t; ++i) {
      const auto& e = entries[static_cast<size_t>(i)];
      const int64_t token = tokens[r][i].item<int64_t>();
      EXPECT_EQ(e.token, token);
      ASSERT_TRUE(e.logprob.has_value());
      EXPECT_NEAR(*e.logprob, ref[static_cast<size_t>(r)][i - 1][token].item<double>(), 1e-4)
          << "row " << r << " position " << i;
      ASSERT_EQ(e.top.size(), 2u);
      EXPECT_EQ(e.top[0].token, ref[static_cast<size_t>(r)][i - 1].argmax().item<int64_t>());
    }
  }
  recorder.Chose(9, /*row=*/1);
  recorder.Chose(9, /*row=*/1);  // a second choice for the same step is not recorded
  EXPECT_TRUE(recorder.Take(0).empty());
  const auto chosen = recorder.Take(1);
  ASSERT_EQ(chosen.size(), 1u);
  EXPECT_NEAR(*chosen[0].logprob, ref[1][t - 1][9].item<double>(), 1e-4);
  // The next step scores row 0's next token after what row 0 was fed.
  const at::Tensor next = at::tensor({4, 9}, at::kLong).unsqueeze(1);
  ASSERT_TRUE(recorder.Step(next, t, {}, serve::StepLogits::kLast).ok());
  recorder.Chose(2, 0);
  const at::Tensor longer = at::cat({tokens[0], at::tensor({4}, at::kLong)}).unsqueeze(0);
  const at::Tensor ref0 = at::log_softmax(model->forward(longer)[0][t], -1);
  const auto row0 = recorder.Take(0);
  ASSERT_EQ(row0.size(), 1u);
  EXPECT_NEAR(*row0[0].logprob, ref0[2].item<double>(), 1e-4);

  EXPECT_FALSE(recorder.Step(next.narrow(0, 0, 1), t + 1, {}, serve::StepLogits::kLast).ok());
  EXPECT_FALSE(
      recorder.Step(next, t + 1, at::tensor({1, 0}, at::kLong), serve::StepLogits::kLast).ok());
}

}  // namespace
}  // namespace colony::api
