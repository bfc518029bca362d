// The small Llama configuration the serve tests write as seeded random checkpoints.
#pragma once

#include "model/llama.h"

namespace colony::serve::test {

inline model::LlamaConfig SmallLlamaConfig(bool tie_word_embeddings) {
  model::LlamaConfig c;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_seq_len = 128;
  c.tie_word_embeddings = tie_word_embeddings;
  return c;
}

}  // namespace colony::serve::test
