// model::AllFinite against at::isfinite(t).all() on tensors of every kind it treats apart: float32
// on the CPU (its own kernel), contiguous or not; other floating and complex types; integers;
// and, where LibTorch sees a GPU, float32, float16 and bfloat16 there (one reduction).
#include "model/finite.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

namespace colony::model {
namespace {

// Each tensor of `dtype` on `device` with one special value at a few positions, and none.
void CheckAgainstTorch(at::ScalarType dtype, const at::Device& device) {
  const std::vector<double> specials = {std::numeric_limits<double>::quiet_NaN(),
                                        std::numeric_limits<double>::infinity(),
                                        -std::numeric_limits<double>::infinity(), 3e4, 0.0};
  for (int64_t at_index : {0, 5, 64, 299}) {
    for (double special : specials) {
      at::Tensor t = torch::ones({20, 15}, at::TensorOptions().dtype(at::kDouble)) * 0.25;
      t.view(-1)[at_index] = special;
      t = t.to(dtype).to(device);
      for (const at::Tensor& view : {t, t.t(), t.narrow(1, 3, 7)}) {
        const bool expected = at::isfinite(view).all().item<bool>();
        EXPECT_EQ(AllFinite(view), expected)
            << dtype << " on " << device << ", " << special << " at " << at_index
            << (view.is_contiguous() ? "" : ", not contiguous");
      }
    }
  }
}

TEST(Finite, AgreesWithTorchForEveryDtypeAndLayoutOnTheCpu) {
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    CheckAgainstTorch(dtype, at::kCPU);
  }
  at::Tensor c = torch::ones({4}, at::kComplexFloat);
  EXPECT_TRUE(AllFinite(c));
  c[2] = c10::complex<float>(0, std::numeric_limits<float>::infinity());
  EXPECT_FALSE(AllFinite(c));
  EXPECT_TRUE(AllFinite(torch::arange(10, at::kLong)));
  EXPECT_TRUE(AllFinite(at::Tensor()));
}

TEST(Finite, AgreesWithTorchOnAGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "LibTorch sees no GPU";
  for (at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
    CheckAgainstTorch(dtype, at::Device(at::kCUDA, 0));
  }
}

}  // namespace
}  // namespace colony::model
