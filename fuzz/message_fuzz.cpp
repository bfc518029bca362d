// Fuzz target for DecodeMessage, which parses every RPC message a peer sends (tensor headers
// included). Checks that it never reads outside the input, that tensor views lie inside it, and
// that whatever it accepts re-encodes with EncodeMessage to exactly the input bytes.
//
// One allowance: ByteReader::Varint accepts non-minimal varints (e.g. 0x80 0x00 for 0), which
// EncodeMessage never writes. Such an input re-encodes to fewer bytes; then the re-encoding must
// itself be a fixed point (decode -> encode reproduces it exactly, and describes the same message).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "net/wire.h"

using colony::Bytes;
using colony::ByteSpan;
using namespace colony::net;

namespace {

Bytes Concat(const EncodedMessage& em) {
  Bytes out;
  for (ByteSpan p : em.pieces) out.insert(out.end(), p.begin(), p.end());
  if (out.size() != em.total) __builtin_trap();
  return out;
}

bool SameMessage(const Message& a, const Message& b) {
  if (a.meta != b.meta || a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const TensorFrame& x = a.tensors[i];
    const TensorFrame& y = b.tensors[i];
    if (x.dtype != y.dtype || x.codec != y.codec || x.shape != y.shape ||
        x.data.size() != y.data.size() ||
        (!x.data.empty() && std::memcmp(x.data.data(), y.data.data(), x.data.size()) != 0)) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto m = DecodeMessage(ByteSpan(data, size), nullptr);
  if (!m.ok()) {
    if (m.status().message().empty()) __builtin_trap();
    return 0;
  }
  if (m->tensors.size() > kMaxTensorsPerMessage) __builtin_trap();
  for (const TensorFrame& t : m->tensors) {
    const uint8_t* p = t.data.data();
    if (!t.data.empty() &&
        (p < data || p > data + size || t.data.size() > static_cast<size_t>(data + size - p))) {
      __builtin_trap();
    }
    if (t.shape.size() > colony::kMaxTensorRank) __builtin_trap();
  }

  auto enc = EncodeMessage(*m);
  if (!enc.ok()) __builtin_trap();  // anything we accept can be sent on
  Bytes out = Concat(*enc);
  if (out.size() == size) {
    if (size > 0 && std::memcmp(out.data(), data, size) != 0) __builtin_trap();
    return 0;
  }
  // Only non-minimal varints make the input longer than its re-encoding.
  if (out.size() > size) __builtin_trap();
  auto again = DecodeMessage(out, nullptr);
  if (!again.ok() || !SameMessage(*m, *again)) __builtin_trap();
  auto enc2 = EncodeMessage(*again);
  if (!enc2.ok() || Concat(*enc2) != out) __builtin_trap();
  return 0;
}
