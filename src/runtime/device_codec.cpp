// Encoding float tensors on their device (device_codec.h), in compression::Encode's format.
#include "runtime/device_codec.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <bit>

namespace colony::runtime {

namespace {

using compression::Codec;

// fp16 and bf16 as compression's kernels write them: round to nearest even, finite values
// saturating at the format's largest finite value (a plain conversion overflows to inf).
at::Tensor Saturated16(const at::Tensor& x, at::ScalarType type, float largest) {
  return at::where(at::isfinite(x), x.clamp(-largest, largest), x).to(type).view(at::kByte);
}

// Blockwise8 as compression's kernels write it: per block of `bs` values the largest finite
// |value| as its float32 scale; each value x as round-half-even(clamp((x * pre) * inv, -127,
// 127)), NaN as 0, with inv = 127 / (scale * pre) (0 for a zero scale) and pre = 2^64 for scales
// below 2^-60 (so that inv stays finite), else 1. Scales first, then the codes.
at::Tensor Blockwise8(const at::Tensor& x, int64_t bs) {
  const int64_t n = x.numel();
  const int64_t blocks = (n + bs - 1) / bs;
  // In place where possible: at most two float copies of the values live at once.
  const at::Tensor padded =
      (n % bs == 0 ? x : at::constant_pad_nd(x, {0, blocks * bs - n}, 0)).view({blocks, bs});
  at::Tensor scale;
  {
    at::Tensor finite_abs = padded.abs();
    finite_abs.masked_fill_(at::isfinite(padded).logical_not_(), 0.0);
    scale = finite_abs.amax(1);
  }
  const at::Tensor tiny = scale < 0x1p-60f;
  const at::Tensor pre = at::ones_like(scale).masked_fill_(tiny, 0x1p64f);
  const at::Tensor inv = (127.0f / (scale * pre)).masked_fill_(scale <= 0, 0.0);
  at::Tensor u = padded * pre.unsqueeze(1);
  u.mul_(inv.unsqueeze(1)).nan_to_num_(0.0).clamp_(-127.0, 127.0).round_();
  const at::Tensor codes = u.to(at::kChar).view(-1).narrow(0, 0, n);
  return at::cat({scale.view(at::kByte), codes.view(at::kByte)});
}

}  // namespace

bool EncodesOnDevice(Codec codec) {
  return codec == Codec::kFloat16 || codec == Codec::kBFloat16 || codec == Codec::kBlockwise8;
}

Result<std::shared_ptr<Bytes>> EncodeOnDevice(const at::Tensor& values, Codec codec,
                                              const compression::CodecOptions& options) {
  if (!EncodesOnDevice(codec)) {
    return InvalidArgument(
        fmt::format("codec {} is not encoded on a device (fp16, bf16 and "
                    "blockwise8 are)",
                    compression::CodecName(codec)));
  }
  if (!values.defined() || !at::isFloatingType(values.scalar_type())) {
    return InvalidArgument(fmt::format("only floating-point tensors can be sent as {}",
                                       compression::CodecName(codec)));
  }
  auto out = std::make_shared<Bytes>();
  COLONY_RETURN_IF_ERROR(
      compression::AppendHeader(codec, static_cast<size_t>(values.numel()), options, *out));
  at::NoGradGuard no_grad;
  try {
    const at::Tensor x = values.detach().to(at::kFloat).contiguous().view(-1);
    at::Tensor payload;
    switch (codec) {
      case Codec::kFloat16:
        payload = Saturated16(x, at::kHalf, 65504.0f);
        break;
      case Codec::kBFloat16:
        payload = Saturated16(x, at::kBFloat16, std::bit_cast<float>(0x7f7f0000u));
        break;
      default:
        payload = Blockwise8(x, options.block_size);
        break;
    }
    // Copied from the device straight into the frame's bytes, after the header.
    const size_t offset = out->size();
    out->resize(offset + static_cast<size_t>(payload.numel()));
    if (payload.numel() > 0) {
      at::from_blob(out->data() + offset, {payload.numel()}, at::TensorOptions().dtype(at::kByte))
          .copy_(payload);
    }
  } catch (const c10::Error& e) {
    // Out of device memory, most likely: an error for this frame, not a crash.
    return ResourceExhausted(fmt::format("encoding a tensor of {} values as {} on {}: {}",
                                         values.numel(), compression::CodecName(codec),
                                         values.device().str(), e.what_without_backtrace()));
  }
  return out;
}

}  // namespace colony::runtime
