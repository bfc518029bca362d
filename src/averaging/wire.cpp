#include "averaging/wire.h"

#include <cmath>
#include <set>

#include "averaging/averaging.pb.h"
#include "averaging/verify_math.h"

namespace colony::averaging {
namespace {

template <typename Proto>
Result<Proto> Parse(std::string_view bytes, const char* what) {
  Proto p;
  if (!p.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return ProtocolError(std::string("malformed averaging ") + what + " (" +
                         std::to_string(bytes.size()) + " bytes)");
  }
  return p;
}

template <typename Repeated>
Result<std::vector<std::string>> Addrs(const Repeated& in, const char* what) {
  if (static_cast<size_t>(in.size()) > kMaxAddrs) {
    return ProtocolError(std::string(what) + " lists " + std::to_string(in.size()) +
                         " addresses; at most " + std::to_string(kMaxAddrs) + " are allowed");
  }
  std::vector<std::string> out;
  for (const auto& a : in) {
    if (a.empty() || a.size() > kMaxAddrBytes) {
      return ProtocolError(std::string(what) + " carries an address of " +
                           std::to_string(a.size()) + " bytes");
    }
    out.push_back(a);
  }
  return out;
}

// Member indices that must be increasing and below the group's size (at most one per member).
template <typename Repeated>
Result<std::vector<uint32_t>> Contributors(const Repeated& in, size_t group_size,
                                           const char* what) {
  if (static_cast<size_t>(in.size()) > group_size) {
    return ProtocolError(std::string(what) + " names more contributors than the group has");
  }
  std::vector<uint32_t> out;
  for (uint32_t c : in) {
    if (c >= group_size || (!out.empty() && c <= out.back())) {
      return ProtocolError(std::string(what) + "'s contributors must be increasing member indices");
    }
    out.push_back(c);
  }
  return out;
}

Result<Mode> ModeFromWire(uint32_t v) {
  if (v > static_cast<uint32_t>(Mode::kAux)) {
    return ProtocolError("unknown averaging mode " + std::to_string(v));
  }
  return static_cast<Mode>(v);
}

Status CheckBytes(const std::string& s, size_t max, const char* what) {
  if (s.size() > max) {
    return ProtocolError(std::string(what) + " is " + std::to_string(s.size()) +
                         " bytes; at most " + std::to_string(max) + " are allowed");
  }
  return {};
}

bool PositiveFinite(double v) { return std::isfinite(v) && v > 0; }

}  // namespace

std::string PeerBytes(const PeerId& peer) {
  const Bytes b = peer.ToBytes();
  return std::string(b.begin(), b.end());
}

std::string_view ModeName(Mode mode) {
  switch (mode) {
    case Mode::kNode:
      return "node";
    case Mode::kClient:
      return "client";
    case Mode::kAux:
      return "aux";
  }
  return "unknown";
}

Result<Mode> ParseMode(std::string_view name) {
  if (name == "node") return Mode::kNode;
  if (name == "client") return Mode::kClient;
  if (name == "aux") return Mode::kAux;
  return InvalidArgument("unknown averaging mode '" + std::string(name) +
                         "'; use node, client or aux");
}

std::string EncodeDeclaration(const Declaration& d) {
  pb::Declaration p;
  for (const auto& a : d.addrs) p.add_addrs(a);
  p.set_looking(d.looking);
  p.set_schema_hash(d.schema_hash);
  return p.SerializeAsString();
}

Result<Declaration> DecodeDeclaration(std::string_view bytes) {
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::Declaration>(bytes, "declaration"));
  Declaration d;
  COLONY_ASSIGN_OR_RETURN(d.addrs, Addrs(p.addrs(), "a declaration"));
  d.looking = p.looking();
  COLONY_RETURN_IF_ERROR(CheckBytes(p.schema_hash(), kMaxSchemaHashBytes, "a schema hash"));
  d.schema_hash = p.schema_hash();
  return d;
}

std::string EncodeJoinRequest(const JoinRequest& r) {
  pb::JoinRequest p;
  p.set_group_key(r.group_key);
  p.set_schema_hash(r.schema_hash);
  p.set_mode(static_cast<uint32_t>(r.mode));
  p.set_bandwidth(r.bandwidth);
  p.set_gathered(r.gathered);
  for (const auto& a : r.addrs) p.add_addrs(a);
  p.set_verify(r.verify);
  p.set_audit(r.audit);
  return p.SerializeAsString();
}

Result<JoinRequest> DecodeJoinRequest(std::string_view bytes) {
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::JoinRequest>(bytes, "join request"));
  JoinRequest r;
  COLONY_RETURN_IF_ERROR(CheckBytes(p.group_key(), 2048, "a group key"));
  COLONY_RETURN_IF_ERROR(CheckBytes(p.schema_hash(), kMaxSchemaHashBytes, "a schema hash"));
  COLONY_RETURN_IF_ERROR(CheckBytes(p.gathered(), kMaxGatheredBytes, "gathered metadata"));
  r.group_key = p.group_key();
  r.schema_hash = p.schema_hash();
  COLONY_ASSIGN_OR_RETURN(r.mode, ModeFromWire(p.mode()));
  if (!PositiveFinite(p.bandwidth())) {
    return ProtocolError("a join request announces a bandwidth that is not positive and finite");
  }
  r.bandwidth = p.bandwidth();
  r.gathered = p.gathered();
  COLONY_ASSIGN_OR_RETURN(r.addrs, Addrs(p.addrs(), "a join request"));
  r.verify = p.verify();
  r.audit = p.audit();
  return r;
}

Status CheckGroup(const GroupInfo& g) {
  if (g.group_id.size() < 8 || g.group_id.size() > kMaxGroupIdBytes) {
    return ProtocolError("a group id must be 8 to 64 bytes, got " +
                         std::to_string(g.group_id.size()));
  }
  if (g.members.empty() || g.members.size() > kMaxGroupSize) {
    return ProtocolError("a group must have 1 to " + std::to_string(kMaxGroupSize) +
                         " members, got " + std::to_string(g.members.size()));
  }
  if (g.part_size == 0 || g.part_size > kMaxPartSize) {
    return ProtocolError("a part size of " + std::to_string(g.part_size) +
                         " values is out of range");
  }
  if (g.total > kMaxTotalValues) return ProtocolError("a group averages too many values");
  std::set<std::string> seen;
  uint64_t sum = 0;
  for (const MemberInfo& m : g.members) {
    if (!seen.insert(PeerBytes(m.peer)).second) {
      return ProtocolError("peer " + m.peer.ToString() + " appears twice in a group");
    }
    if (m.mode == Mode::kClient && m.span != 0) {
      return ProtocolError("client peer " + m.peer.ToString() + " was given a span to reduce");
    }
    if (m.span > g.total - sum) return ProtocolError("the group's spans exceed its total");
    sum += m.span;
  }
  if (sum != g.total) {
    return ProtocolError("the group's spans sum to " + std::to_string(sum) + ", not " +
                         std::to_string(g.total));
  }
  return {};
}

namespace {

void ToProto(const GroupInfo& g, pb::GroupInfo& p) {
  p.set_group_id(g.group_id);
  p.set_part_size(g.part_size);
  p.set_total(g.total);
  for (const MemberInfo& m : g.members) {
    auto* pm = p.add_members();
    pm->set_peer_id(PeerBytes(m.peer));
    for (const auto& a : m.addrs) pm->add_addrs(a);
    pm->set_mode(static_cast<uint32_t>(m.mode));
    pm->set_bandwidth(m.bandwidth);
    pm->set_gathered(m.gathered);
    pm->set_span(m.span);
  }
}

Result<GroupInfo> FromProto(const pb::GroupInfo& p) {
  GroupInfo g;
  g.group_id = p.group_id();
  g.part_size = p.part_size();
  g.total = p.total();
  if (static_cast<size_t>(p.members_size()) > kMaxGroupSize) {
    return ProtocolError("a group has " + std::to_string(p.members_size()) + " members; at most " +
                         std::to_string(kMaxGroupSize) + " are allowed");
  }
  for (const auto& pm : p.members()) {
    MemberInfo m;
    COLONY_ASSIGN_OR_RETURN(m.peer, PeerId::FromBytes(AsBytes(pm.peer_id())));
    COLONY_ASSIGN_OR_RETURN(m.addrs, Addrs(pm.addrs(), "a group member"));
    COLONY_ASSIGN_OR_RETURN(m.mode, ModeFromWire(pm.mode()));
    if (!PositiveFinite(pm.bandwidth())) {
      return ProtocolError("a group member's bandwidth is not positive and finite");
    }
    m.bandwidth = pm.bandwidth();
    COLONY_RETURN_IF_ERROR(CheckBytes(pm.gathered(), kMaxGatheredBytes, "gathered metadata"));
    m.gathered = pm.gathered();
    m.span = pm.span();
    g.members.push_back(std::move(m));
  }
  COLONY_RETURN_IF_ERROR(CheckGroup(g));
  return g;
}

}  // namespace

std::string EncodeJoinResponse(const JoinResponse& r) {
  pb::JoinResponse p;
  p.set_code(static_cast<pb::JoinResponse::Code>(r.code));
  p.set_reason(r.reason);
  if (r.leader) p.set_leader_peer(PeerBytes(*r.leader));
  for (const auto& a : r.leader_addrs) p.add_leader_addrs(a);
  if (r.code == JoinResponse::Code::kBegin) ToProto(r.group, *p.mutable_group());
  return p.SerializeAsString();
}

Result<JoinResponse> DecodeJoinResponse(std::string_view bytes) {
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::JoinResponse>(bytes, "join response"));
  JoinResponse r;
  const int code = static_cast<int>(p.code());
  if (code < 1 || code > 4)
    return ProtocolError("unknown join response code " + std::to_string(code));
  r.code = static_cast<JoinResponse::Code>(code);
  COLONY_RETURN_IF_ERROR(CheckBytes(p.reason(), kMaxReasonBytes, "a join response reason"));
  r.reason = p.reason();
  if (!p.leader_peer().empty()) {
    COLONY_ASSIGN_OR_RETURN(r.leader, PeerId::FromBytes(AsBytes(p.leader_peer())));
  }
  COLONY_ASSIGN_OR_RETURN(r.leader_addrs, Addrs(p.leader_addrs(), "a redirect"));
  if (r.code == JoinResponse::Code::kRedirect && (!r.leader || r.leader_addrs.empty())) {
    return ProtocolError("a redirect must name a leader and its addresses");
  }
  if (r.code == JoinResponse::Code::kBegin) {
    COLONY_ASSIGN_OR_RETURN(r.group, FromProto(p.group()));
  }
  return r;
}

std::string EncodeReduceHello(const ReduceHello& h) {
  pb::ReduceHello p;
  p.set_group_id(h.group_id);
  p.set_sender_index(h.sender_index);
  p.set_weight(h.weight);
  return p.SerializeAsString();
}

Result<ReduceHello> DecodeReduceHello(std::string_view bytes) {
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::ReduceHello>(bytes, "reduce hello"));
  COLONY_RETURN_IF_ERROR(CheckBytes(p.group_id(), kMaxGroupIdBytes, "a group id"));
  if (!std::isfinite(p.weight()) || p.weight() < 0) {
    return ProtocolError("a sender's weight must be finite and not negative");
  }
  return ReduceHello{p.group_id(), p.sender_index(), p.weight()};
}

std::string EncodePartHeader(const PartHeader& h) {
  pb::Part p;
  p.set_index(h.index);
  for (uint32_t c : h.contributors) p.add_contributors(c);
  return p.SerializeAsString();
}

Result<PartHeader> DecodePartHeader(std::string_view bytes, size_t group_size) {
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::Part>(bytes, "part header"));
  PartHeader h;
  h.index = p.index();
  COLONY_ASSIGN_OR_RETURN(h.contributors, Contributors(p.contributors(), group_size, "a part"));
  return h;
}

std::string EncodeStateAdvert(const StateAdvert& a) {
  pb::StateAdvert p;
  for (const auto& s : a.addrs) p.add_addrs(s);
  p.set_priority(a.priority);
  return p.SerializeAsString();
}

Result<StateAdvert> DecodeStateAdvert(std::string_view bytes) {
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::StateAdvert>(bytes, "state advert"));
  StateAdvert a;
  COLONY_ASSIGN_OR_RETURN(a.addrs, Addrs(p.addrs(), "a state advert"));
  if (a.addrs.empty()) return ProtocolError("a state advert lists no address");
  if (!std::isfinite(p.priority())) return ProtocolError("a state advert's priority is not finite");
  a.priority = p.priority();
  return a;
}

std::string EncodeStateRequest(const StateRequest& r) {
  pb::StateRequest p;
  p.set_prefix(r.prefix);
  if (r.min_priority) p.set_min_priority(*r.min_priority);
  p.set_digest_only(r.digest_only);
  return p.SerializeAsString();
}

Result<StateRequest> DecodeStateRequest(std::string_view bytes) {
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::StateRequest>(bytes, "state request"));
  COLONY_RETURN_IF_ERROR(CheckBytes(p.prefix(), 1024, "a key prefix"));
  StateRequest r;
  r.prefix = p.prefix();
  r.digest_only = p.digest_only();
  if (p.has_min_priority()) {
    if (!std::isfinite(p.min_priority())) {
      return ProtocolError("a state request's minimum priority is not finite");
    }
    r.min_priority = p.min_priority();
  }
  return r;
}

std::string EncodeStateHeader(const StateHeader& h) {
  pb::StateHeader p;
  p.set_metadata(h.metadata);
  for (uint64_t s : h.tensor_sizes) p.add_tensor_sizes(s);
  p.set_digest(h.digest);
  return p.SerializeAsString();
}

Result<StateHeader> DecodeStateHeader(std::string_view bytes) {
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::StateHeader>(bytes, "state header"));
  COLONY_RETURN_IF_ERROR(CheckBytes(p.metadata(), kMaxStateMetadataBytes, "state metadata"));
  if (static_cast<size_t>(p.tensor_sizes_size()) > kMaxStateTensors) {
    return ProtocolError("a state lists too many tensors");
  }
  if (!p.digest().empty() && p.digest().size() != kStateDigestBytes) {
    return ProtocolError("a state digest must be 32 bytes");
  }
  StateHeader h;
  h.metadata = p.metadata();
  h.digest = p.digest();
  uint64_t total = 0;
  for (uint64_t s : p.tensor_sizes()) {
    if (s > kMaxTotalValues - total) return ProtocolError("a state holds too many values");
    total += s;
    h.tensor_sizes.push_back(s);
  }
  return h;
}

std::string EncodeVerifyStatement(const VerifyStatement& v) {
  pb::VerifyStatement p;
  p.set_group_id(v.group_id);
  p.set_member(v.member);
  p.set_phase(static_cast<uint32_t>(v.phase));
  p.set_commitment(v.commitment);
  p.set_reveal(v.reveal);
  p.set_weight(v.weight);
  p.set_seed(v.seed);
  p.set_clip_tau(v.clip_tau);
  p.set_audit_claim(v.audit_claim);
  p.set_signature(v.signature);
  for (const SpanCheck& span : v.spans) {
    auto* ps = p.add_spans();
    ps->set_reducer(span.reducer);
    for (const RunCheck& run : span.runs) {
      auto* pr = ps->add_runs();
      pr->set_first_part(run.first_part);
      pr->set_end_part(run.end_part);
      for (uint32_t c : run.contributors) pr->add_contributors(c);
      for (double w : run.weights) pr->add_weights(w);
      for (double x : run.projections) pr->add_projections(x);
      for (double x : run.norms) pr->add_norms(x);
      pr->set_result_norm(run.result_norm);
    }
  }
  return p.SerializeAsString();
}

namespace {

bool FiniteNotNegative(double x) { return std::isfinite(x) && x >= 0; }

Result<RunCheck> DecodeRunCheck(const pb::RunCheck& p, uint32_t after_part, size_t group_size) {
  RunCheck r;
  r.first_part = p.first_part();
  r.end_part = p.end_part();
  if (r.first_part < after_part || r.end_part <= r.first_part) {
    return ProtocolError("a verification run's parts must be non-empty and in order");
  }
  COLONY_ASSIGN_OR_RETURN(r.contributors,
                          Contributors(p.contributors(), group_size, "a verification run"));
  const int n = p.norms_size();
  if (static_cast<size_t>(n) > r.contributors.size() ||
      static_cast<size_t>(p.projections_size()) != kDirections * static_cast<size_t>(n) ||
      (p.weights_size() != 0 && p.weights_size() != n)) {
    return ProtocolError("a verification run's values do not match its contributors");
  }
  for (double x : p.projections()) {
    if (!std::isfinite(x)) return ProtocolError("a verification run carries a non-finite value");
    r.projections.push_back(x);
  }
  for (double x : p.norms()) {
    if (!FiniteNotNegative(x)) return ProtocolError("a verification run carries a bad norm");
    r.norms.push_back(x);
  }
  for (double w : p.weights()) {
    if (!FiniteNotNegative(w)) return ProtocolError("a verification run carries a bad weight");
    r.weights.push_back(w);
  }
  if (!FiniteNotNegative(p.result_norm())) {
    return ProtocolError("a verification run carries a bad result norm");
  }
  r.result_norm = p.result_norm();
  return r;
}

}  // namespace

Result<VerifyStatement> DecodeVerifyStatement(std::string_view bytes, size_t group_size) {
  if (bytes.size() > kMaxVerifyStatementBytes) {
    return ProtocolError("a verification statement of " + std::to_string(bytes.size()) +
                         " bytes is over the limit");
  }
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::VerifyStatement>(bytes, "verification statement"));
  VerifyStatement v;
  COLONY_RETURN_IF_ERROR(CheckBytes(p.group_id(), kMaxGroupIdBytes, "a group id"));
  v.group_id = p.group_id();
  if (p.member() >= group_size)
    return ProtocolError("a verification statement's member is unknown");
  v.member = p.member();
  const uint32_t phase = p.phase();
  const bool commit = phase == static_cast<uint32_t>(VerifyPhase::kCommit);
  const bool reveal = phase == static_cast<uint32_t>(VerifyPhase::kReveal);
  const bool checks = phase == static_cast<uint32_t>(VerifyPhase::kChecks);
  if (!commit && !reveal && !checks) {
    return ProtocolError("unknown verification phase " + std::to_string(phase));
  }
  v.phase = static_cast<VerifyPhase>(phase);
  if ((commit && p.commitment().size() != kVerifyRevealBytes) ||
      (!commit && !p.commitment().empty()) || (reveal && p.reveal().size() != kVerifyRevealBytes) ||
      (!reveal && !p.reveal().empty()) || (checks && p.seed().size() != kVerifyRevealBytes) ||
      (!checks &&
       (p.spans_size() != 0 || p.weight() != 0 || !p.seed().empty() || p.clip_tau() != 0)) ||
      (!commit && !p.audit_claim().empty())) {
    return ProtocolError("a verification statement carries fields of another phase");
  }
  COLONY_RETURN_IF_ERROR(CheckBytes(p.audit_claim(), kMaxAuditClaimBytes, "an audit claim"));
  v.audit_claim = p.audit_claim();
  v.commitment = p.commitment();
  v.reveal = p.reveal();
  v.seed = p.seed();
  if (!FiniteNotNegative(p.clip_tau())) return ProtocolError("a verification tau is bad");
  v.clip_tau = p.clip_tau();
  if (p.signature().size() != kSignatureSize) {
    return ProtocolError("a verification statement must carry a 64-byte signature");
  }
  v.signature = p.signature();
  if (!FiniteNotNegative(p.weight())) return ProtocolError("a verification weight is bad");
  v.weight = p.weight();
  if (static_cast<size_t>(p.spans_size()) > group_size) {
    return ProtocolError("a verification statement names more spans than the group has");
  }
  std::set<uint32_t> reducers;
  for (const auto& ps : p.spans()) {
    if (ps.reducer() >= group_size || !reducers.insert(ps.reducer()).second) {
      return ProtocolError("a verification statement's spans must name distinct reducers");
    }
    if (static_cast<size_t>(ps.runs_size()) > kMaxVerifyRuns) {
      return ProtocolError("a verification span has too many runs");
    }
    SpanCheck span{ps.reducer(), {}};
    uint32_t after = 0;
    for (const auto& pr : ps.runs()) {
      COLONY_ASSIGN_OR_RETURN(RunCheck run, DecodeRunCheck(pr, after, group_size));
      after = run.end_part;
      span.runs.push_back(std::move(run));
    }
    v.spans.push_back(std::move(span));
  }
  return v;
}

}  // namespace colony::averaging
