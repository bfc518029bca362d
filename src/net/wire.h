// The transport's wire format, as pure functions over bytes (no I/O), so each decoder can be
// fuzzed on its own. The layers, outermost first:
//
//   connection := Hello (both sides, plaintext) , record*
//   handshake message := u32le length (<= kMaxHandshakeMessage) | protobuf bytes
//   record    := u32le length | AES-256-GCM ciphertext of the record's frames | 16-byte tag
//                (the length prefix is authenticated as associated data; nonces are per-direction
//                counters, so a replayed, reordered or altered record fails authentication)
//   frame     := u8 type | u8 flags | varint stream_id | varint payload_length | payload
//   message   := varint meta_length | meta | varint tensor_count | tensor*
//   tensor    := u8 dtype | u8 codec | u8 rank | varint dim * rank | varint byte_length | bytes
//
// A message longer than one frame travels as several DATA frames; the first one carries the
// kFlagBegin flag and starts with a varint of the message's total length.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/bytes.h"
#include "core/status.h"
#include "core/tensor.h"

namespace colony::net {

inline constexpr uint32_t kProtocolMajor = 1;
inline constexpr uint32_t kProtocolMinor = 0;

inline constexpr size_t kMaxHandshakeMessage = 4096;
inline constexpr size_t kTagSize = 16;
inline constexpr size_t kMaxRecordPlaintext = 256 * 1024;
inline constexpr size_t kMaxFrameHeader = 1 + 1 + 10 + 10;
// Largest DATA payload that fits a record with its frame header and a BEGIN length prefix.
inline constexpr size_t kMaxDataChunk = kMaxRecordPlaintext - kMaxFrameHeader - 10;
inline constexpr size_t kMaxTensorsPerMessage = 4096;

enum class FrameType : uint8_t {
  kOpen = 1,        // payload: CallHeader. Opens stream_id.
  kData = 2,        // payload: a chunk of one message (see kFlagBegin)
  kCloseWrite = 3,  // the sender will send no more messages on stream_id
  kStatus = 4,      // payload: CallStatus. The handler's final status; ends stream_id.
  kReset = 5,       // payload: CallStatus. Aborts stream_id in both directions.
  kWindow = 6,      // payload: varint credit in bytes, for stream_id (0 = the whole connection)
  kPing = 7,        // payload: 8 opaque bytes; kFlagAck marks the answer
  kGoAway = 8,      // payload: CallStatus. The sender is closing the connection.
  kToken = 9,       // payload: the sender's renewed access token (private swarms, access_token.h)
};
inline constexpr size_t kMaxTokenFrame = 1024;
inline constexpr uint8_t kFlagBegin = 0x1;  // DATA: first chunk of a message
inline constexpr uint8_t kFlagAck = 0x1;    // PING: this is the answer

struct FrameHeader {
  FrameType type;
  uint8_t flags = 0;
  uint32_t stream_id = 0;
  uint64_t payload_length = 0;
};

void EncodeFrameHeader(const FrameHeader& header, Bytes& out);

// Decodes one frame from the front of `in`. On success returns the header and advances `in`
// past the header; the payload is the next payload_length bytes (guaranteed present).
// Errors: ProtocolError naming the problem (unknown type, truncated, oversized, bad flags).
Result<FrameHeader> DecodeFrameHeader(ByteReader& in);

// Splits a decrypted record into frames, validating every header. Frame payloads are views
// into `record`.
struct FrameView {
  FrameHeader header;
  ByteSpan payload;
};
Result<std::vector<FrameView>> SplitFrames(ByteSpan record);

// A tensor inside a message: header fields plus a view of its bytes. `owner` keeps the bytes
// alive (the receive buffer on the receiving side; optional on the sending side, where the
// caller guarantees the bytes outlive the write).
struct TensorFrame {
  DType dtype = DType::kFloat32;
  uint8_t codec = 0;  // 0: raw contiguous little-endian elements; others: compression codecs
  std::vector<int64_t> shape;
  ByteSpan data;
  std::shared_ptr<const void> owner;

  TensorView view() const { return {dtype, shape, data}; }
};

// An RPC message: a control part (usually a serialized protobuf) and raw tensor frames.
struct Message {
  std::string meta;
  std::vector<TensorFrame> tensors;

  Message() = default;
  explicit Message(std::string m) : meta(std::move(m)) {}
};

// Serialization of a message for sending, without copying its meta or tensor bytes: the small
// headers live in `header_bytes` and `pieces` lists the byte ranges to send in order (views into
// header_bytes, the message's meta and the tensors' data, so the message must outlive it).
// header_bytes is a vector so that moving an EncodedMessage keeps the pieces' views valid (a
// std::string would move its small-string buffer).
struct EncodedMessage {
  Bytes header_bytes;
  std::vector<ByteSpan> pieces;
  size_t total = 0;
};
// Fails (InvalidArgument) when a raw tensor's byte length does not match its shape and dtype,
// or when the message has too many tensors or too high a rank.
Result<EncodedMessage> EncodeMessage(const Message& message);

// Parses a complete received message. Tensor data are views into `bytes`, kept alive by `owner`.
// Validates every length, count, rank, dtype and (for raw tensors) shape-vs-size consistency.
Result<Message> DecodeMessage(ByteSpan bytes, std::shared_ptr<const void> owner);

// At most `max_bytes` of `s` as valid UTF-8 (protobuf string fields must be): invalid bytes
// become '?', and a multi-byte character is never cut.
std::string ValidUtf8Prefix(std::string_view s, size_t max_bytes);

// CallStatus payloads (also used by GOAWAY).
Bytes EncodeStatus(const Status& status);
// Never fails: malformed input decodes to a ProtocolError status describing it.
Status DecodeStatus(ByteSpan payload);

}  // namespace colony::net
