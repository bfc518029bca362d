// Whether a tensor holds no NaN or infinity, on any device: float32 on the CPU in one pass
// without allocating (core/finite.h); float32, float16 and bfloat16 on a GPU in one reduction
// (their sum in double, which finite values of those types cannot overflow: one
// synchronization); other floating and complex types through at::isfinite. Integer tensors, and
// undefined ones, hold nothing that is not finite. The check of received and computed tensors in
// train, serve and moe.
#pragma once

#include <ATen/core/Tensor.h>

namespace colony::model {

bool AllFinite(const at::Tensor& t);

}  // namespace colony::model
