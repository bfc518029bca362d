#include "net/wire.h"

#include <algorithm>
#include <string_view>

#include "net/protocol.pb.h"

namespace colony::net {
namespace {

constexpr uint64_t kMaxFramePayload = kMaxRecordPlaintext;

bool KnownFrameType(uint8_t t) { return t >= 1 && t <= 9; }

Status Malformed(const std::string& what) { return ProtocolError("malformed frame: " + what); }

// Length of the valid UTF-8 sequence at the front of `s` (0 if it is not one), as protobuf checks
// string fields: no overlong forms, no surrogates, nothing above U+10FFFF.
size_t Utf8SequenceLength(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t c = b(0);
  if (c < 0x80) return 1;
  size_t n = c >= 0xc2 && c <= 0xdf   ? 2
             : c >= 0xe0 && c <= 0xef ? 3
             : c >= 0xf0 && c <= 0xf4 ? 4
                                      : 0;
  if (n == 0 || s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    if ((b(i) & 0xc0) != 0x80) return 0;
  }
  if ((c == 0xe0 && b(1) < 0xa0) || (c == 0xed && b(1) > 0x9f) || (c == 0xf0 && b(1) < 0x90) ||
      (c == 0xf4 && b(1) > 0x8f)) {
    return 0;
  }
  return n;
}

}  // namespace

// At most `max_bytes` of `s` as valid UTF-8: invalid bytes become '?', and a character is never
// cut.
std::string ValidUtf8Prefix(std::string_view s, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(s.size(), max_bytes));
  while (!s.empty()) {
    size_t n = Utf8SequenceLength(s);
    if (out.size() + std::max<size_t>(n, 1) > max_bytes) break;
    if (n == 0) {
      out += '?';
      n = 1;
    } else {
      out.append(s.data(), n);
    }
    s.remove_prefix(n);
  }
  return out;
}

void EncodeFrameHeader(const FrameHeader& header, Bytes& out) {
  ByteWriter w(out);
  w.U8(static_cast<uint8_t>(header.type));
  w.U8(header.flags);
  w.Varint(header.stream_id);
  w.Varint(header.payload_length);
}

Result<FrameHeader> DecodeFrameHeader(ByteReader& in) {
  uint8_t type = in.U8();
  uint8_t flags = in.U8();
  uint64_t stream_id = in.Varint();
  uint64_t length = in.Varint();
  if (!in.ok()) return Malformed("truncated frame header");
  if (!KnownFrameType(type)) return Malformed("unknown frame type " + std::to_string(type));
  if (stream_id > UINT32_MAX)
    return Malformed("stream id " + std::to_string(stream_id) + " out of range");
  if (length > kMaxFramePayload) {
    return Malformed("payload length " + std::to_string(length) + " exceeds " +
                     std::to_string(kMaxFramePayload));
  }
  if (length > in.remaining()) {
    return Malformed("payload length " + std::to_string(length) + " runs past the record (" +
                     std::to_string(in.remaining()) + " bytes left)");
  }
  FrameHeader h{static_cast<FrameType>(type), flags, static_cast<uint32_t>(stream_id), length};
  switch (h.type) {
    case FrameType::kData:
      if (flags & ~kFlagBegin) return Malformed("unknown DATA flags");
      if (stream_id == 0) return Malformed("DATA on stream 0");
      break;
    case FrameType::kPing:
      if (flags & ~kFlagAck) return Malformed("unknown PING flags");
      if (length != 8) return Malformed("PING payload must be 8 bytes");
      break;
    case FrameType::kWindow:
      if (flags != 0) return Malformed("WINDOW carries no flags");
      break;
    case FrameType::kGoAway:
      if (flags != 0) return Malformed("GOAWAY carries no flags");
      break;
    case FrameType::kToken:
      if (flags != 0 || stream_id != 0) return Malformed("TOKEN carries no flags and no stream");
      if (length > kMaxTokenFrame) return Malformed("TOKEN payload too long");
      break;
    default:
      if (flags != 0) return Malformed("unexpected flags on frame type " + std::to_string(type));
      if (stream_id == 0) return Malformed("frame type " + std::to_string(type) + " on stream 0");
      break;
  }
  return h;
}

Result<std::vector<FrameView>> SplitFrames(ByteSpan record) {
  std::vector<FrameView> frames;
  ByteReader in(record);
  while (in.remaining() > 0) {
    auto h = DecodeFrameHeader(in);
    if (!h.ok()) return h.status();
    ByteSpan payload = in.Raw(h->payload_length);
    frames.push_back({*h, payload});
  }
  return frames;
}

Result<EncodedMessage> EncodeMessage(const Message& message) {
  if (message.tensors.size() > kMaxTensorsPerMessage) {
    return InvalidArgument("message has " + std::to_string(message.tensors.size()) +
                           " tensors; at most " + std::to_string(kMaxTensorsPerMessage) +
                           " allowed");
  }
  EncodedMessage em;
  // First pass: build all small headers, remembering where each one ends so the pieces can be
  // laid out once header_bytes stops growing. The meta and the tensor data are not copied: they
  // are pieces of their own, borrowed from `message`.
  Bytes hdr;
  ByteWriter w(hdr);
  w.Varint(message.meta.size());
  const size_t meta_at = hdr.size();
  w.Varint(message.tensors.size());
  std::vector<size_t> header_ends;
  for (const auto& t : message.tensors) {
    if (t.shape.size() > kMaxTensorRank) {
      return InvalidArgument("tensor rank " + std::to_string(t.shape.size()) + " exceeds " +
                             std::to_string(kMaxTensorRank));
    }
    if (t.codec == 0) {
      auto n = TensorView::NumElements(t.shape);
      if (!n || *n * DTypeSize(t.dtype) != t.data.size()) {
        return InvalidArgument("raw " + std::string(DTypeName(t.dtype)) + " tensor has " +
                               std::to_string(t.data.size()) +
                               " bytes, which does not match its shape");
      }
    }
    w.U8(static_cast<uint8_t>(t.dtype));
    w.U8(t.codec);
    w.U8(static_cast<uint8_t>(t.shape.size()));
    for (int64_t d : t.shape) {
      if (d < 0) return InvalidArgument("negative tensor dimension");
      w.Varint(static_cast<uint64_t>(d));
    }
    w.Varint(t.data.size());
    header_ends.push_back(hdr.size());
  }
  em.header_bytes = std::move(hdr);
  const uint8_t* base = em.header_bytes.data();
  em.pieces.push_back(ByteSpan(base, meta_at));
  if (!message.meta.empty()) {
    em.pieces.push_back(
        ByteSpan(reinterpret_cast<const uint8_t*>(message.meta.data()), message.meta.size()));
  }
  size_t start = meta_at;
  size_t first_end = message.tensors.empty() ? em.header_bytes.size() : header_ends[0];
  em.pieces.push_back(ByteSpan(base + start, first_end - start));
  start = first_end;
  for (size_t i = 0; i < message.tensors.size(); ++i) {
    if (i > 0) {
      em.pieces.push_back(ByteSpan(base + start, header_ends[i] - start));
      start = header_ends[i];
    }
    if (!message.tensors[i].data.empty()) em.pieces.push_back(message.tensors[i].data);
  }
  for (auto p : em.pieces) em.total += p.size();
  return em;
}

Result<Message> DecodeMessage(ByteSpan bytes, std::shared_ptr<const void> owner) {
  auto bad = [](const std::string& why) { return ProtocolError("malformed message: " + why); };
  ByteReader in(bytes);
  Message m;
  uint64_t meta_len = in.Varint();
  if (!in.ok()) return bad("truncated meta length");
  if (meta_len > in.remaining())
    return bad("meta length " + std::to_string(meta_len) + " runs past the end");
  m.meta.assign(AsStringView(in.Raw(meta_len)));
  uint64_t count = in.Varint();
  if (!in.ok()) return bad("truncated tensor count");
  if (count > kMaxTensorsPerMessage)
    return bad("tensor count " + std::to_string(count) + " exceeds limit");
  // Each tensor header takes at least 4 bytes: reject counts the remaining bytes cannot hold
  // before reserving anything.
  if (count * 4 > in.remaining())
    return bad("tensor count " + std::to_string(count) + " exceeds the message");
  m.tensors.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    TensorFrame t;
    uint8_t dtype = in.U8();
    t.codec = in.U8();
    uint8_t rank = in.U8();
    if (!in.ok()) return bad("truncated tensor header");
    auto dt = DTypeFromWire(dtype);
    if (!dt)
      return bad("unknown dtype " + std::to_string(dtype) + " in tensor " + std::to_string(i));
    t.dtype = *dt;
    if (rank > kMaxTensorRank)
      return bad("tensor rank " + std::to_string(rank) + " exceeds " +
                 std::to_string(kMaxTensorRank));
    t.shape.resize(rank);
    for (auto& d : t.shape) {
      uint64_t v = in.Varint();
      if (v > static_cast<uint64_t>(INT64_MAX)) return bad("tensor dimension out of range");
      d = static_cast<int64_t>(v);
    }
    uint64_t nbytes = in.Varint();
    if (!in.ok()) return bad("truncated tensor header");
    if (nbytes > in.remaining()) {
      return bad("tensor " + std::to_string(i) + " claims " + std::to_string(nbytes) +
                 " bytes but only " + std::to_string(in.remaining()) + " remain");
    }
    if (t.codec == 0) {
      auto n = TensorView::NumElements(t.shape);
      if (!n || *n > nbytes || *n * DTypeSize(t.dtype) != nbytes) {
        return bad("raw tensor " + std::to_string(i) + " has " + std::to_string(nbytes) +
                   " bytes, inconsistent with its shape and dtype");
      }
    }
    t.data = in.Raw(nbytes);
    t.owner = owner;
    m.tensors.push_back(std::move(t));
  }
  if (in.remaining() != 0) return bad(std::to_string(in.remaining()) + " trailing bytes");
  return m;
}

Bytes EncodeStatus(const Status& status) {
  proto::CallStatus s;
  s.set_code(static_cast<uint32_t>(status.code()));
  // Keep messages bounded; they are for humans. The field is a protobuf string, which the peer
  // refuses to parse unless it is valid UTF-8: a message with stray bytes, or one cut inside a
  // character, would reach the peer as an undecodable status and lose its code.
  s.set_message(ValidUtf8Prefix(status.message(), 4000));
  Bytes out(s.ByteSizeLong());
  s.SerializeToArray(out.data(), static_cast<int>(out.size()));
  return out;
}

Status DecodeStatus(ByteSpan payload) {
  proto::CallStatus s;
  if (!s.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return ProtocolError("peer sent an undecodable status");
  }
  if (s.code() == 0) return Status::Ok();
  if (s.code() > static_cast<uint32_t>(StatusCode::kProtocolError)) {
    return {StatusCode::kUnknown, s.message()};
  }
  return {static_cast<StatusCode>(s.code()), s.message()};
}

}  // namespace colony::net
