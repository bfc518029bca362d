// What the "lm" task (task.h) and the "moe-lm" task (moe/lm_task.h) share: the corpus, the
// tokenizer and token streams, and the decoder's sizes.
#pragma once

#include <ATen/Tensor.h>

#include <memory>

#include "core/status.h"
#include "model/config.h"
#include "model/corpus.h"
#include "model/tokenizer.h"
#include "train/task.h"

namespace colony::train {

struct LmData {
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::unique_ptr<model::TokenStream> stream;  // this peer's training batches
  at::Tensor valid;                            // the held-out batch [eval_batch, seq_len + 1]
};

// Prepares (or reads from the cache) the corpus, the tokenizer and the token shards.
Result<LmData> PrepareLmData(const TaskOptions& options);

// A token batch as int64 [batch, seq_len + 1].
at::Tensor TokensToTensor(const model::TokenBatch& batch);

// The decoder of model_size (tiny 0.4M, small 3M, base 25M parameters without embeddings) with
// the options' overrides; the vocabulary size is left to the caller.
Result<model::LlamaConfig> LmModelConfig(const TaskOptions& options);

}  // namespace colony::train
