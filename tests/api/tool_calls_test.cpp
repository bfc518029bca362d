// Tool calls read out of answers as each family's template tells its model to write them (the
// calls and content written out by hand), answers that are not wholly calls left as text, and a
// streamed answer that passes on exactly the content the whole answer has, however it is split.
#include "api/tool_calls.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace colony::api {
namespace {

const std::vector<std::string> kTools = {"get_weather", "get_time"};

bool IsAlnum(const std::string& s) {
  return std::ranges::all_of(s, [](char c) { return std::isalnum(static_cast<unsigned char>(c)); });
}

TEST(ToolCalls, ReadsEachFamilysFormat) {
  // Hermes (Qwen2.5, Qwen3): text, then one block per call; the last may end at the answer's end.
  Answer a = ReadToolCalls(ToolCallFormat::kHermes,
                           "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                           "{\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n"
                           "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n",
                           kTools);
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.content, "Let me check.");
  EXPECT_FALSE(a.content_null);
  EXPECT_EQ(a.calls[0].name, "get_weather");
  EXPECT_EQ(a.calls[0].arguments, R"({"city":"Paris","unit":"celsius"})");  // the model's order
  EXPECT_EQ(a.calls[1].name, "get_time");
  EXPECT_EQ(a.calls[1].arguments, "{}");
  for (const ToolCall& c : a.calls) {
    ASSERT_EQ(c.id.size(), 29u) << c.id;
    EXPECT_TRUE(c.id.starts_with("call_") && IsAlnum(c.id.substr(5))) << c.id;
  }
  EXPECT_NE(a.calls[0].id, a.calls[1].id);
  // Only calls: no content.
  a = ReadToolCalls(ToolCallFormat::kHermes,
                    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n"
                    "</tool_call>",
                    kTools);
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_TRUE(a.content_null);
  EXPECT_EQ(a.content, "");

  // Llama 3.1: the answer is the call, "parameters" for its arguments; after <|python_tag|>
  // where the tokenizer keeps it; several separated by ';'.
  for (const char* text :
       {R"({"name": "get_weather", "parameters": {"city": "Paris"}})",
        "  <|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n"}) {
    a = ReadToolCalls(ToolCallFormat::kLlama3Json, text, kTools);
    ASSERT_EQ(a.calls.size(), 1u) << text;
    EXPECT_TRUE(a.content_null);
    EXPECT_EQ(a.calls[0].arguments, R"({"city":"Paris"})");
  }
  a = ReadToolCalls(
      ToolCallFormat::kLlama3Json,
      R"({"name": "get_weather", "parameters": {"city": "a;b}"}}; {"name": "get_time", "parameters": {}})",
      kTools);
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.calls[0].arguments, R"({"city":"a;b}"})");  // brackets and ';' inside strings
  EXPECT_EQ(a.calls[1].name, "get_time");

  // Mistral: [TOOL_CALLS] and an array; decoding drops the special token, so a bare array too.
  // Its ids are what its templates take back: 9 letters and digits.
  for (const char* text : {R"(Sure.[TOOL_CALLS] [{"name": "get_time", "arguments": {}}])",
                           R"([{"name": "get_time", "arguments": {}, "id": "abcdefghi"}])"}) {
    a = ReadToolCalls(ToolCallFormat::kMistral, text, kTools);
    ASSERT_EQ(a.calls.size(), 1u) << text;
    EXPECT_EQ(a.calls[0].id.size(), 9u);
    EXPECT_TRUE(IsAlnum(a.calls[0].id));
  }
  EXPECT_EQ(ReadToolCalls(ToolCallFormat::kMistral,
                          R"(Sure.[TOOL_CALLS] [{"name": "get_time", "arguments": {}}])", kTools)
                .content,
            "Sure.");

  // Formats by the names colony api --tool-call-parser takes (vLLM's).
  for (ToolCallFormat f :
       {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral}) {
    auto parsed = ParseToolCallFormat(ToolCallFormatName(f));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, f);
  }
  EXPECT_EQ(ParseToolCallFormat("llama3_json").value(), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(ParseToolCallFormat("none").status().message(),
            "unknown tool call format 'none' (one of: hermes, llama3_json, mistral)");

  // OpenAI's shape of them.
  const nlohmann::json j = ToolCallsJson({{.id = "call_x", .name = "f", .arguments = "{}"}}, true);
  EXPECT_EQ(j, nlohmann::json::parse(R"([{"id": "call_x", "type": "function", "index": 0,
                                          "function": {"name": "f", "arguments": "{}"}}])"));
  EXPECT_FALSE(
      ToolCallsJson({{.id = "c", .name = "f", .arguments = "{}"}}, false)[0].contains("index"));
}

// Whatever is not wholly well-formed calls to the request's tools stays text, whole: a client is
// never handed a call the model did not cleanly make, nor loses text the model wrote.
TEST(ToolCalls, AnAnswerThatIsNotWhollyCallsToTheRequestsToolsIsText) {
  const std::vector<std::pair<ToolCallFormat, std::string>> texts = {
      {ToolCallFormat::kHermes,
       "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>"},
      {ToolCallFormat::kHermes,
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}\n</tool_call>"},
      {ToolCallFormat::kHermes,
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": [1]}\n</tool_call>"},
      {ToolCallFormat::kHermes,
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\nDone, it is noon."},
      {ToolCallFormat::kHermes,
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}, \"parameters\": "
       "{}}\n</tool_call>"},
      {ToolCallFormat::kHermes,
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}, \"run\": true}\n</tool_call>"},
      {ToolCallFormat::kHermes,
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"a\": 1, \"a\": 2}}\n</tool_call>"},
      {ToolCallFormat::kHermes, "<tool_call>" + std::string(100, '[')},
      {ToolCallFormat::kLlama3Json, R"(Here: {"name": "get_time", "parameters": {}})"},
      {ToolCallFormat::kLlama3Json, R"({"name": "get_time", "parameters": {}} and more)"},
      {ToolCallFormat::kLlama3Json, R"({"name": "get_time", "parameters": {})"},
      {ToolCallFormat::kLlama3Json, R"({"answer": 42})"},
      {ToolCallFormat::kMistral, R"([1, 2, 3])"},
      {ToolCallFormat::kMistral, R"([TOOL_CALLS] [{"name": "get_time", "arguments": "{}"}])"},
      {ToolCallFormat::kMistral, R"([TOOL_CALLS] {"name": "get_time", "arguments": {}})"},
      {ToolCallFormat::kMistral, R"([{"name": "get_time", "arguments": {}}], "x": 1)"},
      {ToolCallFormat::kMistral,
       R"(Hi [TOOL_CALLS][{"name": "get_time", "arguments": {}}], "x": 1)"},
      {ToolCallFormat::kNone, R"({"name": "get_time", "parameters": {}})"},
  };
  for (const auto& [format, text] : texts) {
    const Answer a = ReadToolCalls(format, text, kTools);
    EXPECT_TRUE(a.calls.empty()) << text;
    EXPECT_EQ(a.content, text);
    EXPECT_FALSE(a.content_null);
  }
  // Without tools in the request nothing is a call.
  EXPECT_TRUE(
      ReadToolCalls(ToolCallFormat::kLlama3Json, R"({"name": "get_time", "parameters": {}})", {})
          .calls.empty());
}

std::string Stream(ToolCallFormat format, const std::string& text, std::mt19937& rng,
                   std::vector<std::string>* pieces) {
  ToolCallStream stream(format, kTools);
  std::string out;
  for (size_t at = 0; at < text.size();) {
    const size_t n = std::min<size_t>(text.size() - at, 1 + rng() % 6);
    std::string piece = stream.Add(std::string_view(text).substr(at, n));
    pieces->push_back(piece);
    out += piece;
    at += n;
  }
  const Answer whole = ReadToolCalls(format, text, kTools);
  std::string rest = stream.Finish(whole);
  pieces->push_back(rest);
  return out + rest;
}

// However an answer arrives, the streamed text is the content of the whole answer: all of it
// when it makes no calls, the text before them when it does (a call's text is never sent as
// content, not even its marker's start, nor the whitespace before it).
TEST(ToolCallStream, PassesOnExactlyTheContentOfTheWholeAnswerHoweverItIsSplit) {
  const std::vector<std::pair<ToolCallFormat, std::string>> answers = {
      {ToolCallFormat::kHermes,
       "Let me check.\n\n<tool_call>\n{\"name\": \"get_time\", "
       "\"arguments\": {}}\n</tool_call>"},
      {ToolCallFormat::kHermes,
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n"
       "</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", "
       "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"},
      {ToolCallFormat::kHermes, "A <b>tag</b> and a <tool that is no call, and <tool_call> text"},
      {ToolCallFormat::kHermes, "Ends in whitespace \n\n"},
      {ToolCallFormat::kHermes, "Ends in a marker's start <tool_ca"},
      {ToolCallFormat::kLlama3Json,
       R"(  {"name": "get_weather", "parameters": {"city": "Paris"}})"},
      {ToolCallFormat::kLlama3Json, R"({"not": "a call"})"},
      {ToolCallFormat::kLlama3Json, "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}"},
      {ToolCallFormat::kLlama3Json, "<|pyth but plain text after all"},
      {ToolCallFormat::kLlama3Json, "Plain text with a {brace} later."},
      {ToolCallFormat::kMistral, R"([{"name": "get_time", "arguments": {}}])"},
      {ToolCallFormat::kMistral, R"(Sure. [TOOL_CALLS][{"name": "get_time", "arguments": {}}])"},
      {ToolCallFormat::kMistral, "[a link](http://x) is text"},
      {ToolCallFormat::kMistral,
       R"([a link] first, then [TOOL_CALLS][{"name": "get_time", "arguments": {}}])"},
      {ToolCallFormat::kNone, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n"},
      // Held, then found to be text before the end (and what comes after).
      {ToolCallFormat::kHermes,
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\nDone."},
      {ToolCallFormat::kHermes,
       "A <tool_call>{\"name\": \"rm\"}</tool_call> <tool_call>{\"name\": "
       "\"get_time\"}</tool_call>"},
      {ToolCallFormat::kHermes, "<tool_call>{\"name\": \"get_time\"}</tool_call> <tool_cal> x"},
      {ToolCallFormat::kLlama3Json,
       R"({"name": "get_time", "parameters": {}}; {"answer": "a\"}"} ok)"},
      {ToolCallFormat::kLlama3Json, R"({"name": "get_time", "parameters": {}}; ; x)"},
      {ToolCallFormat::kLlama3Json, "<|python_tag|> {\"name\": \"get_time\"} <|python_tag|>"},
      {ToolCallFormat::kMistral, R"([1, "]"] then [TOOL_CALLS] [{"name": "get_time"}])"},
      {ToolCallFormat::kMistral, R"([TOOL_CALLS][{"name": "get_time"}] [{"name": "f"}])"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS] {\"name\": \"get_time\"}\n\nmore"},
      {ToolCallFormat::kMistral, R"([{"name": "get_time", "arguments": {}}], "x": 1)"},
      {ToolCallFormat::kHermes,
       "Text, \n \n\t then <tool_cal \n <tool_call>{\"name\": \"get_time\"}"},
      {ToolCallFormat::kMistral, " \n [1] \n [TOOL_CALLS]  \n [{\"name\": \"get_time\"}] \n"},
  };
  std::mt19937 rng(7);
  for (const auto& [format, text] : answers) {
    const Answer whole = ReadToolCalls(format, text, kTools);
    for (int split = 0; split < 200; ++split) {
      std::vector<std::string> pieces;
      ASSERT_EQ(Stream(format, text, rng, &pieces), whole.content)
          << ToolCallFormatName(format) << ": " << text;
    }
  }
  // Text is passed on as it comes where no call can be starting.
  ToolCallStream hermes(ToolCallFormat::kHermes, kTools);
  EXPECT_EQ(hermes.Add("Hello"), "Hello");
  EXPECT_EQ(hermes.Add(" there <tool"), " there");  // " <tool" may begin a call
  EXPECT_EQ(hermes.Add("bar>"), " <toolbar>");
  ToolCallStream llama(ToolCallFormat::kLlama3Json, kTools);
  EXPECT_EQ(llama.Add(" "), "");
  EXPECT_EQ(llama.Add("Hi"), " Hi");
  EXPECT_EQ(llama.Add(" {x}"), " {x}");
}

// Held text is passed on as soon as it can no longer be calls, not at the end of the answer: a
// Llama answer that is a JSON object but not a call (a client that asked for JSON), a call to a
// tool the request does not have, text after a call. Fed one byte at a time, the text up to the
// byte that decides it has been passed on once that byte has come, and never before.
TEST(ToolCallStream, PassesHeldTextOnOnceItCanNoLongerBeCalls) {
  struct Case {
    ToolCallFormat format;
    std::string text;
    size_t decided;  // bytes after which it is known to be text
  };
  const std::string json_answer = R"({"answer": {"city": "Paris", "list": [1, "}"]}})";
  const std::string call = R"({"name": "get_time", "parameters": {}})";
  const std::string unknown = "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>";
  const std::string hermes_call =
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  const std::vector<Case> cases = {
      {ToolCallFormat::kLlama3Json, json_answer + " and on", json_answer.size()},
      {ToolCallFormat::kLlama3Json, call + "\nThen text.", call.size() + 2},
      {ToolCallFormat::kLlama3Json, call + "; [1]", call.size() + 3},
      {ToolCallFormat::kLlama3Json, "<|python_tag|>x", 15},
      {ToolCallFormat::kHermes, unknown + " more", unknown.size()},
      {ToolCallFormat::kHermes, hermes_call + "\nDone.", hermes_call.size() + 2},
      {ToolCallFormat::kHermes, "<tool_call>{\"name\": \"get_time\"</tool_call> x", 42},
      {ToolCallFormat::kMistral, R"([1, 2] is a list)", 6},
      {ToolCallFormat::kMistral, R"([TOOL_CALLS] {"name": "get_time"})", 14},
      {ToolCallFormat::kMistral, R"([TOOL_CALLS][{"name": "get_time"}] x)", 36},
  };
  for (const Case& c : cases) {
    ASSERT_TRUE(ReadToolCalls(c.format, c.text, kTools).calls.empty()) << c.text;
    ToolCallStream stream(c.format, kTools);
    std::string out;
    for (size_t i = 0; i < c.text.size(); ++i) {
      out += stream.Add(c.text.substr(i, 1));
      const std::string so_far = c.text.substr(0, i + 1);
      if (i + 1 < c.decided) {
        EXPECT_LT(out.size(), so_far.size()) << c.text << ": passed on at byte " << i + 1;
      } else {
        ASSERT_EQ(out.substr(0, c.decided), so_far.substr(0, c.decided))
            << c.text << ": not passed on by byte " << i + 1;
      }
    }
    EXPECT_EQ(out + stream.Finish(ReadToolCalls(c.format, c.text, kTools)), c.text);
  }
  // A call to one of the request's tools stays held to the end (and never reaches the text).
  ToolCallStream held(ToolCallFormat::kLlama3Json, kTools);
  EXPECT_EQ(held.Add(call), "");
  EXPECT_EQ(held.Add("  "), "");
}

}  // namespace
}  // namespace colony::api
