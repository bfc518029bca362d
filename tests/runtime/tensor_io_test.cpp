// Tensor frames with codecs (runtime/tensor_io.h): what a compressed frame decodes to, checked
// against the values encoded (the 8-bit codec's error bound computed here, per block), and what a
// hostile peer's frames are refused for.
#include "runtime/tensor_io.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "compression/codec.h"

namespace colony::runtime {
namespace {

using compression::Codec;

TEST(TensorFrames, EightBitFramesDecodeWithinTheirErrorBound) {
  at::manual_seed(5);
  const at::Tensor x = at::randn({3, 7, 64}) * 3;
  auto frame = ToFrame(x, Codec::kBlockwise8, {.block_size = 256, .max_threads = 1});
  ASSERT_TRUE(frame.ok()) << frame.status().ToString();
  EXPECT_EQ(frame->codec, static_cast<uint8_t>(Codec::kBlockwise8));
  EXPECT_LT(frame->data.size(), x.numel() * 4 / 3);  // about a quarter of float32's bytes
  auto back = FromFrame(*frame, {.allowed_codecs = {Codec::kBlockwise8}});
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->sizes().equals(x.sizes()));
  // Each block of 256 values is scaled by its largest magnitude into 127 steps: the error is at
  // most half a step (plus float rounding).
  const at::Tensor flat = x.reshape({-1}), got = back->reshape({-1});
  for (int64_t start = 0; start < flat.numel(); start += 256) {
    const auto block = flat.slice(0, start, std::min<int64_t>(start + 256, flat.numel()));
    const double step = block.abs().max().item<double>() / 127;
    const double err =
        (got.slice(0, start, start + block.numel()) - block).abs().max().item<double>();
    EXPECT_LE(err, 0.5 * step * 1.0001 + 1e-7) << "block at " << start;
  }
  // fp16 and raw frames too.
  auto half = ToFrame(x, Codec::kFloat16);
  ASSERT_TRUE(half.ok());
  auto h = FromFrame(*half, {.allowed_codecs = {Codec::kFloat16}});
  ASSERT_TRUE(h.ok());
  EXPECT_LE((*h - x).abs().max().item<double>(), 3e-3 * x.abs().max().item<double>());
  auto raw = ToFrame(x, Codec::kNone);
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->codec, 0);
  EXPECT_TRUE(at::equal(*FromFrame(*raw), x));
}

TEST(TensorFrames, CompressedFramesAreRefusedUnlessAskedForAndWhenTheyLie) {
  const at::Tensor x = at::randn({4, 300});
  auto frame = ToFrame(x, Codec::kBlockwise8);
  ASSERT_TRUE(frame.ok());
  auto message = [](const Result<at::Tensor>& r) {
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.status().message();
  };
  // A receiver that did not name the codec.
  EXPECT_NE(message(FromFrame(*frame)).find("not accepted"), std::string::npos);
  EXPECT_NE(message(FromFrame(*frame, {.allowed_codecs = {Codec::kFloat16}})).find("not accepted"),
            std::string::npos);
  // A codec id that names nothing.
  net::TensorFrame bad = *frame;
  bad.codec = 200;
  EXPECT_NE(message(FromFrame(bad, {.allowed_codecs = {Codec::kBlockwise8}})).find("not accepted"),
            std::string::npos);
  // The frame says 8-bit, its bytes are top-k (a few bytes that would decode to anything).
  auto topk = ToFrame(x, Codec::kTopK);
  ASSERT_TRUE(topk.ok());
  bad = *topk;
  bad.codec = static_cast<uint8_t>(Codec::kBlockwise8);
  EXPECT_NE(message(FromFrame(bad, {.allowed_codecs = {Codec::kBlockwise8}})).find("carries"),
            std::string::npos);
  // A shape of more values than the encoding holds, and one over the receiver's limit.
  bad = *frame;
  bad.shape = {4, 301};
  EXPECT_NE(message(FromFrame(bad, {.allowed_codecs = {Codec::kBlockwise8}})).find("carries"),
            std::string::npos);
  bad.shape = {1 << 20, 1 << 10};
  auto huge = FromFrame(bad, {.max_elements = 1 << 24, .allowed_codecs = {Codec::kBlockwise8}});
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
  // Truncated bytes, and a compressed frame that claims another dtype.
  bad = *frame;
  bad.data = bad.data.subspan(0, bad.data.size() - 10);
  EXPECT_FALSE(FromFrame(bad, {.allowed_codecs = {Codec::kBlockwise8}}).ok());
  bad = *frame;
  bad.dtype = DType::kFloat16;
  EXPECT_NE(message(FromFrame(bad, {.allowed_codecs = {Codec::kBlockwise8}})).find("float32"),
            std::string::npos);
  // Integers are not sent through a float codec.
  EXPECT_FALSE(ToFrame(at::arange(10, at::kLong), Codec::kBlockwise8).ok());
}

}  // namespace
}  // namespace colony::runtime
