// Encoding on a tensor's device (runtime/device_codec.h) gives compression::Encode's bytes for
// the same values, byte for byte: fp16, bf16 and blockwise8, with the values where the formats'
// rules show (rounding ties, subnormals, saturation, infinities, NaN codes, tiny and zero
// blocks, a partial last block). Built twice: on the CPU (the same tensor operations a GPU runs)
// and, as device_codec_gpu_test (label gpu), on a GPU where one is usable.
#include "runtime/device_codec.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "model/device.h"
#include "runtime/tensor_io.h"

#ifndef COLONY_TEST_DEVICE
#define COLONY_TEST_DEVICE "cpu"
#endif

namespace colony::runtime {
namespace {

using compression::Codec;

c10::Device TestDevice() { return c10::Device(COLONY_TEST_DEVICE); }

bool Usable() { return TestDevice().is_cpu() || model::CudaAvailable(); }

// Values that exercise every rule of the three formats, then random ones at several scales.
std::vector<float> EdgeValues(bool with_nan) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f,        -0.0f,       1.0f,    -1.0f,    65504.0f,   65519.0f,
                          65520.0f,    -70000.0f,   1e30f,   -3.4e38f, 3.39e38f,   inf,
                          -inf,        6e-8f,       3e-8f,   2.98e-8f, 1e-40f,     -5.9604645e-8f,
                          1.00048828f, 1.00146484f, 2049.0f, 2051.0f,  0.33333334f};
  if (with_nan) v.push_back(std::nanf(""));
  at::manual_seed(9);
  for (double scale : {1e-3, 1.0, 1e4}) {
    const at::Tensor r = at::randn({3000}) * scale;
    v.insert(v.end(), r.data_ptr<float>(), r.data_ptr<float>() + r.numel());
  }
  return v;
}

Bytes HostEncoding(const std::vector<float>& v, Codec codec, const compression::CodecOptions& o) {
  Bytes out;
  EXPECT_TRUE(compression::Encode(codec, std::span<const float>(v), out, o).ok());
  return out;
}

Bytes DeviceEncoding(const std::vector<float>& v, Codec codec, const compression::CodecOptions& o) {
  const at::Tensor t =
      at::from_blob(const_cast<float*>(v.data()), {static_cast<int64_t>(v.size())}, at::kFloat)
          .clone()
          .to(TestDevice());
  auto bytes = EncodeOnDevice(t, codec, o);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? **bytes : Bytes();
}

TEST(DeviceCodec, HalfPrecisionBytesEqualTheHostEncoders) {
  if (!Usable()) GTEST_SKIP() << "no GPU is usable here";
  // NaN payload bits are the one thing the formats leave to the converter.
  const std::vector<float> v = EdgeValues(/*with_nan=*/false);
  for (Codec codec : {Codec::kFloat16, Codec::kBFloat16}) {
    SCOPED_TRACE(compression::CodecName(codec));
    EXPECT_EQ(DeviceEncoding(v, codec, {}), HostEncoding(v, codec, {}));
  }
}

TEST(DeviceCodec, Blockwise8BytesEqualTheHostEncoder) {
  if (!Usable()) GTEST_SKIP() << "no GPU is usable here";
  std::vector<float> v = EdgeValues(/*with_nan=*/true);
  // A block of tiny values (scale below 2^-60), a block of zeros, one of non-finite values only.
  for (int i = 0; i < 64; ++i) v.push_back(static_cast<float>(i - 32) * 1e-20f);
  v.insert(v.end(), 64, 0.0f);
  for (int i = 0; i < 64; ++i) {
    v.push_back(i % 2 ? std::numeric_limits<float>::infinity() : std::nanf(""));
  }
  for (uint32_t block : {16u, 64u, 4096u}) {
    SCOPED_TRACE(block);
    const compression::CodecOptions o{.block_size = block};
    EXPECT_EQ(DeviceEncoding(v, Codec::kBlockwise8, o), HostEncoding(v, Codec::kBlockwise8, o));
  }
  // Empty input: the header alone.
  EXPECT_EQ(DeviceEncoding({}, Codec::kBlockwise8, {}), HostEncoding({}, Codec::kBlockwise8, {}));
}

// A NaN's bits are the converter's (sign and payload), but it decodes to a NaN.
TEST(DeviceCodec, NaNDecodesToNaN) {
  if (!Usable()) GTEST_SKIP() << "no GPU is usable here";
  const std::vector<float> v = {1.0f, std::nanf(""), -std::nanf(""), 2.0f};
  for (Codec codec : {Codec::kFloat16, Codec::kBFloat16}) {
    SCOPED_TRACE(compression::CodecName(codec));
    std::vector<float> back(v.size());
    ASSERT_TRUE(compression::Decode(DeviceEncoding(v, codec, {}), back).ok());
    EXPECT_EQ(back[0], 1.0f);
    EXPECT_TRUE(std::isnan(back[1]) && std::isnan(back[2]));
    EXPECT_EQ(back[3], 2.0f);
  }
}

TEST(DeviceCodec, OtherCodecsAndBadInputsAreRefused) {
  const at::Tensor x = at::randn({8});
  EXPECT_FALSE(EncodeOnDevice(x, Codec::kTopK, {}).ok());
  EXPECT_FALSE(EncodeOnDevice(x, Codec::kQuantile8, {}).ok());
  EXPECT_FALSE(EncodeOnDevice(at::ones({8}, at::kInt), Codec::kFloat16, {}).ok());
  EXPECT_FALSE(EncodeOnDevice(x, Codec::kBlockwise8, {.block_size = 3}).ok());
}

// A frame of a large tensor on the test device decodes to the values its codec keeps.
TEST(DeviceCodec, AFrameOfADeviceTensorDecodesAsTheHostsDoes) {
  if (TestDevice().is_cpu()) GTEST_SKIP() << "ToFrame encodes a CPU tensor on the host";
  if (!Usable()) GTEST_SKIP() << "no GPU is usable here";
  const at::Tensor x = at::randn({2, kDeviceEncodeMinElements});
  for (Codec codec : {Codec::kFloat16, Codec::kBlockwise8}) {
    SCOPED_TRACE(compression::CodecName(codec));
    auto on_device = ToFrame(x.to(TestDevice()), codec);
    auto on_host = ToFrame(x, codec);
    ASSERT_TRUE(on_device.ok() && on_host.ok());
    EXPECT_EQ(on_device->shape, on_host->shape);
    auto a = FromFrame(*on_device, {.allowed_codecs = {codec}});
    auto b = FromFrame(*on_host, {.allowed_codecs = {codec}});
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
    EXPECT_TRUE(at::equal(*a, *b));
  }
}

}  // namespace
}  // namespace colony::runtime
