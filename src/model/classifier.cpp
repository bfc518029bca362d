#include "model/classifier.h"

#include <ATen/ATen.h>

namespace colony::model {

FashionClassifierImpl::FashionClassifierImpl(FashionArchitecture arch) : architecture(arch) {
  if (architecture == FashionArchitecture::kLinear) {
    fc = register_module("fc", torch::nn::Linear(kImageSize * kImageSize, kNumClasses));
    return;
  }
  conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5)));
  conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5)));
  fc = register_module("fc", torch::nn::Linear(32 * 4 * 4, kNumClasses));
}

torch::Tensor FashionClassifierImpl::forward(const torch::Tensor& images) {
  if (architecture == FashionArchitecture::kLinear) return fc(images.flatten(1));
  auto h = at::max_pool2d(at::relu(conv1(images)), {2, 2});
  h = at::max_pool2d(at::relu(conv2(h)), {2, 2});
  return fc(h.flatten(1));
}

}  // namespace colony::model
