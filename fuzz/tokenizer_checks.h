// What both tokenizer fuzz targets check of a tokenizer the parser accepted: every special id
// is -1 or in range, `sample` and `tail` (arbitrary bytes, often invalid UTF-8) encode into
// in-range ids that decode without crashing, and out-of-range ids are dropped by Decode.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"

inline void CheckAcceptedTokenizer(const colony::model::Tokenizer& tok, std::string_view sample,
                                   std::string_view tail) {
  const int n = tok.vocab_size();
  if (n <= 0) __builtin_trap();
  for (int id : {tok.bos_id(), tok.eos_id(), tok.pad_id(), tok.unk_id()}) {
    if (id < -1 || id >= n) __builtin_trap();
  }
  for (std::string_view text : {sample, tail}) {
    const std::vector<int32_t> ids = tok.Encode(text);
    for (int32_t id : ids) {
      if (id < 0 || id >= n) __builtin_trap();
    }
    (void)tok.Decode(ids);
  }
  const std::vector<int32_t> odd = {-1, n, 0, n - 1, 1 << 30};
  (void)tok.Decode(odd);
}
