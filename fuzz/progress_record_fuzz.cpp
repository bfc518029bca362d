// Fuzz target for the collaborative-training progress records read from the DHT (each peer writes
// its own; any peer of a run can write junk there), and for the run announcements under
// colony.runs. The parsers never crash, every error says what is wrong, and a record they accept
// is within its documented ranges and survives a re-encode unchanged (nothing read is dropped or
// altered silently).
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
  auto run = ParseRunAnnouncement(value);
  if (run.ok()) {
    if (run->run.empty() || run->run.size() > 128 || run->target_batch_size <= 0) __builtin_trap();
    auto again = ParseRunAnnouncement(EncodeRunAnnouncement(*run));
    if (!again.ok() || again->run != run->run ||
        again->target_batch_size != run->target_batch_size) {
      __builtin_trap();
    }
  } else if (run.status().message().empty()) {
    __builtin_trap();
  }
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
      again->phase != r->phase || again->version != r->version ||
      again->round.epoch != r->round.epoch || again->round.group != r->round.group ||
      again->round.size != r->round.size || again->round.ok != r->round.ok ||
      std::isnan(again->loss) != std::isnan(r->loss) ||
      (!std::isnan(r->loss) && again->loss != r->loss)) {
    __builtin_trap();
  }
  return 0;
}
