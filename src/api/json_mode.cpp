// The JSON-object mask of response_format json_object and json_schema on each step's logits.
#include "api/json_mode.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "model/tokenizer.h"

namespace colony::api {

TokenTextTable TokenTextTable::From(std::vector<std::string> within,
                                    std::vector<std::string> first) {
  TokenTextTable t;
  t.within = std::move(within);
  t.first = first.empty() ? t.within : std::move(first);
  t.first.resize(t.within.size());
  t.plain.resize(t.within.size());
  t.chars.resize(t.within.size());
  JsonObjectPrefix in_string;
  in_string.Feed("{\"");
  for (size_t v = 0; v < t.within.size(); ++v) {
    // (Without any '"': one could close a key and open a value, as `":"` does, which no value
    // string can take.)
    JsonObjectPrefix probe = in_string;
    uint32_t chars = 0;  // (a character begins where the string is between characters)
    bool fits = !t.within[v].empty() && t.within[v].find('"') == std::string::npos;
    for (size_t i = 0; fits && i < t.within[v].size(); ++i) {
      chars += probe.between_string_characters() ? 1 : 0;
      fits = probe.Feed(t.within[v][i]);
    }
    t.plain[v] = fits && probe.between_string_characters();
    t.chars[v] = t.plain[v] ? chars : 0;
    JsonObjectPrefix start;
    if (!t.first[v].empty() && start.Feed(t.first[v])) t.begins_object = true;
    t.longest = std::max({t.longest, t.within[v].size(), t.first[v].size()});
  }
  return t;
}

std::shared_ptr<const TokenTextTable> ReadTokenTexts(const model::Tokenizer& tokenizer) {
  const int vocab = std::max(tokenizer.vocab_size(), 0);
  std::vector<std::string> within(static_cast<size_t>(vocab)), first(within.size());
  // A token to decode each one after ("a" is one token in any tokenizer worth the name).
  const std::vector<int32_t> encoded = tokenizer.Encode("a");
  const int32_t anchor = encoded.empty() ? -1 : encoded.back();
  const std::string before = anchor >= 0 ? tokenizer.Decode(std::vector<int32_t>{anchor}) : "";
  for (int v = 0; v < vocab; ++v) {
    const auto token = static_cast<size_t>(v);
    const int32_t alone[] = {v};
    first[token] = tokenizer.Decode(alone);
    within[token] = first[token];
    if (anchor >= 0) {
      const int32_t pair[] = {anchor, v};
      std::string with = tokenizer.Decode(pair);
      if (with.starts_with(before)) within[token] = with.substr(before.size());
    }
  }
  return std::make_shared<const TokenTextTable>(
      TokenTextTable::From(std::move(within), std::move(first)));
}

JsonObjectLogits::JsonObjectLogits(serve::DecoderBackend& inner, JsonModeOptions options)
    : inner_(inner),
      options_(std::move(options)),
      steps_(options_.schema ? "response_format json_schema" : "response_format json_object"),
      masks_(options_.masks) {
  if (!options_.texts) options_.texts = std::make_shared<const TokenTextTable>();
  if (!masks_ || masks_->texts() != options_.texts)
    masks_ = std::make_shared<JsonMasks>(options_.texts, options_.mask_cache_bytes);
}

const std::string* JsonObjectLogits::Text(int64_t t, int64_t answered) const {
  const TokenTextTable& table = *options_.texts;
  if (t < 0 || static_cast<size_t>(t) >= table.within.size()) return nullptr;
  return answered == 0 ? &table.first[static_cast<size_t>(t)]
                       : &table.within[static_cast<size_t>(t)];
}

void JsonObjectLogits::End(int64_t row) {
  if (row >= 0 && static_cast<size_t>(row) < ended_.size()) ended_[static_cast<size_t>(row)] = true;
}

bool JsonObjectLogits::WholeWith(int64_t row, int64_t token) const {
  const std::string* text = Text(token, steps_.answered());
  if (row < 0 || static_cast<size_t>(row) >= rows_.size() || ended_[static_cast<size_t>(row)] ||
      text == nullptr) {
    return false;
  }
  JsonSchemaPrefix next = rows_[static_cast<size_t>(row)];
  return next.Feed(*text) && next.complete();
}

void JsonObjectLogits::ReadFits(const JsonSchemaPrefix& answer, int64_t answered, int64_t vocab,
                                Bits& out) const {
  const TokenTextTable& table = *options_.texts;
  out.assign(static_cast<size_t>((vocab + 63) / 64), 0);
  // Inside a string most tokens are string content, which fits up to its maxLength.
  const bool in_string = answered > 0 && answer.between_string_characters();
  const uint32_t room = answer.string_room();
  for (int64_t v = 0; v < vocab; ++v) {
    const auto token = static_cast<size_t>(v);
    bool fits = false;
    if (in_string && token < table.plain.size() && table.plain[token]) {
      fits = table.chars[token] <= room;
    } else if (const std::string* text = Text(v, answered); text != nullptr && !text->empty()) {
      if (options_.schema) {
        JsonSchemaPrefix next = answer;
        fits = next.Feed(*text);
      } else {  // (the syntax alone, a smaller copy)
        JsonObjectPrefix next = answer.syntax();
        fits = next.Feed(*text);
      }
    }
    if (fits) out[token / 64] |= uint64_t{1} << (token % 64);
  }
}

std::shared_ptr<const JsonObjectLogits::Bits> JsonObjectLogits::Fits(const JsonSchemaPrefix& answer,
                                                                     int64_t answered,
                                                                     int64_t vocab) {
  if (!options_.cache_masks) {
    ReadFits(answer, answered, vocab, *scratch_);
    ++read_masks_;
    return scratch_;
  }
  // Every row is at the start at the first step: its mask is found (or read) once for all rows,
  // and not counted as kept.
  if (answered == 0 && first_) return first_;
  // (A token has at most `longest` bytes, so at most that many characters.)
  const auto longest =
      static_cast<uint32_t>(std::min<size_t>(options_.texts->longest, JsonSchema::kUnbounded - 1));
  const JsonMasks::Key key{.state = answer.key(longest),
                           .schema = options_.schema ? options_.schema->id() : 0,
                           .vocab = vocab,
                           .first = answered == 0};
  std::shared_ptr<const Bits> bits = masks_->Find(key);
  if (bits && answered > 0) ++cached_masks_;
  if (!bits) {
    Bits read;
    ReadFits(answer, answered, vocab, read);
    ++read_masks_;
    bits = masks_->Keep(key, std::move(read));
  }
  if (answered == 0) first_ = bits;
  return bits;
}

Result<at::Tensor> JsonObjectLogits::Step(const at::Tensor& tokens, int64_t position,
                                          const at::Tensor& hypo_ids, serve::StepLogits logits) {
  COLONY_ASSIGN_OR_RETURN(AnswerSteps::Given given,
                          steps_.Begin(tokens, position, hypo_ids, logits, inner_.position()));
  const int64_t rows = steps_.rows();
  if (given.prompt) {
    rows_.assign(static_cast<size_t>(rows), JsonSchemaPrefix(options_.schema.get()));
    ended_.assign(static_cast<size_t>(rows), false);
  } else {
    const int64_t* g = given.tokens.data_ptr<int64_t>();
    const int64_t per_row = given.tokens.size(1);
    for (int64_t r = 0; r < rows; ++r) {
      const auto row = static_cast<size_t>(r);
      for (int64_t j = 0; j < per_row && !ended_[row]; ++j) {
        const int64_t t = g[r * per_row + j];
        // An end token ends the answer; a token that does not fit can only be an ended row's
        // last one, given again.
        const bool ends = std::ranges::find(options_.end_tokens, t) != options_.end_tokens.end();
        const std::string* text = Text(t, given.answered + j);
        if (ends || text == nullptr || !rows_[row].Feed(*text)) ended_[row] = true;
      }
    }
  }
  COLONY_ASSIGN_OR_RETURN(at::Tensor out, inner_.Step(tokens, position, hypo_ids, logits));
  COLONY_ASSIGN_OR_RETURN(const at::Tensor last, steps_.LastLogits(out));
  at::Tensor masked = last.contiguous().clone();
  const int64_t vocab = masked.size(1);
  const auto words = static_cast<size_t>((vocab + 63) / 64);
  if (vocab != vocab_) {  // (the masks are kept by vocabulary too)
    vocab_ = vocab;
    first_.reset();
    ends_.assign(words, 0);
    any_end_ = false;
    for (int64_t t : options_.end_tokens) {
      if (t < 0 || t >= vocab) continue;
      ends_[static_cast<size_t>(t) / 64] |= uint64_t{1} << (static_cast<size_t>(t) % 64);
      any_end_ = true;
    }
  }
  const int64_t answered = steps_.answered();
  const bool may_end = answered >= options_.min_tokens && any_end_;
  constexpr float kOut = -std::numeric_limits<float>::infinity();
  // -inf for the tokens whose bit in keep(word) is clear; whether any is kept. (Bits past the
  // vocabulary are clear: no text or end token has them.)
  auto apply = [&](float* row, const auto& keep) {
    bool any = false;
    for (size_t w = 0; w < words; ++w) {
      const uint64_t kept = keep(w);
      any = any || kept != 0;
      if (kept == ~uint64_t{0}) continue;
      const size_t from = w * 64;
      const size_t n = std::min<size_t>(64, static_cast<size_t>(vocab) - from);
      if (kept == 0) {
        std::fill_n(row + from, n, kOut);
        continue;
      }
      for (size_t b = 0; b < n; ++b) {
        if (((kept >> b) & 1U) == 0) row[from + b] = kOut;
      }
    }
    return any;
  };
  float* base = masked.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    if (ended_[static_cast<size_t>(r)]) continue;
    const JsonSchemaPrefix& answer = rows_[static_cast<size_t>(r)];
    float* row = base + r * vocab;
    bool any = false;
    if (may_end && answer.complete()) {  // the end tokens, and nothing else
      any = apply(row, [this](size_t w) { return ends_[w]; });
    } else {
      const std::shared_ptr<const Bits> fits = Fits(answer, answered, vocab);
      any = apply(row, [this, &fits](size_t w) { return (*fits)[w] & ~ends_[w]; });
    }
    if (!any) {
      return FailedPrecondition(fmt::format(
          "{}: no token of the model's vocabulary continues answer {}'s JSON object",
          options_.schema ? "response_format json_schema" : "response_format json_object", r));
    }
  }
  return masked.unsqueeze(1);
}

}  // namespace colony::api
