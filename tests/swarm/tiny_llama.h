// The tiny Llama that the in-process swarm tests cut into stages: 4 blocks of hidden size 32.
#pragma once

#include "model/llama.h"

namespace colony::test {

inline model::LlamaConfig TinyStageModelConfig() {
  model::LlamaConfig c;
  c.vocab_size = 96;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_seq_len = 64;
  c.tie_word_embeddings = false;
  return c;
}

}  // namespace colony::test
