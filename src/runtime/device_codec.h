// Encoding a float tensor where it lives (a GPU) with tensor operations, so that only the encoded
// bytes cross to the host: fp16 and bf16 (half of float32's bytes) and blockwise8 (a quarter,
// and no float32 pass over the values on the host's cores).
//
//   if (!t.is_cpu() && EncodesOnDevice(codec)) bytes = *EncodeOnDevice(t, codec, options);
//
// The bytes are compression::Encode's for the same values (its header, then its payload in its
// layout, rounding and saturation), so any decoder reads them: the tests compare the two byte
// for byte on the CPU, and on a GPU where one is present. Only a NaN's bits (sign and payload)
// may differ in fp16 and bf16 (it decodes to a NaN either way). ToFrame uses it for GPU tensors of
// at least kDeviceEncodeMinElements values; below that a kernel launch costs more than the host's
// work.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>

#include "compression/codec.h"
#include "core/bytes.h"
#include "core/status.h"

namespace colony::runtime {

inline constexpr int64_t kDeviceEncodeMinElements = int64_t{1} << 16;

// Whether EncodeOnDevice handles the codec: kFloat16, kBFloat16 and kBlockwise8.
bool EncodesOnDevice(compression::Codec codec);

// The encoding of `values` (any floating dtype and shape, on any device; read as float32 in
// row-major order), computed on its device and copied to host memory. InvalidArgument for a
// codec EncodesOnDevice does not handle, a non-floating tensor or bad options.
Result<std::shared_ptr<Bytes>> EncodeOnDevice(const at::Tensor& values, compression::Codec codec,
                                              const compression::CodecOptions& options = {});

}  // namespace colony::runtime
