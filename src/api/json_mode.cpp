// The JSON-object mask of response_format json_object on each step's logits.
#include "api/json_mode.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "model/tokenizer.h"

namespace colony::api {

JsonObjectLogits::JsonObjectLogits(serve::DecoderBackend& inner, JsonModeOptions options)
    : inner_(inner), options_(std::move(options)) {
  if (!options_.token_texts) options_.token_texts = std::make_shared<std::vector<std::string>>();
}

void JsonObjectLogits::End(int64_t row) {
  if (row >= 0 && static_cast<size_t>(row) < ended_.size()) ended_[static_cast<size_t>(row)] = true;
}

bool JsonObjectLogits::WholeWith(int64_t row, int64_t token) const {
  const std::vector<std::string>& texts = *options_.token_texts;
  if (row < 0 || static_cast<size_t>(row) >= rows_.size() || ended_[static_cast<size_t>(row)] ||
      token < 0 || static_cast<size_t>(token) >= texts.size()) {
    return false;
  }
  JsonObjectPrefix next = rows_[static_cast<size_t>(row)];
  return next.Feed(texts[static_cast<size_t>(token)]) && next.complete();
}

Result<at::Tensor> JsonObjectLogits::Step(const at::Tensor& tokens, int64_t position,
                                          const at::Tensor& hypo_ids, serve::StepLogits logits) {
  if (logits != serve::StepLogits::kLast) {
    return InvalidArgument("response_format json_object applies to the last position's logits");
  }
  if (hypo_ids.defined()) {
    return InvalidArgument("response_format json_object does not follow reordered rows");
  }
  if (position != inner_.position()) {
    return InvalidArgument(fmt::format(
        "response_format json_object reads what each row was given: a step at {} after {}",
        position, inner_.position()));
  }
  if (tokens.dim() != 2) return InvalidArgument("tokens must be [rows, T]");
  const int64_t rows = tokens.size(0);
  const std::vector<std::string>& texts = *options_.token_texts;
  if (!started_) {
    started_ = true;
    rows_.assign(static_cast<size_t>(rows), {});
    ended_.assign(static_cast<size_t>(rows), false);
  } else {
    if (rows != static_cast<int64_t>(rows_.size())) {
      return InvalidArgument(
          fmt::format("a step of {} rows after a first step of {}", rows, rows_.size()));
    }
    const at::Tensor given = tokens.to(at::kCPU, at::kLong).contiguous();
    const int64_t* g = given.data_ptr<int64_t>();
    const int64_t per_row = given.size(1);
    for (int64_t r = 0; r < rows; ++r) {
      const auto row = static_cast<size_t>(r);
      for (int64_t j = 0; j < per_row && !ended_[row]; ++j) {
        const int64_t t = g[r * per_row + j];
        // An end token ends the answer; a token that does not fit can only be an ended row's
        // last one, given again.
        const bool ends = std::ranges::find(options_.end_tokens, t) != options_.end_tokens.end();
        if (ends || t < 0 || t >= static_cast<int64_t>(texts.size()) ||
            !rows_[row].Feed(texts[static_cast<size_t>(t)])) {
          ended_[row] = true;
        }
      }
    }
    answered_ += per_row;
  }
  COLONY_ASSIGN_OR_RETURN(at::Tensor out, inner_.Step(tokens, position, hypo_ids, logits));
  if (out.dim() != 3 || out.size(0) != rows || out.scalar_type() != at::kFloat) {
    return InvalidArgument("response_format json_object needs float32 logits [rows, 1, V]");
  }
  at::Tensor masked = out.select(1, out.size(1) - 1).contiguous().clone();
  const int64_t vocab = masked.size(1);
  if (static_cast<int64_t>(is_end_.size()) != vocab) {
    is_end_.assign(static_cast<size_t>(vocab), false);
    for (int64_t t : options_.end_tokens) {
      if (t >= 0 && t < vocab) is_end_[static_cast<size_t>(t)] = true;
    }
  }
  const bool may_end =
      answered_ >= options_.min_tokens && std::ranges::find(is_end_, true) != is_end_.end();
  constexpr float kOut = -std::numeric_limits<float>::infinity();
  float* base = masked.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    if (ended_[static_cast<size_t>(r)]) continue;
    const JsonObjectPrefix& answer = rows_[static_cast<size_t>(r)];
    const bool end_now = may_end && answer.complete();
    float* row = base + r * vocab;
    bool any = false;
    for (int64_t v = 0; v < vocab; ++v) {
      const auto token = static_cast<size_t>(v);
      bool keep = false;
      if (is_end_[token] || end_now) {
        keep = is_end_[token] && end_now;
      } else if (token < texts.size() && !texts[token].empty()) {
        JsonObjectPrefix next = answer;
        keep = next.Feed(texts[token]);
      }
      if (keep) {
        any = true;
      } else {
        row[v] = kOut;
      }
    }
    if (!any) {
      return FailedPrecondition(fmt::format(
          "response_format json_object: no token of the model's vocabulary continues answer {}'s "
          "JSON object",
          r));
    }
  }
  return masked.unsqueeze(1);
}

std::vector<std::string> TokenTexts(const model::Tokenizer& tokenizer) {
  const int vocab = tokenizer.vocab_size();
  std::vector<std::string> texts(static_cast<size_t>(std::max(vocab, 0)));
  // A token to decode each one after ("a" is one token in any tokenizer worth the name).
  const std::vector<int32_t> encoded = tokenizer.Encode("a");
  const int32_t anchor = encoded.empty() ? -1 : encoded.back();
  const std::string before = anchor >= 0 ? tokenizer.Decode(std::vector<int32_t>{anchor}) : "";
  for (int v = 0; v < vocab; ++v) {
    const int32_t alone[] = {v};
    if (anchor >= 0) {
      const int32_t pair[] = {anchor, v};
      std::string with = tokenizer.Decode(pair);
      if (with.starts_with(before) && with.size() > before.size()) {
        texts[static_cast<size_t>(v)] = with.substr(before.size());
        continue;
      }
    }
    texts[static_cast<size_t>(v)] = tokenizer.Decode(alone);
  }
  return texts;
}

}  // namespace colony::api
