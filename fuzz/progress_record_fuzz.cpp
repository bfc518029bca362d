// Fuzz target for the collaborative-training progress records read from the DHT (each peer writes
// its own; any peer of a run can write junk there). ParseProgressRecord never crashes, every error
// says what is wrong, and a record it accepts is within its documented ranges and survives a
// re-encode unchanged (nothing read is dropped or altered silently).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/identity.h"
#include "train/progress_record.h"

using namespace colony;
using namespace colony::train;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const PeerId peer = KeyPair::Generate().peer_id();
  const std::string_view value(reinterpret_cast<const char*>(data), size);
  auto r = ParseProgressRecord(peer, value);
  if (!r.ok()) {
    if (r.status().message().empty()) __builtin_trap();
    return 0;
  }
  if (r->peer != peer || r->epoch < 0 || r->samples < 0 || r->batch < 0) __builtin_trap();
  if (!std::isfinite(r->samples_per_second) || r->samples_per_second < 0) __builtin_trap();
  if (!std::isfinite(r->time)) __builtin_trap();
  if (r->aux && r->samples != 0) __builtin_trap();
  auto again = ParseProgressRecord(peer, EncodeProgressRecord(*r));
  if (!again.ok() || again->epoch != r->epoch || again->samples != r->samples ||
      again->samples_per_second != r->samples_per_second || again->batch != r->batch ||
      again->time != r->time || again->client != r->client || again->aux != r->aux ||
      again->phase != r->phase) {
    __builtin_trap();
  }
  return 0;
}
