// The control messages of the block-serving RPCs ("serve.*", serve.proto) as validated structs.
// Every decoder reads bytes from another peer: it checks ranges, sizes and names and fails with a
// ProtocolError naming the problem, so a handler only ever sees well-formed requests (the checks
// that depend on the server, such as its block range or batch limit, are the server's). Pure
// functions, torch-free; fuzzed by fuzz/serve_wire_fuzz.cpp (whatever decodes re-encodes to a
// fixed point). Tensors travel beside these messages as frames (net::Message::tensors); each
// message says which frames it expects.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compression/codec.h"
#include "core/status.h"

namespace colony::serve {

inline constexpr int64_t kMaxBlockIndex = int64_t{1} << 16;  // blocks are numbered below this
inline constexpr int64_t kMaxLoraRank = 256;
inline constexpr size_t kMaxLoraTargets = 7;
inline constexpr int64_t kMaxEpoch = int64_t{1} << 48;  // a SWARM trainer's epoch
inline constexpr size_t kSessionIdBytes = 16;
inline constexpr size_t kMaxAddressBytes = 512;
// The most metadata a step or push carries (two addresses, a session id and a few numbers fit
// in a third of it).
inline constexpr size_t kMaxStepMetaBytes = 4096;
inline constexpr size_t kMaxInfoStringBytes = 256;

// The projections of a block a LoRA adapter may target.
bool IsProjection(std::string_view name);

// Deep prompts and LoRA adapters that a forward/backward request or an inference session carries
// (tensors after the request's own: prompts [end-start, B or 1, P, H] when prompt_length P > 0,
// then for each block and target, A [rank, in] and B [out, rank]).
struct TuningSpec {
  int64_t prompt_length = 0;
  int64_t lora_rank = 0;                       // 0: no adapters
  std::vector<std::string> lora_targets = {};  // 1..7 distinct projections when lora_rank > 0
  double lora_scale = 1.0;                     // finite; 0 on the wire means 1
};

// serve.forward and serve.backward: blocks [start, end).
struct BlockRequest {
  int64_t start = 0, end = 0;
  TuningSpec tuning = {};
  // The epoch of a SWARM trainer's microbatch (at most kMaxEpoch); -1: not a training request.
  int64_t epoch = -1;
  // How the hidden states (forward: the input; backward: the input and its gradient) and the
  // reply's first tensor travel: one of kBoundaryCodecs.
  compression::Codec boundary_codec = compression::Codec::kNone;
  // A SWARM trainer's microbatch id, the same in its retries (backward, with an epoch; 0: none),
  // and whether a server of these blocks already took its gradient (compute the input gradient
  // only; needs the id).
  uint64_t microbatch = 0;
  bool replay = false;
  uint32_t attempt = 0;  // the try of this backward (from 1; with a microbatch id)
};

// serve.fence: did the server take microbatch's gradient over [start, end)? If not, it never
// takes try `attempt` or an earlier one.
struct FenceRequest {
  int64_t start = 0, end = 0;
  uint64_t microbatch = 0;  // not 0
  uint32_t attempt = 0;     // from 1
};
struct FenceReply {
  bool taken = false;
};

// The codecs hidden states may cross the network in (each decodes to at most 4x its bytes), and
// the block size of the 8-bit one (one float32 scale per 256 values: 1.6% overhead).
inline constexpr std::array<compression::Codec, 4> kBoundaryCodecs = {
    compression::Codec::kNone, compression::Codec::kFloat16, compression::Codec::kBFloat16,
    compression::Codec::kBlockwise8};
inline constexpr uint32_t kBoundaryBlockSize = 256;
inline constexpr bool IsBoundaryCodec(compression::Codec codec) {
  for (compression::Codec c : kBoundaryCodecs) {
    if (c == codec) return true;
  }
  return false;
}
// kBoundaryCodecs but kNone: what a receiver of hidden states decodes besides raw frames.
inline const std::vector<compression::Codec>& CompressedBoundaryCodecs() {
  static const std::vector<compression::Codec> codecs(kBoundaryCodecs.begin() + 1,
                                                      kBoundaryCodecs.end());
  return codecs;
}

// Where a server also sends each step's output: the next server's session (empty: nowhere).
struct PushTarget {
  std::string address = {};     // a multiaddr with /p2p/ (at most kMaxAddressBytes)
  std::string session_id = {};  // kSessionIdBytes bytes when address is set
  bool empty() const { return address.empty(); }
};

// serve.inference, first message: opens a session over blocks [start, end).
struct OpenSessionRequest {
  std::string session_id = {};  // kSessionIdBytes random bytes (also the push capability)
  int64_t start = 0, end = 0;
  int64_t max_length = 0;  // tokens per sequence, >= 1
  int64_t batch_size = 0;  // >= 1
  PushTarget next = {};
  TuningSpec tuning = {};
  // The server whose pushes this session accepts (the one before it in the chain), as a peer id
  // (at most kMaxAddressBytes; empty: none).
  std::string upstream = {};
};
struct SessionOpenedReply {
  uint64_t cache_tokens_left = 0;
};

// serve.inference, every later message: one step. Tensors: hidden [B, T, H] (+ hypo_ids [B]).
struct StepRequest {
  uint64_t step_id = 0;  // >= 1, strictly increasing per session (a repeat is a duplicate)
  int64_t position = 0;  // of the step's first token, >= 0
  bool has_hypo_ids = false;
  std::optional<PushTarget> next = std::nullopt;  // replaces the session's push target when set
  std::optional<std::string> upstream = std::nullopt;  // replaces the session's upstream when set
  // A session whose blocks end at this block replies with the last position only ([B, 1, H]).
  std::optional<uint32_t> last_position_at = std::nullopt;
};
struct StepReply {
  uint64_t step_id = 0;
  int64_t length = 0;  // tokens in the cache after the step
};

// serve.push: a previous server's output for a step of a session here, accepted only from the
// session's upstream (its next target and upstream are never taken from a push: the client
// chooses them).
struct PushRequest {
  std::string session_id = {};
  StepRequest step = {};
};

// serve.info.
struct InfoReply {
  std::string model;
  int64_t start = 0, end = 0;
  std::string state;
  double throughput = 0;
  double inference_steps_per_second = 0;
  uint64_t cache_tokens_left = 0;
  uint64_t cache_bytes_left = 0;
  std::string version;
  std::string dtype;
  std::string quantization;
  int64_t max_batch = 0, max_length = 0, hidden_size = 0;
  uint32_t active_sessions = 0;
  uint64_t weight_bytes = 0;
};

std::string EncodeBlockRequest(const BlockRequest& r);
Result<BlockRequest> DecodeBlockRequest(std::string_view bytes);
std::string EncodeFence(const FenceRequest& r);
Result<FenceRequest> DecodeFence(std::string_view bytes);
std::string EncodeFenceReply(const FenceReply& r);
Result<FenceReply> DecodeFenceReply(std::string_view bytes);
std::string EncodeOpenSession(const OpenSessionRequest& r);
Result<OpenSessionRequest> DecodeOpenSession(std::string_view bytes);
std::string EncodeSessionOpened(const SessionOpenedReply& r);
Result<SessionOpenedReply> DecodeSessionOpened(std::string_view bytes);
std::string EncodeStep(const StepRequest& r);
Result<StepRequest> DecodeStep(std::string_view bytes);
std::string EncodeStepReply(const StepReply& r);
Result<StepReply> DecodeStepReply(std::string_view bytes);
std::string EncodePush(const PushRequest& r);
Result<PushRequest> DecodePush(std::string_view bytes);
std::string EncodeInfo(const InfoReply& r);
Result<InfoReply> DecodeInfo(std::string_view bytes);

}  // namespace colony::serve
