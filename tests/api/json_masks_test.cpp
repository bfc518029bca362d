// JsonMasks (JSON mode's masks kept for every request): which masks the least-recently-used rule
// keeps, written out by hand and against a model of it kept apart (a list of keys in order of
// use) over random finds and keeps, and from several threads at once.
#include "api/json_masks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <list>
#include <random>
#include <thread>
#include <vector>

namespace colony::api {
namespace {

using Bits = JsonMasks::Bits;

JsonMasks::Key KeyOf(uint8_t state, int64_t vocab = 640, bool first = false, uint64_t schema = 0) {
  JsonMasks::Key k;
  k.schema = schema;
  k.state = std::string(24, '\0');
  k.state[0] = static_cast<char>(state);
  k.vocab = vocab;
  k.first = first;
  return k;
}

// A mask that names its key, of `words` words.
Bits MaskOf(const JsonMasks::Key& k, size_t words = 10) {
  Bits b = {static_cast<uint8_t>(k.state[0]) | (uint64_t(k.vocab) << 8) |
            (uint64_t(k.first) << 62) | (k.schema << 40)};
  b.resize(words, ~uint64_t{0});
  return b;
}

constexpr size_t kMaskBytes = 10 * sizeof(uint64_t);

TEST(JsonMasks, TheLeastRecentlyUsedAreDroppedFirst) {
  JsonMasks masks(nullptr, 3 * kMaskBytes);
  for (uint8_t s : {1, 2, 3}) ASSERT_EQ(*masks.Keep(KeyOf(s), MaskOf(KeyOf(s))), MaskOf(KeyOf(s)));
  ASSERT_NE(masks.Find(KeyOf(1)), nullptr);  // 1 is now the most recently used: 2 goes first
  masks.Keep(KeyOf(4), MaskOf(KeyOf(4)));
  EXPECT_EQ(masks.Find(KeyOf(2)), nullptr);
  for (uint8_t s : {1, 3, 4}) {
    auto found = masks.Find(KeyOf(s));
    ASSERT_NE(found, nullptr) << int(s);
    EXPECT_EQ(*found, MaskOf(KeyOf(s)));
  }
  const JsonMasks::Counts c = masks.counts();
  EXPECT_EQ(c.masks, 3U);
  EXPECT_EQ(c.bytes, 3 * kMaskBytes);
  EXPECT_EQ(c.dropped, 1);
  EXPECT_EQ(c.hits, 4);
  EXPECT_EQ(c.misses, 1);
}

// A state's mask is kept apart by schema, vocabulary and first token.
TEST(JsonMasks, KeysDifferByStateSchemaVocabularyAndFirstToken) {
  JsonMasks masks(nullptr, 100 * kMaskBytes);
  const std::vector<JsonMasks::Key> keys = {KeyOf(1),
                                            KeyOf(2),
                                            KeyOf(1, 704),
                                            KeyOf(1, 640, true),
                                            KeyOf(1, 640, false, 7),
                                            KeyOf(1, 640, false, 8)};
  for (const auto& k : keys) masks.Keep(k, MaskOf(k));
  for (const auto& k : keys) {
    auto found = masks.Find(k);
    ASSERT_NE(found, nullptr);
    EXPECT_EQ(*found, MaskOf(k));
  }
  EXPECT_EQ(masks.counts().masks, keys.size());
}

// A key kept twice keeps the first mask; one larger than the budget is handed back unkept; a
// mask still held stays as it was after being dropped.
TEST(JsonMasks, KeepsOneMaskAKeyAndNoneOverTheBudget) {
  JsonMasks masks(nullptr, 2 * kMaskBytes);
  auto first = masks.Keep(KeyOf(1), MaskOf(KeyOf(1)));
  auto second = masks.Keep(KeyOf(1), Bits(10, 7));
  EXPECT_EQ(second, first);
  auto big = masks.Keep(KeyOf(2), Bits(30, 5));
  EXPECT_EQ(*big, Bits(30, 5));
  EXPECT_EQ(masks.Find(KeyOf(2)), nullptr);
  EXPECT_EQ(masks.counts().masks, 1U);
  masks.Keep(KeyOf(3), MaskOf(KeyOf(3)));
  masks.Keep(KeyOf(4), MaskOf(KeyOf(4)));  // drops 1
  EXPECT_EQ(masks.Find(KeyOf(1)), nullptr);
  EXPECT_EQ(*first, MaskOf(KeyOf(1)));
}

// Random finds and keeps of masks of different sizes against a model of the rule: the keys in
// order of use (a find or a keep of a kept key uses it), the oldest dropped until a new one fits.
TEST(JsonMasks, KeepsWhatTheRuleKeeps) {
  std::mt19937_64 rng(4);
  constexpr size_t kBudget = 40 * kMaskBytes;
  JsonMasks masks(nullptr, kBudget);
  std::list<std::pair<uint8_t, size_t>> model;  // key, bytes; the most recently used first
  for (int op = 0; op < 20000; ++op) {
    const auto s = static_cast<uint8_t>(rng() % 64);
    auto it = std::ranges::find_if(model, [s](const auto& e) { return e.first == s; });
    const bool kept = it != model.end();
    std::shared_ptr<const Bits> got;
    if (rng() % 3 == 0) {  // a keep, found kept or not (as after another request's miss)
      got = masks.Keep(KeyOf(s), MaskOf(KeyOf(s), 1 + rng() % 20));
    } else {
      got = masks.Find(KeyOf(s));
      ASSERT_EQ(got != nullptr, kept) << op;
      if (!kept) got = masks.Keep(KeyOf(s), MaskOf(KeyOf(s), 1 + rng() % 20));
    }
    if (kept) {
      model.splice(model.begin(), model, it);
      ASSERT_EQ(got->size() * 8, model.front().second) << op;  // the mask kept first
    } else {
      size_t used = 0;
      for (const auto& e : model) used += e.second;
      while (used + got->size() * 8 > kBudget) {
        used -= model.back().second;
        model.pop_back();
      }
      model.emplace_front(s, got->size() * 8);
    }
    EXPECT_EQ(*got, MaskOf(KeyOf(s), got->size()));
    size_t used = 0;
    for (const auto& e : model) used += e.second;
    const JsonMasks::Counts c = masks.counts();
    ASSERT_EQ(c.masks, model.size()) << op;
    ASSERT_EQ(c.bytes, used) << op;
    ASSERT_LE(c.bytes, kBudget);
  }
}

// Threads finding and keeping at once get each key's own mask, within the budget.
TEST(JsonMasks, ThreadsGetTheirKeysMasks) {
  constexpr size_t kBudget = 24 * kMaskBytes;
  JsonMasks masks(nullptr, kBudget);
  std::atomic<int> wrong{0};
  std::atomic<int64_t> finds{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<uint64_t>(t));
      for (int op = 0; op < 5000; ++op) {
        const JsonMasks::Key k = KeyOf(static_cast<uint8_t>(rng() % 48), 640, rng() % 2 == 0);
        auto bits = masks.Find(k);
        ++finds;
        if (!bits) bits = masks.Keep(k, MaskOf(k));
        if (*bits != MaskOf(k)) ++wrong;
        if (masks.counts().bytes > kBudget) ++wrong;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  const JsonMasks::Counts c = masks.counts();
  EXPECT_EQ(c.hits + c.misses, finds.load());
  EXPECT_GT(c.hits, 0);
  EXPECT_GT(c.dropped, 0);
  EXPECT_LE(c.masks, 24U);
}

}  // namespace
}  // namespace colony::api
