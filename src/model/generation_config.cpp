// generation_config.json -> GenerationConfig: the fields read, those known to change nothing,
// and the checks that refuse the rest by name.
#include "model/generation_config.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "core/files.h"

namespace colony::model {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxGenerationConfigBytes = 1 << 20;
constexpr int64_t kMaxTokenId = int64_t{1} << 31;
constexpr size_t kMaxEosTokens = 64;

Status Bad(std::string_view field, const json& value, std::string_view why) {
  return InvalidArgument(
      fmt::format("generation config: \"{}\" = {} {}", field, value.dump(), why));
}

// Fields that do not change the tokens generated: bookkeeping, token ids the tokenizer owns,
// outputs Colony does not return, the cache's layout, and lengths (colony generate's
// --max-new-tokens and a request's max_tokens always give one).
const std::set<std::string_view>& IrrelevantFields() {
  static const std::set<std::string_view> fields = {
      "_from_model_config", "transformers_version", "_commit_hash",
      "bos_token_id",       "pad_token_id",         "decoder_start_token_id",
      "use_cache",          "output_attentions",    "output_hidden_states",
      "output_scores",      "output_logits",        "return_dict_in_generate",
      "max_length",         "max_new_tokens",       "cache_implementation",
  };
  return fields;
}

Result<double> Number(const json& v, std::string_view field, double low, double high) {
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < low ||
      v.get<double>() > high) {
    return Bad(field, v, fmt::format("must be a number in [{}, {}]", low, high));
  }
  return v.get<double>();
}

Result<int64_t> TokenId(const json& v, std::string_view field) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= kMaxTokenId) {
    return Bad(field, v, "must be a token id (an integer from 0)");
  }
  return v.get<int64_t>();
}

// A field accepted only at the value that changes nothing.
struct Fixed {
  const char* name;
  double value;
  const char* why;
};

}  // namespace

Result<GenerationConfig> GenerationConfig::FromJson(const json& j) {
  if (!j.is_object()) return InvalidArgument("generation config: not a JSON object");
  static const Fixed kFixed[] = {
      {"num_beams", 1, "(beam search by default; colony generate takes --num-beams)"},
      {"num_beam_groups", 1, "(diverse beam search is not supported)"},
      {"num_return_sequences", 1, "(colony generate returns one sequence)"},
      {"length_penalty", 1, "(a length penalty other than 1 is not supported)"},
      {"no_repeat_ngram_size", 0, "(n-gram blocking is not supported)"},
      {"encoder_no_repeat_ngram_size", 0, "(n-gram blocking is not supported)"},
      {"min_length", 0, "(a minimum length is not supported)"},
      {"min_new_tokens", 0, "(a minimum length is not supported)"},
      {"typical_p", 1, "(typical sampling is not supported)"},
      {"min_p", 0, "(min-p sampling is not a model default here; colony api takes it per request)"},
      {"epsilon_cutoff", 0, "(epsilon sampling is not supported)"},
      {"eta_cutoff", 0, "(eta sampling is not supported)"},
      {"diversity_penalty", 0, "(diverse beam search is not supported)"},
      {"encoder_repetition_penalty", 1, "(not supported)"},
  };
  GenerationConfig g;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (IrrelevantFields().contains(key)) continue;
    if (key == "eos_token_id") {
      if (v.is_null()) continue;
      if (v.is_array()) {
        if (v.size() > kMaxEosTokens) {
          return InvalidArgument(fmt::format("generation config: \"{}\" lists {} ids, more than {}",
                                             key, v.size(), kMaxEosTokens));
        }
        for (const json& id : v) {
          COLONY_ASSIGN_OR_RETURN(int64_t t, TokenId(id, key));
          g.eos_token_ids.push_back(t);
        }
      } else {
        COLONY_ASSIGN_OR_RETURN(int64_t t, TokenId(v, key));
        g.eos_token_ids.push_back(t);
      }
    } else if (key == "do_sample") {
      if (!v.is_boolean()) return Bad(key, v, "must be true or false");
      g.do_sample = v.get<bool>();
    } else if (key == "temperature") {
      if (v.is_null()) continue;
      COLONY_ASSIGN_OR_RETURN(g.temperature, Number(v, key, 0, 100));
    } else if (key == "top_p") {
      if (v.is_null()) continue;
      COLONY_ASSIGN_OR_RETURN(g.top_p, Number(v, key, 0, 1));
      if (*g.top_p == 0) return Bad(key, v, "must be above 0");
    } else if (key == "top_k") {
      if (v.is_null()) continue;
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxTokenId) {
        return Bad(key, v, "must be an integer from 0");
      }
      g.top_k = v.get<int64_t>();
    } else if (key == "repetition_penalty") {
      if (v.is_null()) continue;
      COLONY_ASSIGN_OR_RETURN(g.repetition_penalty, Number(v, key, 0.01, 100));
    } else if (auto f = std::ranges::find_if(kFixed, [&](const Fixed& x) { return key == x.name; });
               f != std::end(kFixed)) {
      if (v.is_null() || (v.is_number() && v.get<double>() == f->value)) continue;
      return Unimplemented(fmt::format(
          "generation config: \"{}\" = {} {}; remove the field from generation_config.json to "
          "generate without it",
          key, v.dump(), f->why));
    } else {
      return Unimplemented(fmt::format(
          "generation config: \"{}\" = {} is not understood by Colony; remove the field from "
          "generation_config.json to generate without it",
          key, v.dump()));
    }
  }
  return g;
}

SamplingDefaults GenerationConfig::Defaults() const {
  SamplingDefaults d;
  d.repetition_penalty = repetition_penalty.value_or(1.0);
  if (!do_sample) return d;  // greedy: transformers ignores temperature, top-k and top-p
  d.temperature = temperature.value_or(1.0);
  d.top_k = top_k.value_or(50);
  d.top_p = top_p.value_or(1.0);
  return d;
}

SamplingDefaults GenerationConfig::Over(SamplingDefaults base) const {
  if (temperature) base.temperature = *temperature;
  if (top_k) base.top_k = *top_k;
  if (top_p) base.top_p = *top_p;
  if (repetition_penalty) base.repetition_penalty = *repetition_penalty;
  return base;
}

Result<GenerationConfig> LoadGenerationConfig(const std::filesystem::path& dir) {
  const auto path = dir / kGenerationConfigFileName;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return GenerationConfig{};
  COLONY_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, kMaxGenerationConfigBytes));
  auto doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return InvalidArgument(fmt::format("{} is not valid JSON", path.string()));
  auto g = GenerationConfig::FromJson(doc);
  if (!g.ok()) return g.status().WithContext(path.string());
  return g;
}

}  // namespace colony::model
