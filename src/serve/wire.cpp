#include "serve/wire.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/multiaddr.h"
#include "serve/serve.pb.h"

namespace colony::serve {
namespace {

constexpr int64_t kMaxPromptLength = int64_t{1} << 16;
constexpr std::string_view kProjections[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};

template <typename Proto>
Result<Proto> Parse(std::string_view bytes, const char* what) {
  Proto p;
  if (!p.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return ProtocolError(fmt::format("malformed {} ({} bytes)", what, bytes.size()));
  }
  return p;
}

Status CheckRange(int64_t start, int64_t end, const char* what) {
  if (start >= end || end > kMaxBlockIndex) {
    return ProtocolError(fmt::format("{}: blocks [{}, {}) are not a range below {}", what, start,
                                     end, kMaxBlockIndex));
  }
  return Status::Ok();
}

Status CheckString(const std::string& s, size_t max, const char* what) {
  if (s.size() > max) {
    return ProtocolError(
        fmt::format("{} is {} bytes; at most {} are allowed", what, s.size(), max));
  }
  return Status::Ok();
}

// The tuning fields of a BlockRequest or an OpenSession (named alike in both).
template <typename Message>
Result<TuningSpec> TuningOf(const Message& m, const char* what) {
  TuningSpec t;
  t.prompt_length = m.prompt_length();
  if (t.prompt_length > kMaxPromptLength) {
    return ProtocolError(
        fmt::format("{}: {} prompt tokens; at most {}", what, t.prompt_length, kMaxPromptLength));
  }
  t.lora_rank = m.lora_rank();
  if (t.lora_rank == 0) {
    if (m.lora_targets_size() > 0) {
      return ProtocolError(fmt::format("{}: LoRA targets without a rank", what));
    }
    return t;
  }
  if (t.lora_rank > kMaxLoraRank) {
    return ProtocolError(
        fmt::format("{}: LoRA rank {} is above {}", what, t.lora_rank, kMaxLoraRank));
  }
  if (m.lora_targets_size() < 1 || static_cast<size_t>(m.lora_targets_size()) > kMaxLoraTargets) {
    return ProtocolError(fmt::format("{}: LoRA needs 1 to {} target projections, got {}", what,
                                     kMaxLoraTargets, m.lora_targets_size()));
  }
  for (const auto& name : m.lora_targets()) {
    if (!IsProjection(name)) {
      return ProtocolError(
          fmt::format("{}: unknown LoRA projection '{}'", what, name.substr(0, 32)));
    }
    if (std::count(t.lora_targets.begin(), t.lora_targets.end(), name) > 0) {
      return ProtocolError(fmt::format("{}: LoRA projection '{}' listed twice", what, name));
    }
    t.lora_targets.push_back(name);
  }
  if (!std::isfinite(m.lora_scale())) {
    return ProtocolError(fmt::format("{}: LoRA scale is not finite", what));
  }
  t.lora_scale = m.lora_scale() == 0 ? 1.0 : m.lora_scale();
  return t;
}

template <typename Message>
void SetTuning(Message& m, const TuningSpec& t) {
  m.set_prompt_length(static_cast<uint32_t>(t.prompt_length));
  if (t.lora_rank > 0) {
    m.set_lora_rank(static_cast<uint32_t>(t.lora_rank));
    for (const auto& name : t.lora_targets) m.add_lora_targets(name);
    m.set_lora_scale(t.lora_scale);
  }
}

Result<PushTarget> PushTargetOf(const pb::PushTarget& p, const char* what) {
  PushTarget t{p.address(), p.session_id()};
  COLONY_RETURN_IF_ERROR(CheckString(t.address, kMaxAddressBytes, "a push target's address"));
  if (t.address.empty()) {
    if (!t.session_id.empty()) {
      return ProtocolError(fmt::format("{}: a push target names a session but no address", what));
    }
    return t;
  }
  if (t.session_id.size() != kSessionIdBytes) {
    return ProtocolError(
        fmt::format("{}: a push target's session id must be {} bytes", what, kSessionIdBytes));
  }
  auto addr = Multiaddr::Parse(t.address);
  if (!addr.ok() || !addr->peer_id()) {
    return ProtocolError(
        fmt::format("{}: the push target's address is not a multiaddr with /p2p/", what));
  }
  return t;
}

// A peer id naming the server that may push (empty: none).
Status CheckUpstream(const std::string& upstream, const char* what) {
  if (upstream.empty()) return Status::Ok();
  if (upstream.size() > kMaxAddressBytes || !PeerId::Parse(upstream).ok()) {
    return ProtocolError(fmt::format("{}: the upstream is not a peer id", what));
  }
  return Status::Ok();
}

void SetPushTarget(pb::PushTarget& p, const PushTarget& t) {
  p.set_address(t.address);
  p.set_session_id(t.session_id);
}

Result<StepRequest> StepOf(const pb::Step& p, const char* what) {
  StepRequest s;
  s.step_id = p.step_id();
  s.position = p.position();
  s.has_hypo_ids = p.has_hypo_ids();
  if (s.step_id == 0) return ProtocolError(fmt::format("{}: step ids start at 1", what));
  if (s.position < 0) {
    return ProtocolError(fmt::format("{}: negative position {}", what, s.position));
  }
  if (p.has_next()) {
    COLONY_ASSIGN_OR_RETURN(s.next, PushTargetOf(p.next(), what));
  }
  if (p.has_upstream()) {
    COLONY_RETURN_IF_ERROR(CheckUpstream(p.upstream(), what));
    s.upstream = p.upstream();
  }
  if (p.has_last_position_at()) s.last_position_at = p.last_position_at();
  return s;
}

void SetStep(pb::Step& p, const StepRequest& s) {
  p.set_step_id(s.step_id);
  p.set_position(s.position);
  p.set_has_hypo_ids(s.has_hypo_ids);
  if (s.next) SetPushTarget(*p.mutable_next(), *s.next);
  if (s.upstream) p.set_upstream(*s.upstream);
  if (s.last_position_at) p.set_last_position_at(*s.last_position_at);
}

}  // namespace

bool IsProjection(std::string_view name) {
  return std::find(std::begin(kProjections), std::end(kProjections), name) !=
         std::end(kProjections);
}

std::string EncodeBlockRequest(const BlockRequest& r) {
  pb::BlockRequest p;
  p.set_start(static_cast<uint32_t>(r.start));
  p.set_end(static_cast<uint32_t>(r.end));
  SetTuning(p, r.tuning);
  if (r.epoch >= 0) p.set_epoch(static_cast<uint64_t>(r.epoch));
  p.set_boundary_codec(static_cast<uint32_t>(r.boundary_codec));
  p.set_microbatch(r.microbatch);
  p.set_replay(r.replay);
  p.set_attempt(r.attempt);
  return p.SerializeAsString();
}

Result<BlockRequest> DecodeBlockRequest(std::string_view bytes) {
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::BlockRequest>(bytes, "BlockRequest"));
  BlockRequest r;
  r.start = p.start();
  r.end = p.end();
  COLONY_RETURN_IF_ERROR(CheckRange(r.start, r.end, "BlockRequest"));
  COLONY_ASSIGN_OR_RETURN(r.tuning, TuningOf(p, "BlockRequest"));
  if (p.has_epoch()) {
    if (p.epoch() > static_cast<uint64_t>(kMaxEpoch)) {
      return ProtocolError(fmt::format("BlockRequest: epoch {} is above {}", p.epoch(), kMaxEpoch));
    }
    r.epoch = static_cast<int64_t>(p.epoch());
  }
  const auto codec = p.boundary_codec() <= 255
                         ? compression::CodecFromWire(static_cast<uint8_t>(p.boundary_codec()))
                         : std::nullopt;
  if (!codec || !IsBoundaryCodec(*codec)) {
    return ProtocolError(
        fmt::format("BlockRequest: boundary codec {} is not one of none, fp16, bf16 and blockwise8",
                    p.boundary_codec()));
  }
  r.boundary_codec = *codec;
  r.microbatch = p.microbatch();
  r.replay = p.replay();
  r.attempt = p.attempt();
  if (r.microbatch != 0 && r.epoch < 0) {
    return ProtocolError("BlockRequest: a microbatch id without a trainer's epoch");
  }
  if ((r.replay || r.attempt != 0) && r.microbatch == 0) {
    return ProtocolError("BlockRequest: a replay or a try number without a microbatch id");
  }
  return r;
}

std::string EncodeFence(const FenceRequest& r) {
  pb::FenceRequest p;
  p.set_start(static_cast<uint32_t>(r.start));
  p.set_end(static_cast<uint32_t>(r.end));
  p.set_microbatch(r.microbatch);
  p.set_attempt(r.attempt);
  return p.SerializeAsString();
}

Result<FenceRequest> DecodeFence(std::string_view bytes) {
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::FenceRequest>(bytes, "FenceRequest"));
  FenceRequest r;
  r.start = p.start();
  r.end = p.end();
  COLONY_RETURN_IF_ERROR(CheckRange(r.start, r.end, "FenceRequest"));
  r.microbatch = p.microbatch();
  if (r.microbatch == 0) return ProtocolError("FenceRequest: no microbatch id");
  r.attempt = p.attempt();
  if (r.attempt == 0) return ProtocolError("FenceRequest: no try number");
  return r;
}

std::string EncodeFenceReply(const FenceReply& r) {
  pb::FenceReply p;
  p.set_taken(r.taken);
  return p.SerializeAsString();
}

Result<FenceReply> DecodeFenceReply(std::string_view bytes) {
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::FenceReply>(bytes, "FenceReply"));
  return FenceReply{.taken = p.taken()};
}

std::string EncodeOpenSession(const OpenSessionRequest& r) {
  pb::OpenSession p;
  p.set_session_id(r.session_id);
  p.set_start(static_cast<uint32_t>(r.start));
  p.set_end(static_cast<uint32_t>(r.end));
  p.set_max_length(static_cast<uint32_t>(r.max_length));
  p.set_batch_size(static_cast<uint32_t>(r.batch_size));
  if (!r.next.empty()) SetPushTarget(*p.mutable_next(), r.next);
  SetTuning(p, r.tuning);
  p.set_upstream(r.upstream);
  return p.SerializeAsString();
}

Result<OpenSessionRequest> DecodeOpenSession(std::string_view bytes) {
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::OpenSession>(bytes, "OpenSession"));
  OpenSessionRequest r;
  r.session_id = p.session_id();
  if (r.session_id.size() != kSessionIdBytes) {
    return ProtocolError(fmt::format("OpenSession: session ids are {} bytes", kSessionIdBytes));
  }
  r.start = p.start();
  r.end = p.end();
  COLONY_RETURN_IF_ERROR(CheckRange(r.start, r.end, "OpenSession"));
  r.max_length = p.max_length();
  r.batch_size = p.batch_size();
  if (r.max_length < 1 || r.batch_size < 1) {
    return ProtocolError("OpenSession: max_length and batch_size must be at least 1");
  }
  if (p.has_next()) {
    COLONY_ASSIGN_OR_RETURN(r.next, PushTargetOf(p.next(), "OpenSession"));
  }
  COLONY_ASSIGN_OR_RETURN(r.tuning, TuningOf(p, "OpenSession"));
  COLONY_RETURN_IF_ERROR(CheckUpstream(p.upstream(), "OpenSession"));
  r.upstream = p.upstream();
  return r;
}

std::string EncodeSessionOpened(const SessionOpenedReply& r) {
  pb::SessionOpened p;
  p.set_cache_tokens_left(r.cache_tokens_left);
  return p.SerializeAsString();
}

Result<SessionOpenedReply> DecodeSessionOpened(std::string_view bytes) {
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::SessionOpened>(bytes, "SessionOpened"));
  return SessionOpenedReply{p.cache_tokens_left()};
}

std::string EncodeStep(const StepRequest& r) {
  pb::Step p;
  SetStep(p, r);
  return p.SerializeAsString();
}

Result<StepRequest> DecodeStep(std::string_view bytes) {
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::Step>(bytes, "Step"));
  return StepOf(p, "Step");
}

std::string EncodeStepReply(const StepReply& r) {
  pb::StepResult p;
  p.set_step_id(r.step_id);
  p.set_length(r.length);
  return p.SerializeAsString();
}

Result<StepReply> DecodeStepReply(std::string_view bytes) {
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::StepResult>(bytes, "StepResult"));
  if (p.length() < 0) return ProtocolError("StepResult: negative cache length");
  return StepReply{p.step_id(), p.length()};
}

std::string EncodePush(const PushRequest& r) {
  pb::PushRequest p;
  p.set_session_id(r.session_id);
  StepRequest step = r.step;
  step.next.reset();
  SetStep(*p.mutable_step(), step);
  return p.SerializeAsString();
}

Result<PushRequest> DecodePush(std::string_view bytes) {
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::PushRequest>(bytes, "PushRequest"));
  PushRequest r;
  r.session_id = p.session_id();
  if (r.session_id.size() != kSessionIdBytes) {
    return ProtocolError(fmt::format("PushRequest: session ids are {} bytes", kSessionIdBytes));
  }
  if (!p.has_step()) return ProtocolError("PushRequest: no step");
  if (p.step().has_next()) {
    return ProtocolError("PushRequest: a push does not choose the next hop (the client does)");
  }
  if (p.step().has_upstream()) {
    return ProtocolError("PushRequest: a push does not choose who may push (the client does)");
  }
  COLONY_ASSIGN_OR_RETURN(r.step, StepOf(p.step(), "PushRequest"));
  return r;
}

std::string EncodeInfo(const InfoReply& r) {
  pb::InfoResponse p;
  p.set_model(r.model);
  p.set_start(static_cast<uint32_t>(r.start));
  p.set_end(static_cast<uint32_t>(r.end));
  p.set_state(r.state);
  p.set_throughput(r.throughput);
  p.set_inference_steps_per_second(r.inference_steps_per_second);
  p.set_cache_tokens_left(r.cache_tokens_left);
  p.set_cache_bytes_left(r.cache_bytes_left);
  p.set_version(r.version);
  p.set_dtype(r.dtype);
  p.set_quantization(r.quantization);
  p.set_max_batch(static_cast<uint32_t>(r.max_batch));
  p.set_max_length(static_cast<uint32_t>(r.max_length));
  p.set_hidden_size(static_cast<uint32_t>(r.hidden_size));
  p.set_active_sessions(r.active_sessions);
  p.set_weight_bytes(r.weight_bytes);
  return p.SerializeAsString();
}

Result<InfoReply> DecodeInfo(std::string_view bytes) {
  COLONY_ASSIGN_OR_RETURN(auto p, Parse<pb::InfoResponse>(bytes, "InfoResponse"));
  for (const std::string* s :
       {&p.model(), &p.state(), &p.version(), &p.dtype(), &p.quantization()}) {
    COLONY_RETURN_IF_ERROR(CheckString(*s, kMaxInfoStringBytes, "an InfoResponse string"));
  }
  InfoReply r;
  r.model = p.model();
  r.start = p.start();
  r.end = p.end();
  COLONY_RETURN_IF_ERROR(CheckRange(r.start, r.end, "InfoResponse"));
  r.state = p.state();
  r.throughput = p.throughput();
  r.inference_steps_per_second = p.inference_steps_per_second();
  if (!std::isfinite(r.throughput) || r.throughput < 0 ||
      !std::isfinite(r.inference_steps_per_second) || r.inference_steps_per_second < 0) {
    return ProtocolError("InfoResponse: throughputs must be finite and non-negative");
  }
  r.cache_tokens_left = p.cache_tokens_left();
  r.cache_bytes_left = p.cache_bytes_left();
  r.version = p.version();
  r.dtype = p.dtype();
  r.quantization = p.quantization();
  r.max_batch = p.max_batch();
  r.max_length = p.max_length();
  r.hidden_size = p.hidden_size();
  r.active_sessions = p.active_sessions();
  r.weight_bytes = p.weight_bytes();
  return r;
}

}  // namespace colony::serve
