// FlatGradients: the parameters' .grad as views of one buffer. Expected gradients come from an
// identical model without the views (plain autograd).
#include "train/flat_grads.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <limits>
#include <vector>

namespace colony::train {
namespace {

torch::nn::Linear MakeLinear() {
  at::manual_seed(3);
  return torch::nn::Linear(torch::nn::LinearOptions(5, 3));
}

at::Tensor Loss(torch::nn::Linear& m, int64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
  const at::Tensor x = at::randn({4, 5}, g, at::kFloat);
  return m->forward(x).pow(2).sum();
}

at::Tensor Concat(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> flat;
  for (const auto& p : params) flat.push_back(p.grad().reshape({-1}));
  return at::cat(flat);
}

TEST(FlatGradients, BackwardPassesAccumulateIntoTheViews) {
  torch::nn::Linear reference = MakeLinear(), m = MakeLinear();
  Loss(reference, 1).backward();
  Loss(reference, 2).backward();
  FlatGradients grads(m->parameters());
  const void* buffer = m->parameters()[0].grad().data_ptr();
  Loss(m, 1).backward();
  Loss(m, 2).backward();
  // In place: autograd added into the views (Bind() had nothing to copy).
  EXPECT_EQ(m->parameters()[0].grad().data_ptr(), buffer);
  EXPECT_EQ(grads.Bind().data_ptr(), buffer);
  const at::Tensor expected = Concat(reference->parameters());
  EXPECT_TRUE(at::allclose(grads.Bind(), expected, 1e-6, 1e-6));
  // The buffer is the gradients: writing it is seen through .grad.
  grads.Bind().mul_(2);
  EXPECT_TRUE(at::allclose(Concat(m->parameters()), 2 * expected, 1e-6, 1e-6));
}

TEST(FlatGradients, ADroppedGradientIsZeroAndAReplacedOneIsCopiedIn) {
  torch::nn::Linear m = MakeLinear();
  auto params = m->parameters();
  FlatGradients grads(params);
  Loss(m, 1).backward();
  params[0].mutable_grad() = at::Tensor();         // an optimizer's zero_grad(set_to_none)
  params[1].mutable_grad() = at::full({3}, 7.0f);  // someone else's tensor
  const at::Tensor flat = grads.Bind().clone();
  EXPECT_TRUE(at::equal(flat.narrow(0, 0, 15), at::zeros({15})));
  EXPECT_TRUE(at::equal(flat.narrow(0, 15, 3), at::full({3}, 7.0f)));
  // Bound again: the next backward pass lands in the buffer.
  Loss(m, 2).backward();
  torch::nn::Linear reference = MakeLinear();
  Loss(reference, 2).backward();
  const at::Tensor expected = Concat(reference->parameters());
  EXPECT_TRUE(at::allclose(grads.Bind().narrow(0, 0, 15), expected.narrow(0, 0, 15), 1e-6, 1e-6));
  EXPECT_TRUE(
      at::allclose(grads.Bind().narrow(0, 15, 3), expected.narrow(0, 15, 3) + 7, 1e-6, 1e-6));
}

TEST(FlatGradients, ZeroClearsEveryGradientAndKeepsThemBound) {
  torch::nn::Linear m = MakeLinear();
  auto params = m->parameters();
  FlatGradients grads(params);
  Loss(m, 1).backward();
  params[1].mutable_grad() = at::ones({3});
  grads.Zero();
  for (const auto& p : params) EXPECT_TRUE(at::equal(p.grad(), at::zeros_like(p)));
  EXPECT_TRUE(at::equal(grads.Bind(), at::zeros({18})));
  Loss(m, 1).backward();
  torch::nn::Linear reference = MakeLinear();
  Loss(reference, 1).backward();
  EXPECT_TRUE(at::allclose(grads.Bind(), Concat(reference->parameters()), 1e-6, 1e-6));
}

TEST(FlatGradients, AllFiniteFindsInfinitiesAndNaNsButNotLargeValues) {
  at::Tensor a = at::zeros({4}).requires_grad_(), b = at::zeros({2}).requires_grad_();
  FlatGradients grads({a, b});
  EXPECT_TRUE(grads.AllFinite());
  // Their float32 sum overflows; they are finite all the same.
  a.mutable_grad().fill_(std::numeric_limits<float>::max());
  EXPECT_TRUE(grads.AllFinite());
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    grads.Zero();
    b.mutable_grad()[1] = bad;
    EXPECT_FALSE(grads.AllFinite()) << bad;
  }
  // +inf and -inf together (a sum of NaN) too.
  grads.Zero();
  a.mutable_grad()[0] = std::numeric_limits<float>::infinity();
  b.mutable_grad()[0] = -std::numeric_limits<float>::infinity();
  EXPECT_FALSE(grads.AllFinite());
}

}  // namespace
}  // namespace colony::train
