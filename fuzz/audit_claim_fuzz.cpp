// Fuzz target for an audit claim (train/audit.h: what a member's gradient is recomputed from,
// sent by any member of a verified group). DecodeAuditClaim never crashes, every error says
// what is wrong, and a claim it accepts is within its documented ranges (batch size, runs in
// order and not overlapping, their sum countable) and encodes back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "train/audit.h"

using namespace colony;
using namespace colony::train;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto r = DecodeAuditClaim(bytes);
  if (!r.ok()) {
    if (r.status().message().empty()) __builtin_trap();
    return 0;
  }
  if (r->batch_size < 1 || r->batch_size > kMaxAuditBatchSize || r->runs.size() > kMaxAuditRuns ||
      r->params.size() != 16) {
    __builtin_trap();
  }
  int64_t end = 0;
  for (const auto& [first, count] : r->runs) {
    if (first < end || count < 1) __builtin_trap();
    end = first + count;
  }
  if (r->Batches() < 0 || EncodeAuditClaim(*r) != bytes) __builtin_trap();
  return 0;
}
