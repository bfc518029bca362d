// Tests of core/bytes.h (byte buffers, little-endian and varint fields) and core/tensor.h.
#include "core/bytes.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace colony {
namespace {

TEST(BytesTest, HexEncode) {
  EXPECT_EQ(HexEncode(ByteSpan()), "");
  EXPECT_EQ(HexEncode(Bytes{0x00, 0x0f, 0xa0, 0xff}), "000fa0ff");
}

TEST(BytesTest, AsBytesAndBack) {
  std::string_view s("a\0b", 3);
  ByteSpan b = AsBytes(s);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0], 'a');
  EXPECT_EQ(b[1], 0);
  EXPECT_EQ(AsStringView(b), s);
}

TEST(BytesTest, ReserveRawKeepsTheContentsAndAtLeastDoubles) {
  RawBuffer b;
  ReserveRaw(b, 0);
  EXPECT_TRUE(b.empty());
  for (int i = 0; i < 1000; ++i) b.push_back(static_cast<uint8_t>(i * 7));
  const size_t before = b.capacity();
  ReserveRaw(b, before);  // already enough: nothing moves
  EXPECT_EQ(b.capacity(), before);
  const uint8_t* old = b.data();
  ReserveRaw(b, before + 1);
  EXPECT_NE(b.data(), old);
  EXPECT_GE(b.capacity(), 2 * before);
  ReserveRaw(b, 10 * before);
  EXPECT_GE(b.capacity(), 10 * before);
  ASSERT_EQ(b.size(), 1000u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(b[i], static_cast<uint8_t>(i * 7)) << i;
}

TEST(ByteWriterTest, LittleEndianLayout) {
  Bytes out;
  ByteWriter w(out);
  w.U8(0xab);
  w.U16(0x0102);
  w.U32(0x03040506);
  w.U64(0x0708090a0b0c0d0eULL);
  // U8 | U16 | U32 | U64, each least significant byte first.
  EXPECT_EQ(HexEncode(out), std::string("ab") + "0201" + "06050403" + "0e0d0c0b0a090807");
}

TEST(ByteWriterTest, VarintLayout) {
  auto enc = [](uint64_t v) {
    Bytes out;
    ByteWriter(out).Varint(v);
    return HexEncode(out);
  };
  EXPECT_EQ(enc(0), "00");
  EXPECT_EQ(enc(1), "01");
  EXPECT_EQ(enc(127), "7f");
  EXPECT_EQ(enc(128), "8001");
  EXPECT_EQ(enc(300), "ac02");
  EXPECT_EQ(enc(16383), "ff7f");
  EXPECT_EQ(enc(16384), "808001");
  EXPECT_EQ(enc(UINT64_MAX), "ffffffffffffffffff01");
}

TEST(ByteWriterTest, RawAppends) {
  Bytes out{1};
  ByteWriter w(out);
  w.Raw(Bytes{2, 3});
  w.Raw(std::string_view("xy"));
  EXPECT_EQ(out, (Bytes{1, 2, 3, 'x', 'y'}));
}

TEST(ByteReaderTest, RoundTripOfEveryFieldType) {
  const uint64_t varints[] = {0,          1,          127,        128,
                              300,        16383,      16384,      (1u << 21),
                              UINT32_MAX, 1ULL << 35, 1ULL << 63, UINT64_MAX - 1,
                              UINT64_MAX};
  Bytes buf;
  ByteWriter w(buf);
  w.U8(0);
  w.U8(255);
  w.U16(0);
  w.U16(65535);
  w.U16(0x1234);
  w.U32(0xdeadbeef);
  w.U32(UINT32_MAX);
  w.U64(0x0123456789abcdefULL);
  w.U64(UINT64_MAX);
  for (uint64_t v : varints) w.Varint(v);
  w.Raw(std::string_view("tail"));

  ByteReader r(buf);
  EXPECT_EQ(r.U8(), 0);
  EXPECT_EQ(r.U8(), 255);
  EXPECT_EQ(r.U16(), 0);
  EXPECT_EQ(r.U16(), 65535);
  EXPECT_EQ(r.U16(), 0x1234);
  EXPECT_EQ(r.U32(), 0xdeadbeefu);
  EXPECT_EQ(r.U32(), UINT32_MAX);
  EXPECT_EQ(r.U64(), 0x0123456789abcdefULL);
  EXPECT_EQ(r.U64(), UINT64_MAX);
  for (uint64_t v : varints) EXPECT_EQ(r.Varint(), v);
  EXPECT_EQ(r.remaining(), 4u);
  EXPECT_EQ(AsStringView(r.Raw(4)), "tail");
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.remaining(), 0u);
  EXPECT_EQ(r.position(), buf.size());
}

TEST(ByteReaderTest, RandomVarintRoundTrips) {
  std::mt19937_64 rng(99);
  for (int i = 0; i < 5000; ++i) {
    uint64_t v = rng() >> (rng() % 64);
    Bytes buf;
    ByteWriter(buf).Varint(v);
    ASSERT_LE(buf.size(), 10u);
    ByteReader r(buf);
    ASSERT_EQ(r.Varint(), v);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r.remaining(), 0u);
  }
}

TEST(ByteReaderTest, VarintOfUint64MaxRoundTrips) {
  Bytes buf;
  ByteWriter(buf).Varint(UINT64_MAX);
  ASSERT_EQ(buf.size(), 10u);
  ByteReader r(buf);
  EXPECT_EQ(r.Varint(), UINT64_MAX);
  EXPECT_TRUE(r.ok());
}

TEST(ByteReaderTest, RejectsElevenByteVarint) {
  Bytes buf(10, 0x80);
  buf.push_back(0x00);
  ByteReader r(buf);
  EXPECT_EQ(r.Varint(), 0u);
  EXPECT_FALSE(r.ok());
}

TEST(ByteReaderTest, RejectsVarintOverflowingSixtyFourBits) {
  // Tenth byte may only carry bit 63.
  Bytes buf(9, 0xff);
  buf.push_back(0x02);
  ByteReader r(buf);
  r.Varint();
  EXPECT_FALSE(r.ok());

  Bytes buf2(9, 0xff);
  buf2.push_back(0x7f);
  ByteReader r2(buf2);
  r2.Varint();
  EXPECT_FALSE(r2.ok());
}

TEST(ByteReaderTest, TruncatedVarintFails) {
  Bytes buf{0x80, 0x80};
  ByteReader r(buf);
  EXPECT_EQ(r.Varint(), 0u);
  EXPECT_FALSE(r.ok());
}

TEST(ByteReaderTest, TruncatedInputFailsAndStaysFailed) {
  Bytes buf{1, 2, 3};
  ByteReader r(buf);
  EXPECT_EQ(r.U16(), 0x0201);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.U32(), 0u);  // only one byte left
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.remaining(), 0u);
  // Every later read fails too, even one that would fit in the remaining byte.
  EXPECT_EQ(r.U8(), 0);
  EXPECT_EQ(r.Varint(), 0u);
  EXPECT_TRUE(r.Raw(0).empty());
  EXPECT_TRUE(r.Rest().empty());
  EXPECT_FALSE(r.ok());
}

TEST(ByteReaderTest, EachFieldTypeFailsOnShortInput) {
  for (size_t have = 0; have < 8; ++have) {
    Bytes buf(have, 0x11);
    if (have < 2) {
      ByteReader r(buf);
      r.U16();
      EXPECT_FALSE(r.ok()) << have;
    }
    if (have < 4) {
      ByteReader r(buf);
      r.U32();
      EXPECT_FALSE(r.ok()) << have;
    }
    ByteReader r(buf);
    r.U64();
    EXPECT_FALSE(r.ok()) << have;
  }
  ByteReader empty{ByteSpan()};
  empty.U8();
  EXPECT_FALSE(empty.ok());
}

TEST(ByteReaderTest, RawBoundsAreChecked) {
  Bytes buf{1, 2, 3, 4};
  ByteReader r(buf);
  EXPECT_EQ(r.Raw(2).size(), 2u);
  EXPECT_TRUE(r.Raw(3).empty());
  EXPECT_FALSE(r.ok());

  ByteReader huge(buf);
  EXPECT_TRUE(huge.Raw(std::numeric_limits<size_t>::max()).empty());
  EXPECT_FALSE(huge.ok());
}

TEST(ByteReaderTest, RestTakesEverythingLeft) {
  Bytes buf{1, 2, 3, 4};
  ByteReader r(buf);
  r.U8();
  ByteSpan rest = r.Rest();
  EXPECT_EQ(rest.size(), 3u);
  EXPECT_EQ(rest[0], 2);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.remaining(), 0u);
  EXPECT_TRUE(r.Rest().empty());
  EXPECT_TRUE(r.ok());  // an empty Rest() is not a failure
}

TEST(TensorTest, DTypeSizes) {
  EXPECT_EQ(DTypeSize(DType::kUInt8), 1u);
  EXPECT_EQ(DTypeSize(DType::kInt8), 1u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  EXPECT_EQ(DTypeSize(DType::kInt16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kInt32), 4u);
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeSize(DType::kInt64), 8u);
  EXPECT_EQ(DTypeSize(DType::kFloat64), 8u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(0)), 0u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(11)), 0u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(255)), 0u);
}

TEST(TensorTest, DTypeNames) {
  EXPECT_EQ(DTypeName(DType::kFloat32), "float32");
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(DTypeName(DType::kBool), "bool");
  EXPECT_EQ(DTypeName(static_cast<DType>(200)), "unknown");
}

TEST(TensorTest, DTypeFromWireAcceptsExactlyTheKnownValues) {
  // The numbering is part of the wire format.
  EXPECT_EQ(static_cast<int>(DType::kUInt8), 1);
  EXPECT_EQ(static_cast<int>(DType::kFloat32), 8);
  EXPECT_EQ(static_cast<int>(DType::kBool), 10);
  for (int v = 0; v < 256; ++v) {
    auto d = DTypeFromWire(static_cast<uint8_t>(v));
    if (v >= 1 && v <= 10) {
      ASSERT_TRUE(d.has_value()) << v;
      EXPECT_EQ(static_cast<int>(*d), v);
      EXPECT_GT(DTypeSize(*d), 0u) << v;
      EXPECT_NE(DTypeName(*d), "unknown") << v;
    } else {
      EXPECT_FALSE(d.has_value()) << v;
    }
  }
}

std::optional<uint64_t> Num(std::vector<int64_t> shape) { return TensorView::NumElements(shape); }

TEST(TensorTest, NumElements) {
  EXPECT_EQ(Num({}), 1u);  // a scalar
  EXPECT_EQ(Num({7}), 7u);
  EXPECT_EQ(Num({2, 3, 4}), 24u);
  EXPECT_EQ(Num({0}), 0u);
  EXPECT_EQ(Num({5, 0, 3}), 0u);
  EXPECT_EQ(Num({int64_t{1} << 32, int64_t{1} << 31}), uint64_t{1} << 63);
}

TEST(TensorTest, NumElementsRejectsNegativeDims) {
  EXPECT_FALSE(Num({-1}).has_value());
  EXPECT_FALSE(Num({2, -3}).has_value());
  EXPECT_FALSE(Num({0, -1}).has_value());
  EXPECT_FALSE(Num({std::numeric_limits<int64_t>::min()}).has_value());
}

TEST(TensorTest, NumElementsRejectsOverflow) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_FALSE(Num({int64_t{1} << 32, int64_t{1} << 32}).has_value());
  EXPECT_FALSE(Num({kMax, kMax}).has_value());
  EXPECT_FALSE(Num({kMax, 3}).has_value());
  EXPECT_EQ(Num({kMax, 2}), static_cast<uint64_t>(kMax) * 2);
  EXPECT_FALSE(Num({1 << 20, 1 << 20, 1 << 20, 1 << 20}).has_value());
}

TEST(TensorTest, NumElementsDoesNotDependOnTheOrderOfDims) {
  // An empty tensor is empty whatever its other dimensions.
  constexpr int64_t kBig = int64_t{1} << 40;
  EXPECT_EQ(Num({0, kBig, kBig}), 0u);
  EXPECT_EQ(Num({kBig, kBig, 0}), 0u);
  EXPECT_EQ(Num({kBig, 0, kBig}), 0u);
  // ... but a negative dimension is always an error.
  EXPECT_FALSE(Num({0, kBig, -1}).has_value());
}

}  // namespace
}  // namespace colony
