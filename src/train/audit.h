// What a peer's mean gradient of a round is recomputed from in BTARD's audits
// (CollaborativeOptions::audit_targets, averaging::AveragerOptions::audit_targets): its data
// stream (seed and batch size), the batches of it it summed (runs of consecutive indices), and
// a digest of the parameters it computed them at. Sent with the peer's signed commitment before
// the round's seed picks who is audited; every field is bounded on decoding.
//
//   AuditClaim c{.seed = 7, .batch_size = 32, .runs = {{120, 2}}, .params = ParamsDigest(flat)};
//   auto back = DecodeAuditClaim(EncodeAuditClaim(c));
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace colony::train {

inline constexpr size_t kMaxAuditRuns = 64;
inline constexpr int64_t kMaxAuditBatchSize = 1 << 20;

struct AuditClaim {
  uint64_t seed = 0;
  int64_t batch_size = 0;
  // (first batch index, batches), in order; none for a round without samples.
  std::vector<std::pair<int64_t, int64_t>> runs;
  std::string params;  // ParamsDigest() of the parameters, 16 bytes

  int64_t Batches() const;
  // Adds batch `index` (after the others), extending the last run when it follows it; false
  // when there are already kMaxAuditRuns runs and it does not.
  bool Add(int64_t index);
};

std::string EncodeAuditClaim(const AuditClaim& claim);
Result<AuditClaim> DecodeAuditClaim(std::string_view bytes);

// BLAKE2b (16 bytes) of the flat float32 parameters.
std::string ParamsDigest(std::span<const float> flat);

}  // namespace colony::train
