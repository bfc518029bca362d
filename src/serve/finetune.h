// FineTune: prompt tuning, deep prompt tuning or LoRA trained by the client through a swarm's
// frozen remote blocks (tuning.h holds the tuned models), on a set of token sequences, with a
// progress callback; what `colony finetune` runs.
//
//   auto data = serve::FineTuneSequences(tokenizer_or_null, vocab, "lines.txt");
//   auto result = serve::FineTune(head, remote, *data, {.method = FineTuneMethod::kLora});
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/tokenizer.h"
#include "serve/generation.h"
#include "serve/remote_sequential.h"

namespace colony::serve {

enum class FineTuneMethod {
  kPrompt,      // trainable prompt embeddings before the input
  kDeepPrompt,  // also added before every remote block (the servers return their gradients)
  kLora,        // LoRA adapters on the remote blocks' projections, applied by the servers
};
std::string_view MethodName(FineTuneMethod method);

struct FineTuneStep {
  int64_t step = 0, steps = 0;
  double loss = 0;
  double steps_per_second = 0;
};

struct FineTuneOptions {
  FineTuneMethod method = FineTuneMethod::kPrompt;
  int64_t prompt_length = 8;  // prompt tuning
  int64_t lora_rank = 4;      // LoRA
  int64_t steps = 30;
  double lr = 0.05;
  int64_t batch_size = 4;
  // Writes the tuned tensors here at the end (SaveTuned); empty: not saved.
  std::filesystem::path save = {};
  // Called every `report_every` steps and after the last.
  std::function<void(const FineTuneStep&)> on_step = {};
  int64_t report_every = 5;
};

struct FineTuneResult {
  double initial_loss = 0;  // on all the sequences, before
  double final_loss = 0;    // and after
  int64_t steps = 0;
};

// Trains on `sequences` (token ids; padded to one length, padding ignored by the loss).
Result<FineTuneResult> FineTune(ClientModel head, std::shared_ptr<RemoteSequential> remote,
                                const std::vector<std::vector<int64_t>>& sequences,
                                const FineTuneOptions& options);

// The demonstration data: the lines of `data` (a few built-in sentences when empty) tokenized
// with `tokenizer`; without a tokenizer, fixed synthetic token patterns below `vocab` (and a
// data file is an error: it cannot be tokenized).
Result<std::vector<std::vector<int64_t>>> FineTuneSequences(const model::Tokenizer* tokenizer,
                                                            int64_t vocab,
                                                            const std::filesystem::path& data);

}  // namespace colony::serve
