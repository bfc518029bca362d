// Fuzz target for the frame layer: SplitFrames and DecodeFrameHeader read every decrypted record a
// peer sends. Checks that they never read outside the record, that SplitFrames accepts exactly
// what a DecodeFrameHeader loop accepts, that accepted frames tile the record, and that accepted
// headers survive EncodeFrameHeader.
#include <cstddef>
#include <cstdint>

#include "net/wire.h"

using colony::ByteReader;
using colony::Bytes;
using colony::ByteSpan;
using namespace colony::net;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteSpan in(data, size);
  const uint8_t* const end = data + size;

  auto frames = SplitFrames(in);
  if (frames.ok()) {
    const uint8_t* at = data;  // frames follow each other with nothing in between
    for (const FrameView& f : *frames) {
      if (f.payload.size() != f.header.payload_length) __builtin_trap();
      if (f.payload.size() > kMaxRecordPlaintext) __builtin_trap();
      const uint8_t* p = f.payload.data();
      if (p < at || p > end || f.payload.size() > static_cast<size_t>(end - p)) __builtin_trap();
      if (p - at < 4 || p - at > static_cast<ptrdiff_t>(kMaxFrameHeader)) __builtin_trap();
      at = p + f.payload.size();
      const auto type = static_cast<uint8_t>(f.header.type);
      if (type < 1 || type > 9) __builtin_trap();
      if (f.header.type == FrameType::kToken && (f.header.stream_id != 0 || f.header.flags != 0 ||
                                                 f.header.payload_length > kMaxTokenFrame)) {
        __builtin_trap();
      }
      if (f.header.type == FrameType::kData && f.header.stream_id == 0) __builtin_trap();

      // The header re-encodes to bytes that decode to the same header.
      Bytes enc;
      EncodeFrameHeader(f.header, enc);
      const size_t header_size = enc.size();
      enc.insert(enc.end(), f.payload.begin(), f.payload.end());
      ByteReader r(enc);
      auto again = DecodeFrameHeader(r);
      if (!again.ok() || again->type != f.header.type || again->flags != f.header.flags ||
          again->stream_id != f.header.stream_id ||
          again->payload_length != f.header.payload_length || r.position() != header_size ||
          r.remaining() != f.payload.size()) {
        __builtin_trap();
      }
    }
    if (at != end) __builtin_trap();
  } else if (frames.status().message().empty()) {
    __builtin_trap();
  }

  // The same record through DecodeFrameHeader by hand.
  ByteReader r(in);
  bool clean = true;
  while (r.remaining() > 0) {
    const size_t before = r.remaining();
    auto h = DecodeFrameHeader(r);
    if (!h.ok()) {
      if (h.status().message().empty()) __builtin_trap();
      clean = false;
      break;
    }
    if (h->payload_length > r.remaining()) __builtin_trap();  // promised to be present
    ByteSpan payload = r.Raw(h->payload_length);
    if (!r.ok() || payload.size() != h->payload_length) __builtin_trap();
    if (r.remaining() >= before) __builtin_trap();  // always makes progress
  }
  if (clean != frames.ok()) __builtin_trap();
  return 0;
}
