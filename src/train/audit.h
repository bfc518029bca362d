// What a peer's mean gradient of a round is recomputed from in BTARD's audits
// (CollaborativeOptions::audit_targets, averaging::AveragerOptions::audit_targets): its data
// stream (seed and batch size), the batches of it it summed (runs of consecutive indices), and
// a digest of the parameters it computed them at. Sent with the peer's signed commitment before
// the round's seed picks who is audited; every field is bounded on decoding.
//
// The stream is not the peer's to choose: at each epoch it is AuditDataSeed(run, peer, epoch),
// and a claim sums the stream's first batches (BTARD derives every peer's data from values it
// cannot pick, so that it cannot steer the model with data it selected).
//
//   AuditClaim c{.seed = AuditDataSeed("run", id, 3), .batch_size = 32, .runs = {{0, 2}},
//                .params = ParamsDigest(flat)};
//   auto back = DecodeAuditClaim(EncodeAuditClaim(c));
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/identity.h"
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

// The seed of the data stream that `peer` of run `run_id` trains on at `epoch` in an audited
// run: the first 8 bytes (little-endian) of BLAKE2b over a domain tag, the run id, the peer's
// id and the epoch. A peer chooses neither; an identity made to give pleasing data at one epoch
// gives other data at the next.
uint64_t AuditDataSeed(std::string_view run_id, const PeerId& peer, int64_t epoch);

// BLAKE2b (16 bytes) of the flat float32 parameters.
std::string ParamsDigest(std::span<const float> flat);

}  // namespace colony::train
