// Encoding and validation of averaging messages (averaging.proto). Everything decoded here comes
// from other peers: every decoder checks sizes, counts, ids and numbers, and fails with a
// ProtocolError naming the problem. Pure functions; fuzzed by fuzz/averaging_fuzz.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "averaging/mode.h"
#include "core/identity.h"
#include "core/status.h"

namespace colony::averaging {

inline constexpr size_t kMaxGroupSize = 256;
inline constexpr size_t kMaxAddrs = 16;
inline constexpr size_t kMaxAddrBytes = 256;
inline constexpr size_t kMaxGatheredBytes = 64 * 1024;
inline constexpr size_t kMaxGroupIdBytes = 64;
inline constexpr size_t kMaxSchemaHashBytes = 64;
inline constexpr size_t kMaxReasonBytes = 1024;
inline constexpr size_t kMaxStateMetadataBytes = 1 << 20;
inline constexpr size_t kMaxStateTensors = 1 << 16;
// Values per message part: at most 16 Mi values (64 MiB of float32).
inline constexpr uint64_t kMaxPartSize = uint64_t{1} << 24;
// A follower takes parts of at least this many values (or of its own part size, if smaller)
// from a leader: every part costs a reducer a few hundred bytes of state and a message, so a
// leader's tiny parts could otherwise cost its followers far more memory than their tensors.
inline constexpr uint64_t kMinPartSize = 1024;
// At most 2^40 values are averaged at once (4 TiB of float32).
inline constexpr uint64_t kMaxTotalValues = uint64_t{1} << 40;

struct Declaration {
  std::vector<std::string> addrs;
  bool looking = true;
  std::string schema_hash;
};

struct JoinRequest {
  std::string group_key;
  std::string schema_hash;
  Mode mode = Mode::kNode;
  double bandwidth = 0;
  std::string gathered;
  std::vector<std::string> addrs;
  bool verify = false;
  bool audit = false;
};

struct MemberInfo {
  PeerId peer;
  std::vector<std::string> addrs;
  Mode mode = Mode::kNode;
  double bandwidth = 0;
  std::string gathered;
  uint64_t span = 0;
};

struct GroupInfo {
  std::string group_id;
  std::vector<MemberInfo> members;
  uint64_t part_size = 0;
  uint64_t total = 0;
};

struct JoinResponse {
  enum class Code : uint8_t { kBegin = 1, kRejected = 2, kRedirect = 3, kDisbanded = 4 };
  Code code = Code::kRejected;
  std::string reason;
  std::optional<PeerId> leader;  // kRedirect
  std::vector<std::string> leader_addrs;
  GroupInfo group;  // kBegin
};

struct ReduceHello {
  std::string group_id;
  uint32_t sender_index = 0;
  double weight = 0;
};

struct PartHeader {
  uint32_t index = 0;
  std::vector<uint32_t> contributors;
};

struct StateAdvert {
  std::vector<std::string> addrs;
  double priority = 0;
};

struct StateHeader {
  std::string metadata;
  std::vector<uint64_t> tensor_sizes;
  std::string digest;  // only in answer to a digest_only request: SHA-256 (32 bytes)
};
inline constexpr size_t kStateDigestBytes = 32;

// Verification (docs/averaging.md): one member's statement in one phase.
inline constexpr size_t kMaxVerifyStatementBytes = 1 << 20;
// What a member's values are recomputed from in an audit (StepOptions::audit_claim).
inline constexpr size_t kMaxAuditClaimBytes = 4096;
inline constexpr size_t kMaxVerifyRuns = 1024;  // per span
inline constexpr size_t kVerifyRevealBytes = 32;
enum class VerifyPhase : uint32_t { kCommit = 1, kReveal = 2, kChecks = 3 };
struct RunCheck {
  uint32_t first_part = 0, end_part = 0;
  std::vector<uint32_t> contributors;
  std::vector<double> weights;      // none, or one per entry of norms
  std::vector<double> projections;  // kDirections (verify_math.h) per entry of norms
  std::vector<double> norms;
  double result_norm = 0;
};
struct SpanCheck {
  uint32_t reducer = 0;
  std::vector<RunCheck> runs;
};
struct VerifyStatement {
  std::string group_id;
  uint32_t member = 0;
  VerifyPhase phase = VerifyPhase::kCommit;
  std::string commitment;  // kCommit: 32 bytes
  std::string reveal;      // kReveal: 32 bytes
  double weight = 0;       // kChecks
  std::vector<SpanCheck> spans;
  std::string seed;         // kChecks: 32 bytes
  double clip_tau = 0;      // kChecks: CenteredClip's tau, 0 for the weighted mean
  std::string audit_claim;  // kCommit: at most kMaxAuditClaimBytes (audits)
  std::string signature;    // the member's, 64 bytes (ban_evidence.h)
};

// The binary form of a peer id, as a string (protobuf bytes fields, map keys).
std::string PeerBytes(const PeerId& peer);

std::string EncodeDeclaration(const Declaration& d);
Result<Declaration> DecodeDeclaration(std::string_view bytes);
std::string EncodeJoinRequest(const JoinRequest& r);
Result<JoinRequest> DecodeJoinRequest(std::string_view bytes);
std::string EncodeJoinResponse(const JoinResponse& r);
// For kBegin also validates the group (see CheckGroup).
Result<JoinResponse> DecodeJoinResponse(std::string_view bytes);
std::string EncodeReduceHello(const ReduceHello& h);
Result<ReduceHello> DecodeReduceHello(std::string_view bytes);
std::string EncodePartHeader(const PartHeader& p);
// Contributors must be strictly increasing and below `group_size`.
Result<PartHeader> DecodePartHeader(std::string_view bytes, size_t group_size);
std::string EncodeStateAdvert(const StateAdvert& a);
Result<StateAdvert> DecodeStateAdvert(std::string_view bytes);
struct StateRequest {
  std::string prefix;
  std::optional<double> min_priority;
  bool digest_only = false;
};
std::string EncodeStateRequest(const StateRequest& r);
Result<StateRequest> DecodeStateRequest(std::string_view bytes);
std::string EncodeStateHeader(const StateHeader& h);
Result<StateHeader> DecodeStateHeader(std::string_view bytes);

std::string EncodeVerifyStatement(const VerifyStatement& v);
// Bounds everything against the group's size: at most kMaxVerifyStatementBytes, a known phase
// with exactly its fields, spans of distinct reducers below group_size, at most kMaxVerifyRuns
// runs per span with increasing, non-empty part ranges, increasing contributors below
// group_size, at most one norm per contributor with kDirections projections each and weights
// either none or one per norm, finite values, norms and weights not negative.
Result<VerifyStatement> DecodeVerifyStatement(std::string_view bytes, size_t group_size);

// A group is consistent: 1..kMaxGroupSize distinct members, spans sum to total, clients own
// no span, part_size in [1, kMaxPartSize], total <= kMaxTotalValues, a group id of 8..64 bytes.
Status CheckGroup(const GroupInfo& g);

}  // namespace colony::averaging
