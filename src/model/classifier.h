// Classifiers for Fashion-MNIST (28x28 grayscale, 10 classes), the models of the collaborative
// training demos and tests.
//
// kCnn (default): small enough (~19k parameters) that averaging it over the network is cheap and
// a CPU trains it in seconds.
//   conv 1->16 5x5, ReLU, max-pool 2  -> [16, 12, 12]
//   conv 16->32 5x5, ReLU, max-pool 2 -> [32, 4, 4]
//   linear 512 -> 10
// kLinear: multinomial logistic regression (linear 784 -> 10, 7,850 parameters); a batch takes
// microseconds, so a swarm of it steps as fast as a swarm of GPUs would.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

namespace colony::model {

enum class FashionArchitecture { kCnn, kLinear };

class FashionClassifierImpl : public torch::nn::Module {
 public:
  static constexpr int64_t kNumClasses = 10;
  static constexpr int64_t kImageSize = 28;

  explicit FashionClassifierImpl(FashionArchitecture architecture = FashionArchitecture::kCnn);
  // images [B, 1, 28, 28] float -> logits [B, 10].
  torch::Tensor forward(const torch::Tensor& images);

  FashionArchitecture architecture;
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};  // kCnn only
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(FashionClassifier);

}  // namespace colony::model
