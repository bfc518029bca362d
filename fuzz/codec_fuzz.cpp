// Fuzz target for the compression codecs, whose decoder reads tensors sent by remote peers.
//  - PeekHeader and Decode never crash on any bytes; when Decode accepts an encoding, the header
//    agrees with it, and every codec that DecodesFinite() (all but none, fp16, bf16, scaled-fp16
//    and topk, which carry values as they are) produces finite values; when it refuses one, it
//    wrote nothing into its output. MaxAbsBound, when set, is finite and bounds every value.
//    DecodeAddScaled accepts exactly what Decode accepts, adds exactly what Decode wrote, and
//    leaves its sum unchanged when it refuses. Decoding with Writes::kPastCaches accepts the same
//    encodings and writes the same bytes.
//  - Encoding the input bytes read as floats, with a codec chosen by the first byte, always decodes
//    again to the same number of values; finite inputs stay finite.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "compression/codec.h"

using colony::Bytes;
using colony::ByteSpan;
using namespace colony::compression;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ByteSpan in(data, size);
  auto info = PeekHeader(in);
  if (info.ok() && info->count <= (1u << 20)) {
    constexpr float kUntouched = -12345.0f;
    std::vector<float> out(static_cast<size_t>(info->count), kUntouched);
    colony::Status st = Decode(in, out);
    if (st.ok() && DecodesFinite(info->codec)) {
      for (float v : out)
        if (!std::isfinite(v)) __builtin_trap();
    }
    // A block-scale bound, when there is one, is finite and bounds every decoded value.
    if (const std::optional<float> bound = MaxAbsBound(in); st.ok() && bound) {
      if (!std::isfinite(*bound)) __builtin_trap();
      for (float v : out)
        if (std::fabs(v) > *bound) __builtin_trap();
    }
    if (!st.ok()) {
      for (float v : out)
        if (v != kUntouched) __builtin_trap();
    }
    // Writing past the caches accepts the same encodings and writes the same bytes.
    std::vector<float> past(out.size(), kUntouched);
    const colony::Status past_st = Decode(in, past, 0, Writes::kPastCaches);
    if (past_st.ok() != st.ok()) __builtin_trap();
    if (!out.empty() && std::memcmp(past.data(), out.data(), out.size() * sizeof(float)) != 0)
      __builtin_trap();
    // A count that differs from the output span is always refused.
    std::vector<float> wrong(out.size() + 1);
    if (Decode(in, wrong).ok()) __builtin_trap();
    // The fused decode-and-add agrees with decoding first and adding after, bit for bit.
    constexpr float kWeight = 0.75f;
    std::vector<float> acc(out.size());
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = static_cast<float>(i % 7) - 3.0f;
    const std::vector<float> before = acc;
    const colony::Status added = DecodeAddScaled(in, acc, kWeight);
    if (added.ok() != st.ok()) __builtin_trap();
    for (size_t i = 0; i < acc.size(); ++i) {
      const float expect = st.ok() ? before[i] + kWeight * out[i] : before[i];
      if (std::memcmp(&acc[i], &expect, sizeof(float)) != 0 &&
          !(std::isnan(acc[i]) && std::isnan(expect)))
        __builtin_trap();
    }
  }

  if (size == 0) return 0;
  const auto codec = static_cast<Codec>(data[0] % (kMaxCodecId + 1));
  std::vector<float> values((size - 1) / sizeof(float));
  if (!values.empty()) std::memcpy(values.data(), data + 1, values.size() * sizeof(float));
  bool finite = true;
  for (float v : values) finite = finite && std::isfinite(v);
  CodecOptions options;
  options.block_size = 16 + (size > 1 ? data[1] % 48 : 0);  // odd sizes too
  options.topk_fraction = size > 2 ? (1 + data[2] % 100) / 100.0 : 0.01;
  Bytes enc;
  if (!Encode(codec, values, enc, options).ok()) __builtin_trap();
  if (enc.size() > MaxEncodedSize(codec, values.size(), options)) __builtin_trap();
  std::vector<float> back(values.size());
  if (!Decode(enc, back).ok()) __builtin_trap();
  // Saturating codecs keep finite inputs finite (topk copies values as they are).
  if (finite) {
    for (float v : back)
      if (!std::isfinite(v)) __builtin_trap();
  }
  return 0;
}
