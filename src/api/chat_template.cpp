// The plain and ChatML chat templates, and finding a model's own template.
#include "api/chat_template.h"

#include "core/files.h"
#include "model/strict_json.h"

namespace colony::api {

Result<ChatTemplate> ParseChatTemplate(std::string_view name) {
  if (name == "plain") return ChatTemplate::kPlain;
  if (name == "chatml") return ChatTemplate::kChatml;
  return InvalidArgument("chat template '" + std::string(name) + "' is not one of plain, chatml");
}

std::string_view ChatTemplateName(ChatTemplate t) {
  return t == ChatTemplate::kChatml ? "chatml" : "plain";
}

std::string RenderChat(ChatTemplate t, const std::vector<ChatMessage>& messages) {
  std::string out;
  if (t == ChatTemplate::kChatml) {
    for (const auto& m : messages) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    }
    return out + "<|im_start|>assistant\n";
  }
  for (const auto& m : messages) {
    if (m.role == "system") {
      out += m.content + "\n\n";
    } else {
      out += (m.role == "user" ? "User: " : "Assistant: ") + m.content + "\n";
    }
  }
  return out + "Assistant:";
}

std::vector<std::string> ChatStops(ChatTemplate t) {
  if (t == ChatTemplate::kChatml) return {"<|im_end|>"};
  return {"\nUser:"};
}

Result<bool> HasOwnChatTemplate(const std::filesystem::path& model_dir) {
  const auto file = model_dir / "tokenizer_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return false;
  COLONY_ASSIGN_OR_RETURN(std::string text, ReadFileToString(file, 16 << 20));
  COLONY_ASSIGN_OR_RETURN(auto j, model::ParseStrictJsonObject(text, file.string(), 64));
  auto it = j.find("chat_template");
  return it != j.end() && !it->is_null();
}

}  // namespace colony::api
