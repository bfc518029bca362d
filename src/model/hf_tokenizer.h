// Hugging Face tokenizer.json: the BPE tokenizers of Llama 3, Qwen2 and GPT-2-style models, read
// and applied natively, with the encodings of the tokenizers library (which transformers' fast
// tokenizers are).
//
// What is understood (anything else is refused with an error naming the field and value):
//  - normalizer: none, NFC, NFD, NFKC, NFKD (ICU), or a Sequence of them;
//  - pre_tokenizer: ByteLevel (with or without GPT-2's regex, add_prefix_space), Split (an
//    Oniguruma regex or a literal string; every split behaviour; invert), or a Sequence of them,
//    as Llama 3 and Qwen2 use;
//  - model: BPE (merges in either format; ignore_merges, byte_fallback, unk_token, fuse_unk);
//  - added_tokens: special and normal, normalized or not, lstrip/rstrip, matched leftmost-longest
//    in the text before pre-tokenization;
//  - post_processor: none, ByteLevel, TemplateProcessing of at most one leading special token
//    (taken as the bos token) and the sequence, or a Sequence of them;
//  - decoder: ByteLevel (or none: tokens joined by spaces);
//  - tokenizer_config.json, when given: bos/eos/pad/unk_token, clean_up_tokenization_spaces, and
//    add_bos_token/add_eos_token, add_prefix_space, do_lower_case, split_special_tokens where
//    they change nothing; its other fields (chat_template, model_max_length, ...) do not change
//    encodings and are not read.
//
// Text that is not valid UTF-8 is first made valid (each bad subpart becomes U+FFFD), as Python
// strings always are. Decode skips special tokens (tokenizers' default).
//
//   auto model = ParseHfTokenizer(json_text, config_text);
//   model::Tokenizer tok(*model);
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "core/status.h"
#include "model/tokenizer.h"

namespace colony::model {

// Llama 3's tokenizer.json is 9 MB, Qwen2's 7 MB.
inline constexpr size_t kMaxHfTokenizerBytes = 64 << 20;
// tokenizer_config.json holds chat templates (Llama 3.1's is 55 KB).
inline constexpr size_t kMaxHfTokenizerConfigBytes = 4 << 20;

// `tokenizer_config_json` may be empty (no tokenizer_config.json).
Result<std::shared_ptr<const TokenizerModel>> ParseHfTokenizer(
    std::string_view tokenizer_json, std::string_view tokenizer_config_json);

}  // namespace colony::model
