// --device names: what each means, and the errors for devices Colony cannot use.
#include "model/device.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <vector>

namespace colony::model {
namespace {

TEST(Device, CpuAndAutoAlwaysWork) {
  auto cpu = ParseDevice("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_TRUE(cpu->is_cpu());
  auto automatic = ParseDevice("auto");
  ASSERT_TRUE(automatic.ok()) << automatic.status().ToString();
  EXPECT_EQ(automatic->is_cuda(), CudaAvailable());
}

TEST(Device, UnknownNamesAndBadIndicesAreRefusedByName) {
  for (const char* name :
       {"gpu", "CUDA", "tpu", "", "cuda:", "cuda:-1", "cuda:x", "cuda:0x", "cuda:1000", "cpu:0"}) {
    auto d = ParseDevice(name);
    ASSERT_FALSE(d.ok()) << name;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(d.status().message().find(std::string("'") + name + "'"), std::string::npos)
        << d.status().ToString();
  }
}

TEST(Device, CudaWithoutAUsableGpuSaysWhyInsteadOfFallingBackToTheCpu) {
  if (CudaAvailable()) GTEST_SKIP() << "a GPU is usable here";
  for (const char* name : {"cuda", "cuda:0", "cuda:3"}) {
    auto d = ParseDevice(name);
    ASSERT_FALSE(d.ok()) << name;
    EXPECT_EQ(d.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(d.status().message().find("no CUDA device is usable"), std::string::npos)
        << d.status().ToString();
  }
}

TEST(Device, AnIndexPastTheLastGpuIsRefused) {
  if (!CudaAvailable()) GTEST_SKIP() << "no GPU is usable here";
  auto d = ParseDevice("cuda:255");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("only"), std::string::npos) << d.status().ToString();
  auto first = ParseDevice("cuda:0");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->is_cuda());
}

TEST(Device, DeviceOfAModuleIsItsParameters) {
  torch::nn::Linear linear(3, 2);
  EXPECT_TRUE(DeviceOf(*linear).is_cpu());
  EXPECT_EQ(DeviceOf(*linear).str(), "cpu");
  if (CudaAvailable()) {
    linear->to(c10::Device(c10::kCUDA, 0));
    EXPECT_EQ(DeviceOf(*linear).str(), "cuda:0");
  }
}

// ToDevice stages a host tensor in pinned memory and copies it to a GPU without waiting: the
// result must hold the values the source had at the call even when the source is overwritten or
// freed at once (a copy that read pageable memory later would see zeros or freed memory). On the
// tensor's own device it is Tensor::to: the same tensor.
TEST(Device, ToDeviceCopiesTheValuesAtTheCallAndConvertsTheDtype) {
  const at::Tensor expected = at::randn({1 << 20});
  EXPECT_TRUE(ToDevice(expected, c10::Device(c10::kCPU)).is_same(expected));
  EXPECT_TRUE(at::equal(ToDevice(expected, c10::Device(c10::kCPU), at::kBFloat16),
                        expected.to(at::kBFloat16)));
  if (!CudaAvailable()) GTEST_SKIP() << "no GPU is usable here";
  const c10::Device gpu(c10::kCUDA, 0);
  at::Tensor source = expected.clone();
  const at::Tensor copied = ToDevice(source, gpu);
  source.zero_();
  auto buffer = std::make_unique<std::vector<float>>(expected.data_ptr<float>(),
                                                     expected.data_ptr<float>() + (1 << 20));
  const at::Tensor from_buffer = ToDevice(at::from_blob(buffer->data(), {1 << 20}), gpu);
  buffer.reset();
  const at::Tensor converted = ToDevice(expected, gpu, at::kBFloat16);
  EXPECT_EQ(copied.device(), gpu);
  EXPECT_EQ(converted.device(), gpu);
  EXPECT_EQ(converted.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(copied.cpu(), expected));
  EXPECT_TRUE(at::equal(from_buffer.cpu(), expected));
  EXPECT_TRUE(at::equal(converted.cpu(), expected.to(at::kBFloat16)));
}

}  // namespace
}  // namespace colony::model
