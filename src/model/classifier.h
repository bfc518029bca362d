// A small CNN for Fashion-MNIST (28x28 grayscale, 10 classes), the model of the collaborative
// training demos: small enough (~19k parameters) that averaging it over the network is cheap and
// a CPU trains it in seconds.
//
//   conv 1->16 5x5, ReLU, max-pool 2  -> [16, 12, 12]
//   conv 16->32 5x5, ReLU, max-pool 2 -> [32, 4, 4]
//   linear 512 -> 10
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

namespace colony::model {

class FashionClassifierImpl : public torch::nn::Module {
 public:
  static constexpr int64_t kNumClasses = 10;
  static constexpr int64_t kImageSize = 28;

  FashionClassifierImpl();
  // images [B, 1, 28, 28] float -> logits [B, 10].
  torch::Tensor forward(const torch::Tensor& images);

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(FashionClassifier);

}  // namespace colony::model
