// Fuzz target for the tokenizer model parser, which reads SentencePiece model files downloaded
// from the Internet (e.g. a Llama tokenizer.model). Tokenizer::FromBytes never crashes on any
// bytes; a model it accepts encodes text into in-range ids and decodes any ids without crashing.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"
#include "tokenizer_checks.h"

using colony::model::Tokenizer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto tok = Tokenizer::FromBytes(bytes);
  if (!tok.ok()) {
    if (tok.status().message().empty()) __builtin_trap();
    return 0;
  }
  // Text: a fixed sample, plus the tail of the input (arbitrary bytes, often invalid UTF-8).
  CheckAcceptedTokenizer(
      *tok,
      "Hello,  world!\n\tfoo_bar(1234) caf\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x90\xa7 "
      "<s> <0x41>",
      bytes.substr(size - std::min<size_t>(size, 64)));
  return 0;
}
