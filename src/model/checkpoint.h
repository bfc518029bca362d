// Saving and loading torch tensors as safetensors, and Llama checkpoints in Hugging Face layout
// (a directory with config.json and model.safetensors, or shards listed by
// model.safetensors.index.json). Loading reads only the tensors asked for, so a server that
// holds blocks 8..15 of a large model reads just those blocks' bytes.
//
//   COLONY_RETURN_IF_ERROR(SaveLlama("ckpt", model));
//   COLONY_ASSIGN_OR_RETURN(LlamaModel copy, LoadLlama("ckpt"));
//   COLONY_ASSIGN_OR_RETURN(LlamaBlockRange mine, LoadLlamaBlocks("ckpt", 8, 16));
//
// Floating-point tensors convert between F32, F16, BF16 and F64 on load (e.g. a BF16 checkpoint
// into a float32 model); other dtypes must match exactly.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/llama.h"
#include "model/safetensors.h"

namespace colony::model {

// The named parameters of any module, aliasing them (for SaveModule / LoadModule).
NamedTensors NamedParametersOf(const torch::nn::Module& module);

// The safetensors dtype of a torch scalar type (nullopt for types safetensors lacks), and back.
std::optional<DType> ToDType(at::ScalarType t);
at::ScalarType ToScalarType(DType d);

// Writes the tensors (any device; CPU copies are made as needed) atomically to one file.
Status SaveModule(const std::filesystem::path& file, const NamedTensors& named,
                  const std::map<std::string, std::string>& metadata = {});
// Copies the file's tensors into `named` in place (without recording autograd history). The
// file must hold exactly these names with the same shapes; missing or unexpected names are
// errors, and nothing is copied unless every tensor checks out.
Status LoadModule(const std::filesystem::path& file, const NamedTensors& named);

// Reads dir/config.json.
Result<LlamaConfig> LoadLlamaConfig(const std::filesystem::path& dir);
// Writes dir/config.json and dir/model.safetensors (HF names, float32, metadata format=pt),
// creating dir if needed.
Status SaveLlama(const std::filesystem::path& dir, LlamaModel& model);
// The same, checking that `config` is the model's (InvalidArgument otherwise).
Status SaveLlama(const std::filesystem::path& dir, LlamaModel& model, const LlamaConfig& config);
// Copies the checkpoint tensors with these HF names into the given tensors, reading only them
// (from whichever shards hold them). Tensors in the checkpoint but not asked for are ignored.
Status LoadLlamaTensors(const std::filesystem::path& dir, const NamedTensors& named);
// A whole model: config + every weight.
Result<LlamaModel> LoadLlama(const std::filesystem::path& dir);

// Blocks [first, last) of a checkpoint: blocks[i] is layer first + i.
struct LlamaBlockRange {
  LlamaConfig config;
  int64_t first = 0;
  std::vector<LlamaBlock> blocks;
};
Result<LlamaBlockRange> LoadLlamaBlocks(const std::filesystem::path& dir, int64_t first,
                                        int64_t last);

}  // namespace colony::model
