// Chat templates: how `colony api` turns the messages of a chat completion request into one
// prompt, and what ends the assistant's turn. Each is the text of the template its model family
// publishes (tokenizer_config.json's Jinja program), written out here:
//  - plain (the default for models without a template of their own):
//      BOS "<system text>\n\n" "User: <text>\n" "Assistant: <text>\n" ... "Assistant:"
//    stopping at "\nUser:".
//  - chatml (Qwen2 and many fine-tunes): BOS "<|im_start|>role\n<text><|im_end|>\n" ...
//    "<|im_start|>assistant\n", stopping at "<|im_end|>".
//  - llama3 (Llama 3 Instruct): BOS "<|start_header_id|>role<|end_header_id|>\n\n<text>
//    <|eot_id|>" ... "<|start_header_id|>assistant<|end_header_id|>\n\n" (texts trimmed), stopping
//    at "<|eot_id|>".
//  - llama2 (Llama 2 Chat): BOS "[INST] <<SYS>>\n<system>\n<</SYS>>\n\n<user> [/INST]" " <answer> "
//    EOS, then BOS "[INST] <user> [/INST]" ... (texts stripped; turns must alternate, user first).
//  - mistral (Mistral Instruct v0.1/v0.2): BOS "[INST] <user> [/INST]" "<answer>" EOS ...; a
//    system message goes before the first user text, with "\n\n" (the template has no system role).
// BOS and EOS are the tokenizer's tokens, not text: a SentencePiece tokenizer does not read "<s>"
// in text as its BOS. A model with a chat template of its own (a Jinja program) is served with
// that one (api/model_chat_template.h) unless the operator names one of these
// (`colony api --chat-template`).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/openai_request.h"
#include "core/status.h"
#include "model/tokenizer.h"

namespace colony::api {

enum class ChatTemplate { kPlain, kChatml, kLlama3, kLlama2, kMistral };

// One of the names above; InvalidArgument otherwise.
Result<ChatTemplate> ParseChatTemplate(std::string_view name);
std::string_view ChatTemplateName(ChatTemplate t);

// A piece of a rendered chat: text, or the tokenizer's BOS or EOS token (whose text, where a
// template wrote it, is kept for a tokenizer without that token).
struct ChatPiece {
  enum Kind { kText, kBos, kEos };
  Kind kind = kText;
  std::string text;
  bool operator==(const ChatPiece&) const = default;
};

// The prompt for the messages, ending where the assistant's answer starts. InvalidArgument
// (naming 'messages') for what the template cannot express, e.g. llama2's turns out of order.
Result<std::vector<ChatPiece>> RenderChat(ChatTemplate t, const std::vector<ChatMessage>& messages);
// The strings that end the assistant's turn.
std::vector<std::string> ChatStops(ChatTemplate t);

// The prompt's tokens: text encoded piece by piece, BOS and EOS where the template puts them
// (where the tokenizer has none: their text, encoded, if any).
std::vector<int64_t> EncodeChat(const std::vector<ChatPiece>& pieces, const model::Tokenizer& tok);
// The tokens that end the assistant's turn as its EOS does: the stop strings the tokenizer reads
// as one special token (which decoding skips, so the stop string would never be seen).
std::vector<int64_t> ChatStopTokens(ChatTemplate t, const model::Tokenizer& tok);
// FailedPrecondition when the tokenizer cannot serve the template: llama3's markers must each be
// one token, llama2's and mistral's BOS and EOS must exist.
Status CheckChatTemplate(ChatTemplate t, const model::Tokenizer& tok);

}  // namespace colony::api
