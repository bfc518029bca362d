// The API's torch-free parts: OpenAI requests parsed field by field (and refused with the field's
// name), chat templates rendered to the documented text, and streamed text that never sends a
// stop string's start or half a character, checked against the whole text cut by hand.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "api/chat_template.h"
#include "api/openai_request.h"
#include "api/text_stream.h"

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
  EXPECT_EQ(r->prompt, "Hello");
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

  // Scoring a prompt as lm-eval-harness asks: its tokens echoed with their log-probabilities.
  auto scoring = ParseCompletionRequest(R"({"prompt": [[1, 2, 3]], "max_tokens": 0,
      "echo": true, "logprobs": 1, "temperature": 0, "return_tokens_as_token_ids": true})",
                                        {});
  ASSERT_TRUE(scoring.ok()) << scoring.status().ToString();
  EXPECT_EQ(scoring->max_tokens, 0);
  EXPECT_TRUE(scoring->echo);
  EXPECT_EQ(scoring->logprobs, 1);
  EXPECT_TRUE(scoring->tokens_as_ids);
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
  EXPECT_TRUE(tokens->prompt_is_tokens);
  EXPECT_EQ(tokens->prompt_tokens, (std::vector<int64_t>{1, 17, 42}));
  auto nested = ParseCompletionRequest(R"({"prompt": [[5, 6]], "stop": "x"})", {});
  ASSERT_TRUE(nested.ok());
  EXPECT_EQ(nested->prompt_tokens, (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(nested->stop, (std::vector<std::string>{"x"}));
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

  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
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
      {R"({"prompt": "x", "best_of": 3})", "'best_of'"},
      {R"({"prompt": "x", "frequency_penalty": 0.5})", "'frequency_penalty'"},
      {R"({"prompt": "x", "logprobs": 21})", "'logprobs' must be between 0 and 20"},
      {R"({"prompt": "x", "logprobs": true})", "'logprobs' must be an integer"},
      {R"({"prompt": "x", "echo": "yes"})", "'echo' must be true or false"},
      {R"({"prompt": "x", "return_tokens_as_token_ids": 1})", "'return_tokens_as_token_ids'"},
      {R"({"prompt": "x", "suffix": "end"})", "'suffix'"},
      {R"({"prompt": "x", "logit_bias": {"50256": -100}})", "'logit_bias'"},
      {R"({"prompt": "x", "temperature": 2.5})", "'temperature' must be between 0 and 2"},
      {R"({"prompt": "x", "temperature": "hot"})", "'temperature' must be a number"},
      {R"({"prompt": "x", "top_p": 0})", "'top_p' must be above 0"},
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
      {R"({"prompt": "x", "functions": []})", "'functions' is not a field"},
      {R"({"prompt": ["a", "b"]})", "'prompt' must be a string or an array of token ids"},
      {R"({"prompt": [1, -2]})", "'prompt' must be between 0"},
      {R"({"prompt": []})", "'prompt' must be a string"},
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
      {R"({"messages": []})", "'messages' must be a non-empty array"},
      {R"({"messages": [{"role": "tool", "content": "x"}]})", "'messages.role'"},
      {R"({"messages": [{"role": "user"}]})", "'messages.content' is missing"},
      {R"({"messages": [{"role": "user", "content": "x", "name": "bob"}]})", "'messages.name'"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
       "'messages.content' parts must be"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})",
       "'tools'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})",
       "'response_format'"},
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
  };
  for (const auto& [body, expected] : chat_cases) {
    auto r = ParseChatRequest(body, {});
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_NE(r.status().message().find(expected), std::string::npos)
        << body << " -> " << r.status().message();
  }
}

TEST(OpenAiRequest, LimitsBoundWhatOneRequestMayAskFor) {
  RequestLimits limits{
      .max_n = 2, .max_messages = 3, .max_stop = 1, .max_stop_bytes = 4, .max_prompt_tokens = 5};
  EXPECT_FALSE(ParseCompletionRequest(R"({"prompt": "x", "n": 3})", limits).ok());
  EXPECT_FALSE(ParseCompletionRequest(R"({"prompt": [1, 2, 3, 4, 5, 6]})", limits).ok());
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

TEST(ChatTemplate, RendersTheDocumentedText) {
  const std::vector<ChatMessage> messages = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};
  EXPECT_EQ(RenderChat(ChatTemplate::kPlain, messages),
            "Be brief.\n\nUser: Hi\nAssistant: Hello.\nUser: Bye\nAssistant:");
  EXPECT_EQ(RenderChat(ChatTemplate::kChatml, messages),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(ChatStops(ChatTemplate::kPlain), (std::vector<std::string>{"\nUser:"}));
  EXPECT_EQ(ChatStops(ChatTemplate::kChatml), (std::vector<std::string>{"<|im_end|>"}));
  EXPECT_EQ(*ParseChatTemplate("chatml"), ChatTemplate::kChatml);
  EXPECT_FALSE(ParseChatTemplate("llama3").ok());
}

// A decoder over a fixed table of token texts (tokens may hold parts of a UTF-8 character).
TextStream::Decode TableDecoder(std::vector<std::string> table) {
  return [table](std::span<const int32_t> ids) {
    std::string out;
    for (int32_t id : ids) out += table.at(static_cast<size_t>(id));
    return out;
  };
}

// Streams tokens 0..n-1 of the table and returns the pieces sent.
std::vector<std::string> StreamAll(const std::vector<std::string>& table,
                                   const std::vector<std::string>& stops, std::string* text,
                                   bool* stopped) {
  TextStream s(TableDecoder(table), stops);
  std::vector<std::string> pieces;
  for (size_t i = 0; i < table.size() && !s.stopped(); ++i) {
    pieces.push_back(s.Add(static_cast<int64_t>(i)));
  }
  pieces.push_back(s.Finish());
  *text = s.text();
  *stopped = s.stopped();
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

TEST(TextStream, StreamedPiecesAlwaysJoinToTheWholeTextCutByHand) {
  // Every split of a text into tokens, every stop string: the pieces join to the text cut before
  // the stop string's first occurrence, found here with std::string::find.
  const std::string whole = "ab\nUser: cd\nUser: e";
  for (const std::string stop : {"\nUser:", "cd", "e", "zz", "b\n"}) {
    for (size_t cut1 = 1; cut1 < whole.size(); ++cut1) {
      for (size_t cut2 = cut1 + 1; cut2 < whole.size(); ++cut2) {
        const std::vector<std::string> table = {
            whole.substr(0, cut1), whole.substr(cut1, cut2 - cut1), whole.substr(cut2)};
        std::string text;
        bool stopped = false;
        auto pieces = StreamAll(table, {stop}, &text, &stopped);
        const auto at = whole.find(stop);
        const std::string expected = at == std::string::npos ? whole : whole.substr(0, at);
        std::string joined;
        for (const auto& p : pieces) joined += p;
        EXPECT_EQ(joined, expected) << "stop '" << stop << "' cuts " << cut1 << "," << cut2;
        EXPECT_EQ(text, expected);
        EXPECT_EQ(stopped, at != std::string::npos);
      }
    }
  }
}

}  // namespace
}  // namespace colony::api
