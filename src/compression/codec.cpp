// Compression codecs: encoders, hostile-input decoders and the kernels behind them.
//
// Layout of every encoding (all integers and floats little-endian, written field by field):
//
//   u8 codec id | varint count | codec parameters | payload
//
//   none          payload: count x f32
//   fp16, bf16    payload: count x u16
//   scaled-fp16   f32 mean, f32 std        payload: count x u16 (fp16 of (x - mean) / std)
//   uniform8      f32 mean, f32 radius     payload: count x u8, level q -> mean + (q - 127.5) *
//                                          radius / 127.5
//   quantile8     256 x f32 codebook       payload: count x u8 (index into the codebook)
//   blockwise8    u32 block size           payload: ceil(count / bs) x f32 absmax scales, then
//                                          count x i8 in [-127, 127] (q -> q * scale / 127)
//   blockwise4    u32 block size           payload: scales as above, then ceil(count / 2) bytes:
//                                          value i in the low nibble of byte i / 2 when i is even,
//                                          the high one when odd; code c in [1, 15] means
//                                          (c - 8) * scale / 7; an odd count pads with nibble 0
//   topk          varint k                 payload: k x f32 values, then k varint index deltas
//                                          (the first is the index itself; later ones are >= 1)
//
// Encoders never emit non-finite parameters (scales, means, codebooks are computed over the finite
// inputs only), so every encoding decodes; decoders reject non-finite parameters, codes the
// encoder never writes, and any length that differs from the one the header implies. Except for
// the codecs that carry values as they are (none, fp16, bf16, scaled-fp16, topk: inf and NaN
// travel), decoded values are always finite.
//
// Kernels are branch-free loops (`#pragma omp simd`, explicit accumulators for reductions), built
// for SSE2 and AVX2 with runtime dispatch on x86-64; blockwise codecs read each block once (its
// absmax and its codes while it is in cache). Inputs of at least kParallelMin values are split into
// fixed chunks run by OpenMP threads; chunking does not depend on the thread count, so encodings
// are byte-identical however many threads ran (statistics are merged in chunk order).
#include "compression/codec.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/simd.h"
#include "core/stream_store.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace colony::compression {

namespace {

// Below kParallelMin values, threads cost more than they save.
[[maybe_unused]] constexpr size_t kParallelMin = size_t{1} << 20;
constexpr size_t kChunk = size_t{1} << 16;  // values per parallel work item
constexpr size_t kTile = 1024;              // values per kernel tile (stays in L1)
constexpr uint32_t kMinBlock = 16;
constexpr uint32_t kMaxBlock = 1u << 20;
// uniform8 covers mean +- 4 std: on Gaussian data this balances rounding error (step 8 std / 255)
// against clipping of the tails (MSE ~9e-5 vs ~5e-4 for hivemind's +-3 std).
constexpr float kUniformSigmas = 4.0f;
constexpr size_t kQuantileSample = size_t{1} << 16;
constexpr int kLloydIterations = 100;
constexpr size_t kCodebookSize = 256;

constexpr bool kLittleEndian = std::endian::native == std::endian::little;

// ---- byte-order helpers for bulk arrays -------------------------------------------------------

void StoreU16(uint8_t* dst, const uint16_t* src, size_t n) {
  if (n == 0) return;  // memcpy must not see the null pointer of an empty span
  if constexpr (kLittleEndian) {
    std::memcpy(dst, src, n * 2);
  } else {
    for (size_t i = 0; i < n; ++i) {
      dst[2 * i] = static_cast<uint8_t>(src[i]);
      dst[2 * i + 1] = static_cast<uint8_t>(src[i] >> 8);
    }
  }
}
void LoadU16(uint16_t* dst, const uint8_t* src, size_t n) {
  if (n == 0) return;  // memcpy must not see the null pointer of an empty span
  if constexpr (kLittleEndian) {
    std::memcpy(dst, src, n * 2);
  } else {
    for (size_t i = 0; i < n; ++i)
      dst[i] = static_cast<uint16_t>(src[2 * i] | (src[2 * i + 1] << 8));
  }
}
void StoreF32(uint8_t* dst, const float* src, size_t n) {
  if (n == 0) return;  // memcpy must not see the null pointer of an empty span
  if constexpr (kLittleEndian) {
    std::memcpy(dst, src, n * 4);
  } else {
    for (size_t i = 0; i < n; ++i) {
      uint32_t u = std::bit_cast<uint32_t>(src[i]);
      for (int b = 0; b < 4; ++b) dst[4 * i + b] = static_cast<uint8_t>(u >> (8 * b));
    }
  }
}
void LoadF32(float* dst, const uint8_t* src, size_t n) {
  if (n == 0) return;  // memcpy must not see the null pointer of an empty span
  if constexpr (kLittleEndian) {
    std::memcpy(dst, src, n * 4);
  } else {
    for (size_t i = 0; i < n; ++i) {
      uint32_t u = 0;
      for (int b = 0; b < 4; ++b) u |= static_cast<uint32_t>(src[4 * i + b]) << (8 * b);
      dst[i] = std::bit_cast<float>(u);
    }
  }
}
float LoadOneF32(const uint8_t* src) {
  float f;
  LoadF32(&f, src, 1);
  return f;
}

void PutF32(ByteWriter& w, float f) { w.U32(std::bit_cast<uint32_t>(f)); }
float GetF32(ByteReader& r) { return std::bit_cast<float>(r.U32()); }

// ---- scalar conversions (inlined into the kernels) --------------------------------------------

// Branch-free float -> half, round to nearest even (after F. Giesen's float_to_half_fast3_rtne).
inline uint16_t ToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  // Normal range: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
  // Wraps for a < 2^-14 (not selected then); results past 0x7bff (65504) saturate.
  uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  normal = normal < 0x7bffu ? normal : 0x7bffu;
  // Subnormal range: adding 0.5f aligns the value so that the FPU's rounding (to nearest even)
  // drops exactly the bits half precision cannot hold.
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(a) + 0.5f) - 0x3f000000u;
  const uint32_t special = a > 0x7f800000u ? 0x7e00u : 0x7c00u;  // NaN -> quiet NaN, inf -> inf
  uint32_t r = a < 0x38800000u ? sub : normal;
  r = a >= 0x7f800000u ? special : r;
  return static_cast<uint16_t>(r | sign);
}

// Branch-free half -> float (exact).
inline float FromHalf(uint16_t h) {
  const uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = em & 0x0f800000u;
  const uint32_t normal = em + 0x38000000u;  // rebias 15 -> 127
  const uint32_t infnan = em + 0x70000000u;  // exponent 31 -> 255
  // Subnormal: the mantissa becomes a normal float with exponent 2^-14, minus the implicit 1.
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(em + 0x38800000u) - 0x1p-14f);
  uint32_t r = exp == 0x0f800000u ? infnan : normal;
  r = exp == 0 ? sub : r;
  return std::bit_cast<float>(r | sign);
}

inline uint16_t ToBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t a = x & 0x7fffffffu;
  uint32_t rounded = (a + 0x7fffu + ((a >> 16) & 1u)) >> 16;
  rounded = rounded < 0x7f7fu ? rounded : 0x7f7fu;  // finite values saturate to bf16 max
  uint32_t r = a == 0x7f800000u ? 0x7f80u : rounded;
  r = a > 0x7f800000u ? ((a >> 16) | 0x40u) : r;  // NaN: keep the top payload bits, set quiet
  return static_cast<uint16_t>(r | ((x >> 16) & 0x8000u));
}

inline float FromBf16(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// |x| for finite x, 0 for inf and NaN: the statistics encoders use ignore non-finite inputs.
inline float FiniteAbs(float x) {
  const float a = std::fabs(x);
  return a <= FLT_MAX ? a : 0.0f;
}
inline bool IsFinite(float x) { return std::fabs(x) <= FLT_MAX; }

// Maps v to [lo, hi], NaN to `nan_to`; branch-free.
inline float Clamp(float v, float lo, float hi, float nan_to) {
  v = v == v ? v : nan_to;
  v = v > lo ? v : lo;
  return v < hi ? v : hi;
}

// Clamps to the finite range (NaN -> FLT_MAX): decoded values stay finite even when hostile but
// finite parameters (a huge mean plus a huge radius) would overflow.
inline float SaturateFinite(float v) {
  v = v < FLT_MAX ? v : FLT_MAX;
  return v > -FLT_MAX ? v : -FLT_MAX;
}

// Multiplier that maps [-range, range] to [-levels, levels] without overflowing to inf for tiny
// ranges: values are pre-multiplied by `pre` (2^64 when the range is below 2^-60).
struct Scaler {
  float pre = 1.0f;
  float inv = 0.0f;
};
Scaler MakeScaler(float range, float levels) {
  Scaler s;
  if (!(range > 0.0f)) return s;  // all-zero (or empty) data: everything maps to level 0
  s.pre = range < 0x1p-60f ? 0x1p64f : 1.0f;
  s.inv = levels / (range * s.pre);
  return s;
}

// ---- parallel chunking ------------------------------------------------------------------------

// Calls fn(chunk_index, begin, end) for consecutive ranges of `chunk` items covering [0, n),
// on OpenMP threads when n is large and threads are allowed.
template <typename F>
void ForChunks(size_t n, size_t chunk, size_t parallel_items, int max_threads, const F& fn) {
  const size_t chunks = (n + chunk - 1) / chunk;
#ifdef _OPENMP
  if (parallel_items >= kParallelMin && max_threads != 1 && chunks > 1) {
    const int threads = max_threads > 0 ? max_threads : omp_get_max_threads();
    const auto count = static_cast<std::ptrdiff_t>(chunks);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (std::ptrdiff_t c = 0; c < count; ++c) {
      const auto cu = static_cast<size_t>(c);
      fn(cu, cu * chunk, std::min(n, (cu + 1) * chunk));
    }
    return;
  }
#else
  (void)parallel_items;
  (void)max_threads;
#endif
  for (size_t c = 0; c < chunks; ++c) fn(c, c * chunk, std::min(n, (c + 1) * chunk));
}

// ---- kernels ----------------------------------------------------------------------------------
// Plain loops over [0, m) taking their parameters by value and their arrays as restrict
// pointers, so that the vectorizer sees no aliasing and no control flow. Reductions keep kLanes
// explicit accumulators instead of `omp simd reduction`, which g++ 12 keeps in memory (a store
// and reload per iteration) at -O2.

constexpr size_t kLanes = 16;

// Each kernel is also compiled for AVX2 (COLONY_KERNEL, core/simd.h), so none is a template.
COLONY_KERNEL void KToHalf(const float* __restrict p, size_t m, uint16_t* __restrict t) {
#pragma omp simd
  for (size_t j = 0; j < m; ++j) t[j] = ToHalf(p[j]);
}
COLONY_KERNEL void KToBf16(const float* __restrict p, size_t m, uint16_t* __restrict t) {
#pragma omp simd
  for (size_t j = 0; j < m; ++j) t[j] = ToBf16(p[j]);
}
COLONY_KERNEL void KFromHalf(const uint16_t* __restrict t, size_t m, float* __restrict o) {
#pragma omp simd
  for (size_t j = 0; j < m; ++j) o[j] = FromHalf(t[j]);
}
COLONY_KERNEL void KFromBf16(const uint16_t* __restrict t, size_t m, float* __restrict o) {
#pragma omp simd
  for (size_t j = 0; j < m; ++j) o[j] = FromBf16(t[j]);
}
COLONY_KERNEL void KScaledToHalf(const float* __restrict p, size_t m, float mean, float pre,
                                 float inv, uint16_t* __restrict t) {
#pragma omp simd
  for (size_t j = 0; j < m; ++j) {
    // x - mean can overflow for finite values near FLT_MAX: saturate those (ToHalf saturates
    // them further) so that finite inputs never encode as inf.
    const float v = ((p[j] - mean) * pre) * inv;
    t[j] = ToHalf(IsFinite(p[j]) ? SaturateFinite(v) : v);
  }
}
COLONY_KERNEL void KScaledFromHalf(const uint16_t* __restrict t, size_t m, float mean, float sd,
                                   float* __restrict o) {
#pragma omp simd
  for (size_t j = 0; j < m; ++j) {
    // Finite halves decode to finite values; inf and NaN (sent as such) pass through.
    const float h = FromHalf(t[j]);
    const float v = SaturateFinite(h * sd + mean);
    o[j] = IsFinite(h) ? v : h;
  }
}
COLONY_KERNEL void KUniform8(const float* __restrict p, size_t m, float mean, float pre, float inv,
                             uint8_t* __restrict q) {
#pragma omp simd
  for (size_t j = 0; j < m; ++j) {
    const float v = Clamp(((p[j] - mean) * pre) * inv + 127.5f, 0.0f, 255.0f, 127.5f);
    q[j] = static_cast<uint8_t>(static_cast<int>(v + 0.5f));
  }
}
COLONY_KERNEL void KFromUniform8(const uint8_t* __restrict q, size_t m, float mean, float step,
                                 float* __restrict o) {
#pragma omp simd
  for (size_t j = 0; j < m; ++j)
    o[j] = SaturateFinite(mean + (static_cast<float>(q[j]) - 127.5f) * step);
}
COLONY_KERNEL float KAbsMax(const float* __restrict p, size_t m) {
  float acc[kLanes] = {};
  size_t j = 0;
  for (; j + kLanes <= m; j += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) {
      const float a = FiniteAbs(p[j + k]);
      acc[k] = acc[k] > a ? acc[k] : a;
    }
  }
  for (size_t k = 0; j < m; ++j, ++k) {
    const float a = FiniteAbs(p[j]);
    acc[k] = acc[k] > a ? acc[k] : a;
  }
  float mx = 0.0f;
  for (float a : acc) mx = mx > a ? mx : a;
  return mx;
}
// q in [-levels, levels] (NaN -> 0, +-inf -> +-levels), rounded to nearest even. Adding 1.5 * 2^23
// leaves the rounded integer in the low mantissa bits (two's complement relative to the magic
// constant's bits), which saves a float -> int conversion per value.
inline int QuantizeSymmetric(float v, float pre, float inv, float levels) {
  const float u = Clamp((v * pre) * inv, -levels, levels, 0.0f) + 12582912.0f;
  return static_cast<int>(std::bit_cast<uint32_t>(u) - 0x4b400000u);
}
COLONY_KERNEL void KBlockwise8(const float* __restrict p, size_t m, float pre, float inv,
                               uint8_t* __restrict q) {
#pragma omp simd
  for (size_t j = 0; j < m; ++j)
    q[j] = static_cast<uint8_t>(QuantizeSymmetric(p[j], pre, inv, 127.0f) & 0xff);
}
// Blocks of finite values (their absmax bits below 0x7f800000, KAbsMaxBits) need neither the
// finite-only absmax nor the clamp: |v * pre * inv| stays within a few ulps of 127, which rounds
// as the clamped value does. The same codes as KAbsMax and KBlockwise8.
COLONY_KERNEL uint32_t KAbsMaxBits(const float* __restrict p, size_t m) {
  uint32_t acc[kLanes] = {};
  size_t j = 0;
  for (; j + kLanes <= m; j += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) {
      const uint32_t a = std::bit_cast<uint32_t>(p[j + k]) & 0x7fffffffu;
      acc[k] = acc[k] > a ? acc[k] : a;
    }
  }
  for (size_t k = 0; j < m; ++j, ++k) {
    const uint32_t a = std::bit_cast<uint32_t>(p[j]) & 0x7fffffffu;
    acc[k] = acc[k] > a ? acc[k] : a;
  }
  uint32_t most = 0;
  for (uint32_t a : acc) most = most > a ? most : a;
  return most;
}
COLONY_KERNEL void KFiniteBlockwise8(const float* __restrict p, size_t m, float pre, float inv,
                                     uint8_t* __restrict q) {
#pragma omp simd
  for (size_t j = 0; j < m; ++j) {
    const float u = (p[j] * pre) * inv + 12582912.0f;
    q[j] = static_cast<uint8_t>((std::bit_cast<uint32_t>(u) - 0x4b400000u) & 0xffu);
  }
}
inline uint8_t Code4(float v, float pre, float inv) {
  return static_cast<uint8_t>(QuantizeSymmetric(v, pre, inv, 7.0f) + 8);
}
COLONY_KERNEL void KBlockwise4(const float* __restrict p, size_t pairs, float pre, float inv,
                               uint8_t* __restrict q) {
#pragma omp simd
  for (size_t j = 0; j < pairs; ++j)
    q[j] = static_cast<uint8_t>(Code4(p[2 * j], pre, inv) | (Code4(p[2 * j + 1], pre, inv) << 4));
}
inline float Code8(uint8_t c) { return static_cast<float>(static_cast<int8_t>(c)); }
inline float FromCode8(uint8_t c, float step) { return SaturateFinite(Code8(c) * step); }
COLONY_KERNEL void KFromBlockwise8(const uint8_t* __restrict q, size_t m, float step,
                                   float* __restrict o) {
#pragma omp simd
  for (size_t j = 0; j < m; ++j) o[j] = FromCode8(q[j], step);
}
// Blocks whose largest value, 127 * step, is finite (every honest block): no product can
// overflow (rounding is monotonic), so the clamp, half of the loop's instructions, is left out.
// The same values as KFromBlockwise8 / KAddFromBlockwise8.
inline bool Blockwise8Finite(float step) { return 127.0f * step <= FLT_MAX; }
COLONY_KERNEL void KFromFiniteBlockwise8(const uint8_t* __restrict q, size_t m, float step,
                                         float* __restrict o) {
#pragma omp simd
  for (size_t j = 0; j < m; ++j) o[j] = Code8(q[j]) * step;
}
COLONY_KERNEL void KAddFromFiniteBlockwise8(const uint8_t* __restrict q, size_t m, float step,
                                            float w, float* __restrict a) {
#pragma omp simd
  for (size_t j = 0; j < m; ++j) a[j] += w * (Code8(q[j]) * step);
}
inline float FromCode4(unsigned nibble, float step) {
  return SaturateFinite(static_cast<float>(static_cast<int>(nibble) - 8) * step);
}
COLONY_KERNEL void KFromBlockwise4(const uint8_t* __restrict q, size_t pairs, float step,
                                   float* __restrict o) {
#pragma omp simd
  for (size_t j = 0; j < pairs; ++j) {
    o[2 * j] = FromCode4(q[j] & 0xfu, step);
    o[2 * j + 1] = FromCode4(q[j] >> 4, step);
  }
}
// The decoders above fused with a weighted sum: a += w * (the value the decoder writes), the
// same IEEE operations in the same order as decoding first and adding after.
COLONY_KERNEL void KAddFromBlockwise8(const uint8_t* __restrict q, size_t m, float step, float w,
                                      float* __restrict a) {
#pragma omp simd
  for (size_t j = 0; j < m; ++j) a[j] += w * FromCode8(q[j], step);
}
COLONY_KERNEL void KAddFromBlockwise4(const uint8_t* __restrict q, size_t pairs, float step,
                                      float w, float* __restrict a) {
#pragma omp simd
  for (size_t j = 0; j < pairs; ++j) {
    a[2 * j] += w * FromCode4(q[j] & 0xfu, step);
    a[2 * j + 1] += w * FromCode4(q[j] >> 4, step);
  }
}
// Codes the encoders never write, found before anything is decoded. Non-zero when one of the
// m 8-bit codes is -128.
COLONY_KERNEL unsigned KAnyCode8Outside(const uint8_t* __restrict q, size_t m) {
  uint8_t acc[kLanes] = {};
  size_t j = 0;
  for (; j + kLanes <= m; j += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) acc[k] = static_cast<uint8_t>(acc[k] | (q[j + k] == 0x80));
  }
  for (size_t k = 0; j < m; ++j, ++k) acc[k] = static_cast<uint8_t>(acc[k] | (q[j] == 0x80));
  unsigned flag = 0;
  for (uint8_t a : acc) flag |= a;
  return flag;
}
// Non-zero when one of the 2 x `bytes` 4-bit codes is 0.
COLONY_KERNEL unsigned KAnyCode4Outside(const uint8_t* __restrict q, size_t bytes) {
  uint8_t acc[kLanes] = {};
  size_t j = 0;
  for (; j + kLanes <= bytes; j += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) {
      acc[k] = static_cast<uint8_t>(acc[k] | ((q[j + k] & 0xf) == 0) | ((q[j + k] >> 4) == 0));
    }
  }
  for (size_t k = 0; j < bytes; ++j, ++k) {
    acc[k] = static_cast<uint8_t>(acc[k] | ((q[j] & 0xf) == 0) | ((q[j] >> 4) == 0));
  }
  unsigned flag = 0;
  for (uint8_t a : acc) flag |= a;
  return flag;
}

// ---- statistics -------------------------------------------------------------------------------

// Count, mean and sum of squared deviations (M2) of a set of values; merged with Chan's formula.
struct Moments {
  double n = 0, mean = 0, m2 = 0;
  void Merge(const Moments& o) {
    if (o.n == 0) return;
    const double total = n + o.n, delta = o.mean - mean;
    mean += delta * o.n / total;
    m2 += o.m2 + delta * delta * n * o.n / total;
    n = total;
  }
  double Std() const { return n > 0 ? std::sqrt(std::max(0.0, m2 / n)) : 0.0; }
};

// Moments of the finite values of one tile. Sums run in float on values shifted by the tile's
// first value (so that a large common offset does not swamp the squares); the tile is short
// enough that float sums lose nothing that matters for choosing a quantization range.
COLONY_KERNEL Moments KTileMoments(const float* __restrict p, size_t m) {
  const float x0 = IsFinite(p[0]) ? p[0] : 0.0f;
  // 8 lanes of 3 sums: 24 accumulators still fit AVX2's (and SSE2's) registers.
  constexpr size_t kMomentLanes = 8;
  float a1[kMomentLanes] = {}, a2[kMomentLanes] = {}, ac[kMomentLanes] = {};
  size_t j = 0;
  for (; j + kMomentLanes <= m; j += kMomentLanes) {
    for (size_t k = 0; k < kMomentLanes; ++k) {
      const float v = p[j + k];
      const float fin = IsFinite(v) ? 1.0f : 0.0f;
      const float d = IsFinite(v) ? v - x0 : 0.0f;
      a1[k] += d;
      a2[k] += d * d;
      ac[k] += fin;
    }
  }
  for (; j < m; ++j) {
    const float v = p[j];
    const float d = IsFinite(v) ? v - x0 : 0.0f;
    a1[0] += d;
    a2[0] += d * d;
    ac[0] += IsFinite(v) ? 1.0f : 0.0f;
  }
  float s1 = 0, s2 = 0, cnt = 0;
  for (size_t k = 0; k < kMomentLanes; ++k) {
    s1 += a1[k];
    s2 += a2[k];
    cnt += ac[k];
  }
  Moments t;
  if (cnt == 0) return t;
  t.n = cnt;
  const double mean_d = static_cast<double>(s1) / cnt;
  t.mean = x0 + mean_d;
  t.m2 = std::max(0.0, static_cast<double>(s2) - mean_d * static_cast<double>(s1));
  return t;
}

// Mean and (population) standard deviation of the finite values.
Moments ComputeMoments(std::span<const float> x, int max_threads) {
  const size_t chunks = (x.size() + kChunk - 1) / kChunk;
  std::vector<Moments> part(chunks);
  ForChunks(x.size(), kChunk, x.size(), max_threads, [&](size_t c, size_t b, size_t e) {
    Moments mo;
    for (size_t i = b; i < e; i += kTile)
      mo.Merge(KTileMoments(x.data() + i, std::min(kTile, e - i)));
    part[c] = mo;
  });
  Moments all;
  for (const auto& p : part) all.Merge(p);
  return all;
}

// Converts a double statistic to a finite float (saturating).
float FiniteFloat(double v) {
  if (!(std::fabs(v) <= static_cast<double>(FLT_MAX)))
    return v > 0 ? FLT_MAX : (v < 0 ? -FLT_MAX : 0);
  return static_cast<float>(v);
}

// ---- encoders ---------------------------------------------------------------------------------

// Grows `out` by `n` bytes and returns a pointer to them.
uint8_t* Extend(Bytes& out, size_t n) {
  const size_t at = out.size();
  out.resize(at + n);
  return out.data() + at;
}

void EncodeNone(std::span<const float> x, Bytes& out) {
  StoreF32(Extend(out, x.size() * 4), x.data(), x.size());
}

using To16Kernel = void (*)(const float*, size_t, uint16_t*);
using From16Kernel = void (*)(const uint16_t*, size_t, float*);

void Encode16(To16Kernel kernel, std::span<const float> x, uint8_t* dst, int max_threads) {
  ForChunks(x.size(), kChunk, x.size(), max_threads, [&](size_t, size_t b, size_t e) {
    alignas(64) uint16_t t[kTile];
    for (size_t i = b; i < e; i += kTile) {
      const size_t m = std::min(kTile, e - i);
      kernel(x.data() + i, m, t);
      StoreU16(dst + 2 * i, t, m);
    }
  });
}

void EncodeScaledHalf(std::span<const float> x, Bytes& out, int max_threads) {
  const Moments mo = ComputeMoments(x, max_threads);
  const float mean = FiniteFloat(mo.mean), sd = FiniteFloat(mo.Std());
  ByteWriter w(out);
  PutF32(w, mean);
  PutF32(w, sd);
  uint8_t* dst = Extend(out, x.size() * 2);
  const Scaler s = MakeScaler(sd, 1.0f);
  ForChunks(x.size(), kChunk, x.size(), max_threads, [&](size_t, size_t b, size_t e) {
    alignas(64) uint16_t t[kTile];
    for (size_t i = b; i < e; i += kTile) {
      const size_t m = std::min(kTile, e - i);
      KScaledToHalf(x.data() + i, m, mean, s.pre, s.inv, t);
      StoreU16(dst + 2 * i, t, m);
    }
  });
}

void EncodeUniform8(std::span<const float> x, Bytes& out, int max_threads) {
  const Moments mo = ComputeMoments(x, max_threads);
  const float mean = FiniteFloat(mo.mean);
  const float radius = FiniteFloat(mo.Std() * kUniformSigmas);
  ByteWriter w(out);
  PutF32(w, mean);
  PutF32(w, radius);
  uint8_t* dst = Extend(out, x.size());
  const Scaler s = MakeScaler(radius, 127.5f);
  ForChunks(x.size(), kChunk, x.size(), max_threads, [&](size_t, size_t b, size_t e) {
    KUniform8(x.data() + b, e - b, mean, s.pre, s.inv, dst + b);
  });
}

// 256 codebook values for `x`: Lloyd-Max iterations on a deterministic sample, started from the
// centroids of equal-probability buckets (pure quantiles leave the tail buckets so wide that
// Gaussian data loses ~9e-4 MSE there). Sorted ascending.
std::vector<float> QuantileCodebook(std::span<const float> x) {
  std::vector<float> sample;
  const size_t n = x.size();
  if (n <= kQuantileSample) {
    sample.reserve(n);
    for (float v : x)
      if (IsFinite(v)) sample.push_back(v);
  } else {
    // Stratified: one pseudo-random value from each of kQuantileSample equal strides.
    sample.reserve(kQuantileSample);
    const size_t stride = n / kQuantileSample;
    uint64_t state = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < kQuantileSample; ++i) {
      state ^= state >> 33;
      state *= 0xff51afd7ed558ccdull;
      state ^= state >> 29;
      state += 0x9E3779B97F4A7C15ull;
      const float v = x[i * stride + static_cast<size_t>(state % stride)];
      if (IsFinite(v)) sample.push_back(v);
    }
  }
  std::vector<float> book(kCodebookSize, 0.0f);
  const size_t m = sample.size();
  if (m == 0) return book;
  std::sort(sample.begin(), sample.end());
  if (m <= kCodebookSize) {  // every sample value gets its own entry (exact for small inputs)
    for (size_t i = 0; i < kCodebookSize; ++i) book[i] = sample[i * m / kCodebookSize];
    return book;
  }
  std::vector<double> prefix(m + 1, 0.0);
  for (size_t i = 0; i < m; ++i) prefix[i + 1] = prefix[i] + sample[i];
  auto centroid = [&](size_t lo, size_t hi) {
    return static_cast<float>((prefix[hi] - prefix[lo]) / static_cast<double>(hi - lo));
  };
  for (size_t i = 0; i < kCodebookSize; ++i)
    book[i] = centroid(i * m / kCodebookSize, (i + 1) * m / kCodebookSize);
  for (int it = 0; it < kLloydIterations; ++it) {
    // Bucket i holds the sample values v with t[i-1] < v <= t[i], t[i] the midpoints (as the
    // encoder assigns them).
    size_t lo = 0;
    for (size_t i = 0; i < kCodebookSize; ++i) {
      size_t hi = m;
      if (i + 1 < kCodebookSize) {
        const float t = book[i] * 0.5f + book[i + 1] * 0.5f;
        hi =
            static_cast<size_t>(std::upper_bound(sample.begin(), sample.end(), t) - sample.begin());
        hi = std::max(hi, lo);
      }
      if (hi > lo) book[i] = centroid(lo, hi);
      lo = hi;
    }
    std::sort(book.begin(), book.end());
  }
  return book;
}

// Branch-free binary search of each value among 255 sorted midpoints, 8 steps for a group of
// values at a time: the groups' searches are independent, so their loads overlap (and the AVX2
// variant uses gathers) instead of each value waiting on 8 dependent, mispredicted branches.
COLONY_KERNEL void KNearestCode(const float* __restrict p, size_t m, const float* __restrict mid,
                                uint8_t* __restrict q) {
  constexpr size_t kGroup = 16;
  size_t i = 0;
  for (; i + kGroup <= m; i += kGroup) {
    int pos[kGroup] = {};
    for (int step = 128; step > 0; step >>= 1) {
      for (size_t k = 0; k < kGroup; ++k) pos[k] += p[i + k] > mid[pos[k] + step - 1] ? step : 0;
    }
    for (size_t k = 0; k < kGroup; ++k) q[i + k] = static_cast<uint8_t>(pos[k]);
  }
  for (; i < m; ++i) {
    int pos = 0;
    for (int step = 128; step > 0; step >>= 1) pos += p[i] > mid[pos + step - 1] ? step : 0;
    q[i] = static_cast<uint8_t>(pos);
  }
}

void EncodeQuantile8(std::span<const float> x, Bytes& out, int max_threads) {
  const std::vector<float> book = QuantileCodebook(x);
  ByteWriter w(out);
  for (float v : book) PutF32(w, v);
  // The nearest entry of a sorted codebook: the number of midpoints below the value.
  alignas(64) std::array<float, kCodebookSize> mid{};
  for (size_t i = 0; i + 1 < kCodebookSize; ++i) mid[i] = book[i] * 0.5f + book[i + 1] * 0.5f;
  mid[kCodebookSize - 1] = INFINITY;  // never read by the search below
  uint8_t* dst = Extend(out, x.size());
  ForChunks(x.size(), kChunk, x.size(), max_threads, [&](size_t, size_t b, size_t e) {
    KNearestCode(x.data() + b, e - b, mid.data(), dst + b);
  });
}

// Blockwise encoders take each block's absmax (over its finite values) and quantize the block
// right after, while it is still in L1/L2: one pass over the input.
void EncodeBlockwise8(std::span<const float> x, uint32_t bs, Bytes& out, int max_threads) {
  const size_t blocks = (x.size() + bs - 1) / bs;
  uint8_t* dst = Extend(out, blocks * 4 + x.size());
  uint8_t* codes = dst + blocks * 4;
  const size_t per_chunk = std::max<size_t>(1, kChunk / bs);
  ForChunks(blocks, per_chunk, x.size(), max_threads, [&](size_t, size_t b, size_t e) {
    for (size_t blk = b; blk < e; ++blk) {
      const size_t at = blk * bs;
      const size_t m = std::min<size_t>(bs, x.size() - at);
      const uint32_t bits = KAbsMaxBits(x.data() + at, m);
      const bool finite = bits < 0x7f800000u;
      const float scale = finite ? std::bit_cast<float>(bits) : KAbsMax(x.data() + at, m);
      StoreF32(dst + 4 * blk, &scale, 1);
      const Scaler s = MakeScaler(scale, 127.0f);
      (finite ? KFiniteBlockwise8 : KBlockwise8)(x.data() + at, m, s.pre, s.inv, codes + at);
    }
  });
}

// Chunks of blockwise4 work hold an even number of blocks, so that no byte of codes is shared by
// two chunks (threads) even when the block size is odd.
size_t Blockwise4BlocksPerChunk(size_t bs) { return std::max<size_t>(2, kChunk / bs / 2 * 2); }

void EncodeBlockwise4(std::span<const float> x, uint32_t bs, Bytes& out, int max_threads) {
  const size_t blocks = (x.size() + bs - 1) / bs;
  uint8_t* dst = Extend(out, blocks * 4 + (x.size() + 1) / 2);
  uint8_t* codes = dst + blocks * 4;
  ForChunks(
      blocks, Blockwise4BlocksPerChunk(bs), x.size(), max_threads, [&](size_t, size_t b, size_t e) {
        for (size_t blk = b; blk < e; ++blk) {
          size_t i = blk * bs;
          const size_t end = std::min<size_t>(x.size(), i + bs);
          const float scale = KAbsMax(x.data() + i, end - i);
          StoreF32(dst + 4 * blk, &scale, 1);
          const Scaler s = MakeScaler(scale, 7.0f);
          if (i & 1) {  // odd start (odd block size): the low nibble is already written
            codes[i / 2] = static_cast<uint8_t>(codes[i / 2] | (Code4(x[i], s.pre, s.inv) << 4));
            ++i;
          }
          const size_t pairs = (end - i) / 2;
          KBlockwise4(x.data() + i, pairs, s.pre, s.inv, codes + i / 2);
          i += 2 * pairs;
          // The low nibble of a byte whose high nibble is the next block's, or zero padding.
          if (i < end) codes[i / 2] = Code4(x[i], s.pre, s.inv);
        }
      });
}

// Top-k ranks by magnitude; NaN ranks above everything (so a poisoned tensor stays visibly
// poisoned). Magnitudes of non-negative floats order like their bit patterns, so the keys are
// integers.
inline uint32_t TopKKey(float v) {
  const uint32_t a = std::bit_cast<uint32_t>(v) & 0x7fffffffu;
  return a > 0x7f800000u ? 0xffffffffu : a;
}

// Adds to hist[digit of key] for the keys whose bits under `mask` equal `prefix`. Four
// interleaved sub-histograms keep runs of equal digits (common: most values share a few
// exponents) from serialising on one counter's store-to-load latency.
void TopKHistogram(const float* __restrict p, size_t n, uint32_t mask, uint32_t prefix, int shift,
                   uint32_t digit, uint64_t* __restrict hist) {
  constexpr size_t kSub = 4;
  constexpr size_t kFlush = size_t{1} << 28;  // uint32 sub-counts cannot overflow in between
  const size_t bins = size_t{digit} + 1;
  std::vector<uint32_t> sub(kSub * bins);
  for (size_t b = 0; b < n; b += kFlush) {
    const size_t e = std::min(n, b + kFlush);
    std::fill(sub.begin(), sub.end(), 0u);
    size_t i = b;
    for (; i + kSub <= e; i += kSub) {
      for (size_t k = 0; k < kSub; ++k) {
        const uint32_t kv = TopKKey(p[i + k]);
        if ((kv & mask) == prefix) ++sub[k * bins + ((kv >> shift) & digit)];
      }
    }
    for (; i < e; ++i) {
      const uint32_t kv = TopKKey(p[i]);
      if ((kv & mask) == prefix) ++sub[(kv >> shift) & digit];
    }
    for (size_t k = 0; k < kSub; ++k) {
      for (size_t d = 0; d < bins; ++d) hist[d] += sub[k * bins + d];
    }
  }
}

Status EncodeTopK(std::span<const float> x, double fraction, Bytes& out) {
  if (!(fraction > 0.0 && fraction <= 1.0))
    return InvalidArgument(
        fmt::format("topk fraction is {}, expected a value in (0, 1]", fraction));
  const size_t n = x.size();
  size_t k = 0;
  if (n > 0) {
    const double want = std::ceil(fraction * static_cast<double>(n));
    k = std::clamp<size_t>(static_cast<size_t>(want), 1, n);
  }
  ByteWriter w(out);
  w.Varint(k);
  if (k == 0) return Status::Ok();
  // The k-th largest key, found by radix selection (three histogram passes over 11, 11 and 10
  // bits, no copy of the input), and how many values equal to it are kept.
  size_t ties = k;  // rank of the k-th largest among the values sharing the prefix found so far
  uint32_t threshold = 0, mask = 0;
  std::vector<uint64_t> hist;
  for (const int shift : {21, 10, 0}) {
    const int width = shift == 21 ? 11 : (shift == 10 ? 11 : 10);
    const uint32_t digit = (1u << width) - 1;
    hist.assign(size_t{1} << width, 0);
    TopKHistogram(x.data(), n, mask, threshold, shift, digit, hist.data());
    uint32_t b = digit;
    for (; hist[b] < ties; --b) ties -= hist[b];  // terminates: the group holds >= ties values
    threshold |= b << shift;
    mask |= digit << shift;
  }
  // Values above the threshold are all kept, then the first `ties` equal to it (by index).
  std::vector<size_t> idx;
  idx.reserve(k);
  for (size_t i = 0; i < n && idx.size() < k; ++i) {
    const uint32_t kv = TopKKey(x[i]);
    if (kv > threshold) {
      idx.push_back(i);
    } else if (kv == threshold && ties > 0) {
      idx.push_back(i);
      --ties;
    }
  }
  uint8_t* vals = Extend(out, k * 4);
  for (size_t j = 0; j < k; ++j) StoreF32(vals + 4 * j, &x[idx[j]], 1);
  size_t prev = 0;
  for (size_t j = 0; j < k; ++j) {
    w.Varint(j == 0 ? idx[0] : idx[j] - prev);
    prev = idx[j];
  }
  return Status::Ok();
}

// ---- decoders ---------------------------------------------------------------------------------

Status Malformed(std::string what) { return DataLoss(std::move(what)); }

Status CheckPayload(std::string_view name, size_t got, size_t want, std::string_view detail) {
  if (got == want) return Status::Ok();
  return Malformed(
      fmt::format("{} payload is {} bytes, expected {} for {}", name, got, want, detail));
}

void Decode16(From16Kernel kernel, const uint8_t* src, std::span<float> out, int max_threads) {
  ForChunks(out.size(), kChunk, out.size(), max_threads, [&](size_t, size_t b, size_t e) {
    alignas(64) uint16_t t[kTile];
    for (size_t i = b; i < e; i += kTile) {
      const size_t m = std::min(kTile, e - i);
      LoadU16(t, src + 2 * i, m);
      kernel(t, m, out.data() + i);
    }
  });
}

Status CheckParam(std::string_view codec, std::string_view what, float v, bool non_negative) {
  if (IsFinite(v) && (!non_negative || v >= 0.0f)) return Status::Ok();
  return Malformed(fmt::format("{} {} is {}, expected a finite value{}", codec, what, v,
                               non_negative ? " >= 0" : ""));
}

// Scales of a blockwise encoding: finite and >= 0.
Status ReadScales(std::string_view codec, const uint8_t* src, size_t blocks,
                  std::vector<float>& scales) {
  scales.resize(blocks);
  LoadF32(scales.data(), src, blocks);
  bool ok = true;
  for (float s : scales) ok &= (s >= 0.0f && s <= FLT_MAX);
  if (ok) return Status::Ok();
  for (size_t b = 0; b < blocks; ++b) {
    if (!(scales[b] >= 0.0f && scales[b] <= FLT_MAX))
      return Malformed(fmt::format("{} block {} has scale {}, expected a finite value >= 0", codec,
                                   b, scales[b]));
  }
  return Status::Ok();
}

// Writes the decoded values to `out`, or with `add_weight` adds add_weight * each to it.
Status DecodeBlockwise(Codec codec, ByteReader& r, std::span<float> out, int max_threads,
                       std::optional<float> add_weight = std::nullopt,
                       Writes writes = Writes::kCached) {
  const bool four = codec == Codec::kBlockwise4;
  const std::string_view name = CodecName(codec);
  const uint32_t bs = r.U32();
  if (!r.ok()) return Malformed(fmt::format("{} header is truncated", name));
  if (bs < kMinBlock || bs > kMaxBlock)
    return Malformed(fmt::format("{} block size is {}, expected a value in [{}, {}]", name, bs,
                                 kMinBlock, kMaxBlock));
  const size_t n = out.size();
  const size_t blocks = (n + bs - 1) / bs;
  const size_t code_bytes = four ? (n + 1) / 2 : n;
  const ByteSpan payload = r.Rest();
  COLONY_RETURN_IF_ERROR(CheckPayload(name, payload.size(), blocks * 4 + code_bytes,
                                      fmt::format("{} values in blocks of {}", n, bs)));
  std::vector<float> scales;
  COLONY_RETURN_IF_ERROR(ReadScales(name, payload.data(), blocks, scales));
  const uint8_t* codes = payload.data() + blocks * 4;
  if (n == 0) return Status::Ok();

  // Codes the encoder never writes (-128; nibble 0) are refused before anything is written, so
  // a failed decode leaves `out` as it was.
  auto code_of = [&](size_t i) {
    return four ? (i & 1 ? codes[i / 2] >> 4 : codes[i / 2] & 0xf) : codes[i];
  };
  const unsigned outside =
      four ? KAnyCode4Outside(codes, n / 2) | ((n & 1) && (codes[n / 2] & 0xf) == 0 ? 1u : 0u)
           : KAnyCode8Outside(codes, n);
  if (outside != 0) {
    size_t i = 0;
    while (i + 1 < n && code_of(i) != (four ? 0 : 0x80)) ++i;
    return Malformed(fmt::format("{} has a code outside [-{}, {}] at value {} (block {})", name,
                                 four ? 7 : 127, four ? 7 : 127, i, i / bs));
  }
  if (four && (n & 1) && (codes[n / 2] >> 4) != 0)
    return Malformed(fmt::format("{} padding nibble is {}, expected 0", name, codes[n / 2] >> 4));

  const size_t per_chunk = four ? Blockwise4BlocksPerChunk(bs) : std::max<size_t>(1, kChunk / bs);
  const bool add = add_weight.has_value();
  const float w = add_weight.value_or(0.0f);
  const bool stream = !four && !add && writes == Writes::kPastCaches;
  ForChunks(blocks, per_chunk, n, max_threads, [&](size_t, size_t b, size_t e) {
    float* o = out.data();
    auto put = [&](size_t i, float v) { o[i] = add ? o[i] + w * v : v; };
    for (size_t blk = b; blk < e; ++blk) {
      size_t i = blk * bs;
      const size_t end = std::min<size_t>(n, i + bs);
      if (!four) {
        const float step = scales[blk] / 127.0f;
        const bool finite = Blockwise8Finite(step);
        if (add) {
          (finite ? KAddFromFiniteBlockwise8 : KAddFromBlockwise8)(codes + i, end - i, step, w,
                                                                   o + i);
        } else if (stream) {
          // Decoded a tile at a time (it stays in L1), then stored past the caches.
          float piece[kTile];
          for (; i < end; i += kTile) {
            const size_t len = std::min(kTile, end - i);
            (finite ? KFromFiniteBlockwise8 : KFromBlockwise8)(codes + i, len, step, piece);
            StreamStore(o + i, piece, len * sizeof(float));
          }
        } else {
          (finite ? KFromFiniteBlockwise8 : KFromBlockwise8)(codes + i, end - i, step, o + i);
        }
        continue;
      }
      const float step = scales[blk] / 7.0f;
      if (i & 1) {
        put(i, FromCode4(codes[i / 2] >> 4, step));
        ++i;
      }
      const size_t pairs = (end - i) / 2;
      if (add) {
        KAddFromBlockwise4(codes + i / 2, pairs, step, w, o + i);
      } else {
        KFromBlockwise4(codes + i / 2, pairs, step, o + i);
      }
      i += 2 * pairs;
      if (i < end) put(i, FromCode4(codes[i / 2] & 0xfu, step));
    }
    if (stream) StreamFence();
  });
  return Status::Ok();
}

Status DecodeTopK(ByteReader& r, std::span<float> out) {
  const size_t n = out.size();
  const uint64_t k = r.Varint();
  if (!r.ok()) return Malformed("topk header is truncated");
  if (k > n) return Malformed(fmt::format("topk keeps {} values of {}, expected k <= count", k, n));
  if (n > 0 && k == 0)
    return Malformed(fmt::format("topk keeps 0 values of {}, expected k >= 1", n));
  const ByteSpan vals = r.Raw(k * 4);
  if (!r.ok())
    return Malformed(fmt::format("topk payload has {} bytes, expected at least {} for {} values",
                                 r.remaining(), k * 4, k));
  // The indices are checked before anything is written, so a failed decode leaves `out` as it
  // was; then read again to write.
  const ByteReader indices = r;
  uint64_t index = 0;
  for (uint64_t j = 0; j < k; ++j) {
    const uint64_t delta = r.Varint();
    if (!r.ok()) return Malformed(fmt::format("topk index {} of {} is truncated", j, k));
    if (j > 0 && delta == 0)
      return Malformed(fmt::format("topk index {} repeats index {}", j, index));
    // index + delta < n, written so that it cannot overflow.
    if (delta >= n || (j > 0 && delta >= n - index))
      return Malformed(fmt::format("topk index {} is out of range for {} values", j, n));
    index = j == 0 ? delta : index + delta;
  }
  if (r.remaining() != 0)
    return Malformed(fmt::format("topk encoding has {} trailing bytes", r.remaining()));
  std::fill(out.begin(), out.end(), 0.0f);
  ByteReader again = indices;
  index = 0;
  for (uint64_t j = 0; j < k; ++j) {
    const uint64_t delta = again.Varint();
    index = j == 0 ? delta : index + delta;
    out[index] = LoadOneF32(vals.data() + 4 * j);
  }
  return Status::Ok();
}

struct Header {
  Codec codec = Codec::kNone;
  uint64_t count = 0;
};

Result<Header> ReadHeader(ByteReader& r) {
  const uint8_t id = r.U8();
  if (!r.ok()) return Malformed("encoding is empty, expected at least a codec id and a count");
  const std::optional<Codec> codec = CodecFromWire(id);
  if (!codec) {
    return Malformed(
        fmt::format("unknown codec id {}, expected a value in [0, {}]", id, kMaxCodecId));
  }
  const uint64_t count = r.Varint();
  if (!r.ok())
    return Malformed(fmt::format("{} element count is truncated or overlong", CodecName(*codec)));
  return Header{*codec, count};
}

}  // namespace

// ---- public API -------------------------------------------------------------------------------

uint16_t FloatToHalf(float value) { return ToHalf(value); }
float HalfToFloat(uint16_t half) { return FromHalf(half); }
uint16_t FloatToBFloat16(float value) { return ToBf16(value); }
float BFloat16ToFloat(uint16_t bf16) { return FromBf16(bf16); }

std::string_view CodecName(Codec codec) {
  switch (codec) {
    case Codec::kNone:
      return "none";
    case Codec::kFloat16:
      return "fp16";
    case Codec::kBFloat16:
      return "bf16";
    case Codec::kScaledFloat16:
      return "scaled-fp16";
    case Codec::kUniform8:
      return "uniform8";
    case Codec::kQuantile8:
      return "quantile8";
    case Codec::kBlockwise8:
      return "blockwise8";
    case Codec::kBlockwise4:
      return "blockwise4";
    case Codec::kTopK:
      return "topk";
  }
  return "unknown";
}

Result<Codec> ParseCodec(std::string_view name) {
  for (uint8_t id = 0; id <= kMaxCodecId; ++id) {
    if (CodecName(static_cast<Codec>(id)) == name) return static_cast<Codec>(id);
  }
  return InvalidArgument(fmt::format(
      "unknown codec '{}', expected one of none, fp16, bf16, scaled-fp16, uniform8, quantile8, "
      "blockwise8, blockwise4, topk",
      name));
}

bool DecodesFinite(Codec codec) {
  switch (codec) {
    case Codec::kNone:
    case Codec::kFloat16:
    case Codec::kBFloat16:
    case Codec::kScaledFloat16:  // non-finite inputs travel as such
    case Codec::kTopK:
      return false;
    case Codec::kUniform8:
    case Codec::kQuantile8:
    case Codec::kBlockwise8:
    case Codec::kBlockwise4:
      return true;
  }
  return false;
}

std::optional<Codec> CodecFromWire(uint8_t value) {
  if (value > kMaxCodecId) return std::nullopt;
  return static_cast<Codec>(value);
}

Codec CompressionPolicy::Choose(size_t count, TensorRole role) const {
  if (count < size_threshold) return small;
  switch (role) {
    case TensorRole::kGradient:
      return gradients;
    case TensorRole::kParameter:
      return parameters;
    case TensorRole::kOptimizerState:
      return optimizer_state;
  }
  return small;
}

size_t MaxEncodedSize(Codec codec, size_t count, const CodecOptions& options) {
  const size_t header = 1 + 10;
  const size_t bs = std::clamp<size_t>(options.block_size, kMinBlock, kMaxBlock);
  const size_t blocks = (count + bs - 1) / bs;
  switch (codec) {
    case Codec::kNone:
      return header + 4 * count;
    case Codec::kFloat16:
    case Codec::kBFloat16:
      return header + 2 * count;
    case Codec::kScaledFloat16:
      return header + 8 + 2 * count;
    case Codec::kUniform8:
      return header + 8 + count;
    case Codec::kQuantile8:
      return header + 4 * kCodebookSize + count;
    case Codec::kBlockwise8:
      return header + 4 + 4 * blocks + count;
    case Codec::kBlockwise4:
      return header + 4 + 4 * blocks + (count + 1) / 2;
    case Codec::kTopK:
      // At most every value, each with a varint index delta of at most 10 bytes.
      return header + 10 + count * (4 + 10);
  }
  return header + 14 * count + 1024;
}

Status AppendHeader(Codec codec, size_t count, const CodecOptions& options, Bytes& out) {
  if (!CodecFromWire(static_cast<uint8_t>(codec)))
    return InvalidArgument(fmt::format("unknown codec {}", static_cast<int>(codec)));
  const bool blockwise = codec == Codec::kBlockwise8 || codec == Codec::kBlockwise4;
  if (blockwise && (options.block_size < kMinBlock || options.block_size > kMaxBlock)) {
    return InvalidArgument(fmt::format("{} block size is {}, expected a value in [{}, {}]",
                                       CodecName(codec), options.block_size, kMinBlock, kMaxBlock));
  }
  ByteWriter w(out);
  w.U8(static_cast<uint8_t>(codec));
  w.Varint(count);
  if (blockwise) w.U32(options.block_size);
  return Status::Ok();
}

Status Encode(Codec codec, std::span<const float> values, Bytes& out, const CodecOptions& options) {
  const size_t start = out.size();
  COLONY_RETURN_IF_ERROR(AppendHeader(codec, values.size(), options, out));
  const int threads = options.max_threads;
  switch (codec) {
    case Codec::kNone:
      EncodeNone(values, out);
      break;
    case Codec::kFloat16:
      Encode16(KToHalf, values, Extend(out, values.size() * 2), threads);
      break;
    case Codec::kBFloat16:
      Encode16(KToBf16, values, Extend(out, values.size() * 2), threads);
      break;
    case Codec::kScaledFloat16:
      EncodeScaledHalf(values, out, threads);
      break;
    case Codec::kUniform8:
      EncodeUniform8(values, out, threads);
      break;
    case Codec::kQuantile8:
      EncodeQuantile8(values, out, threads);
      break;
    case Codec::kBlockwise8:
      EncodeBlockwise8(values, options.block_size, out, threads);
      break;
    case Codec::kBlockwise4:
      EncodeBlockwise4(values, options.block_size, out, threads);
      break;
    case Codec::kTopK:
      if (Status st = EncodeTopK(values, options.topk_fraction, out); !st.ok()) {
        out.resize(start);
        return st;
      }
      break;
  }
  return Status::Ok();
}

Result<EncodedInfo> PeekHeader(ByteSpan encoded) {
  ByteReader r(encoded);
  COLONY_ASSIGN_OR_RETURN(Header h, ReadHeader(r));
  return EncodedInfo{h.codec, h.count};
}

std::optional<float> MaxAbsBound(ByteSpan encoded) {
  ByteReader r(encoded);
  const Result<Header> h = ReadHeader(r);
  if (!h.ok() || (h->codec != Codec::kBlockwise8 && h->codec != Codec::kBlockwise4))
    return std::nullopt;
  const uint32_t bs = r.U32();
  if (!r.ok() || bs < kMinBlock || bs > kMaxBlock) return std::nullopt;
  const uint64_t blocks = h->count / bs + (h->count % bs != 0 ? 1 : 0);
  if (blocks > r.remaining() / 4) return std::nullopt;
  std::vector<float> scales;
  if (!ReadScales(CodecName(h->codec), r.Rest().data(), blocks, scales).ok()) return std::nullopt;
  const float levels = h->codec == Codec::kBlockwise8 ? 127.0f : 7.0f;
  const float most = blocks == 0 ? 0.0f : *std::max_element(scales.begin(), scales.end());
  // The decoders write SaturateFinite(code * (scale / levels)) with |code| <= levels; rounding is
  // monotonic, so the largest scale's product with `levels` bounds them all, exactly as computed
  // (it may round above the scale itself, by far for a subnormal one).
  return SaturateFinite(most / levels * levels);
}

bool DecodesAddInOnePass(Codec codec) {
  return codec == Codec::kBlockwise8 || codec == Codec::kBlockwise4;
}

Status DecodeAddScaled(ByteSpan encoded, std::span<float> acc, float w) {
  ByteReader r(encoded);
  COLONY_ASSIGN_OR_RETURN(Header h, ReadHeader(r));
  if (h.count != acc.size()) {
    return InvalidArgument(fmt::format("{} encoding holds {} values, but the sum has {}",
                                       CodecName(h.codec), h.count, acc.size()));
  }
  if (DecodesAddInOnePass(h.codec)) return DecodeBlockwise(h.codec, r, acc, 1, w);
  const auto values = std::make_unique_for_overwrite<float[]>(acc.size());
  const std::span<float> decoded(values.get(), acc.size());  // Decode writes every value
  COLONY_RETURN_IF_ERROR(Decode(encoded, decoded, 1));
  for (size_t i = 0; i < acc.size(); ++i) acc[i] += w * decoded[i];
  return Status::Ok();
}

Status Decode(ByteSpan encoded, std::span<float> out) { return Decode(encoded, out, 0); }

Status Decode(ByteSpan encoded, std::span<float> out, int max_threads) {
  return Decode(encoded, out, max_threads, Writes::kCached);
}

Status Decode(ByteSpan encoded, std::span<float> out, int max_threads, Writes writes) {
  ByteReader r(encoded);
  COLONY_ASSIGN_OR_RETURN(Header h, ReadHeader(r));
  const std::string_view name = CodecName(h.codec);
  if (h.count != out.size()) {
    return InvalidArgument(fmt::format(
        "{} encoding holds {} values, but the output has room for {}", name, h.count, out.size()));
  }
  const size_t n = out.size();
  const std::string detail = fmt::format("{} values", n);
  switch (h.codec) {
    case Codec::kNone: {
      const ByteSpan p = r.Rest();
      COLONY_RETURN_IF_ERROR(CheckPayload(name, p.size(), 4 * n, detail));
      if (kLittleEndian && writes == Writes::kPastCaches) {
        StreamStore(out.data(), p.data(), 4 * n);
        StreamFence();
      } else {
        LoadF32(out.data(), p.data(), n);
      }
      return Status::Ok();
    }
    case Codec::kFloat16:
    case Codec::kBFloat16: {
      const ByteSpan p = r.Rest();
      COLONY_RETURN_IF_ERROR(CheckPayload(name, p.size(), 2 * n, detail));
      if (h.codec == Codec::kFloat16) {
        Decode16(KFromHalf, p.data(), out, max_threads);
      } else {
        Decode16(KFromBf16, p.data(), out, max_threads);
      }
      return Status::Ok();
    }
    case Codec::kScaledFloat16: {
      const float mean = GetF32(r), sd = GetF32(r);
      if (!r.ok()) return Malformed("scaled-fp16 header is truncated");
      COLONY_RETURN_IF_ERROR(CheckParam(name, "mean", mean, false));
      COLONY_RETURN_IF_ERROR(CheckParam(name, "std", sd, true));
      const ByteSpan p = r.Rest();
      COLONY_RETURN_IF_ERROR(CheckPayload(name, p.size(), 2 * n, detail));
      ForChunks(n, kChunk, n, max_threads, [&](size_t, size_t b, size_t e) {
        alignas(64) uint16_t t[kTile];
        for (size_t i = b; i < e; i += kTile) {
          const size_t m = std::min(kTile, e - i);
          LoadU16(t, p.data() + 2 * i, m);
          KScaledFromHalf(t, m, mean, sd, out.data() + i);
        }
      });
      return Status::Ok();
    }
    case Codec::kUniform8: {
      const float mean = GetF32(r), radius = GetF32(r);
      if (!r.ok()) return Malformed("uniform8 header is truncated");
      COLONY_RETURN_IF_ERROR(CheckParam(name, "mean", mean, false));
      COLONY_RETURN_IF_ERROR(CheckParam(name, "radius", radius, true));
      const ByteSpan p = r.Rest();
      COLONY_RETURN_IF_ERROR(CheckPayload(name, p.size(), n, detail));
      const float step = radius / 127.5f;
      const uint8_t* q = p.data();
      ForChunks(n, kChunk, n, max_threads, [&](size_t, size_t b, size_t e) {
        KFromUniform8(q + b, e - b, mean, step, out.data() + b);
      });
      return Status::Ok();
    }
    case Codec::kQuantile8: {
      const ByteSpan bookb = r.Raw(4 * kCodebookSize);
      if (!r.ok()) return Malformed("quantile8 codebook is truncated");
      std::array<float, kCodebookSize> book{};
      LoadF32(book.data(), bookb.data(), kCodebookSize);
      for (size_t i = 0; i < kCodebookSize; ++i) {
        if (!IsFinite(book[i]))
          return Malformed(fmt::format("quantile8 codebook entry {} is {}, expected a finite value",
                                       i, book[i]));
      }
      const ByteSpan p = r.Rest();
      COLONY_RETURN_IF_ERROR(CheckPayload(name, p.size(), n, detail));
      const uint8_t* q = p.data();
      ForChunks(n, kChunk, n, max_threads, [&](size_t, size_t b, size_t e) {
        float* o = out.data();
        for (size_t i = b; i < e; ++i) o[i] = book[q[i]];
      });
      return Status::Ok();
    }
    case Codec::kBlockwise8:
    case Codec::kBlockwise4:
      return DecodeBlockwise(h.codec, r, out, max_threads, std::nullopt, writes);
    case Codec::kTopK:
      return DecodeTopK(r, out);
  }
  return Internal("unreachable codec");
}

}  // namespace colony::compression
