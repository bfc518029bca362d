// A model's own Jinja chat template: found in the model directory, rendered over a request's
// messages, split at BOS and EOS, and probed for what ends the assistant's turn.
#include "api/model_chat_template.h"

#include <fmt/format.h>

#include <algorithm>

#include "api/jinja_builtins.h"
#include "core/files.h"
#include "model/strict_json.h"

namespace colony::api {

namespace {

using jinja::Dict;
using jinja::List;
using jinja::Value;

constexpr uint64_t kMaxFileBytes = 16 << 20;

Result<bool> Exists(const std::filesystem::path& file) {
  std::error_code ec;
  const bool exists = std::filesystem::exists(file, ec);
  if (ec) return FailedPrecondition(fmt::format("{}: {}", file.string(), ec.message()));
  return exists;
}

Result<nlohmann::json> ReadJson(const std::filesystem::path& file) {
  COLONY_ASSIGN_OR_RETURN(std::string text, ReadFileToString(file, kMaxFileBytes));
  return model::ParseStrictJsonObject(text, file.filename().string(), 64);
}

// A special token's text in tokenizer_config.json: "text", {"content": "text", ...} or null.
Result<std::string> TokenText(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::string();
  const nlohmann::json* content = &*it;
  if (it->is_object()) {
    auto c = it->find("content");
    if (c == it->end()) {
      return InvalidArgument(fmt::format("tokenizer_config.json's {} has no \"content\"", key));
    }
    content = &*c;
  }
  if (!content->is_string()) {
    return InvalidArgument(
        fmt::format("tokenizer_config.json's {} must be a string, an object or null", key));
  }
  return content->get<std::string>();
}

// The templates a model directory names: the default one and transformers' "tool_use".
struct Found {
  std::optional<ModelChatTemplate::Source> main;
  std::optional<ModelChatTemplate::Source> tool_use;
};

// tokenizer_config.json's chat_template: a string, or transformers' list of {"name", "template"}
// (each name once) of which the one named "default" is the template of every chat, or of those
// without tools where one is named "tool_use". Other names are chosen by name in transformers,
// which an OpenAI request cannot do.
Result<Found> TemplateField(const nlohmann::json& j, const std::string& file) {
  Found found;
  auto it = j.find("chat_template");
  if (it == j.end() || it->is_null()) return found;
  if (it->is_string()) {
    found.main = {.text = it->get<std::string>(), .file = file};
    return found;
  }
  if (!it->is_array()) {
    return InvalidArgument(fmt::format("{}'s chat_template must be a string or a list", file));
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& named = (*it)[i];
    if (!named.is_object() || !named.contains("name") || !named["name"].is_string() ||
        !named.contains("template") || !named["template"].is_string()) {
      return InvalidArgument(fmt::format(
          "{}'s chat_template[{}] must be an object with a string \"name\" and a string "
          "\"template\"",
          file, i));
    }
    std::string name = named["name"].get<std::string>();
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      return InvalidArgument(
          fmt::format("{}'s chat_template names a template \"{}\" twice", file, name));
    }
    if (name == "default") {
      found.main = {.text = named["template"].get<std::string>(), .file = file};
    }
    if (name == "tool_use") {
      found.tool_use = {.text = named["template"].get<std::string>(),
                        .file = file + "'s \"tool_use\" chat_template"};
    }
    names.push_back(std::move(name));
  }
  if (!found.main) {
    return InvalidArgument(
        fmt::format("{}'s chat_template is a list without a template named \"default\"", file));
  }
  return found;
}

// The .jinja files of transformers' additional_chat_templates/ (at most a few: the first found).
Result<std::optional<std::filesystem::path>> AnyJinjaIn(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (it->path().extension() == ".jinja") return std::optional(it->path());
  }
  if (ec) return FailedPrecondition(fmt::format("{}: {}", dir.string(), ec.message()));
  return std::optional<std::filesystem::path>();
}

// A request's tools as the templates' tool_use variants are checked and probed with.
constexpr std::string_view kProbeTools =
    R"([{"type": "function", "function": {"name": "probe", "description": "A tool.", )"
    R"("parameters": {"type": "object", "properties": {}}}}])";

// A JSON text the request parser has checked (an object, or the tools' array).
Value FromCheckedJson(std::string_view text) {
  auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  return JinjaValueFromJson(j);
}

// A message as transformers hands it to the template: an assistant's tool calls as
// {"id", "type": "function", "function": {"name", "arguments": {...}}} (arguments as an object,
// as vLLM passes them: templates write them with tojson or iterate them), a tool's answer with
// its tool_call_id.
Value Message(const ChatMessage& m) {
  Dict d = {{"role", Value::String(m.role)},
            {"content", m.content_null ? Value::None() : Value::String(m.content)}};
  if (!m.tool_calls.empty()) {
    List calls;
    for (const ToolCall& c : m.tool_calls) {
      Dict function = {{"name", Value::String(c.name)},
                       {"arguments", FromCheckedJson(c.arguments)}};
      calls.push_back(Value::FromDict({{"id", Value::String(c.id)},
                                       {"type", Value::String("function")},
                                       {"function", Value::FromDict(std::move(function))}}));
    }
    d.emplace_back("tool_calls", Value::FromList(std::move(calls)));
  }
  if (m.role == "tool") d.emplace_back("tool_call_id", Value::String(m.tool_call_id));
  return Value::FromDict(std::move(d));
}

// A text that no answer, template or tokenizer writes by chance.
constexpr std::string_view kProbe = "colony-end-of-turn-probe-4f1c";

}  // namespace

jinja::Value JinjaValueFromJson(const nlohmann::ordered_json& j) {
  using Type = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case Type::null:
      return Value::None();
    case Type::boolean:
      return Value::Bool(j.get<bool>());
    case Type::number_integer:
      return Value::Int(j.get<int64_t>());
    case Type::number_unsigned:
      if (j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        return Value::Float(j.get<double>());
      }
      return Value::Int(j.get<int64_t>());
    case Type::number_float:
      return Value::Float(j.get<double>());
    case Type::string:
      return Value::String(j.get<std::string>());
    case Type::array: {
      List l;
      l.reserve(j.size());
      for (const auto& item : j) l.push_back(JinjaValueFromJson(item));
      return Value::FromList(std::move(l));
    }
    case Type::object: {
      Dict d;
      d.reserve(j.size());
      for (const auto& [k, v] : j.items()) d.emplace_back(k, JinjaValueFromJson(v));
      return Value::FromDict(std::move(d));
    }
    default:  // binary, discarded
      return Value::None();
  }
}

Result<std::optional<ModelChatTemplate>> ModelChatTemplate::Load(const std::filesystem::path& dir) {
  Tokens tokens;
  Found found;
  const auto config_file = dir / "tokenizer_config.json";
  COLONY_ASSIGN_OR_RETURN(const bool has_config, Exists(config_file));
  nlohmann::json config = nlohmann::json::object();
  if (has_config) {
    COLONY_ASSIGN_OR_RETURN(config, ReadJson(config_file));
    COLONY_ASSIGN_OR_RETURN(tokens.bos, TokenText(config, "bos_token"));
    COLONY_ASSIGN_OR_RETURN(tokens.eos, TokenText(config, "eos_token"));
    COLONY_ASSIGN_OR_RETURN(tokens.unk, TokenText(config, "unk_token"));
    COLONY_ASSIGN_OR_RETURN(tokens.pad, TokenText(config, "pad_token"));
  }
  const auto jinja_file = dir / "chat_template.jinja";
  const auto json_file = dir / "chat_template.json";
  // transformers saves a list's other templates there, by name, beside chat_template.jinja.
  const auto extra_dir = dir / "additional_chat_templates";
  const auto tool_use_file = extra_dir / "tool_use.jinja";
  COLONY_ASSIGN_OR_RETURN(const bool has_jinja, Exists(jinja_file));
  COLONY_ASSIGN_OR_RETURN(const bool has_json, Exists(json_file));
  COLONY_ASSIGN_OR_RETURN(const bool has_extra, Exists(extra_dir));
  if (has_jinja) {
    COLONY_ASSIGN_OR_RETURN(std::string text, ReadFileToString(jinja_file, kMaxFileBytes));
    found.main = {.text = std::move(text), .file = jinja_file.string()};
    COLONY_ASSIGN_OR_RETURN(const bool has_tool_use, Exists(tool_use_file));
    if (has_tool_use) {
      COLONY_ASSIGN_OR_RETURN(std::string tool_text,
                              ReadFileToString(tool_use_file, kMaxFileBytes));
      found.tool_use = {.text = std::move(tool_text), .file = tool_use_file.string()};
    }
  } else {
    // Without chat_template.jinja, transformers takes these templates for all there are and has
    // no default one (nor the configuration's).
    std::optional<std::filesystem::path> extra;
    if (has_extra) {
      COLONY_ASSIGN_OR_RETURN(extra, AnyJinjaIn(extra_dir));
    }
    if (extra) {
      return InvalidArgument(fmt::format(
          "{} is a chat template of a model directory without chat_template.jinja, which "
          "transformers saves as the default template beside it",
          extra->string()));
    }
    if (has_json) {
      COLONY_ASSIGN_OR_RETURN(auto j, ReadJson(json_file));
      COLONY_ASSIGN_OR_RETURN(found, TemplateField(j, json_file.string()));
    } else if (has_config) {
      COLONY_ASSIGN_OR_RETURN(found, TemplateField(config, config_file.string()));
    }
  }
  if (!found.main) return std::optional<ModelChatTemplate>();
  COLONY_ASSIGN_OR_RETURN(auto t, FromSources(*found.main, found.tool_use, std::move(tokens)));
  return std::optional<ModelChatTemplate>(std::move(t));
}

Result<ModelChatTemplate::Variant> ModelChatTemplate::Parse(std::string_view source,
                                                            std::string file) {
  auto t = jinja::Template::Parse(source);
  if (!t.ok()) {
    return InvalidArgument(fmt::format("{}: the chat template {}", file, t.status().message()));
  }
  return Variant{.program = std::move(*t),
                 .file = std::move(file),
                 .format = DetectToolCallFormat(source),
                 .takes_tools = source.find("tools") != std::string_view::npos};
}

Result<ModelChatTemplate> ModelChatTemplate::FromSource(std::string_view source, std::string file,
                                                        Tokens tokens) {
  COLONY_ASSIGN_OR_RETURN(Variant main, Parse(source, std::move(file)));
  return ModelChatTemplate(std::move(main), std::nullopt, std::move(tokens));
}

Result<ModelChatTemplate> ModelChatTemplate::FromSources(const Source& default_source,
                                                         const std::optional<Source>& tool_use,
                                                         Tokens tokens) {
  COLONY_ASSIGN_OR_RETURN(Variant main, Parse(default_source.text, default_source.file));
  std::optional<Variant> with_tools;
  if (tool_use) {
    COLONY_ASSIGN_OR_RETURN(with_tools, Parse(tool_use->text, tool_use->file));
  }
  return ModelChatTemplate(std::move(main), std::move(with_tools), std::move(tokens));
}

// The names RenderRaw() puts in the context, besides the request's chat_template_kwargs.
constexpr std::string_view kContextNames[] = {"messages",  "add_generation_prompt",
                                              "tools",     "documents",
                                              "bos_token", "eos_token",
                                              "unk_token", "pad_token"};

bool ModelChatTemplate::SetsVariable(std::string_view name) {
  // Jinja's globals besides Colony's (whose templates would meet the request's value there).
  for (std::string_view global : {"lipsum", "cycler", "joiner"}) {
    if (name == global) return true;
  }
  return std::ranges::find(kContextNames, name) != std::end(kContextNames) ||
         !jinja::Global(name).undefined();
}

Result<std::string> ModelChatTemplate::RenderRaw(const std::vector<ChatMessage>& messages,
                                                 bool prompt, std::string_view tools_json,
                                                 std::string_view kwargs_json) const {
  List list;
  list.reserve(messages.size());
  for (const ChatMessage& m : messages) list.push_back(Message(m));
  Dict context = {
      {std::string(kContextNames[0]), Value::FromList(std::move(list))},
      {std::string(kContextNames[1]), Value::Bool(prompt)},
      {std::string(kContextNames[2]),
       tools_json.empty() ? Value::None() : FromCheckedJson(tools_json)},
      {std::string(kContextNames[3]), Value::None()},
  };
  const std::string* texts[] = {&tokens_.bos, &tokens_.eos, &tokens_.unk, &tokens_.pad};
  for (size_t k = 0; k < 4; ++k) {
    if (!texts[k]->empty()) {
      context.emplace_back(std::string(kContextNames[4 + k]), Value::String(*texts[k]));
    }
  }
  if (!kwargs_json.empty()) {  // names the request parser let through (none of the above)
    const Value kwargs = FromCheckedJson(kwargs_json);
    if (kwargs.kind() == Value::Kind::kDict) {
      for (const auto& [name, value] : kwargs.as_dict()) {
        if (SetsVariable(name)) {
          return InvalidArgument(
              fmt::format("chat_template_kwargs: '{}' is set by colony api", name));
        }
        context.emplace_back(name, value);
      }
    }
  }
  return For(!tools_json.empty()).program.Render(context);
}

Result<std::string> ModelChatTemplate::RenderText(const std::vector<ChatMessage>& messages,
                                                  bool prompt, std::string_view tools_json,
                                                  std::string_view kwargs_json) const {
  auto out = RenderRaw(messages, prompt, tools_json, kwargs_json);
  if (out.ok()) return out;
  const Status& st = out.status();
  switch (st.code()) {
    case StatusCode::kFailedPrecondition:  // the template's own refusal, in its words
      return InvalidArgument(fmt::format("'messages': {}", st.message()));
    case StatusCode::kInvalidArgument:
      return InvalidArgument(
          fmt::format("'messages': the model's chat template ({}) failed on "
                      "them: {}",
                      file(!tools_json.empty()), st.message()));
    default:
      return st.WithContext("'messages': the model's chat template");
  }
}

Status ModelChatTemplate::Check() const {
  for (const bool tools : {false, true}) {
    if (tools && !tool_use_) break;
    auto out = RenderRaw({{"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}}, true,
                         tools ? kProbeTools : std::string_view());
    if (out.ok() || out.status().code() == StatusCode::kFailedPrecondition) continue;
    return InvalidArgument(fmt::format(
        "{}: the chat template fails on a conversation of a user's, an assistant's and a user's "
        "turn{}: {}",
        file(tools), tools ? " with a tool offered" : "", out.status().message()));
  }
  return Status::Ok();
}

Result<std::vector<ChatPiece>> ModelChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                         std::string_view tools_json,
                                                         std::string_view kwargs_json) const {
  if (!tools_json.empty() && !For(true).takes_tools) {
    return InvalidArgument(
        fmt::format("'tools': the model's chat template ({}) does not take tools", file(true)));
  }
  COLONY_ASSIGN_OR_RETURN(std::string text, RenderText(messages, true, tools_json, kwargs_json));
  std::vector<ChatPiece> pieces;
  size_t pos = 0;
  while (pos < text.size()) {
    // The nearest BOS or EOS text (the longer where both start at one place).
    size_t at = std::string::npos;
    ChatPiece::Kind kind = ChatPiece::kText;
    const std::string* marker = nullptr;
    for (const auto& [k, t] :
         {std::pair{ChatPiece::kBos, &tokens_.bos}, std::pair{ChatPiece::kEos, &tokens_.eos}}) {
      if (t->empty()) continue;
      const size_t found = text.find(*t, pos);
      if (found < at || (found == at && found != std::string::npos && t->size() > marker->size())) {
        at = found;
        kind = k;
        marker = t;
      }
    }
    if (at > pos) {
      pieces.push_back({.kind = ChatPiece::kText, .text = text.substr(pos, at - pos)});
    }
    if (at == std::string::npos) break;
    pieces.push_back({.kind = kind, .text = *marker});
    pos = at + marker->size();
  }
  return pieces;
}

ModelChatTemplate::TurnEnd ModelChatTemplate::EndOfTurn(const model::Tokenizer& tok,
                                                        bool tools) const {
  TurnEnd end;
  const std::string_view probe_tools = tools && tool_use_ ? kProbeTools : std::string_view();
  auto text = RenderText({{"user", "Hi"}, {"assistant", std::string(kProbe)}, {"user", "Next"}},
                         false, probe_tools);
  if (!text.ok()) {
    text = RenderText({{"user", "Hi"}, {"assistant", std::string(kProbe)}}, false, probe_tools);
  }
  if (!text.ok()) return end;
  const size_t at = text->find(kProbe);
  if (at == std::string::npos) return end;
  std::string after = text->substr(at + kProbe.size());
  if (const size_t next = after.find("Next"); next != std::string::npos) after.resize(next);
  // Whitespace the template writes before the end (Llama 2's " " before EOS) is not the end.
  const size_t first = after.find_first_not_of(" \t\n\r");
  if (first == std::string::npos) return end;
  after.erase(0, first);
  if (!tokens_.eos.empty() && after.rfind(tokens_.eos, 0) == 0) return end;
  // The longest start of it that the tokenizer reads as one special token.
  for (size_t n = std::min<size_t>(after.size(), 64); n > 0; --n) {
    const std::string candidate = after.substr(0, n);
    const std::vector<int32_t> ids = tok.Encode(candidate);
    if (ids.size() == 1 && tok.Decode(ids).empty()) {
      end.stops.push_back(candidate);
      end.tokens.push_back(ids[0]);
      return end;
    }
  }
  // Plain text: the turn ends where the template starts the next one, at the first line it
  // writes after the answer (with the whitespace before it, and without trailing whitespace,
  // which the model need not write): a base model's "\nUser:".
  std::string line = after.substr(0, after.find('\n'));
  line.erase(line.find_last_not_of(" \t\r") + 1);
  if (!line.empty()) end.stops.push_back(text->substr(at + kProbe.size(), first) + line);
  return end;
}

}  // namespace colony::api
