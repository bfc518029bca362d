// Chat templates: how `colony api` turns the messages of a chat completion request into one
// prompt, and the stop strings that end the assistant's turn.
//  - plain (the default for models without a template of their own):
//      "<system text>\n\n" "User: <text>\n" "Assistant: <text>\n" ... "Assistant:"
//    and generation stops at "\nUser:".
//  - chatml (Qwen2 and many fine-tunes): "<|im_start|>role\n<text><|im_end|>\n" ...
//    "<|im_start|>assistant\n", stopping at "<|im_end|>".
// A model whose tokenizer_config.json carries its own chat_template (a Jinja program) is served
// with one of these only when the operator names it (`colony api --chat-template`): Colony does
// not run Jinja, and guessing would silently change what the model sees.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "api/openai_request.h"
#include "core/status.h"

namespace colony::api {

enum class ChatTemplate { kPlain, kChatml };

// "plain" or "chatml"; InvalidArgument otherwise.
Result<ChatTemplate> ParseChatTemplate(std::string_view name);
std::string_view ChatTemplateName(ChatTemplate t);

// The prompt text for the messages, ending where the assistant's answer starts.
std::string RenderChat(ChatTemplate t, const std::vector<ChatMessage>& messages);
// The strings that end the assistant's turn.
std::vector<std::string> ChatStops(ChatTemplate t);

// Whether the model directory's tokenizer_config.json (when there is one) has a chat_template.
Result<bool> HasOwnChatTemplate(const std::filesystem::path& model_dir);

}  // namespace colony::api
