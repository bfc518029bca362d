// Colony's Jinja against Jinja itself: every template of tests/data/jinja/templates (the chat
// templates of ten model families, and two that use each feature once) rendered over the
// conversations of make_references.py, compared with what Jinja rendered there, configured as
// transformers configures it (references.json); and thousands of random templates rendered by
// Jinja as the test runs (differential.py). Then the bounds a hostile template or request meets,
// and errors that name what they refuse.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "api/jinja_template.h"
#include "api/model_chat_template.h"
#include "core/subprocess.h"

namespace colony::api::jinja {
namespace {

const std::string kData = COLONY_JINJA_DATA;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Result<std::string> Render(std::string_view source, const Dict& context = {},
                           const RenderLimits& limits = {}) {
  COLONY_ASSIGN_OR_RETURN(Template t, Template::Parse(source));
  return t.Render(context, limits);
}

TEST(Jinja, RendersWhatJinjaRendersForEveryTemplateAndConversation) {
  const auto refs = nlohmann::ordered_json::parse(ReadFile(kData + "/references.json"));
  ASSERT_GE(refs["cases"].size(), 70u);
  int errors = 0;
  for (const auto& c : refs["cases"]) {
    const std::string name = c["template"].get<std::string>();
    SCOPED_TRACE(name + " over " + c["context"]["messages"].dump().substr(0, 120) +
                 " add_generation_prompt=" + c["context"]["add_generation_prompt"].dump());
    auto t = Template::Parse(ReadFile(kData + "/templates/" + name + ".jinja"));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    const Value context = JinjaValueFromJson(c["context"]);
    auto out = t->Render(context.as_dict());
    if (c.contains("error")) {
      ++errors;
      ASSERT_FALSE(out.ok()) << "Jinja raised '" << c["error"].get<std::string>()
                             << "'; Colony rendered:\n"
                             << *out;
      // raise_exception's message reaches the client as the template wrote it.
      if (c["raised"].get<bool>()) {
        EXPECT_EQ(out.status().code(), StatusCode::kFailedPrecondition);
        EXPECT_EQ(out.status().message(), c["error"].get<std::string>());
      } else {
        EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
        EXPECT_EQ(out.status().message().rfind("line ", 0), 0u) << out.status().message();
      }
      continue;
    }
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_EQ(*out, c["output"].get<std::string>());
  }
  EXPECT_GE(errors, 10);
}

// Random templates (differential.py: nested expressions of every operator, filter, test and
// method Colony runs over a context of strings, numbers, lists and dicts; and statements with
// random whitespace control, comments, loops, sets and macros) rendered by Jinja itself and by
// Colony: the same text, or an error from both. Seeds are fixed, so a failure repeats.
TEST(Jinja, AgreesWithJinjaItselfOnRandomTemplates) {
  for (const auto& [mode, count] :
       {std::pair{"expressions", 4000}, std::pair{"statements", 2000}}) {
    auto python = Subprocess::Spawn(
        {"/usr/bin/python3", kData + "/differential.py", mode, "1", std::to_string(count)});
    ASSERT_TRUE(python.ok()) << python.status().ToString();
    std::vector<nlohmann::ordered_json> cases;
    while (true) {
      auto line = python->ReadLine(std::chrono::seconds(120));
      if (!line.ok()) {
        ASSERT_EQ(line.status().code(), StatusCode::kNotFound) << line.status().ToString();
        break;
      }
      cases.push_back(nlohmann::ordered_json::parse(*line));
    }
    auto exit = python->Wait(std::chrono::seconds(30));
    ASSERT_TRUE(exit.ok() && *exit == 0) << "differential.py " << mode << " failed";
    ASSERT_EQ(cases.size(), static_cast<size_t>(count) + 1);
    const Value context = JinjaValueFromJson(cases.back()["context"]);
    cases.pop_back();
    int differ = 0;
    int errors = 0;
    for (const auto& c : cases) {
      const std::string source = c["template"].get<std::string>();
      Result<std::string> out = Render(source, context.as_dict());
      const bool jinja_failed = c.contains("error");
      errors += jinja_failed ? 1 : 0;
      if (jinja_failed ? !out.ok() : (out.ok() && *out == c["output"].get<std::string>())) continue;
      if (++differ <= 5) {
        ADD_FAILURE() << mode << ": " << source << "\n  Jinja:  "
                      << (jinja_failed ? c["error"] : c["output"]).get<std::string>()
                      << "\n  Colony: " << (out.ok() ? *out : "error " + out.status().message());
      }
    }
    EXPECT_EQ(differ, 0) << mode;
    // Both kinds of answer are exercised.
    EXPECT_GT(errors, count / 20) << mode;
    EXPECT_LT(errors, count / 2) << mode;
  }
}

// Python's printf-style `%` formatting, against what Jinja rendered for each line (the
// expected texts were printed by Debian's python3-jinja2), and the formats Python refuses.
TEST(Jinja, FormatsWithPercentAsPythonDoes) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({{ "%x|%X|%o|%#x|%#o|%05x|%-5x|%+d|% d|%.3d|%8.3d|%-8.3d|%08d|%#08x|%+05d" % (-255, 255, 8, -255, 8, -255, 10, 5, 5, 5, -5, 5, -42, 255, 3) }})",
       R"(-ff|FF|10|-0xff|0o10|-00ff|a    |+5| 5|005|    -005|005     |-0000042|0x0000ff|+0003)"},
      {R"({{ "%40.10f|%.0f" % (1e20, 2.5) }})", R"(        100000000000000000000.0000000000|2)"},
      {R"({{ "%d|%d|%i|%d|%x" % (3.99, -3.99, true, false, true) }})", R"(3|-3|1|0|1)"},
      {R"({{ "%c%c|%5.1f%%" % (955, "x", 99.45) }})", R"(λx| 99.5%)"},
      {R"({{ "%e|%E|%g|%G" % (0.000123, 1e100, 1e-5, 12345678.9) }})",
       R"(1.230000e-04|1.000000E+100|1e-05|1.23457E+07)"},
      {R"({{ "%s|%r|%5s|%-5s|%.2s" % ("é", "é", "ab", "ab", "日本語") }})",
       R"(é|'é'|   ab|ab   |日本)"},
      {R"({{ "%(name)s is %(age)d" % {"name": "Ann", "age": 30.5} }})", R"(Ann is 30)"},
      {R"({{ "no specifiers" % {"a": 1} }})", R"(no specifiers)"},
      {R"({{ "%s" % [1, "a"] }})", R"([1, 'a'])"},
  };
  for (const auto& [source, expected] : cases) {
    auto out = Render(source);
    ASSERT_TRUE(out.ok()) << source << ": " << out.status().ToString();
    EXPECT_EQ(*out, expected) << source;
  }
  for (const char* refused :
       {R"({{ "%s %s" % (1,) }})", R"({{ "a" % 5 }})", R"({{ "%d" % "x" }})", R"({{ "%x" % 2.5 }})",
        R"({{ "%(a)s" % {} }})", R"({{ "%q" % 1 }})"}) {
    EXPECT_FALSE(Render(refused).ok()) << refused;
  }
}

TEST(Jinja, RefusesWhatItDoesNotRunByNameAndLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a\n{{ x|shuffle }}", "line 2: no filter named 'shuffle'"},
      {"{% if x is prime %}{% endif %}", "line 1: no test named 'prime'"},
      {"{% include 'other.jinja' %}", "line 1: the statement 'include' is not supported here"},
      {"{% raw %}x{% endraw %}", "line 1: the statement 'raw' is not supported here"},
      {"{% for x in y recursive %}{% endfor %}", "line 1: recursive for loops are not supported"},
      {"\n\n{% if x %}", "line 3: a block is not closed (expected 'elif')"},
      {"{{ x", "line 1: a '{{' is not closed"},
      {"{{ 'abc }}", "line 1: a string is not closed"},
      {"{{ (1 }}", "line 1: unexpected '}': a '(' is not closed"},
      {"{{ f(1 }}", "line 1: unexpected '}': a '(' is not closed"},
      {"{{ f(1 ]", "line 1: unexpected ']': a '(' is not closed"},
      {"{{ x ] }}", "line 1: unexpected ']'"},
      {"{{ x @ y }}", "line 1: unexpected character '@'"},
      {"{% endfor %}", "line 1: the statement 'endfor' is not supported here"},
      {"{# open", "line 1: a comment is not closed"},
      {"{{ 99999999999999999999 }}", "line 1: number 99999999999999999999 is too large"},
      {"{% break %}", "line 1: 'break' outside a loop"},
      {"{% for i in x %}{% else %}\n{% continue %}{% endfor %}",
       "line 2: 'continue' outside a loop"},
      {"{% for i in x %}{% macro m() %}{% break %}{% endmacro %}{% endfor %}",
       "line 1: 'break' outside a loop"},
  };
  for (const auto& [source, message] : cases) {
    auto t = Template::Parse(source);
    ASSERT_FALSE(t.ok()) << source;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << source;
    EXPECT_EQ(t.status().message(), message) << source;
  }
}

TEST(Jinja, ErrorsAtRenderingNameTheLineAndWhatFailed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"\n{{ x.y }}", "line 2: 'x' is undefined"},
      {"{{ none + 1 }}", "line 1: unsupported operand types for +: a none and a integer"},
      {"{{ 'a' < 1 }}", "line 1: '<' is not supported between a string and a integer"},
      {"{{ 1 // 0 }}", "line 1: integer division or modulo by zero"},
      {"{{ 9223372036854775807 + 1 }}", "line 1: '+' overflows 64-bit integers"},
      {"{{ nothing() }}", "line 1: 'nothing' is undefined, not a function"},
      {"{% set x = 1 %}{% set x.y = 2 %}",
       "line 1: cannot set an attribute of 'x', a integer (only of a namespace())"},
      {"{% for a, b in [1] %}{% endfor %}", "line 1: cannot unpack a integer into 2 names"},
      {"{{ range(1000000) }}", "line 1: range: more than 100,000 items"},
      {"{% for x in none %}{% endfor %}", "line 1: a none cannot be iterated"},
  };
  for (const auto& [source, message] : cases) {
    auto out = Render(source);
    ASSERT_FALSE(out.ok()) << source;
    EXPECT_EQ(out.status().message(), message) << source;
  }
}

// A template, or the messages a client sends through it, cannot make rendering take unbounded
// memory, time or stack.
TEST(Jinja, BoundsWhatAHostileTemplateOrRequestCanMake) {
  RenderLimits small;
  small.max_output_bytes = 1 << 16;
  small.max_list_items = 1000;
  small.max_steps = 100000;
  // Doubling a string: each step is allowed, the sum is not.
  auto doubled = Render(
      "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}{{ ns.s|length }}",
      {}, small);
  ASSERT_FALSE(doubled.ok());
  EXPECT_EQ(doubled.status().code(), StatusCode::kResourceExhausted);
  auto repeated = Render("{{ 'ab' * 100000000000 }}", {}, small);
  EXPECT_EQ(repeated.status().code(), StatusCode::kResourceExhausted);
  auto listed = Render(
      "{% set ns = namespace(l=[1]) %}{% for i in range(30) %}{% set ns.l = ns.l + ns.l %}"
      "{% endfor %}",
      {}, small);
  EXPECT_EQ(listed.status().code(), StatusCode::kResourceExhausted);
  auto looped = Render(
      "{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}", {}, small);
  ASSERT_FALSE(looped.ok());
  EXPECT_EQ(looped.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(looped.status().message().find("more than 100000 steps"), std::string::npos);
  auto printed = Render("{% for a in range(100000) %}0123456789{% endfor %}", {}, small);
  EXPECT_EQ(printed.status().code(), StatusCode::kResourceExhausted);
  auto recursed = Render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", {}, small);
  ASSERT_FALSE(recursed.ok());
  EXPECT_EQ(recursed.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(recursed.status().message().find("nest deeper than 32"), std::string::npos);
  // A client's long message passes through once per use: within the limits it renders.
  const std::string content(20000, 'w');
  Dict context = {{"m", Value::String(content)}};
  auto ok = Render("{{ m }}{{ m|length }}", context, small);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(*ok, content + "20000");
  // Deep nesting is a parse error, not a stack overflow.
  for (const std::string& deep :
       {"{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}",
        "{{ " + std::string(100000, '[') + std::string(100000, ']') + " }}",
        "{{ " + std::string(100000, '-') + "1 }}",
        "{{ " +
            [] {
              std::string s;
              for (int i = 0; i < 100000; ++i) s += "not ";
              return s;
            }() +
            "1 }}",
        [] {
          std::string s;
          for (int i = 0; i < 100000; ++i) s += "{% if 1 %}";
          return s;
        }()}) {
    auto t = Template::Parse(deep);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("deeper than 64"), std::string::npos)
        << t.status().message();
  }
}

}  // namespace
}  // namespace colony::api::jinja
