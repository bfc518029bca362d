// Fuzz target for the Hugging Face config.json and generation_config.json readers, which read
// checkpoints downloaded from the Internet. LlamaConfig::FromJson never crashes on any JSON, a
// refusal always says why, and a config it accepts is valid and survives ToJson -> FromJson
// unchanged. GenerationConfig::FromJson never crashes either, says why it refuses, and what it
// accepts gives sampling settings in the ranges SamplingOptions takes.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/generation_config.h"

using colony::model::LlamaConfig;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json doc = nlohmann::json::parse(data, data + size, nullptr,
                                                   /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  if (auto g = colony::model::GenerationConfig::FromJson(doc); g.ok()) {
    const colony::model::SamplingDefaults d = g->Defaults();
    if (!(d.temperature >= 0 && d.top_k >= 0 && d.top_p > 0 && d.top_p <= 1 &&
          d.repetition_penalty > 0)) {
      __builtin_trap();
    }
    if (g->eos_token_ids.size() > 64) __builtin_trap();
  } else if (g.status().message().empty()) {
    __builtin_trap();
  }
  auto config = LlamaConfig::FromJson(doc);
  if (!config.ok()) {
    if (config.status().message().empty()) __builtin_trap();
    return 0;
  }
  if (!config->Validate().ok()) __builtin_trap();
  auto back = LlamaConfig::FromJson(config->ToJson());
  if (!back.ok() || !(*back == *config)) __builtin_trap();
  return 0;
}
