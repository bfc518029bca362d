// response_format {"type": "json_object"} and {"type": "json_schema"}: a decoder backend that
// keeps each row's answer a JSON object (api/json_prefix.h), valid against a schema when given one
// (api/json_schema.h), as vLLM's structured outputs do: at every step a token whose text
// could not follow the row's answer so far gets -inf, before the penalties, biases and sampling.
// The end tokens are allowed only once the object is whole and min_tokens tokens were generated,
// and then nothing else is (the answer ends there); a whole object not yet allowed to end (by
// min_tokens, or with no end tokens, as with ignore_eos) is followed by whitespace (without end
// tokens the service ends the answer with its object instead: WholeWith). A token
// without text (a special token) is never chosen but as an end token. An answer cut short by
// max_tokens or a stop string is a prefix of an object.
//
//   JsonObjectLogits json(backend, {.texts = ReadTokenTexts(tokenizer), .end_tokens = {eos}});
//   serve::GenerateRows(json, prompt, options, eos);
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "api/answer_steps.h"
#include "api/json_masks.h"
#include "api/json_prefix.h"
#include "api/json_schema.h"
#include "core/status.h"
#include "serve/generation.h"

namespace colony::model {
class Tokenizer;
}

namespace colony::api {

// Every token's text, read from a tokenizer once (ReadTokenTexts) and shared by the requests.
struct TokenTextTable {
  // Decoded after another token and cut from its text, so that a tokenizer that drops the
  // leading space of a text's first word keeps it; by id.
  std::vector<std::string> within;
  // Decoded alone: an answer's first token, as the answer's text has it.
  std::vector<std::string> first;
  // Whether within[t] is string content alone (no '"', no control bytes, whole escapes and UTF-8
  // characters): inside any string it fits, if the string may take chars[t] more characters
  // (maxLength), and leaves the string as it was but for their count.
  std::vector<bool> plain;
  std::vector<uint32_t> chars;  // of a plain text (as JsonSchemaPrefix counts them); else 0
  size_t longest = 0;           // bytes of the longest text, within or first
  bool begins_object = false;   // some first token's text can begin a JSON object

  // The table of these texts (`first` empty: the same as `within`).
  static TokenTextTable From(std::vector<std::string> within, std::vector<std::string> first = {});
};
std::shared_ptr<const TokenTextTable> ReadTokenTexts(const model::Tokenizer& tokenizer);

struct JsonModeOptions {
  // Ids past the table's end (a model's padded vocabulary) have no text.
  std::shared_ptr<const TokenTextTable> texts;
  // The schema answers must be valid against (response_format json_schema); null: any object.
  std::shared_ptr<const JsonSchema> schema = nullptr;
  std::vector<int64_t> end_tokens;
  int64_t min_tokens = 0;
  // Which tokens continue an answer is kept by the answer's state (JsonObjectPrefix::key) for
  // the rows and steps that reach it again; false reads the vocabulary for every row at every
  // step (the benchmark's reference).
  bool cache_masks = true;
  // The masks kept for every request of `texts` (api/json_masks.h; the service keeps one per
  // model), by state and schema. Null, or kept for other texts: the request keeps its own, within
  // mask_cache_bytes (a bit per token each; the least recently used dropped first): 4 MiB holds
  // 220 states' masks of a 152,000-token vocabulary.
  std::shared_ptr<JsonMasks> masks = nullptr;
  size_t mask_cache_bytes = size_t{4} << 20;
};

// Steps as AdjustedLogits does (api/answer_steps.h); a row none of whose tokens can continue its
// object fails the step with FailedPrecondition (a vocabulary without some of JSON's bytes).
class JsonObjectLogits : public serve::DecoderBackend {
 public:
  JsonObjectLogits(serve::DecoderBackend& inner, JsonModeOptions options);

  Result<at::Tensor> Step(const at::Tensor& tokens, int64_t position, const at::Tensor& hypo_ids,
                          serve::StepLogits logits) override;
  int64_t position() const override { return inner_.position(); }
  int64_t max_length() const override { return inner_.max_length(); }

  // Row `row`'s answer has ended (at a stop string, a stop token, its object's end): its logits
  // are left alone from now on (serve::GenerateRows steps an ended row with its last token).
  void End(int64_t row);
  // Whether row `row`'s answer, followed by `token` (not yet stepped with), is a whole object.
  bool WholeWith(int64_t row, int64_t token) const;
  // Rows masked with the tokens kept for their state, without reading the vocabulary (after the
  // first step, whose mask is read, or found kept, once for every row).
  int64_t cached_masks() const { return cached_masks_; }
  // Masks read from the vocabulary (a state met first, by this request or by every request that
  // kept its masks in masks()).
  int64_t read_masks() const { return read_masks_; }
  const JsonMasks& masks() const { return *masks_; }  // those this request keeps its masks in

 private:
  // Token t's text after the row's answer so far (whose first token was the `answered`th).
  const std::string* Text(int64_t t, int64_t answered) const;
  // A bit per token of the vocabulary: whether its text continues `answer` (an end token's bit
  // is not read), kept by the answer's state.
  using Bits = JsonMasks::Bits;
  std::shared_ptr<const Bits> Fits(const JsonSchemaPrefix& answer, int64_t answered, int64_t vocab);
  void ReadFits(const JsonSchemaPrefix& answer, int64_t answered, int64_t vocab, Bits& out) const;

  serve::DecoderBackend& inner_;
  JsonModeOptions options_;
  AnswerSteps steps_;
  std::vector<JsonSchemaPrefix> rows_;
  std::vector<bool> ended_;
  int64_t vocab_ = -1;  // of the logits
  Bits ends_;           // the end tokens' bits, for that vocabulary
  bool any_end_ = false;
  std::shared_ptr<JsonMasks> masks_;
  std::shared_ptr<const Bits> first_;  // the start's, at the first step (for every row)
  std::shared_ptr<Bits> scratch_ = std::make_shared<Bits>();  // without cache_masks
  int64_t cached_masks_ = 0;
  int64_t read_masks_ = 0;
};

}  // namespace colony::api
