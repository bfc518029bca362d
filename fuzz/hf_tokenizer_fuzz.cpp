// Fuzz target for the Hugging Face tokenizer.json reader, which reads tokenizers downloaded from
// the Internet (Llama 3, Qwen2): the input is a tokenizer.json, optionally followed by a NUL
// byte and a tokenizer_config.json. Tokenizer::FromHfJson never crashes on any bytes, a refusal
// always says why, and a tokenizer it accepts encodes any text into in-range ids and decodes any
// ids without crashing.
#include <algorithm>
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
  const size_t nul = bytes.find('\0');
  const std::string_view json = bytes.substr(0, nul);
  const std::string_view config = nul == std::string_view::npos ? "" : bytes.substr(nul + 1);
  auto tok = Tokenizer::FromHfJson(json, config);
  if (!tok.ok()) {
    if (tok.status().message().empty()) __builtin_trap();
    return 0;
  }
  // Text: a fixed sample, plus the tail of the input (arbitrary bytes, often invalid UTF-8).
  CheckAcceptedTokenizer(*tok,
                         "Hello,  world's 12345!!\n\n\tfoo_bar(1234) caf\xc3\xa9 e\xcc\x81 "
                         "\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x9a\x80 <s> <m>a-b <|begin_of_text|>",
                         bytes.substr(size - std::min<size_t>(size, 64)));
  return 0;
}
