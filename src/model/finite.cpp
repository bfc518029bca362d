#include "model/finite.h"

#include <ATen/ATen.h>

#include <cmath>
#include <span>

#include "core/finite.h"

namespace colony::model {

bool AllFinite(const at::Tensor& t) {
  if (!t.defined()) return true;
  if (!at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type())) return true;
  const at::ScalarType type = t.scalar_type();
  if (t.device().is_cpu() && type == at::kFloat) {
    const at::Tensor c = t.contiguous();
    return colony::AllFinite(
        std::span<const float>(c.data_ptr<float>(), static_cast<size_t>(c.numel())));
  }
  if (!t.device().is_cpu() && (type == at::kFloat || type == at::kHalf || type == at::kBFloat16)) {
    // inf, -inf and NaN make the sum inf or NaN.
    return std::isfinite(t.sum(at::kDouble).item<double>());
  }
  return at::isfinite(t).all().item<bool>();
}

}  // namespace colony::model
