// Compression codecs for float32 buffers: what averaging sends over slow links.
//
// Every codec turns a span of float32 values into a self-describing byte string and back:
//
//   Bytes enc;
//   compression::Encode(Codec::kBlockwise8, values, enc);          // appends to enc
//   std::vector<float> back(values.size());
//   Status st = compression::Decode(enc, back);                   // validates everything
//
// The encoded form starts with a small header (codec id, element count, codec parameters), so a
// decoder needs nothing but the bytes and the number of elements the caller expects. Decode()
// treats its input as hostile: a wrong codec id, an element count that differs from the output
// span, truncated or trailing bytes, block counts that do not add up, a top-k index out of range
// or repeated, non-finite scales — all yield InvalidArgument/DataLoss naming the problem, never a
// crash or an out-of-bounds access.
//
// Depends on core only (no LibTorch). Thread-safe: all functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "core/bytes.h"
#include "core/status.h"

namespace colony::compression {

// The numeric values are part of the wire format (they travel in TensorFrame::codec): never
// renumber. 0 is "raw float32" everywhere in Colony.
enum class Codec : uint8_t {
  kNone = 0,           // raw little-endian float32 (4 bytes/value)
  kFloat16 = 1,        // IEEE half precision, round to nearest even, saturating (2 bytes/value)
  kBFloat16 = 2,       // bfloat16, round to nearest even, saturating (2 bytes/value)
  kScaledFloat16 = 3,  // (x - mean) / std stored as float16, mean and std as float32
  kUniform8 = 4,       // 8-bit uniform quantization over [mean - r, mean + r], r = k * std
  kQuantile8 = 5,      // 8-bit, 256 buckets at the data's quantiles (codebook of 256 floats)
  kBlockwise8 = 6,     // 8-bit, absmax scale per block of `block_size` values
  kBlockwise4 = 7,     // 4-bit, absmax scale per block (two values per byte)
  kTopK = 8,           // the k largest-magnitude values with their indices; the rest are 0
};

inline constexpr uint8_t kMaxCodecId = 8;

std::string_view CodecName(Codec codec);
// Parses "none", "fp16", "bf16", "scaled-fp16", "uniform8", "quantile8", "blockwise8",
// "blockwise4", "topk" (as on the command line).
Result<Codec> ParseCodec(std::string_view name);
// Validates a codec id read from untrusted input.
std::optional<Codec> CodecFromWire(uint8_t value);
// Whether Decode() of this codec yields only finite values, whatever the (hostile) input: its
// decoder saturates or checks what it reads. False for the codecs that carry raw floats or
// pass non-finite inputs through.
bool DecodesFinite(Codec codec);

struct CodecOptions {
  // Blockwise codecs: values per block (each block stores one float32 absmax scale).
  // Must be in [16, 1 << 20]; encoded into the output so the decoder needs no options.
  uint32_t block_size = 4096;
  // Top-k: fraction of values kept (at least one value is kept for non-empty input).
  // Must be in (0, 1].
  double topk_fraction = 0.01;
  // Threads for inputs of at least 1M values (OpenMP): 0 = OpenMP's default (all cores),
  // 1 = the calling thread only. Smaller inputs always run on the calling thread.
  int max_threads = 0;
};

// Appends what Encode() writes before a codec's payload: its id, the element count and, for the
// blockwise codecs, the block size (checked as Encode checks it). An encoder of the payload
// elsewhere (on a GPU: runtime/device_codec.h) appends it after these, in Encode's layout:
//   fp16, bf16:  `count` 16-bit values, little-endian;
//   blockwise8:  one float32 scale per block (little-endian), then `count` int8 codes.
Status AppendHeader(Codec codec, size_t count, const CodecOptions& options, Bytes& out);

// Appends the encoding of `values` to `out`. Non-finite inputs are encoded best-effort (callers
// that must reject them check first). Errors only for invalid options.
Status Encode(Codec codec, std::span<const float> values, Bytes& out,
              const CodecOptions& options = {});

// An upper bound of the bytes Encode() appends for `count` values (to reserve buffers).
size_t MaxEncodedSize(Codec codec, size_t count, const CodecOptions& options = {});

// Decodes `encoded` (one complete output of Encode) into `out`, whose size must equal the
// encoded element count. On success every value of `out` is written (it need not be
// initialized first); on error nothing is: everything is checked before the first write.
Status Decode(ByteSpan encoded, std::span<float> out);
// The same with a thread limit (see CodecOptions::max_threads).
Status Decode(ByteSpan encoded, std::span<float> out, int max_threads);

// Where Decode() writes. kPastCaches is for an output that is not read again soon (a part of a
// large tensor receiving an all-reduce result): uncompressed and blockwise8 values are then
// written with non-temporal stores (core/stream_store.h), which skip reading every destination
// cache line first and leave the caches to hotter data. The same values either way.
enum class Writes { kCached, kPastCaches };
Status Decode(ByteSpan encoded, std::span<float> out, int max_threads, Writes writes);

// Adds w * (each value Decode() would write) to `acc`, whose size must equal the encoded element
// count: the same float operations as decoding into a buffer and adding it after, with the same
// checks, all made before the first write (on error `acc` is unchanged). Runs on the calling
// thread. Blockwise codecs decode and add in one pass (DecodesAddInOnePass); the others decode
// into a buffer first.
Status DecodeAddScaled(ByteSpan encoded, std::span<float> acc, float w);
bool DecodesAddInOnePass(Codec codec);

// An upper bound of |v| over the values a successful Decode() of `encoded` writes, read from the
// block scales of the codecs that carry them (blockwise8, blockwise4: a decoded value is at most
// its block's scale / levels * levels, computed as the decoder computes it) without touching the
// values; for an honest encoder, whose blocks each hold their scale, it equals the largest
// decoded magnitude. nullopt for the other codecs and for a header or scales that Decode()
// refuses. Finite whenever set.
std::optional<float> MaxAbsBound(ByteSpan encoded);

// Reads only the header: the codec and the number of values `encoded` holds.
struct EncodedInfo {
  Codec codec = Codec::kNone;
  uint64_t count = 0;
};
Result<EncodedInfo> PeekHeader(ByteSpan encoded);

// The scalar conversions behind kFloat16 and kBFloat16 (exposed for tests and other modules).
// FloatToHalf rounds to nearest even; finite values beyond the half range saturate to +-65504
// (averaging must not turn a large finite gradient into inf); +-inf stay infinite; NaN stays NaN
// (quiet, sign kept). FloatToBFloat16 rounds to nearest even and saturates finite values to
// +-bf16 max the same way. Both conversions back are exact.
uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t half);
uint16_t FloatToBFloat16(float value);
float BFloat16ToFloat(uint16_t bf16);

// What a tensor is, for choosing a codec by role.
enum class TensorRole : uint8_t { kGradient = 0, kParameter = 1, kOptimizerState = 2 };

// Chooses a codec per tensor: tensors with fewer than `size_threshold` values use `small`
// (compressing tiny tensors saves nothing and loses precision); larger ones use the codec of
// their role.
struct CompressionPolicy {
  Codec small = Codec::kNone;
  size_t size_threshold = 1 << 16;
  Codec gradients = Codec::kNone;
  Codec parameters = Codec::kNone;
  Codec optimizer_state = Codec::kNone;
  CodecOptions options;

  // The same codec for every tensor of at least `size_threshold` values.
  static CompressionPolicy Uniform(Codec codec) {
    CompressionPolicy p;
    p.gradients = p.parameters = p.optimizer_state = codec;
    return p;
  }
  Codec Choose(size_t count, TensorRole role) const;
};

}  // namespace colony::compression
