// Fuzz target for the tokenizer model parser, which reads SentencePiece model files downloaded
// from the Internet (e.g. a Llama tokenizer.model). Tokenizer::FromBytes never crashes on any
// bytes; a model it accepts encodes text into in-range ids and decodes any ids without crashing.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"

using colony::model::Tokenizer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto tok = Tokenizer::FromBytes(bytes);
  if (!tok.ok()) {
    if (tok.status().message().empty()) __builtin_trap();
    return 0;
  }
  const int n = tok->vocab_size();
  if (n <= 0) __builtin_trap();
  // Text: a fixed sample, plus the tail of the input (arbitrary bytes, often invalid UTF-8).
  const std::string_view tail = bytes.substr(size - std::min<size_t>(size, 64));
  for (std::string_view text : {std::string_view("Hello,  world!\n\tfoo_bar(1234) caf\xc3\xa9 "
                                                 "\xe2\x96\x81 \xf0\x9f\x90\xa7 <s> <0x41>"),
                                tail}) {
    const std::vector<int32_t> ids = tok->Encode(text);
    for (int32_t id : ids) {
      if (id < 0 || id >= n) __builtin_trap();
    }
    (void)tok->Decode(ids);
  }
  // Out-of-range ids are dropped.
  const std::vector<int32_t> odd = {-1, n, 0, n - 1, 1 << 30};
  (void)tok->Decode(odd);
  return 0;
}
