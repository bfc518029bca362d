// The chat templates written out (text and BOS/EOS pieces), their stop strings and tokens.
#include "api/chat_template.h"

#include <fmt/format.h>

#include <array>
#include <utility>

namespace colony::api {

namespace {

constexpr std::array<std::pair<std::string_view, ChatTemplate>, 5> kNames = {{
    {"plain", ChatTemplate::kPlain},
    {"chatml", ChatTemplate::kChatml},
    {"llama3", ChatTemplate::kLlama3},
    {"llama2", ChatTemplate::kLlama2},
    {"mistral", ChatTemplate::kMistral},
}};

// Python's str.strip() for ASCII whitespace (what the templates' trim and strip remove).
std::string Strip(std::string_view s) {
  constexpr std::string_view kSpace = " \t\n\r\v\f";
  const size_t begin = s.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  return std::string(s.substr(begin, s.find_last_not_of(kSpace) - begin + 1));
}

ChatPiece Text(std::string text) { return {.kind = ChatPiece::kText, .text = std::move(text)}; }
ChatPiece Bos() { return {.kind = ChatPiece::kBos, .text = {}}; }
ChatPiece Eos() { return {.kind = ChatPiece::kEos, .text = {}}; }

// Llama 2 and Mistral: after an optional system message, user and assistant turns alternate,
// starting with the user and ending with a user's turn.
Status CheckAlternation(const std::vector<ChatMessage>& messages, size_t first,
                        std::string_view name) {
  for (size_t i = first; i < messages.size(); ++i) {
    const bool user = (i - first) % 2 == 0;
    if (messages[i].role != (user ? "user" : "assistant")) {
      return InvalidArgument(fmt::format(
          "'messages': the {} chat template needs user and assistant turns to alternate, user "
          "first{}; message {} is '{}'",
          name, first == 1 ? " (after one system message)" : "", i, messages[i].role));
    }
  }
  if (messages.size() == first || messages.back().role != "user") {
    return InvalidArgument(fmt::format(
        "'messages': the {} chat template needs the last message to be the user's", name));
  }
  return Status::Ok();
}

}  // namespace

Result<ChatTemplate> ParseChatTemplate(std::string_view name) {
  for (const auto& [n, t] : kNames) {
    if (n == name) return t;
  }
  return InvalidArgument(
      fmt::format("chat template '{}' is not one of plain, chatml, llama3, llama2, mistral", name));
}

std::string_view ChatTemplateName(ChatTemplate t) {
  for (const auto& [n, v] : kNames) {
    if (v == t) return n;
  }
  return "plain";
}

Result<std::vector<ChatPiece>> RenderChat(ChatTemplate t,
                                          const std::vector<ChatMessage>& messages) {
  std::vector<ChatPiece> out = {Bos()};
  switch (t) {
    case ChatTemplate::kPlain: {
      std::string text;
      for (const auto& m : messages) {
        if (m.role == "system") {
          text += m.content + "\n\n";
        } else {
          text += (m.role == "user" ? "User: " : "Assistant: ") + m.content + "\n";
        }
      }
      out.push_back(Text(text + "Assistant:"));
      return out;
    }
    case ChatTemplate::kChatml: {
      std::string text;
      for (const auto& m : messages) {
        text += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      }
      out.push_back(Text(text + "<|im_start|>assistant\n"));
      return out;
    }
    case ChatTemplate::kLlama3: {
      std::string text;
      for (const auto& m : messages) {
        text += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + Strip(m.content) +
                "<|eot_id|>";
      }
      out.push_back(Text(text + "<|start_header_id|>assistant<|end_header_id|>\n\n"));
      return out;
    }
    case ChatTemplate::kLlama2: {
      const bool system = !messages.empty() && messages.front().role == "system";
      COLONY_RETURN_IF_ERROR(CheckAlternation(messages, system ? 1 : 0, "llama2"));
      out.clear();
      for (size_t i = system ? 1 : 0; i < messages.size(); ++i) {
        std::string content = messages[i].content;
        if (system && i == 1) {
          content = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n" + content;
        }
        if (messages[i].role == "user") {
          out.push_back(Bos());
          out.push_back(Text("[INST] " + Strip(content) + " [/INST]"));
        } else {
          out.push_back(Text(" " + Strip(content) + " "));
          out.push_back(Eos());
        }
      }
      return out;
    }
    case ChatTemplate::kMistral: {
      const bool system = !messages.empty() && messages.front().role == "system";
      COLONY_RETURN_IF_ERROR(CheckAlternation(messages, system ? 1 : 0, "mistral"));
      for (size_t i = system ? 1 : 0; i < messages.size(); ++i) {
        std::string content = messages[i].content;
        if (system && i == 1) content = messages[0].content + "\n\n" + content;
        if (messages[i].role == "user") {
          out.push_back(Text("[INST] " + content + " [/INST]"));
        } else {
          out.push_back(Text(content));
          out.push_back(Eos());
        }
      }
      return out;
    }
  }
  return InvalidArgument("unknown chat template");
}

std::vector<std::string> ChatStops(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::kPlain:
      return {"\nUser:"};
    case ChatTemplate::kChatml:
      return {"<|im_end|>"};
    case ChatTemplate::kLlama3:
      return {"<|eot_id|>"};
    case ChatTemplate::kLlama2:
    case ChatTemplate::kMistral:
      return {};  // their turns end with the EOS token
  }
  return {};
}

std::vector<int64_t> EncodeChat(const std::vector<ChatPiece>& pieces, const model::Tokenizer& tok) {
  std::vector<int64_t> out;
  for (const ChatPiece& p : pieces) {
    if (p.kind == ChatPiece::kText) {
      for (int32_t id : tok.Encode(p.text)) out.push_back(id);
    } else if (const int id = p.kind == ChatPiece::kBos ? tok.bos_id() : tok.eos_id(); id >= 0) {
      out.push_back(id);
    } else {
      for (int32_t t : tok.Encode(p.text)) out.push_back(t);
    }
  }
  return out;
}

std::vector<int64_t> ChatStopTokens(ChatTemplate t, const model::Tokenizer& tok) {
  std::vector<int64_t> out;
  for (const std::string& stop : ChatStops(t)) {
    const std::vector<int32_t> ids = tok.Encode(stop);
    // One token whose text decoding skips: a special token.
    if (ids.size() == 1 && tok.Decode(ids).empty()) out.push_back(ids[0]);
  }
  return out;
}

Status CheckChatTemplate(ChatTemplate t, const model::Tokenizer& tok) {
  if (t == ChatTemplate::kLlama3) {
    for (std::string_view marker : {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}) {
      if (const size_t n = tok.Encode(marker).size(); n != 1) {
        return FailedPrecondition(fmt::format(
            "the llama3 chat template needs a tokenizer that reads '{}' as one token (Llama 3's "
            "tokenizer.json); this one ({}) makes {} tokens of it",
            marker, tok.file_name(), n));
      }
    }
  }
  if ((t == ChatTemplate::kLlama2 || t == ChatTemplate::kMistral) &&
      (tok.bos_id() < 0 || tok.eos_id() < 0)) {
    return FailedPrecondition(fmt::format(
        "the {} chat template puts BOS and EOS tokens between turns; this tokenizer ({}) lacks {}",
        ChatTemplateName(t), tok.file_name(), tok.bos_id() < 0 ? "a BOS token" : "an EOS token"));
  }
  return Status::Ok();
}

}  // namespace colony::api
