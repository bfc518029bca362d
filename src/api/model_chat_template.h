// A model's own chat template, run as transformers' apply_chat_template runs it: the Jinja
// program a model directory carries, given `messages` (with assistants' tool calls and tools'
// answers), `add_generation_prompt` (true: the prompt ends where the assistant's answer starts),
// `tools` (the request's, as the client wrote them; none without), `documents` (none), the
// texts of tokenizer_config.json's bos_token, eos_token, unk_token and pad_token (those it names),
// and the request's chat_template_kwargs.
//
//   auto t = ModelChatTemplate::Load(model_dir);    // none when the directory has no template
//   auto pieces = (*t)->Render(request.messages);   // the prompt: text, BOS and EOS
//   auto end = (*t)->EndOfTurn(tokenizer);          // what ends the assistant's turn
//
// Where the template comes from, first found: chat_template.jinja (what transformers saves
// today), chat_template.json's "chat_template", tokenizer_config.json's "chat_template" (a
// string, or transformers' list of named templates). A model may carry a second template for
// chats with tools, named "tool_use" (additional_chat_templates/tool_use.jinja beside
// chat_template.jinja, or in that list; Hermes 2 Pro): as transformers'
// apply_chat_template does, a request with tools runs it and every other request the default one.
// The rendered text is split at the BOS and EOS texts, which become the tokenizer's tokens (a
// SentencePiece tokenizer does not read "<s>" in text as its BOS); other special tokens in the text
// are read as the tokenizer reads them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "api/chat_template.h"
#include "api/jinja_template.h"
#include "api/openai_request.h"
#include "api/tool_calls.h"
#include "core/status.h"
#include "model/tokenizer.h"

namespace colony::api {

// JSON as a template sees it: objects as dicts in their keys' order, integers beyond int64 as
// floats.
jinja::Value JinjaValueFromJson(const nlohmann::ordered_json& j);

class ModelChatTemplate {
 public:
  // The texts of the special tokens the template is given (empty: not given, undefined there).
  struct Tokens {
    std::string bos, eos, unk, pad;
  };

  // A template's text and the file it came from (named in errors).
  struct Source {
    std::string text;
    std::string file;
  };

  // The model directory's template; none when it has none. InvalidArgument naming the file (and
  // the line) for a template that is malformed or uses what Colony's Jinja does not run.
  static Result<std::optional<ModelChatTemplate>> Load(const std::filesystem::path& model_dir);
  // `file` names the source in errors.
  static Result<ModelChatTemplate> FromSource(std::string_view source, std::string file,
                                              Tokens tokens);
  // The default template and one for requests with tools.
  static Result<ModelChatTemplate> FromSources(const Source& default_source,
                                               const std::optional<Source>& tool_use,
                                               Tokens tokens);

  // Renders a conversation of a user's, an assistant's and a user's turn (the tool_use
  // template with a tool offered): InvalidArgument naming the file and the line when a template
  // fails on it other than by refusing it (raise_exception), e.g. by reading a variable that
  // transformers does not define. `colony api` checks this at start, so that such a template
  // does not fail every request.
  Status Check() const;

  // The prompt for the messages, ending where the assistant's answer starts. InvalidArgument
  // naming 'messages' when the template refuses them (its raise_exception's message as it wrote
  // it, e.g. roles that do not alternate) or fails on them (with the line). `tools_json`: the
  // request's tools (GenerationRequest::tools_json); 'tools' is refused by a template that
  // never reads them; with tools the tool_use template runs where there is one. `kwargs_json`: more
  // variables (GenerationRequest::template_kwargs_json).
  Result<std::vector<ChatPiece>> Render(const std::vector<ChatMessage>& messages,
                                        std::string_view tools_json = {},
                                        std::string_view kwargs_json = {}) const;

  // Whether Render() gives the template a variable of this name itself (the request's messages,
  // tools and special tokens' texts, Jinja's globals), which chat_template_kwargs may not set.
  static bool SetsVariable(std::string_view name);

  // What the template writes right after an assistant's answer, found by rendering a short
  // conversation whose answer is a marker: the special token there (Llama 3's <|eot_id|>,
  // ChatML's <|im_end|>, Gemma's <end_of_turn>) as a stop token, or else the first line of text
  // there (a base model's "\nUser:", or "<|im_end|>" where the tokenizer has no such token) as
  // a stop string. Nothing where an EOS follows the answer: EOS ends generation anyway.
  // `tools`: of the template that runs with tools.
  struct TurnEnd {
    std::vector<std::string> stops;
    std::vector<int64_t> tokens;
  };
  TurnEnd EndOfTurn(const model::Tokenizer& tok, bool tools = false) const;

  // The file of the template that runs without tools, or with them.
  const std::string& file(bool tools = false) const { return For(tools).file; }
  bool has_tool_use() const { return tool_use_.has_value(); }
  // How the template that runs with tools tells the model to write tool calls (tool_calls.h);
  // kNone: in no way Colony knows.
  ToolCallFormat tool_format() const { return For(true).format; }

 private:
  struct Variant {
    jinja::Template program;
    std::string file;
    ToolCallFormat format = ToolCallFormat::kNone;
    bool takes_tools = false;  // the template reads `tools`
  };
  static Result<Variant> Parse(std::string_view source, std::string file);
  ModelChatTemplate(Variant main, std::optional<Variant> tool_use, Tokens tokens)
      : default_(std::move(main)), tool_use_(std::move(tool_use)), tokens_(std::move(tokens)) {}
  const Variant& For(bool tools) const { return tools && tool_use_ ? *tool_use_ : default_; }
  // The template's rendering, its errors as jinja::Template gives them.
  Result<std::string> RenderRaw(const std::vector<ChatMessage>& messages, bool prompt,
                                std::string_view tools_json = {},
                                std::string_view kwargs_json = {}) const;
  // The same, errors as a request's.
  Result<std::string> RenderText(const std::vector<ChatMessage>& messages, bool prompt,
                                 std::string_view tools_json = {},
                                 std::string_view kwargs_json = {}) const;

  Variant default_;
  std::optional<Variant> tool_use_;  // transformers' "tool_use" template
  Tokens tokens_;
};

}  // namespace colony::api
