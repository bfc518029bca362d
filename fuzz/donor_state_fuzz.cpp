// Fuzz target for a state donor's metadata (the JSON header a newcomer reads before any tensor
// data; any peer can be a donor). ParseDonorState never crashes, every error says what is wrong,
// and a state it accepts is within its documented ranges: shapes whose product is each tensor's
// value count (no overflow), epochs not negative, names bounded.
#include <cstddef>
#include <cstdint>
#include <string>

#include "train/donor_state.h"

using namespace colony;
using namespace colony::train;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string metadata(reinterpret_cast<const char*>(data), size);
  auto r = ParseDonorState(metadata, "run");
  if (!r.ok()) {
    if (r.status().message().empty()) __builtin_trap();
    return 0;
  }
  if (r->epoch < 0 || r->inner_step < 0) __builtin_trap();
  for (const DonorTensor& t : r->tensors) {
    if (t.name.size() > kMaxDonorTensorName || t.shape.size() > kMaxDonorTensorDims) {
      __builtin_trap();
    }
    int64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0) __builtin_trap();
      n *= d;  // bounded: the parser refused anything above 2^40
    }
    if (n != t.numel || n < 0 || n > (int64_t{1} << 40)) __builtin_trap();
  }
  return 0;
}
