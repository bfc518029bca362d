// JsonSchemaCache (response_format json_schema's schemas compiled once a text for every request):
// a text sent again gets the first compilation (and so its masks' keys), other texts their own;
// the least recently used go first past the count or the bytes of the texts, written out by hand;
// and from several threads at once one text is one compilation.
#include "api/json_schema_cache.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "api/openai_request.h"

namespace colony::api {
namespace {

// A schema of one property named `name`, and its canonical text.
std::pair<std::string, std::shared_ptr<const JsonSchema>> Schema(const std::string& name) {
  const nlohmann::json s = {{"type", "object"}, {"properties", {{name, {{"type", "integer"}}}}}};
  auto compiled = JsonSchema::Compile(s);
  EXPECT_TRUE(compiled.ok()) << compiled.status().ToString();
  return {s.dump(), compiled.ok() ? *compiled : nullptr};
}

TEST(JsonSchemaCache, ATextSentAgainIsItsFirstCompilation) {
  JsonSchemaCache cache;
  const auto [text, first] = Schema("a");
  const auto [again_text, again] = Schema("a");
  ASSERT_EQ(text, again_text);
  EXPECT_NE(first->id(), again->id());  // (each compilation its own)
  EXPECT_EQ(cache.Intern(text, first), first);
  EXPECT_EQ(cache.Intern(again_text, again), first);
  const auto [other_text, other] = Schema("b");
  EXPECT_EQ(cache.Intern(other_text, other), other);
  // A request's schema with its keys in any order is the same canonical text (a request is read
  // keeping its keys' order).
  for (const char* schema : {R"({"type": "object", "properties": {"a": {"type": "integer"}}})",
                             R"({"properties": {"a": {"type": "integer"}}, "type": "object"})"}) {
    auto request = ParseChatRequest(
        std::string(R"({"messages": [{"role": "user", "content": "hi"}], "response_format":
            {"type": "json_schema", "json_schema": {"name": "x", "schema": )") +
            schema + "}}}",
        {});
    ASSERT_TRUE(request.ok()) << request.status().ToString();
    EXPECT_EQ(request->json_schema_text, text);
    EXPECT_EQ(cache.Intern(request->json_schema_text, request->json_schema), first);
  }
  const JsonSchemaCache::Counts c = cache.counts();
  EXPECT_EQ(c.hits, 3);
  EXPECT_EQ(c.misses, 2);
  EXPECT_EQ(c.schemas, 2U);
  EXPECT_EQ(c.bytes, text.size() + first->bytes() + other_text.size() + other->bytes());
  EXPECT_GT(first->bytes(), sizeof(JsonSchema));
}

TEST(JsonSchemaCache, TheLeastRecentlyUsedAreDroppedFirst) {
  JsonSchemaCache cache(/*max_schemas=*/2);
  const auto a = Schema("a"), b = Schema("b"), c = Schema("c");
  cache.Intern(a.first, a.second);
  cache.Intern(b.first, b.second);
  EXPECT_EQ(cache.Intern(a.first, Schema("a").second), a.second);  // a used last: b goes first
  cache.Intern(c.first, c.second);
  EXPECT_EQ(cache.counts().schemas, 2U);
  EXPECT_EQ(cache.counts().dropped, 1);
  EXPECT_EQ(cache.Intern(a.first, Schema("a").second), a.second);
  EXPECT_EQ(cache.Intern(c.first, Schema("c").second), c.second);
  const auto b_again = Schema("b");
  EXPECT_EQ(cache.Intern(b.first, b_again.second), b_again.second);  // dropped: compiled anew

  // By bytes (texts and nodes): room for two of these, not three; a schema larger than all of it
  // is not kept.
  const size_t each = a.first.size() + a.second->bytes();
  ASSERT_EQ(each, c.first.size() + c.second->bytes());
  JsonSchemaCache small(/*max_schemas=*/100, /*max_bytes=*/2 * each + 1);
  small.Intern(a.first, a.second);
  small.Intern(b.first, b.second);
  small.Intern(c.first, c.second);
  EXPECT_EQ(small.counts().schemas, 2U);
  EXPECT_EQ(small.counts().bytes, 2 * each);
  EXPECT_EQ(small.Intern(b.first, Schema("b").second), b.second);
  EXPECT_EQ(small.Intern(c.first, Schema("c").second), c.second);
  const nlohmann::json described = {{"type", "object"},
                                    {"description", std::string(3 * each, 'x')}};
  const auto large = *JsonSchema::Compile(described);
  EXPECT_EQ(small.Intern(described.dump(), large), large);
  EXPECT_EQ(small.counts().schemas, 2U);  // (none dropped for it)
  EXPECT_EQ(small.Intern(b.first, Schema("b").second), b.second);
  EXPECT_EQ(small.Intern("{}", nullptr), nullptr);  // (nothing to keep)
  EXPECT_EQ(small.counts().schemas, 2U);
}

TEST(JsonSchemaCache, ThreadsSendingOneTextGetOneCompilation) {
  JsonSchemaCache cache(/*max_schemas=*/5);
  const std::vector<std::string> names = {"b", "c", "d", "e", "f", "g"};
  std::vector<std::vector<std::shared_ptr<const JsonSchema>>> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round) {
        const auto s = Schema("a");
        got[t].push_back(cache.Intern(s.first, s.second));
        const auto o = Schema(names[(t + static_cast<size_t>(round)) % names.size()]);
        cache.Intern(o.first, o.second);  // (others come and go)
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(cache.counts().schemas, 5U);
  EXPECT_GT(cache.counts().dropped, 0);
  // Every thread got the first compilation of "a": a thread sends another text only after "a",
  // so at most four others come between two sends of "a", which stays among the five kept.
  for (const auto& g : got) {
    for (const auto& s : g) EXPECT_EQ(s, got[0][0]);
  }
}

}  // namespace
}  // namespace colony::api
