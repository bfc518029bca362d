// Fuzz target for the Hugging Face config.json reader, which reads checkpoints downloaded from
// the Internet. LlamaConfig::FromJson never crashes on any JSON, a refusal always says why, and
// a config it accepts is valid and survives ToJson -> FromJson unchanged.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "model/config.h"

using colony::model::LlamaConfig;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json doc = nlohmann::json::parse(data, data + size, nullptr,
                                                   /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
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
