// generation_config.json as transformers writes it: the files of real checkpoints (their fields
// copied here), the fixtures transformers 5.17 saved, and the fields Colony refuses by name.
#include "model/generation_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "test_support.h"

namespace colony::model {
namespace {

using nlohmann::json;

Result<GenerationConfig> Parse(const char* text) {
  return GenerationConfig::FromJson(json::parse(text));
}

// transformers' generate() with no arguments but the file: do_sample picks sampling, and the
// settings the file leaves out are GenerationConfig's defaults (temperature 1.0, top_k 50,
// top_p 1.0, repetition_penalty 1.0).
TEST(GenerationConfig, RealCheckpointsFilesGiveTransformersDefaults) {
  // Llama 3.1 8B Instruct's file.
  auto llama = Parse(R"({"bos_token_id": 128000, "do_sample": true,
                         "eos_token_id": [128001, 128008, 128009], "temperature": 0.6,
                         "top_p": 0.9, "transformers_version": "4.42.3"})");
  ASSERT_TRUE(llama.ok()) << llama.status().ToString();
  EXPECT_EQ(llama->eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(
      llama->Defaults(),
      (SamplingDefaults{.temperature = 0.6, .top_k = 50, .top_p = 0.9, .repetition_penalty = 1.0}));
  // Qwen2.5 7B Instruct's file.
  auto qwen = Parse(R"({"bos_token_id": 151643, "pad_token_id": 151643, "do_sample": true,
                        "eos_token_id": [151645, 151643], "repetition_penalty": 1.05,
                        "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                        "transformers_version": "4.37.0"})");
  ASSERT_TRUE(qwen.ok()) << qwen.status().ToString();
  EXPECT_EQ(qwen->eos_token_ids, (std::vector<int64_t>{151645, 151643}));
  EXPECT_EQ(qwen->Defaults(),
            (SamplingDefaults{
                .temperature = 0.7, .top_k = 20, .top_p = 0.8, .repetition_penalty = 1.05}));
  // Without do_sample transformers decodes greedily whatever the temperature says (Llama 2's
  // early files), with the repetition penalty still applied.
  auto greedy = Parse(R"({"temperature": 0.9, "top_p": 0.6, "repetition_penalty": 1.2,
                          "max_length": 4096, "eos_token_id": 2})");
  ASSERT_TRUE(greedy.ok()) << greedy.status().ToString();
  EXPECT_EQ(greedy->Defaults(), (SamplingDefaults{.repetition_penalty = 1.2}));
  // A server in front of it (vLLM's rule) takes the file's values over its own, do_sample aside.
  const SamplingDefaults openai{.temperature = 1.0};
  EXPECT_EQ(
      greedy->Over(openai),
      (SamplingDefaults{.temperature = 0.9, .top_k = 0, .top_p = 0.6, .repetition_penalty = 1.2}));
  EXPECT_EQ(GenerationConfig{}.Over(openai), openai);
}

TEST(GenerationConfig, TheFixturesTransformersSavedLoad) {
  for (const char* name : {"llama-v5-rope500k-tied", "llama3-rope-scaling", "llama-sharded-bf16",
                           "qwen2-attention-bias", "mistral", "mixtral-4x-top2"}) {
    auto g = LoadGenerationConfig(std::filesystem::path(COLONY_HF_FIXTURES) / name);
    ASSERT_TRUE(g.ok()) << name << ": " << g.status().ToString();
    EXPECT_EQ(g->eos_token_ids, (std::vector<int64_t>{2})) << name;
    EXPECT_EQ(g->Defaults(), SamplingDefaults{}) << name;  // greedy
  }
  // A directory without the file generates as transformers' defaults do: greedy, no end list.
  auto none =
      LoadGenerationConfig(std::filesystem::path(COLONY_HF_FIXTURES) / "tokenizer-bytelevel-bpe");
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->eos_token_ids.empty());
  EXPECT_EQ(none->Defaults(), SamplingDefaults{});
}

// Every field that would make Colony generate other than the file says is refused by name (with
// its value), and so are malformed values; the value that changes nothing is accepted.
TEST(GenerationConfig, FieldsColonyWouldNotHonourAreRefusedByName) {
  const std::pair<const char*, const char*> refused[] = {
      {R"({"typical_p": 0.9})", "\"typical_p\" = 0.9"},
      {R"({"min_p": 0.05})", "\"min_p\" = 0.05"},
      {R"({"num_beams": 4})", "\"num_beams\" = 4"},
      {R"({"no_repeat_ngram_size": 3})", "\"no_repeat_ngram_size\" = 3"},
      {R"({"min_new_tokens": 5})", "\"min_new_tokens\" = 5"},
      {R"({"guidance_scale": 1.5})", "\"guidance_scale\" = 1.5"},
      {R"({"eos_token_id": "2"})", "\"eos_token_id\""},
      {R"({"eos_token_id": [2, -1]})", "\"eos_token_id\" = -1"},
      {R"({"do_sample": 1})", "\"do_sample\" = 1"},
      {R"({"temperature": -1})", "\"temperature\" = -1"},
      {R"({"top_p": 0})", "\"top_p\" = 0"},
      {R"({"top_p": 1.5})", "\"top_p\" = 1.5"},
      {R"({"top_k": 2.5})", "\"top_k\" = 2.5"},
      {R"({"repetition_penalty": 0})", "\"repetition_penalty\" = 0"},
  };
  for (const auto& [text, names] : refused) {
    auto g = Parse(text);
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_NE(g.status().message().find(names), std::string::npos)
        << text << ": " << g.status().ToString();
  }
  json many = {{"eos_token_id", json::array()}};
  for (int i = 0; i < 65; ++i) many["eos_token_id"].push_back(i);
  auto g = GenerationConfig::FromJson(many);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("65 ids"), std::string::npos) << g.status().ToString();
  EXPECT_FALSE(GenerationConfig::FromJson(json::array()).ok());
  // The neutral values, nulls and bookkeeping pass.
  auto neutral = Parse(R"({"num_beams": 1, "length_penalty": 1.0, "typical_p": 1.0, "min_p": 0.0,
                           "min_length": 0, "temperature": null, "eos_token_id": null,
                           "_from_model_config": true, "use_cache": true,
                           "cache_implementation": "dynamic", "max_new_tokens": 200})");
  ASSERT_TRUE(neutral.ok()) << neutral.status().ToString();
  EXPECT_EQ(neutral->Defaults(), SamplingDefaults{});
  // A file that is not JSON names itself.
  const auto dir = test::TempPath("generation-config-test");
  std::filesystem::create_directories(dir);
  test::WriteFile((dir / kGenerationConfigFileName).string(), "{\"do_sample\": tru");
  auto broken = LoadGenerationConfig(dir);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("generation_config.json"), std::string::npos)
      << broken.status().ToString();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace colony::model
