// Fuzz target for the block-server records read from the DHT (written by anyone who can store
// there), and for the model announcements under colony.models. ParseServerRecord never crashes, and
// a record it accepts is consistent: a block range inside the model, finite non-negative
// throughputs, a bounded address list; and it survives a re-encode unchanged.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/identity.h"
#include "serve/records.h"

using namespace colony;
using namespace colony::serve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const PeerId peer = KeyPair::Generate().peer_id();
  const std::string_view value(reinterpret_cast<const char*>(data), size);
  auto model = ParseModelAnnouncement(value);
  if (model.ok()) {
    if (model->model.empty() || model->num_blocks <= 0 || model->num_blocks > kMaxModelBlocks) {
      __builtin_trap();
    }
    auto again = ParseModelAnnouncement(EncodeModelAnnouncement(*model));
    if (!again.ok() || again->model != model->model || again->num_blocks != model->num_blocks) {
      __builtin_trap();
    }
  } else if (model.status().message().empty()) {
    __builtin_trap();
  }
  auto r = ParseServerRecord(peer, value, 16);
  if (!r.ok()) {
    if (r.status().message().empty()) __builtin_trap();
    return 0;
  }
  if (r->start < 0 || r->end <= r->start || r->end > 16) __builtin_trap();
  if (!std::isfinite(r->throughput) || r->throughput < 0) __builtin_trap();
  if (r->addresses.size() > 16 || r->next_pings.size() > kMaxNextPings) __builtin_trap();
  for (const auto& [next, ms] : r->next_pings) {
    if (!std::isfinite(ms) || ms < 0) __builtin_trap();
  }
  auto again = ParseServerRecord(peer, EncodeServerRecord(*r), 16);
  if (!again.ok() || again->start != r->start || again->end != r->end || again->state != r->state ||
      again->addresses != r->addresses || again->next_pings != r->next_pings) {
    __builtin_trap();
  }
  return 0;
}
