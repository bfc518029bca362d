#include "averaging/ban_evidence.h"

#include <fmt/format.h>

#include "averaging/averaging.pb.h"
#include "averaging/verify_math.h"

namespace colony::averaging {

namespace {
constexpr std::string_view kDomain = "colony.avg.verify/1";
}  // namespace

std::string StatementSigningBytes(std::string_view prefix, const VerifyStatement& statement) {
  VerifyStatement unsigned_statement = statement;
  unsigned_statement.signature.clear();
  std::string out(kDomain);
  out.push_back('\0');
  out += prefix;
  out.push_back('\0');
  out += EncodeVerifyStatement(unsigned_statement);
  return out;
}

void SignStatement(const KeyPair& key, std::string_view prefix, VerifyStatement& statement) {
  const std::string bytes = StatementSigningBytes(prefix, statement);
  const Signature sig = key.Sign(AsBytes(bytes));
  statement.signature.assign(reinterpret_cast<const char*>(sig.data()), sig.size());
}

bool SignedBy(const PeerId& peer, std::string_view prefix, const VerifyStatement& statement) {
  if (statement.signature.size() != kSignatureSize) return false;
  Signature sig;
  std::copy(statement.signature.begin(), statement.signature.end(), sig.begin());
  const std::string bytes = StatementSigningBytes(prefix, statement);
  return peer.Verify(AsBytes(bytes), sig);
}

Projection EntryOf(const RunCheck& run, size_t at) {
  Projection p;
  for (size_t d = 0; d < kDirections; ++d) p.values[d] = run.projections[kDirections * at + d];
  p.norm = run.norms[at];
  return p;
}

Result<std::string> ReducerConviction(const VerifyStatement& statement) {
  if (statement.phase != VerifyPhase::kChecks) {
    return InvalidArgument("not a statement of checks");
  }
  const SpanCheck* own = nullptr;
  for (const SpanCheck& span : statement.spans) {
    if (span.reducer == statement.member) own = &span;
  }
  if (own == nullptr) return NotFound("the statement has no checks of its member's own span");
  std::vector<RunValues> values;
  uint32_t at = 0;
  for (const RunCheck& run : own->runs) {
    if (run.first_part != at || run.weights.size() != run.contributors.size() ||
        run.norms.size() != run.contributors.size()) {
      return std::string(
          "its checks of its own span do not cover its parts with a value per contributor");
    }
    at = run.end_part;
    RunValues v{run.weights, {}, run.result_norm};
    for (size_t c = 0; c < run.norms.size(); ++c) v.projections.push_back(EntryOf(run, c));
    values.push_back(std::move(v));
  }
  const bool clipped = statement.clip_tau > 0;
  const FixedPointCheck check = CheckFixedPoint(values, clipped);
  if (check.ok) return NotFound("its checks pass: its results were its reduction's fixed point");
  return fmt::format(
      "its result is not the {} of its inputs: its own checks give a residual of {:.4g} on a "
      "random direction, where an honest one stays under {:.4g}",
      clipped ? "CenteredClip" : "weighted mean", check.residual, check.tolerance);
}

Result<std::string> CheckBanEvidence(std::string_view prefix, const BanEvidence& evidence) {
  COLONY_ASSIGN_OR_RETURN(VerifyStatement statement,
                          DecodeVerifyStatement(evidence.statement, kMaxGroupSize));
  if (!SignedBy(evidence.peer, prefix, statement)) {
    return PermissionDenied("the evidence's statement is not signed by the banned peer");
  }
  auto conviction = ReducerConviction(statement);
  if (!conviction.ok()) {
    return InvalidArgument("the evidence does not convict the peer: " +
                           std::string(conviction.status().message()));
  }
  return conviction;
}

std::string EncodeBanList(const BanList& bans) {
  pb::BanList list;
  for (const BanEvidence& b : bans.evidence) {
    auto* e = list.add_bans();
    const Bytes id = b.peer.ToBytes();
    e->set_peer_id(std::string(id.begin(), id.end()));
    e->set_statement(b.statement);
  }
  for (const PeerId& peer : bans.accused) {
    const Bytes id = peer.ToBytes();
    list.add_accused(std::string(id.begin(), id.end()));
  }
  return list.SerializeAsString();
}

Result<BanList> DecodeBanList(std::string_view bytes) {
  pb::BanList list;
  if (!list.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return ProtocolError("malformed ban list");
  }
  if (static_cast<size_t>(list.bans_size()) > kMaxBanEvidence) {
    return ProtocolError(fmt::format("a ban list holds at most {} entries", kMaxBanEvidence));
  }
  if (static_cast<size_t>(list.accused_size()) > kMaxAccusations) {
    return ProtocolError(fmt::format("a ban list accuses at most {} peers", kMaxAccusations));
  }
  BanList out;
  for (const auto& e : list.bans()) {
    auto peer = PeerId::FromBytes(AsBytes(e.peer_id()));
    if (!peer.ok()) return ProtocolError("a ban names an invalid peer id");
    if (e.statement().size() > kMaxVerifyStatementBytes) {
      return ProtocolError("a ban's evidence is over the statement size limit");
    }
    out.evidence.push_back({*peer, e.statement()});
  }
  for (const auto& id : list.accused()) {
    auto peer = PeerId::FromBytes(AsBytes(id));
    if (!peer.ok()) return ProtocolError("an accusation names an invalid peer id");
    out.accused.push_back(*peer);
  }
  return out;
}

}  // namespace colony::averaging
