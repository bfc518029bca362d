// --device names: what each means, and the errors for devices Colony cannot use.
#include "model/device.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

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

}  // namespace
}  // namespace colony::model
