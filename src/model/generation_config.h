// A checkpoint's generation_config.json: the defaults transformers' generate() takes from it (the
// tokens that end a generation, and whether and how it samples).
//
//   COLONY_ASSIGN_OR_RETURN(GenerationConfig g, LoadGenerationConfig(model_dir));
//   g.eos_token_ids;        // e.g. Llama 3.1 Instruct's {128001, 128008, 128009}
//   g.Defaults();           // greedy, or sampling at the file's temperature, top-k and top-p
//
// Every field of the file is understood, or known not to change what is generated (bookkeeping,
// token ids the tokenizer owns, lengths that Colony's commands and requests always give), or
// accepted only at the value that changes nothing (num_beams 1, ...), or loading fails with an
// error that names it: Colony never generates differently from what the file asks for without
// saying so. A checkpoint without the file generates as transformers' defaults do (greedy).
// Torch-free (fuzzed with the config reader).
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <vector>

#include "core/status.h"

namespace colony::model {

inline constexpr const char* kGenerationConfigFileName = "generation_config.json";

// Sampling settings, as model::SamplingOptions holds them (temperature 0: greedy; top_k 0 and
// top_p 1: off; repetition_penalty 1: off).
struct SamplingDefaults {
  double temperature = 0;
  int64_t top_k = 0;
  double top_p = 1.0;
  double repetition_penalty = 1.0;
  bool operator==(const SamplingDefaults&) const = default;
};

struct GenerationConfig {
  // Generating any of these ends the answer (transformers: eos_token_id, one id or a list);
  // the tokenizer's EOS ends it too.
  std::vector<int64_t> eos_token_ids;
  bool do_sample = false;
  std::optional<double> temperature;
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  std::optional<double> repetition_penalty;

  // InvalidArgument or Unimplemented naming the field and its value.
  static Result<GenerationConfig> FromJson(const nlohmann::json& j);

  // What transformers' generate() does with no arguments but the file: greedy unless do_sample
  // (the repetition penalty applies to both); sampling at the file's temperature, top-k and
  // top-p, or transformers' defaults for those the file leaves out (1.0, 50, 1.0).
  SamplingDefaults Defaults() const;
  // The file's values over `base` for the fields it gives, do_sample aside (as vLLM's OpenAI
  // server takes a model's generation config as the defaults of the fields a request omits).
  SamplingDefaults Over(SamplingDefaults base) const;
};

// Reads dir/generation_config.json; a directory without one gives GenerationConfig{}. Errors name
// the file.
Result<GenerationConfig> LoadGenerationConfig(const std::filesystem::path& dir);

}  // namespace colony::model
