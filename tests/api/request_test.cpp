// The API's torch-free parts: OpenAI requests parsed field by field (and refused with the field's
// name), chat templates rendered to the documented text, and streamed text that never sends a
// stop string's start or half a character, checked against the whole text cut by hand.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "api/chat_template.h"
#include "api/model_chat_template.h"
#include "api/openai_request.h"
#include "api/text_stream.h"
#include "model/tokenizer.h"
#include "test_support.h"

namespace colony::api {
namespace {

TEST(OpenAiRequest, ParsesACompletionRequestAsClientsSendIt) {
  auto r = ParseCompletionRequest(R"({"model": "llama", "prompt": "Hello", "max_tokens": 7,
      "temperature": 0, "top_p": 0.9, "n": 2, "stream": true, "stop": ["\n", "END"],
      "seed": 42, "user": "u1", "presence_penalty": 0, "frequency_penalty": 0.0,
      "logprobs": null, "echo": false, "stream_options": {"include_usage": true}})",
                                  {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->chat);
  EXPECT_EQ(r->model, "llama");
  ASSERT_EQ(r->prompts.size(), 1u);
  EXPECT_EQ(r->prompts[0].text, "Hello");
  EXPECT_FALSE(r->prompts[0].is_tokens);
  EXPECT_EQ(r->max_tokens, 7);
  EXPECT_EQ(r->temperature, 0);
  EXPECT_DOUBLE_EQ(r->top_p, 0.9);
  EXPECT_EQ(r->n, 2);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(r->stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_EQ(r->seed, 42u);

  EXPECT_FALSE(r->logprobs.has_value());
  EXPECT_FALSE(r->echo);
  EXPECT_EQ(r->best_of, 2);  // n when absent
  EXPECT_EQ(r->presence_penalty, 0);
  EXPECT_EQ(r->frequency_penalty, 0);
  EXPECT_TRUE(r->logit_bias.empty());

  // OpenAI's penalties and biases, as a client sends them (ids as the keys of an object).
  auto biased = ParseChatRequest(R"({"messages": [{"role": "user", "content": "hi"}],
      "presence_penalty": -0.5, "frequency_penalty": 1.25,
      "logit_bias": {"50256": -100, "7": 2.5, "0": 100}})",
                                 {});
  ASSERT_TRUE(biased.ok()) << biased.status().ToString();
  EXPECT_EQ(biased->presence_penalty, -0.5);
  EXPECT_EQ(biased->frequency_penalty, 1.25);
  EXPECT_EQ(biased->logit_bias,
            (std::vector<std::pair<int64_t, double>>{{0, 100}, {7, 2.5}, {50256, -100}}));
  auto best = ParseCompletionRequest(R"({"prompt": "x", "n": 2, "best_of": 5})", {});
  ASSERT_TRUE(best.ok()) << best.status().ToString();
  EXPECT_EQ(best->n, 2);
  EXPECT_EQ(best->best_of, 5);
  EXPECT_FALSE(best->ignore_eos);
  // What vLLM's benchmark client sends.
  auto bench = ParseCompletionRequest(R"({"model": "m", "prompt": "x", "temperature": 0.0,
      "max_tokens": 8, "logprobs": null, "stream": true, "stream_options": {"include_usage": true},
      "ignore_eos": true, "best_of": 1})",
                                      {});
  ASSERT_TRUE(bench.ok()) << bench.status().ToString();
  EXPECT_TRUE(bench->ignore_eos);
  EXPECT_FALSE(bench->include_stop);
  EXPECT_EQ(bench->min_p, 0);
  auto min_p = ParseCompletionRequest(R"({"prompt": "x", "temperature": 0.7, "min_p": 0.05})", {});
  ASSERT_TRUE(min_p.ok()) << min_p.status().ToString();
  EXPECT_EQ(min_p->min_p, 0.05);
  EXPECT_TRUE(min_p->allowed_token_ids.empty());
  auto allowed =
      ParseCompletionRequest(R"({"prompt": "x", "allowed_token_ids": [9, 2, 9, 0]})", {});
  ASSERT_TRUE(allowed.ok()) << allowed.status().ToString();
  EXPECT_EQ(allowed->allowed_token_ids, (std::vector<int64_t>{0, 2, 9}));
  auto with_stop = ParseCompletionRequest(
      R"({"prompt": "x", "stop": "y", "include_stop_str_in_output": true})", {});
  ASSERT_TRUE(with_stop.ok()) << with_stop.status().ToString();
  EXPECT_TRUE(with_stop->include_stop);
  EXPECT_EQ(bench->min_tokens, 0);
  auto at_least =
      ParseCompletionRequest(R"({"prompt": "x", "max_tokens": 8, "min_tokens": 8})", {});
  ASSERT_TRUE(at_least.ok()) << at_least.status().ToString();
  EXPECT_EQ(at_least->min_tokens, 8);
  auto chat_least =
      ParseChatRequest(R"({"messages": [{"role": "user", "content": "hi"}], "min_tokens": 3})", {});
  ASSERT_TRUE(chat_least.ok()) << chat_least.status().ToString();
  EXPECT_EQ(chat_least->min_tokens, 3);
  EXPECT_TRUE(chat_least->stop_token_ids.empty());
  // stop_token_ids (vLLM's): in the request's order, an id given twice once.
  auto stop_ids = ParseChatRequest(
      R"({"messages": [{"role": "user", "content": "hi"}], "stop_token_ids": [7, 0, 7, 2147483647]})",
      {});
  ASSERT_TRUE(stop_ids.ok()) << stop_ids.status().ToString();
  EXPECT_EQ(stop_ids->stop_token_ids, (std::vector<int64_t>{7, 0, 2147483647}));
  auto no_stop_ids = ParseCompletionRequest(R"({"prompt": "x", "stop_token_ids": null})", {});
  ASSERT_TRUE(no_stop_ids.ok()) << no_stop_ids.status().ToString();
  EXPECT_TRUE(no_stop_ids->stop_token_ids.empty());
  auto chat_best = ParseChatRequest(
      R"({"messages": [{"role": "user", "content": "hi"}], "best_of": 2})", {});  // legacy only
  ASSERT_FALSE(chat_best.ok());
  EXPECT_EQ(chat_best.status().message(),
            "'best_of' is not a field of a chat completion request that colony api knows");
  std::string many = R"({"prompt": "x", "logit_bias": {)";
  for (int i = 0; i < 1025; ++i) many += fmt::format("{}\"{}\": 1", i ? ", " : "", i);
  auto too_many = ParseCompletionRequest(many + "}}", {});
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().message(), "'logit_bias' holds 1025 tokens; at most 1024");
  nlohmann::json ids = nlohmann::json::array();
  for (int i = 0; i < 65; ++i) ids.push_back(i);
  auto too_many_ids =
      ParseCompletionRequest(nlohmann::json({{"prompt", "x"}, {"stop_token_ids", ids}}).dump(), {});
  ASSERT_FALSE(too_many_ids.ok());
  EXPECT_EQ(too_many_ids.status().message(), "'stop_token_ids' holds 65 tokens; at most 64");

  // Scoring a prompt as lm-eval-harness asks: its tokens echoed with their log-probabilities.
  auto scoring = ParseCompletionRequest(R"({"prompt": [[1, 2, 3]], "max_tokens": 0,
      "echo": true, "logprobs": 1, "temperature": 0, "return_tokens_as_token_ids": true})",
                                        {});
  ASSERT_TRUE(scoring.ok()) << scoring.status().ToString();
  EXPECT_EQ(scoring->max_tokens, 0);
  EXPECT_TRUE(scoring->echo);
  EXPECT_EQ(scoring->logprobs, 1);
  EXPECT_TRUE(scoring->tokens_as_ids);
  // JSON mode on the legacy endpoint too (vLLM takes it there): the answer after the prompt.
  auto completion_json = ParseCompletionRequest(
      R"({"prompt": "x", "response_format": {"type": "json_object"}, "echo": true})", {});
  ASSERT_TRUE(completion_json.ok()) << completion_json.status().ToString();
  EXPECT_TRUE(completion_json->json_object);
  auto completion_text =
      ParseCompletionRequest(R"({"prompt": "x", "response_format": {"type": "text"}})", {});
  ASSERT_TRUE(completion_text.ok()) << completion_text.status().ToString();
  EXPECT_FALSE(completion_text->json_object);
  auto none = ParseCompletionRequest(R"({"prompt": "x", "logprobs": 0})", {});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->logprobs, 0);  // the chosen tokens' only

  auto defaults = ParseCompletionRequest(R"({"prompt": "x"})", {});
  ASSERT_TRUE(defaults.ok());
  EXPECT_FALSE(defaults->max_tokens.has_value());
  EXPECT_EQ(defaults->temperature, 1.0);  // OpenAI's default: sampling
  EXPECT_EQ(defaults->n, 1);
  EXPECT_FALSE(defaults->stream);

  auto tokens = ParseCompletionRequest(R"({"prompt": [1, 17, 42]})", {});
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->prompts.size(), 1u);
  EXPECT_TRUE(tokens->prompts[0].is_tokens);
  EXPECT_EQ(tokens->prompts[0].tokens, (std::vector<int64_t>{1, 17, 42}));
  auto nested = ParseCompletionRequest(R"({"prompt": [[5, 6]], "stop": "x"})", {});
  ASSERT_TRUE(nested.ok());
  ASSERT_EQ(nested->prompts.size(), 1u);
  EXPECT_EQ(nested->prompts[0].tokens, (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(nested->stop, (std::vector<std::string>{"x"}));
  // A batch (OpenAI's array of prompts): strings or arrays of token ids, in order.
  auto batch = ParseCompletionRequest(R"({"prompt": ["a", [7, 8], "b"]})", {});
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  ASSERT_EQ(batch->prompts.size(), 3u);
  EXPECT_EQ(batch->prompts[0].text, "a");
  EXPECT_TRUE(batch->prompts[1].is_tokens);
  EXPECT_EQ(batch->prompts[1].tokens, (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(batch->prompts[2].text, "b");
  EXPECT_FALSE(batch->prompts[2].is_tokens);
}

TEST(OpenAiRequest, ParsesAChatRequest) {
  auto r = ParseChatRequest(R"({"model": "m", "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": "Hello."},
      {"role": "developer", "content": "Rule."}],
      "max_completion_tokens": 5, "response_format": {"type": "text"}, "tools": []})",
                            {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->chat);
  ASSERT_EQ(r->messages.size(), 4u);
  EXPECT_EQ(r->messages[1].content, "Hi there");
  EXPECT_EQ(r->messages[3].role, "system");
  EXPECT_EQ(r->max_tokens, 5);
  EXPECT_FALSE(r->logprobs.has_value());
  EXPECT_FALSE(r->json_object);

  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  auto json_mode =
      ParseChatRequest("{" + user + R"(, "response_format": {"type": "json_object"}})", {});
  ASSERT_TRUE(json_mode.ok()) << json_mode.status().ToString();
  EXPECT_TRUE(json_mode->json_object);
  EXPECT_EQ(json_mode->json_schema, nullptr);
  // OpenAI's structured outputs: the schema compiled (api/json_schema.h); without one, any object.
  auto schema = ParseChatRequest("{" + user + R"(, "response_format": {"type": "json_schema",
      "json_schema": {"name": "n", "strict": true, "schema": {"type": "object",
      "properties": {"a": {"type": "integer"}}, "required": ["a"],
      "additionalProperties": false}}}})",
                                 {});
  ASSERT_TRUE(schema.ok()) << schema.status().ToString();
  EXPECT_TRUE(schema->json_object);
  ASSERT_NE(schema->json_schema, nullptr);
  JsonSchemaPrefix answer(schema->json_schema.get());
  EXPECT_TRUE(answer.Feed("{\"a\": 12}") && answer.complete());
  EXPECT_FALSE(JsonSchemaPrefix(schema->json_schema.get()).Feed("{\"b\""));
  auto no_schema = ParseChatRequest(
      "{" + user + R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "n"}}})",
      {});
  ASSERT_TRUE(no_schema.ok()) << no_schema.status().ToString();
  EXPECT_TRUE(no_schema->json_object);
  EXPECT_EQ(no_schema->json_schema, nullptr);
  auto no_tools =
      ParseChatRequest("{" + user +
                           R"(, "response_format": {"type": "json_object"}, "tool_choice": "none",
          "tools": [{"type": "function", "function": {"name": "f"}}]})",
                       {});
  ASSERT_TRUE(no_tools.ok()) << no_tools.status().ToString();  // the model is not told of tools
  auto top = ParseChatRequest("{" + user + R"(, "logprobs": true, "top_logprobs": 3})", {});
  ASSERT_TRUE(top.ok()) << top.status().ToString();
  EXPECT_EQ(top->logprobs, 3);
  auto chosen = ParseChatRequest("{" + user + R"(, "logprobs": true})", {});
  ASSERT_TRUE(chosen.ok());
  EXPECT_EQ(chosen->logprobs, 0);
  auto off = ParseChatRequest("{" + user + R"(, "logprobs": false, "top_logprobs": 0})", {});
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->logprobs.has_value());
}

TEST(OpenAiRequest, RefusesWhatItWouldNotDoNamingTheField) {
  const std::map<std::string, std::string> cases = {
      {R"({"prompt": "x", "best_of": 9})", "'best_of' must be between 1 and 8"},
      {R"({"prompt": "x", "ignore_eos": 1})", "'ignore_eos' must be true or false"},
      {R"({"prompt": "x", "include_stop_str_in_output": "yes"})",
       "'include_stop_str_in_output' must be true or false"},
      {R"({"prompt": "x", "max_tokens": 4, "min_tokens": 5})",
       "'min_tokens' is 5, more than max_tokens (4)"},
      {R"({"prompt": "x", "min_tokens": -1})", "'min_tokens' must be between 0 and"},
      {R"({"prompt": "x", "min_tokens": 1.5})", "'min_tokens' must be"},
      {R"({"prompt": "x", "stop_token_ids": 7})", "'stop_token_ids' must be an array of token ids"},
      {R"({"prompt": "x", "stop_token_ids": [1, -1]})",
       "'stop_token_ids[1]' must be between 0 and 2147483647"},
      {R"({"prompt": "x", "stop_token_ids": [2147483648]})",
       "'stop_token_ids[0]' must be between 0 and 2147483647"},
      {R"({"prompt": "x", "stop_token_ids": ["7"]})", "'stop_token_ids[0]' must be an integer"},
      {R"({"prompt": "x", "n": 3, "best_of": 2})",
       "'best_of' is 2, fewer than the 3 choices asked for (n)"},
      {R"({"prompt": "x", "best_of": 2, "stream": true})", "'best_of' cannot be streamed"},
      {R"({"prompt": "x", "frequency_penalty": 2.5})", "'frequency_penalty' must be between -2"},
      {R"({"prompt": "x", "presence_penalty": "high"})", "'presence_penalty' must be a number"},
      {R"({"prompt": "x", "logprobs": 21})", "'logprobs' must be between 0 and 20"},
      {R"({"prompt": "x", "logprobs": true})", "'logprobs' must be an integer"},
      {R"({"prompt": "x", "echo": "yes"})", "'echo' must be true or false"},
      {R"({"prompt": "x", "return_tokens_as_token_ids": 1})", "'return_tokens_as_token_ids'"},
      {R"({"prompt": "x", "suffix": "end"})", "'suffix'"},
      {R"({"prompt": "x", "logit_bias": {"50256": -101}})",
       "'logit_bias.50256' must be between -100 and 100"},
      {R"({"prompt": "x", "logit_bias": {"050256": 1}})", "'logit_bias.050256' is not a token id"},
      {R"({"prompt": "x", "logit_bias": {"-1": 1}})", "'logit_bias.-1' is not a token id"},
      {R"({"prompt": "x", "logit_bias": {"": 1}})", "'logit_bias.' is not a token id"},
      {R"({"prompt": "x", "logit_bias": {"1.0": 1}})", "'logit_bias.1.0' is not a token id"},
      {R"({"prompt": "x", "logit_bias": {"4294967296": 1}})", "'logit_bias.4294967296' is not"},
      {R"({"prompt": "x", "logit_bias": {"7": "up"}})", "'logit_bias.7' must be a number"},
      {R"({"prompt": "x", "logit_bias": [[7, 1]]})", "'logit_bias' must be an object"},
      {R"({"prompt": "x", "temperature": 2.5})", "'temperature' must be between 0 and 2"},
      {R"({"prompt": "x", "temperature": "hot"})", "'temperature' must be a number"},
      {R"({"prompt": "x", "top_p": 0})", "'top_p' must be above 0"},
      {R"({"prompt": "x", "min_p": 1.5})", "'min_p' must be between 0 and 1"},
      {R"({"prompt": "x", "min_p": -0.1})", "'min_p' must be between 0 and 1"},
      {R"({"prompt": "x", "min_p": "0.1"})", "'min_p' must be a number"},
      {R"({"prompt": "x", "allowed_token_ids": []})",
       "'allowed_token_ids' must hold at least one token id"},
      {R"({"prompt": "x", "allowed_token_ids": 5})", "'allowed_token_ids' must be an array"},
      {R"({"prompt": "x", "allowed_token_ids": [1, -1]})", "'allowed_token_ids[1]'"},
      {R"({"prompt": "x", "n": 9})", "'n' must be between 1 and 8"},
      {R"({"prompt": "x", "n": 1.5})", "'n' must be an integer"},
      {R"({"prompt": "x", "max_tokens": 0})", "'max_tokens' must be at least 1 (0 only with"},
      {R"({"prompt": "x", "max_tokens": -1})", "'max_tokens' must be between 0"},
      {R"({"prompt": "x", "max_tokens": 18446744073709551615})", "'max_tokens' must be between"},
      {R"({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", "'stop' holds 5 strings"},
      {R"({"prompt": "x", "stop": [""]})", "'stop' must not hold an empty string"},
      {R"({"prompt": "x", "stop": 7})", "'stop' must be a string or an array"},
      {R"({"prompt": "x", "stream": "yes"})", "'stream' must be true or false"},
      {R"({"prompt": "x", "stream_options": {"chunk": 1}})", "'stream_options.chunk'"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})",
       "'stream_options' is only allowed with \"stream\": true"},
      {R"({"prompt": "x", "stream": false, "stream_options": {"include_usage": true}})",
       "'stream_options' is only allowed with \"stream\": true"},
      {R"({"prompt": "x", "functions": []})", "'functions' is not a field"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema"}})",
       "'response_format' json_schema needs a \"json_schema\" object"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {
          "type": "object", "properties": {"a": {"type": "string", "pattern": "^a"}}}}}})",
       "'response_format' json_schema: /properties/a/pattern: 'pattern' is not supported"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {},
          "strict": 1}}})",
       "'response_format' json_schema.strict must be true or false"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {},
          "format": "x"}}})",
       "'response_format' json_schema has no field 'format'"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {}, "x": 1}})",
       "'response_format' has no field 'x'"},
      {R"({"prompt": "x", "response_format": "json_object"})", "'response_format' must be"},
      {R"({"prompt": [true]})", "'prompt' must be a string, an array of token ids, or an"},
      {R"({"prompt": ["a", 7]})", "'prompt[1]' must be a string, an array of token ids, or an"},
      {R"({"prompt": []})", "'prompt' must be a string, an array of token ids, or an"},
      {R"({"prompt": ["a", []]})", "'prompt[1]' must not be empty"},
      {R"({"prompt": [[1], [2, -3]]})", "'prompt[1]' must be between 0 and 2147483647"},
      {R"({"prompt": [1, "a"]})", "'prompt' must be an integer"},
      {R"({"prompt": [1, -2]})", "'prompt' must be between 0"},
      {R"({"max_tokens": 3})", "'prompt' is missing"},
      {R"({"prompt": "x", "prompt": "y"})", "duplicate key"},
      {R"([1, 2])", "not a JSON object"},
      {R"({"prompt": )", "not valid JSON"},
  };
  for (const auto& [body, expected] : cases) {
    auto r = ParseCompletionRequest(body, {});
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << body;
    EXPECT_NE(r.status().message().find(expected), std::string::npos)
        << body << " -> " << r.status().message();
  }
  const std::map<std::string, std::string> chat_cases = {
      {R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2,
          "min_tokens": 3})",
       "'min_tokens' is 3, more than max_completion_tokens (2)"},
      {R"({"messages": []})", "'messages' must be a non-empty array"},
      {R"({"messages": [{"role": "tool", "content": "x"}]})", "'messages.tool_call_id' is missing"},
      {R"({"messages": [{"role": "robot", "content": "x"}]})", "'messages.role'"},
      {R"({"messages": [{"role": "user"}]})", "'messages.content' is missing"},
      {R"({"messages": [{"role": "user", "content": "x", "name": "bob"}]})", "'messages.name'"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
       "'messages.content' parts must be"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})",
       "'tools'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema",
          "json_schema": {"name": "n", "schema": {"type": "string"}}}})",
       "'response_format' json_schema: the schema: the answer is a JSON object"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema",
          "json_schema": {"name": "n", "schema": {"type": "object"}}},
          "tools": [{"type": "function", "function": {"name": "f"}}]})",
       "'response_format' json_schema with tools is not supported"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json"}})",
       "'response_format' must be"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"},
          "tools": [{"type": "function", "function": {"name": "f"}}]})",
       "'response_format' json_object with tools is not supported"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object",
          "strict": true}})",
       "'response_format' must be"},
      {R"({"messages": [{"role": "user", "content": "x"}], "prompt": "y"})",
       "'prompt' is not a field of a chat completion request"},
      {R"({"model": "m"})", "'messages' is missing"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",
       "'top_logprobs' needs \"logprobs\": true"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})",
       "'top_logprobs' must be between 0 and 20"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 3})",
       "'logprobs' must be true or false"},
      {R"({"messages": [{"role": "user", "content": "x"}], "echo": true})",
       "'echo' is not a field of a chat completion request"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})",
       "'max_tokens' must be at least 1"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
          "max_completion_tokens": 6})",
       "'max_completion_tokens' is 6 and max_tokens 5: send one of them"},
  };
  for (const auto& [body, expected] : chat_cases) {
    auto r = ParseChatRequest(body, {});
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_NE(r.status().message().find(expected), std::string::npos)
        << body << " -> " << r.status().message();
  }
  // The two names of the bound may both be sent when they agree.
  auto both = ParseChatRequest(
      R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
          "max_completion_tokens": 5})",
      {});
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(both->max_tokens, 5);
}

// A tool-calling conversation as OpenAI's clients send it: tools, an assistant's call (its
// arguments the text of a JSON object) and the tool's answer.
constexpr std::string_view kToolRequest = R"({
  "messages": [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
    {"role": "tool", "content": "{\"temperature\": 21.5}", "tool_call_id": "call_1"},
    {"role": "user", "content": "Thanks"}],
  "tools": [{"type": "function", "function": {"name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
      "unit": {"type": "string", "enum": ["celsius", "kelvin"]}}, "required": ["city"]}}}]
})";

TEST(OpenAiRequest, ParsesToolsCallsAndAnswersAsClientsSendThem) {
  auto r = ParseChatRequest(kToolRequest, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tool_names, (std::vector<std::string>{"get_weather"}));
  // The tools as the client wrote them, keys in its order (not sorted), for the template.
  EXPECT_LT(r->tools_json.find("\"description\""), r->tools_json.find("\"parameters\""));
  EXPECT_LT(r->tools_json.find("\"unit\""), r->tools_json.find("\"required\""));
  ASSERT_EQ(r->messages.size(), 5u);
  EXPECT_EQ(r->messages[2].tool_calls,
            (std::vector<ToolCall>{{.id = "call_1",
                                    .name = "get_weather",
                                    .arguments = R"({"city": "Paris", "unit": "celsius"})"}}));
  EXPECT_EQ(r->messages[3].role, "tool");
  EXPECT_EQ(r->messages[3].tool_call_id, "call_1");
  // An assistant's message may hold only calls (content null or absent).
  for (const char* content : {R"("content": null, )", ""}) {
    const std::string body = std::string(R"({"messages": [{"role": "user", "content": "x"},
        {"role": "assistant", )") +
                             content +
                             R"("tool_calls": [{"id": "c", "type": "function",
        "function": {"name": "f", "arguments": "{}"}}]}]})";
    auto only_calls = ParseChatRequest(body, {});
    ASSERT_TRUE(only_calls.ok()) << body << only_calls.status().ToString();
    EXPECT_TRUE(only_calls->messages[1].content_null);
  }
  // tool_choice "none": the model is not told of the tools.
  const std::string none = std::string(kToolRequest).insert(1, R"("tool_choice": "none", )");
  auto without = ParseChatRequest(none, {});
  ASSERT_TRUE(without.ok()) << without.status().ToString();
  EXPECT_TRUE(without->tools_json.empty());
  EXPECT_TRUE(without->tool_names.empty());
  const std::string automatic = std::string(kToolRequest).insert(1, R"("tool_choice": "auto", )");
  EXPECT_EQ(ParseChatRequest(automatic, {})->tool_names.size(), 1u);
}

// chat_template_kwargs (vLLM's): more variables for the model's own template, by their names;
// not the ones colony api sets from the request itself.
TEST(OpenAiRequest, ChatTemplateKwargsAreVariablesOfTheTemplate) {
  const std::string user = R"({"messages": [{"role": "user", "content": "x"}], )";
  auto r = ParseChatRequest(
      user + R"("chat_template_kwargs": {"enable_thinking": false, "n": [1]}})", {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->template_kwargs_json, R"({"enable_thinking":false,"n":[1]})");
  const std::map<std::string, std::string> cases = {
      {R"("chat_template_kwargs": [1]})", "'chat_template_kwargs' must be an object"},
      {R"("chat_template_kwargs": {"messages": []}})",
       "'chat_template_kwargs.messages' is set by colony api"},
      {R"("chat_template_kwargs": {"raise_exception": 1}})",
       "'chat_template_kwargs.raise_exception' is set by colony api"},
      {R"("chat_template_kwargs": {"pad_token": "x"}})",
       "'chat_template_kwargs.pad_token' is set by colony api"},
      {R"("chat_template_kwargs": {"namespace": 1}})",
       "'chat_template_kwargs.namespace' is set by colony api"},
      {R"("chat_template_kwargs": {"joiner": 1}})",
       "'chat_template_kwargs.joiner' is set by colony api"},
      {R"("chat_template_kwargs": {"": 1}})", "'chat_template_kwargs.' is not a template"},
      {R"("chat_template_kwargs": {"a-b": 1}})", "'chat_template_kwargs.a-b' is not a template"},
      {R"("chat_template_kwargs": {"1a": 1}})", "'chat_template_kwargs.1a' is not a template"},
  };
  for (const auto& [rest, expected] : cases) {
    auto bad = ParseChatRequest(user + rest, {});
    ASSERT_FALSE(bad.ok()) << rest;
    EXPECT_NE(bad.status().message().find(expected), std::string::npos)
        << rest << " -> " << bad.status().message();
  }
  EXPECT_FALSE(ParseCompletionRequest(R"({"prompt": "x", "chat_template_kwargs": {}})", {}).ok());
}

// What a client (or an attacker) may get wrong about tools, each refused by the field's name.
TEST(OpenAiRequest, RefusesMalformedToolsAndCallsNamingTheField) {
  const std::string user = R"({"role": "user", "content": "x"})";
  const auto with_tools = [&](const std::string& tools) {
    return R"({"messages": [)" + user + R"(], "tools": )" + tools + "}";
  };
  const auto with_call = [&](const std::string& call) {
    return R"({"messages": [)" + user + R"(, {"role": "assistant", "tool_calls": [)" + call +
           "]}]}";
  };
  const std::string f = R"({"type": "function", "function": {"name": "f"}})";
  const std::string deep = std::string(40, '[') + std::string(40, ']');
  const std::map<std::string, std::string> cases = {
      {with_tools("{}"), "'tools' must be an array"},
      {with_tools(R"([{"type": "retrieval"}])"), "'tools' must hold"},
      {with_tools(R"([{"type": "function", "function": {"description": "d"}}])"),
       "'tools.function.name' is missing"},
      {with_tools(R"([{"type": "function", "function": {"name": "a b"}}])"),
       "'tools.function.name' must be 1 to 64 letters"},
      {with_tools(R"([{"type": "function", "function": {"name": ")" + std::string(65, 'a') +
                  R"("}}])"),
       "'tools.function.name' must be 1 to 64"},
      {with_tools("[" + f + ", " + f + "]"), "'tools.function.name' 'f' names two tools"},
      {with_tools(R"([{"type": "function", "function": {"name": "f", "parameters": "x"}}])"),
       "'tools.function.parameters' must be a JSON schema object"},
      {with_tools(R"([{"type": "function", "function": {"name": "f", "strict": true}}])"),
       "'tools.function.strict' is not supported"},
      {with_tools(R"([{"type": "function", "function": {"name": "f", "code": "x"}}])"),
       "'tools.function.code' is not supported"},
      {with_tools(R"([{"type": "function", "function": {"name": "f", "parameters": )" + deep +
                  "}}]"),
       "nests deeper than 32"},
      {with_tools("[" + f + R"(], "tool_choice": "required")"), "'tool_choice' is not supported"},
      {with_tools("[" + f + R"(], "tool_choice": {"type": "function", "function": {"name": "f"}})"),
       "'tool_choice' is not supported"},
      {with_tools("[" + f + R"(], "parallel_tool_calls": false)"), "'parallel_tool_calls'"},
      {with_call(R"({"type": "function", "function": {"name": "f", "arguments": "{}"}})"),
       "'messages.tool_calls.id' is missing"},
      {with_call(R"({"id": "c", "type": "code", "function": {"name": "f", "arguments": "{}"}})"),
       "'messages.tool_calls.type' must be \"function\""},
      {with_call(R"({"id": "c", "type": "function", "function": {"name": "f"}})"),
       "'messages.tool_calls.function.arguments' is missing"},
      {with_call(
           R"({"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}})"),
       "'messages.tool_calls.function.arguments' is not a JSON object"},
      {with_call(R"({"id": "c", "type": "function", "function": {"name": "f", "arguments": "{"}})"),
       "'messages.tool_calls.function.arguments' is not valid JSON"},
      {with_call(R"({"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}})"),
       "'messages.tool_calls.function.arguments' must be a string"},
      {with_call(R"({"id": ")" + std::string(257, 'i') +
                 R"(", "type": "function", "function": {"name": "f", "arguments": "{}"}})"),
       "'messages.tool_calls.id' is at most 256 bytes"},
      {R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})",
       "'messages.tool_calls' belong to an assistant's message"},
      {R"({"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]})",
       "'messages.tool_call_id' belongs to a tool's message"},
      {R"({"messages": [{"role": "assistant", "content": null}]})",
       "'messages.content' must not be null"},
      {R"({"messages": [{"role": "assistant", "tool_calls": []}]})",
       "'messages.content' is missing"},
      {R"({"messages": [{"role": "tool", "content": "x", "tool_call_id": ""}]})",
       "'messages.tool_call_id' must be 1 to 256 bytes"},
  };
  for (const auto& [body, expected] : cases) {
    auto r = ParseChatRequest(body, {});
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << body;
    EXPECT_NE(r.status().message().find(expected), std::string::npos)
        << body << " -> " << r.status().message();
  }
  // Bounds: tools per request and calls per message.
  std::string many_tools = "[";
  for (int i = 0; i < 3; ++i) {
    many_tools += (i > 0 ? ", " : "") +
                  std::string(R"({"type": "function", "function": {"name": "f)") +
                  std::to_string(i) + R"("}})";
  }
  many_tools += "]";
  RequestLimits limits;
  limits.max_tools = 2;
  limits.max_tool_calls = 1;
  auto too_many = ParseChatRequest(with_tools(many_tools), limits);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("'tools' holds 3 tools; at most 2"),
            std::string::npos);
  const std::string call =
      R"({"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}})";
  auto too_many_calls = ParseChatRequest(with_call(call + ", " + call), limits);
  ASSERT_FALSE(too_many_calls.ok());
  EXPECT_NE(too_many_calls.status().message().find("'messages.tool_calls' holds 2 calls"),
            std::string::npos);
}

// vLLM's /tokenize and /detokenize: a prompt (text) or a chat; token ids back to text.
TEST(OpenAiRequest, TokenizeAndDetokenizeRequestsAreParsedAsVllmsAndRefusedNamingTheField) {
  auto prompt = ParseTokenizeRequest(R"({"model": "m", "prompt": "Hi there"})", {});
  ASSERT_TRUE(prompt.ok()) << prompt.status().ToString();
  EXPECT_EQ(prompt->what.model, "m");
  EXPECT_FALSE(prompt->what.chat);
  ASSERT_EQ(prompt->what.prompts.size(), 1u);
  EXPECT_EQ(prompt->what.prompts[0].text, "Hi there");
  EXPECT_TRUE(prompt->add_special_tokens);  // vLLM's default for a prompt
  auto bare = ParseTokenizeRequest(R"({"prompt": "x", "add_special_tokens": false})", {});
  ASSERT_TRUE(bare.ok()) << bare.status().ToString();
  EXPECT_FALSE(bare->add_special_tokens);
  auto chat = ParseTokenizeRequest(
      R"({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true,
          "chat_template_kwargs": {"enable_thinking": false}, "return_token_strs": false})",
      {});
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  EXPECT_TRUE(chat->what.chat);
  ASSERT_EQ(chat->what.messages.size(), 1u);
  EXPECT_EQ(chat->what.messages[0].content, "hi");
  EXPECT_EQ(chat->what.template_kwargs_json, R"({"enable_thinking":false})");
  EXPECT_FALSE(chat->add_special_tokens);  // the template writes them
  auto ids = ParseDetokenizeRequest(R"({"model": "m", "tokens": [0, 5, 2147483647]})", {});
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(ids->model, "m");
  EXPECT_EQ(ids->tokens, (std::vector<int64_t>{0, 5, 2147483647}));

  const std::map<std::string, std::string> tokenize_cases = {
      {R"({})", "'prompt' or 'messages' must be given"},
      {R"({"prompt": "x", "messages": [{"role": "user", "content": "x"}]})",
       "'prompt' or 'messages' must be given, and not both"},
      {R"({"prompt": [1, 2]})", "'prompt' must be a string"},
      {R"({"prompt": ["a", "b"]})", "'prompt' must be a string"},
      {R"({"prompt": "x", "max_tokens": 3})", "'max_tokens' is not a field of a tokenize request"},
      {R"({"prompt": "x", "return_token_strs": true})",
       "'return_token_strs' is only supported as false"},
      {R"({"prompt": "x", "chat_template_kwargs": {"a": 1}})",
       "'chat_template_kwargs' needs 'messages'"},
      {R"({"prompt": "x", "add_generation_prompt": true})",
       "'add_generation_prompt' needs 'messages'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "add_special_tokens": true})",
       "'add_special_tokens' is only supported as false with messages"},
      {R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false})",
       "'add_generation_prompt' is only supported as true"},
      {R"({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true})",
       "'continue_final_message' is only supported as false"},
      {R"({"prompt": "x", "add_special_tokens": "yes"})",
       "'add_special_tokens' must be true or false"},
  };
  // Each body is refused with a message that holds its needle.
  auto refused = [](const auto& parse, const std::map<std::string, std::string>& cases) {
    for (const auto& [body, needle] : cases) {
      auto r = parse(body, RequestLimits{});
      ASSERT_FALSE(r.ok()) << body;
      EXPECT_NE(r.status().message().find(needle), std::string::npos)
          << body << ": " << r.status().message();
    }
  };
  refused(ParseTokenizeRequest, tokenize_cases);
  const std::map<std::string, std::string> detokenize_cases = {
      {R"({})", "'tokens' is missing"},
      {R"({"tokens": "1 2"})", "'tokens' must be an array of token ids"},
      {R"({"tokens": [1, -2]})", "'tokens[1]' must be between 0 and 2147483647"},
      {R"({"tokens": [1], "prompt": "x"})", "'prompt' is not a field of a detokenize request"},
  };
  refused(ParseDetokenizeRequest, detokenize_cases);
  RequestLimits limits;
  limits.max_prompt_tokens = 2;
  auto long_ids = ParseDetokenizeRequest(R"({"tokens": [1, 2, 3]})", limits);
  ASSERT_FALSE(long_ids.ok());
  EXPECT_EQ(long_ids.status().message(), "'tokens' holds 3 tokens; at most 2");
}

TEST(OpenAiRequest, LimitsBoundWhatOneRequestMayAskFor) {
  RequestLimits limits{.max_n = 2,
                       .max_messages = 3,
                       .max_stop = 1,
                       .max_stop_bytes = 4,
                       .max_prompts = 2,
                       .max_prompt_tokens = 5};
  EXPECT_FALSE(ParseCompletionRequest(R"({"prompt": "x", "n": 3})", limits).ok());
  EXPECT_FALSE(ParseCompletionRequest(R"({"prompt": [1, 2, 3, 4, 5, 6]})", limits).ok());
  EXPECT_FALSE(ParseCompletionRequest(R"({"prompt": [[1], [1, 2, 3, 4, 5, 6]]})", limits).ok());
  EXPECT_TRUE(ParseCompletionRequest(R"({"prompt": ["a", "b"]})", limits).ok());
  auto three = ParseCompletionRequest(R"({"prompt": ["a", "b", "c"]})", limits);
  ASSERT_FALSE(three.ok());
  EXPECT_EQ(three.status().message(), "'prompt' holds 3 prompts; at most 2");
  EXPECT_FALSE(ParseCompletionRequest(R"({"prompt": "x", "stop": ["a", "b"]})", limits).ok());
  EXPECT_FALSE(ParseCompletionRequest(R"({"prompt": "x", "stop": "abcde"})", limits).ok());
  EXPECT_FALSE(ParseChatRequest(R"({"messages": [{"role": "user", "content": "1"},
      {"role": "user", "content": "2"}, {"role": "user", "content": "3"},
      {"role": "user", "content": "4"}]})",
                                limits)
                   .ok());
  std::string deep =
      R"({"prompt": "x", "user": )" + std::string(100, '[') + std::string(100, ']') + "}";
  EXPECT_FALSE(ParseCompletionRequest(deep, {}).ok());
}

// The pieces as one string, BOS and EOS written as <BOS> and <EOS>.
std::string Joined(const Result<std::vector<ChatPiece>>& pieces) {
  if (!pieces.ok()) return "error: " + pieces.status().message();
  std::string out;
  for (const ChatPiece& p : *pieces) {
    out += p.kind == ChatPiece::kBos ? "<BOS>" : p.kind == ChatPiece::kEos ? "<EOS>" : p.text;
  }
  return out;
}

// Each template against the text its family's published Jinja template renders for the same
// conversation (written out by hand from tokenizer_config.json of Llama-3-8B-Instruct,
// Llama-2-7b-chat-hf and Mistral-7B-Instruct-v0.2).
TEST(ChatTemplate, RendersWhatEachFamilysOwnTemplateRenders) {
  const std::vector<ChatMessage> messages = {
      {"system", "Be brief."}, {"user", " Hi\n"}, {"assistant", "Hello."}, {"user", "Bye"}};
  EXPECT_EQ(Joined(RenderChat(ChatTemplate::kPlain, messages)),
            "<BOS>Be brief.\n\nUser:  Hi\n\nAssistant: Hello.\nUser: Bye\nAssistant:");
  EXPECT_EQ(Joined(RenderChat(ChatTemplate::kChatml, messages)),
            "<BOS><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi\n<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(Joined(RenderChat(ChatTemplate::kLlama3, messages)),
            "<BOS><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(Joined(RenderChat(ChatTemplate::kLlama2, messages)),
            "<BOS>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi [/INST] Hello. <EOS>"
            "<BOS>[INST] Bye [/INST]");
  EXPECT_EQ(Joined(RenderChat(ChatTemplate::kMistral, messages)),
            "<BOS>[INST] Be brief.\n\n Hi\n [/INST]Hello.<EOS>[INST] Bye [/INST]");
  EXPECT_EQ(Joined(RenderChat(ChatTemplate::kLlama2, {{"user", "Q"}})), "<BOS>[INST] Q [/INST]");

  // Llama 2's and Mistral's templates refuse turns out of order; so does Colony, naming them.
  const std::vector<std::vector<ChatMessage>> out_of_order = {
      {{"user", "a"}, {"user", "b"}},
      {{"assistant", "a"}, {"user", "b"}},
      {{"system", "s"}, {"assistant", "a"}},
      {{"user", "a"}, {"assistant", "b"}},
      {{"user", "a"}, {"system", "s"}, {"user", "b"}},
      {{"system", "s"}},
  };
  for (ChatTemplate t : {ChatTemplate::kLlama2, ChatTemplate::kMistral}) {
    for (const auto& m : out_of_order) {
      auto r = RenderChat(t, m);
      ASSERT_FALSE(r.ok()) << ChatTemplateName(t) << ": " << Joined(r);
      EXPECT_TRUE(r.status().message().starts_with("'messages'")) << r.status().message();
    }
  }

  EXPECT_EQ(ChatStops(ChatTemplate::kPlain), (std::vector<std::string>{"\nUser:"}));
  EXPECT_EQ(ChatStops(ChatTemplate::kChatml), (std::vector<std::string>{"<|im_end|>"}));
  EXPECT_EQ(ChatStops(ChatTemplate::kLlama3), (std::vector<std::string>{"<|eot_id|>"}));
  for (std::string_view name : {"plain", "chatml", "llama3", "llama2", "mistral"}) {
    auto t = ParseChatTemplate(name);
    ASSERT_TRUE(t.ok()) << name;
    EXPECT_EQ(ChatTemplateName(*t), name);
  }
  EXPECT_FALSE(ParseChatTemplate("llama3.1").ok());
}

// The transformers fixture's byte-level tokenizer with Llama 3's chat markers added as special
// tokens (ids 2048 to 2050) and its BOS prepended by the post-processor, as Llama 3's
// tokenizer.json has them.
model::Tokenizer Llama3LikeTokenizer() {
  const std::string file =
      std::string(COLONY_HF_FIXTURES) + "/tokenizer-bytelevel-bpe/tokenizer.json";
  nlohmann::json j = nlohmann::json::parse(std::ifstream(file));
  int id = 2048;
  for (const char* marker : {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}) {
    j["added_tokens"].push_back({{"id", id++},
                                 {"content", marker},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", true}});
  }
  const nlohmann::json bos = {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}};
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair",
       {bos,
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        bos,
        {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens",
       {{"<|begin_of_text|>",
         {{"id", "<|begin_of_text|>"}, {"ids", {0}}, {"tokens", {"<|begin_of_text|>"}}}}}}};
  auto tok = model::Tokenizer::FromHfJson(
      j.dump(), R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"})");
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return std::move(*tok);
}

TEST(ChatTemplate, EncodesMarkersAsTokensAndEndsTheTurnAtItsSpecialToken) {
  const model::Tokenizer tok = Llama3LikeTokenizer();
  auto pieces = RenderChat(ChatTemplate::kLlama3, {{"user", "Hi"}});
  ASSERT_TRUE(pieces.ok());
  const std::vector<int64_t> ids = EncodeChat(*pieces, tok);
  std::vector<int64_t> want = {0, 2048};  // BOS, <|start_header_id|>
  for (int32_t t : tok.Encode("user")) want.push_back(t);
  want.push_back(2049);
  for (int32_t t : tok.Encode("\n\nHi")) want.push_back(t);
  want.insert(want.end(), {2050, 2048});
  for (int32_t t : tok.Encode("assistant")) want.push_back(t);
  want.push_back(2049);
  for (int32_t t : tok.Encode("\n\n")) want.push_back(t);
  EXPECT_EQ(ids, want);
  // <|eot_id|> is special: decoding skips it, so the stop string alone would never be seen.
  EXPECT_EQ(ChatStopTokens(ChatTemplate::kLlama3, tok), (std::vector<int64_t>{2050}));
  EXPECT_TRUE(ChatStopTokens(ChatTemplate::kPlain, tok).empty());
  EXPECT_TRUE(CheckChatTemplate(ChatTemplate::kLlama3, tok).ok());

  // BOS and EOS between Llama 2's turns are the tokenizer's tokens, not the text "<s>".
  auto llama2 =
      RenderChat(ChatTemplate::kLlama2, {{"user", "a"}, {"assistant", "b"}, {"user", "c"}});
  ASSERT_TRUE(llama2.ok());
  const std::vector<int64_t> l2 = EncodeChat(*llama2, tok);
  EXPECT_EQ(std::ranges::count(l2, 0), 2);  // BOS before each user turn
  EXPECT_EQ(std::ranges::count(l2, 1), 1);  // EOS after the answer

  // Without the markers as tokens, llama3 is refused by name; without BOS, llama2 and mistral.
  auto plain = model::Tokenizer::FromHfJson(colony::test::ReadFile(
      std::string(COLONY_HF_FIXTURES) + "/tokenizer-bytelevel-bpe/tokenizer.json"));
  ASSERT_TRUE(plain.ok());
  const Status st = CheckChatTemplate(ChatTemplate::kLlama3, *plain);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("'<|start_header_id|>' as one token"), std::string::npos)
      << st.message();
  if (plain->bos_id() < 0) {
    EXPECT_FALSE(CheckChatTemplate(ChatTemplate::kLlama2, *plain).ok());
  }
}

std::string JinjaTemplate(const std::string& name) {
  return colony::test::ReadFile(std::string(COLONY_JINJA_DATA) + "/templates/" + name + ".jinja");
}

const std::vector<ChatMessage> kTurns = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};

// Llama 3's and Llama 2's own templates, run, give the tokens their written-out twins give (which
// the test above holds to the families' published output), and Llama 3's turn ends at its
// <|eot_id|> token, found by rendering the template, not by knowing it.
TEST(ModelChatTemplate, RunsTheModelsOwnTemplateToTheTokensOfItsWrittenOutTwin) {
  const model::Tokenizer tok = Llama3LikeTokenizer();
  const ModelChatTemplate::Tokens tokens{
      .bos = "<|begin_of_text|>", .eos = "<|end_of_text|>", .unk = "", .pad = ""};
  auto llama3 = ModelChatTemplate::FromSource(JinjaTemplate("llama3"), "llama3.jinja", tokens);
  ASSERT_TRUE(llama3.ok()) << llama3.status().ToString();
  auto own = llama3->Render(kTurns);
  ASSERT_TRUE(own.ok()) << own.status().ToString();
  auto twin = RenderChat(ChatTemplate::kLlama3, kTurns);
  ASSERT_TRUE(twin.ok());
  EXPECT_EQ(EncodeChat(*own, tok), EncodeChat(*twin, tok));
  EXPECT_EQ((*own)[0].kind, ChatPiece::kBos);
  const auto end = llama3->EndOfTurn(tok);
  EXPECT_EQ(end.tokens, (std::vector<int64_t>{2050}));
  EXPECT_EQ(end.stops, (std::vector<std::string>{"<|eot_id|>"}));

  // Llama 2 writes BOS and EOS as text between turns: split out, they are the tokenizer's.
  auto llama2 = ModelChatTemplate::FromSource(JinjaTemplate("llama2"), "llama2.jinja", tokens);
  ASSERT_TRUE(llama2.ok()) << llama2.status().ToString();
  auto own2 = llama2->Render(kTurns);
  ASSERT_TRUE(own2.ok()) << own2.status().ToString();
  auto twin2 = RenderChat(ChatTemplate::kLlama2, kTurns);
  ASSERT_TRUE(twin2.ok());
  EXPECT_EQ(EncodeChat(*own2, tok), EncodeChat(*twin2, tok));
  EXPECT_EQ(std::ranges::count(EncodeChat(*own2, tok), 0), 2);
  // Its answer ends with EOS, which ends generation anyway.
  EXPECT_TRUE(llama2->EndOfTurn(tok).tokens.empty());
  EXPECT_TRUE(llama2->EndOfTurn(tok).stops.empty());
  // Its own refusal reaches the client by the field's name and in its own words.
  auto refused = llama2->Render({{"user", "a"}, {"user", "b"}});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "'messages': Conversation roles must alternate user/assistant/user/assistant/...");

  // A base model's template of plain text ends the turn where the next one starts.
  auto plain = ModelChatTemplate::FromSource(
      "{% for m in messages %}{{ m.role|capitalize }}: {{ m.content }}\n{% endfor %}"
      "{% if add_generation_prompt %}Assistant:{% endif %}",
      "plain.jinja", {});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->EndOfTurn(tok).stops, (std::vector<std::string>{"\nUser:"}));
  EXPECT_TRUE(plain->EndOfTurn(tok).tokens.empty());
  // ChatML's with a tokenizer that has no <|im_end|> token: its text, up to the line's end.
  auto chatml = ModelChatTemplate::FromSource(JinjaTemplate("chatml"), "chatml.jinja", tokens);
  ASSERT_TRUE(chatml.ok());
  EXPECT_EQ(chatml->EndOfTurn(tok).stops, (std::vector<std::string>{"<|im_end|>"}));
  EXPECT_TRUE(chatml->EndOfTurn(tok).tokens.empty());
}

// A template that fails on an ordinary conversation (here one that reads a variable
// transformers does not define) is refused when colony api starts, by file and line, not on every
// request; one that only refuses some conversations itself (raise_exception) passes, and its
// refusal reaches the client in its own words.
TEST(ModelChatTemplate, ATemplateThatFailsOnAPlainConversationIsRefusedAtStart) {
  auto broken = ModelChatTemplate::FromSource(
      "{% for m in messages %}\n{{ m.role ~ ': ' ~ m.content ~ settings.suffix }}{% endfor %}",
      "t.jinja", {});
  ASSERT_TRUE(broken.ok()) << broken.status().ToString();
  const Status st = broken->Check();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "t.jinja: the chat template fails on a conversation of a user's, an assistant's and a "
            "user's turn: line 2: 'settings' is undefined");
  auto rendered = broken->Render({{"user", "Hi"}});
  ASSERT_FALSE(rendered.ok());
  EXPECT_EQ(rendered.status().message(),
            "'messages': the model's chat template (t.jinja) failed on them: line 2: 'settings' is "
            "undefined");

  auto gemma = ModelChatTemplate::FromSource(JinjaTemplate("gemma"), "gemma.jinja", {});
  ASSERT_TRUE(gemma.ok()) << gemma.status().ToString();
  EXPECT_TRUE(gemma->Check().ok()) << gemma->Check().ToString();
  auto refused = gemma->Render(kTurns);  // a system turn, which Gemma's template refuses
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), "'messages': System role not supported");
}

// A request's tools, calls and answers reach the model's own template as transformers hands
// them over (arguments as an object): the prompt is, byte for byte, what Jinja itself renders
// from the same conversation (references.json, make_references.py's TOOL_TURNS).
TEST(ModelChatTemplate, RendersARequestsToolsAndCallsAsJinjaDoes) {
  std::ifstream in(std::string(COLONY_JINJA_DATA) + "/references.json");
  const auto refs = nlohmann::json::parse(in);
  auto request = ParseChatRequest(kToolRequest, {});
  ASSERT_TRUE(request.ok()) << request.status().ToString();
  const ModelChatTemplate::Tokens tokens{
      .bos = "<s>", .eos = "</s>", .unk = "<unk>", .pad = "<pad>"};
  int compared = 0;
  for (const auto& c : refs["cases"]) {
    if (c["context"]["tools"].is_null()) continue;
    const std::string name = c["template"];
    auto t = ModelChatTemplate::FromSource(JinjaTemplate(name), name + ".jinja", tokens);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    auto pieces = t->Render(request->messages, request->tools_json);
    ASSERT_TRUE(pieces.ok()) << name << ": " << pieces.status().ToString();
    std::string text;
    for (const ChatPiece& p : *pieces) text += p.text;
    EXPECT_EQ(text, c["output"].get<std::string>()) << name;
    ++compared;
  }
  EXPECT_EQ(compared, 2);  // Qwen2.5's and Llama 3.1's

  // What each family's template tells its model to write.
  const std::map<std::string, ToolCallFormat> formats = {{"qwen2.5", ToolCallFormat::kHermes},
                                                         {"llama3.1", ToolCallFormat::kLlama3Json},
                                                         {"llama3", ToolCallFormat::kNone},
                                                         {"chatml", ToolCallFormat::kNone}};
  for (const auto& [name, format] : formats) {
    auto t = ModelChatTemplate::FromSource(JinjaTemplate(name), name, tokens);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->tool_format(), format) << name;
  }
  // chat_template_kwargs are the template's variables (Qwen3's switch of its thinking).
  auto qwen3 = ModelChatTemplate::FromSource(
      "{{ messages[0].content }}{% if enable_thinking is defined and not enable_thinking %}"
      "<think></think>{% endif %}",
      "qwen3.jinja", {});
  ASSERT_TRUE(qwen3.ok());
  auto thinking = qwen3->Render({{"user", "Hi"}});
  auto quiet = qwen3->Render({{"user", "Hi"}}, "", R"({"enable_thinking": false})");
  ASSERT_TRUE(thinking.ok() && quiet.ok());
  EXPECT_EQ((*thinking)[0].text, "Hi");
  EXPECT_EQ((*quiet)[0].text, "Hi<think></think>");

  // A template that never reads `tools` refuses them rather than drop them silently.
  auto llama2 = ModelChatTemplate::FromSource(JinjaTemplate("llama2"), "llama2.jinja", tokens);
  ASSERT_TRUE(llama2.ok());
  auto refused = llama2->Render({{"user", "Hi"}}, request->tools_json);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "'tools': the model's chat template (llama2.jinja) does not take tools");
}

TEST(ModelChatTemplate, FindsTheTemplateWhereTransformersSavesIt) {
  const colony::test::TempDir dir("chat-template");
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.File(name)) << text;
  };
  const auto rendered = [&]() -> std::string {
    auto t = ModelChatTemplate::Load(dir.path());
    if (!t.ok()) return "error: " + t.status().message();
    if (!t->has_value()) return "none";
    auto pieces = (*t)->Render({{"user", "Hi"}});
    if (!pieces.ok()) return "error: " + pieces.status().message();
    std::string out;
    for (const ChatPiece& p : *pieces) {
      out += p.kind == ChatPiece::kBos ? "<BOS>" : p.kind == ChatPiece::kEos ? "<EOS>" : p.text;
    }
    return out;
  };
  EXPECT_EQ(rendered(), "none");
  // tokenizer_config.json: the tokens' texts as strings or as transformers' AddedToken objects.
  write("tokenizer_config.json", R"({"bos_token": {"content": "<s>", "lstrip": false},
      "eos_token": "</s>", "chat_template": "{{ bos_token }}A:{{ messages[0].content }}{{ eos_token }}"})");
  EXPECT_EQ(rendered(), "<BOS>A:Hi<EOS>");
  // transformers' list of named templates: the one named "default".
  write("tokenizer_config.json", R"({"bos_token": "<s>", "chat_template": [
      {"name": "tool_use", "template": "T"}, {"name": "default", "template": "D:{{ bos_token }}"}]})");
  EXPECT_EQ(rendered(), "D:<BOS>");
  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
  EXPECT_EQ(rendered(), "error: " + dir.File("tokenizer_config.json") +
                            "'s chat_template is a list without a template named \"default\"");
  // chat_template.json, then chat_template.jinja (what transformers writes today) come first.
  write("chat_template.json", R"({"chat_template": "J:{{ messages|length }}"})");
  EXPECT_EQ(rendered(), "J:1");
  write("chat_template.jinja", "K:{{ messages[0].role }}\n");
  EXPECT_EQ(rendered(), "K:user");
  // One Colony cannot run is refused by file, line and name when it is loaded.
  write("chat_template.jinja", "ok\n{{ messages|shuffle }}");
  EXPECT_EQ(rendered(), "error: " + dir.File("chat_template.jinja") +
                            ": the chat template line 2: no filter named 'shuffle'");
}

// transformers' apply_chat_template runs a model's "tool_use" template for a request with tools
// and its default one for every other (Hermes 2 Pro and Command-R carry both): from a
// tokenizer_config.json list or from additional_chat_templates/ beside chat_template.jinja. The
// prompt with tools is, byte for byte, what Jinja renders from the tool_use template
// (references.json); without them, what the default template alone renders.
TEST(ModelChatTemplate, RunsTheToolUseTemplateForRequestsWithToolsAsTransformersDoes) {
  std::ifstream in(std::string(COLONY_JINJA_DATA) + "/references.json");
  const auto refs = nlohmann::json::parse(in);
  std::string with_tools_reference;
  for (const auto& c : refs["cases"]) {
    if (c["template"] == "qwen2.5" && !c["context"]["tools"].is_null()) {
      with_tools_reference = c["output"].get<std::string>();
    }
  }
  ASSERT_FALSE(with_tools_reference.empty());
  auto request = ParseChatRequest(kToolRequest, {});
  ASSERT_TRUE(request.ok()) << request.status().ToString();
  const std::vector<ChatMessage> plain = {{"user", "Hi"}};
  const auto text_of = [](const Result<std::vector<ChatPiece>>& pieces) -> std::string {
    if (!pieces.ok()) return "error: " + pieces.status().message();
    std::string text;
    for (const ChatPiece& p : *pieces) text += p.text;
    return text;
  };
  auto llama3 =
      ModelChatTemplate::FromSource(JinjaTemplate("llama3"), "llama3",
                                    {.bos = "<|begin_of_text|>", .eos = "", .unk = "", .pad = ""});
  ASSERT_TRUE(llama3.ok());
  const std::string without_tools_reference = text_of(llama3->Render(plain));
  ASSERT_NE(without_tools_reference.find("<|start_header_id|>user<|end_header_id|>\n\nHi"),
            std::string::npos)
      << without_tools_reference;

  const colony::test::TempDir dir("tool-use-template");
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.File(name)) << text;
  };
  const auto check = [&](const std::string& tool_use_file) {
    auto t = ModelChatTemplate::Load(dir.path());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ASSERT_TRUE(t->has_value());
    const ModelChatTemplate& both = **t;
    EXPECT_TRUE(both.has_tool_use());
    EXPECT_TRUE(both.Check().ok());
    EXPECT_EQ(text_of(both.Render(request->messages, request->tools_json)), with_tools_reference);
    EXPECT_EQ(text_of(both.Render(plain)), without_tools_reference);
    // The format the answer is read in is the one the tool_use template teaches.
    EXPECT_EQ(both.tool_format(), ToolCallFormat::kHermes);
    EXPECT_EQ(both.file(true), tool_use_file);
    // Each ends the assistant's turn its way: Llama 3's <|eot_id|> token, Qwen's <|im_end|>
    // (text to this tokenizer).
    const model::Tokenizer tok = Llama3LikeTokenizer();
    EXPECT_EQ(both.EndOfTurn(tok).tokens, (std::vector<int64_t>{2050}));
    EXPECT_EQ(both.EndOfTurn(tok, /*tools=*/true).stops, (std::vector<std::string>{"<|im_end|>"}));
    EXPECT_TRUE(both.EndOfTurn(tok, /*tools=*/true).tokens.empty());
  };
  nlohmann::json config = {{"bos_token", "<|begin_of_text|>"},
                           {"chat_template",
                            {{{"name", "default"}, {"template", JinjaTemplate("llama3")}},
                             {{"name", "rag"}, {"template", "{{ documents }}"}},
                             {{"name", "tool_use"}, {"template", JinjaTemplate("qwen2.5")}}}}};
  write("tokenizer_config.json", config.dump());
  check(dir.File("tokenizer_config.json") + "'s \"tool_use\" chat_template");

  // What transformers saves today: the default in chat_template.jinja, the others by name in
  // additional_chat_templates/ (which then win over the configuration's list).
  write("tokenizer_config.json", R"({"bos_token": "<|begin_of_text|>"})");
  write("chat_template.jinja", JinjaTemplate("llama3"));
  std::filesystem::create_directory(dir.path() / "additional_chat_templates");
  write("additional_chat_templates/tool_use.jinja", JinjaTemplate("qwen2.5"));
  write("additional_chat_templates/rag.jinja", "{{ documents }}");
  check(dir.File("additional_chat_templates/tool_use.jinja"));

  // Without a tool_use template the default one runs with tools too (and refuses them here:
  // Llama 3's never reads them).
  std::filesystem::remove(dir.path() / "additional_chat_templates/tool_use.jinja");
  auto one = ModelChatTemplate::Load(dir.path());
  ASSERT_TRUE(one.ok() && one->has_value());
  EXPECT_FALSE((*one)->has_tool_use());
  EXPECT_EQ(text_of((*one)->Render(request->messages, request->tools_json)),
            "error: 'tools': the model's chat template (" + dir.File("chat_template.jinja") +
                ") does not take tools");

  // A tool_use template that fails on a plain conversation with a tool is refused at start.
  write("additional_chat_templates/tool_use.jinja", "{{ tools[0].function.nam.x }}");
  auto failing = ModelChatTemplate::Load(dir.path());
  ASSERT_TRUE(failing.ok() && failing->has_value());
  const Status checked = (*failing)->Check();
  EXPECT_NE(checked.message().find(dir.File("additional_chat_templates/tool_use.jinja") +
                                   ": the chat template fails on a conversation of a user's, an "
                                   "assistant's and a user's turn with a tool offered"),
            std::string::npos)
      << checked.ToString();

  // Templates transformers could not pair with a default one, or lists it would misread.
  const auto refused = [&]() -> std::string {
    auto t = ModelChatTemplate::Load(dir.path());
    return t.ok() ? "loaded" : t.status().message();
  };
  std::filesystem::remove(dir.path() / "chat_template.jinja");
  std::filesystem::remove(dir.path() / "additional_chat_templates/tool_use.jinja");
  EXPECT_EQ(refused(), dir.File("additional_chat_templates/rag.jinja") +
                           " is a chat template of a model directory without "
                           "chat_template.jinja, which transformers saves as the default "
                           "template beside it");
  std::filesystem::remove_all(dir.path() / "additional_chat_templates");
  write("tokenizer_config.json", R"({"chat_template": [{"name": "default", "template": "D"},
      {"name": "tool_use", "template": "T"}, {"name": "default", "template": "E"}]})");
  EXPECT_EQ(refused(), dir.File("tokenizer_config.json") +
                           "'s chat_template names a template \"default\" twice");
  write("tokenizer_config.json",
        R"({"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use"}]})");
  EXPECT_EQ(refused(), dir.File("tokenizer_config.json") +
                           "'s chat_template[1] must be an object with a string \"name\" and a "
                           "string \"template\"");
  write("tokenizer_config.json", R"({"chat_template": [{"name": "default", "template": "D"}, 7]})");
  EXPECT_EQ(refused(), dir.File("tokenizer_config.json") +
                           "'s chat_template[1] must be an object with a string \"name\" and a "
                           "string \"template\"");
}

// A decoder over a fixed table of token texts (tokens may hold parts of a UTF-8 character).
TextStream::Decode TableDecoder(std::vector<std::string> table) {
  return [table](std::span<const int32_t> ids) {
    std::string out;
    for (int32_t id : ids) out += table.at(static_cast<size_t>(id));
    return out;
  };
}

// Streams tokens 0..n-1 of the table and returns the pieces sent (and, when asked, the stop
// string that ended the text, "" for none). With include_stop every stop string is kept.
std::vector<std::string> StreamAll(const std::vector<std::string>& table,
                                   const std::vector<std::string>& stops, std::string* text,
                                   bool* stopped, int64_t min_tokens = 0, bool include_stop = false,
                                   std::string* stop = nullptr) {
  TextStream s(TableDecoder(table), stops, min_tokens, include_stop ? stops.size() : 0);
  std::vector<std::string> pieces;
  for (size_t i = 0; i < table.size() && !s.stopped(); ++i) {
    pieces.push_back(s.Add(static_cast<int64_t>(i)));
  }
  pieces.push_back(s.Finish());
  *text = s.text();
  *stopped = s.stopped();
  if (stop != nullptr) {
    *stop = s.stop_index() >= 0 ? stops.at(static_cast<size_t>(s.stop_index())) : "";
  }
  return pieces;
}

TEST(TextStream, CutsAtTheFirstStopStringAndNeverSendsItsStart) {
  // "Hello\nUser: more" split so that the stop string "\nUser:" spans three tokens.
  const std::vector<std::string> table = {"Hel", "lo", "\nU", "se", "r:", " more"};
  std::string text;
  bool stopped = false;
  auto pieces = StreamAll(table, {"\nUser:"}, &text, &stopped);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(text, "Hello");
  std::string joined;
  for (const auto& p : pieces) {
    EXPECT_EQ(p.find('\n'), std::string::npos) << "a stop string's start was sent: " << p;
    joined += p;
  }
  EXPECT_EQ(joined, "Hello");
  EXPECT_EQ(pieces[0], "Hel");  // sent at once: nothing in it can start the stop string
}

TEST(TextStream, ReleasesAHeldBackPrefixThatWasNoStopString) {
  const std::vector<std::string> table = {"a\nU", "ser", "s", " x"};
  std::string text;
  bool stopped = false;
  auto pieces = StreamAll(table, {"\nUser:"}, &text, &stopped);
  EXPECT_FALSE(stopped);
  EXPECT_EQ(text, "a\nUsers x");
  EXPECT_EQ(pieces[0], "a");  // "\nU" held back
  std::string joined;
  for (const auto& p : pieces) joined += p;
  EXPECT_EQ(joined, "a\nUsers x");
}

TEST(TextStream, NeverSendsHalfACharacter) {
  // "é" is C3 A9, "€" is E2 82 AC: split over tokens.
  const std::vector<std::string> table = {"caf\xC3", "\xA9 ", "\xE2\x82", "\xAC!"};
  std::string text;
  bool stopped = false;
  auto pieces = StreamAll(table, {}, &text, &stopped);
  EXPECT_EQ(pieces[0], "caf");
  EXPECT_EQ(pieces[1], "\xC3\xA9 ");
  EXPECT_EQ(pieces[2], "");
  EXPECT_EQ(pieces[3], "\xE2\x82\xAC!");
  EXPECT_EQ(text, "caf\xC3\xA9 \xE2\x82\xAC!");
}

TEST(TextStream, StreamedPiecesJoinToTheTextCutByHandWithAndWithoutMinTokens) {
  // Every split of a text into three tokens, every stop string, every min_tokens: the pieces
  // join to the text cut before the first occurrence (found with std::string::find) that ends
  // after the text of the first min_tokens tokens (min_tokens 0: the first occurrence), as vLLM
  // looks for stop strings only in the text after them; with include_stop (vLLM's
  // include_stop_str_in_output) cut after it. stop() names the stop string that cut.
  const std::string whole = "ab\nUser: cd\nUser: e";
  for (const std::string stop : {"\nUser:", "cd", "e", "zz", "b\n", "a"}) {
    for (size_t cut1 = 1; cut1 < whole.size(); ++cut1) {
      for (size_t cut2 = cut1 + 1; cut2 < whole.size(); ++cut2) {
        const std::vector<std::string> table = {
            whole.substr(0, cut1), whole.substr(cut1, cut2 - cut1), whole.substr(cut2)};
        for (int64_t min_tokens = 0; min_tokens <= 4; ++min_tokens) {
          size_t kept = 0;  // bytes of the first min_tokens tokens' text
          for (int64_t i = 0; i < std::min<int64_t>(min_tokens, 3); ++i) {
            kept += table[static_cast<size_t>(i)].size();
          }
          size_t at = whole.find(stop);
          while (at != std::string::npos && at + stop.size() <= kept) at = whole.find(stop, at + 1);
          for (const bool include : {false, true}) {
            const std::string expected =
                at == std::string::npos ? whole : whole.substr(0, at + (include ? stop.size() : 0));
            std::string text;
            std::string cut_by;
            bool stopped = false;
            auto pieces = StreamAll(table, {stop}, &text, &stopped, min_tokens, include, &cut_by);
            std::string joined;
            for (const auto& p : pieces) joined += p;
            const std::string where = "stop '" + stop + "' cuts " + std::to_string(cut1) + "," +
                                      std::to_string(cut2) + " min_tokens " +
                                      std::to_string(min_tokens) + " include " +
                                      std::to_string(static_cast<int>(include));
            EXPECT_EQ(joined, expected) << where;
            EXPECT_EQ(text, expected) << where;
            EXPECT_EQ(stopped, at != std::string::npos) << where;
            EXPECT_EQ(cut_by, at != std::string::npos ? stop : "") << where;
          }
        }
      }
    }
  }
  // A decoder that writes an unfinished character as U+FFFD and rewrites it when a later token
  // completes it (as byte-level decoders do): "\xC3", "\xA9", "!" with min_tokens 1 is
  // "\xEF\xBF\xBD" after the first token, "é!" after the third. The "!" is the third token's text
  // (and "é" was finished by the second), so each is a stop string.
  const TextStream::Decode replacing = [](std::span<const int32_t> ids) {
    const std::vector<std::string> table = {"\xC3", "\xA9", "!"};
    std::string out;
    for (int32_t id : ids) out += table.at(static_cast<size_t>(id));
    if (out.ends_with("\xC3")) out.replace(out.size() - 1, 1, "\xEF\xBF\xBD");
    return out;
  };
  for (const auto& [stop, expected] :
       std::vector<std::pair<std::string, std::string>>{{"!", "\xC3\xA9"}, {"\xC3\xA9", ""}}) {
    TextStream s(replacing, {stop}, /*min_tokens=*/1);
    for (int64_t t = 0; t < 3 && !s.stopped(); ++t) s.Add(t);
    s.Finish();
    EXPECT_TRUE(s.stopped()) << stop;
    EXPECT_EQ(s.text(), expected) << stop;
  }
}

TEST(TextStream, KeepsOnlyTheFirstKeptStopStringsInTheText) {
  // A request's stop strings come first and are kept (include_stop_str_in_output); a chat
  // template's end of turn after them is not.
  const std::vector<std::string> table = {"one", "\nUser:", " two"};
  for (const auto& [stops, text_is, index] :
       std::vector<std::tuple<std::vector<std::string>, std::string, int64_t>>{
           {{"ne", "\nUser:"}, "one", 0}, {{"zz", "\nUser:"}, "one", 1}}) {
    TextStream s(TableDecoder(table), stops, 0, /*kept=*/1);
    for (int64_t t = 0; t < 3 && !s.stopped(); ++t) s.Add(t);
    s.Finish();
    EXPECT_EQ(s.text(), text_is) << index;
    EXPECT_EQ(s.stop_index(), index);
  }
}

TEST(TextStream, NamesTheStopStringThatBeginsFirstAndOfTwoThereTheFirstGiven) {
  // One token "xabcd": "bc" begins before "cd" whatever their order; "abc" and "ab" begin at the
  // same place, and the first given is the one that cut (with include_stop, the text ends with
  // it).
  const std::vector<std::string> table = {"xabcd"};
  // {stops, the one that cuts, the text, the text with include_stop}
  for (const auto& [stops, cut_by, text_without, text_with] :
       std::vector<std::tuple<std::vector<std::string>, std::string, std::string, std::string>>{
           {{"cd", "bc"}, "bc", "xa", "xabc"},
           {{"bc", "cd"}, "bc", "xa", "xabc"},
           {{"abc", "ab"}, "abc", "x", "xabc"},
           {{"ab", "abc"}, "ab", "x", "xab"},
           {{"zz"}, "", "xabcd", "xabcd"}}) {
    for (const bool include : {false, true}) {
      std::string text;
      std::string stop;
      bool stopped = false;
      StreamAll(table, stops, &text, &stopped, 0, include, &stop);
      EXPECT_EQ(stop, cut_by) << cut_by;
      EXPECT_EQ(stopped, !cut_by.empty()) << cut_by;
      EXPECT_EQ(text, include ? text_with : text_without) << cut_by;
    }
  }
}

}  // namespace
}  // namespace colony::api
