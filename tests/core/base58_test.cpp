#include "core/base58.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

namespace colony {
namespace {

Bytes FromHex(std::string_view hex) {
  Bytes out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<uint8_t>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

struct Vector {
  const char* hex;
  const char* text;
};

// Bitcoin Core's src/test/data/base58_encode_decode.json.
constexpr Vector kBitcoinVectors[] = {
    {"", ""},
    {"61", "2g"},
    {"626262", "a3gV"},
    {"636363", "aPEr"},
    {"73696d706c792061206c6f6e6720737472696e67", "2cFupjhnEsSn59qHXstmK2ffpLv2"},
    {"00eb15231dfceb60925886b67d065299925915aeb172c06647", "1NS17iag9jJgTHD1VXjvLCEnZuQ3rJDE9L"},
    {"516b6fcd0f", "ABnLTmg"},
    {"bf4f89001e670274dd", "3SEo3LWLoPntC"},
    {"572e4794", "3EFU7m"},
    {"ecac89cad93923c02321", "EJDM8drfXA6uyA"},
    {"10c8511e", "Rt5zm"},
    {"00000000000000000000", "1111111111"},
};

TEST(Base58Test, BitcoinVectorsEncode) {
  for (const auto& v : kBitcoinVectors) {
    EXPECT_EQ(Base58Encode(FromHex(v.hex)), v.text) << "hex " << v.hex;
  }
}

TEST(Base58Test, BitcoinVectorsDecode) {
  for (const auto& v : kBitcoinVectors) {
    auto decoded = Base58Decode(v.text);
    ASSERT_TRUE(decoded.ok()) << v.text << ": " << decoded.status().ToString();
    EXPECT_EQ(HexEncode(*decoded), v.hex) << "text " << v.text;
  }
}

TEST(Base58Test, HelloWorld) {
  EXPECT_EQ(Base58Encode(AsBytes("hello world")), "StV1DL6CwTryKyV");
  auto decoded = Base58Decode("StV1DL6CwTryKyV");
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(AsStringView(*decoded), "hello world");
}

TEST(Base58Test, LeadingZeroBytesBecomeOnes) {
  EXPECT_EQ(Base58Encode(Bytes{0}), "1");
  EXPECT_EQ(Base58Encode(Bytes{0, 0, 0}), "111");
  EXPECT_EQ(Base58Encode(Bytes{0, 0, 0x61}), "112g");
  auto decoded = Base58Decode("112g");
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, (Bytes{0, 0, 0x61}));
  decoded = Base58Decode("1");
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, Bytes{0});
}

TEST(Base58Test, SingleBytes) {
  // Exercises every carry path of the single-digit conversions.
  for (int b = 0; b < 256; ++b) {
    Bytes in{static_cast<uint8_t>(b)};
    std::string text = Base58Encode(in);
    auto back = Base58Decode(text);
    ASSERT_TRUE(back.ok()) << b;
    EXPECT_EQ(*back, in) << b;
  }
  EXPECT_EQ(Base58Encode(Bytes{57}), "z");
  EXPECT_EQ(Base58Encode(Bytes{58}), "21");
  EXPECT_EQ(Base58Encode(Bytes{255}), "5Q");
}

TEST(Base58Test, RandomRoundTrips) {
  std::mt19937_64 rng(12345);
  for (int iter = 0; iter < 2000; ++iter) {
    size_t len = rng() % 120;
    Bytes in(len);
    for (auto& b : in) b = static_cast<uint8_t>(rng());
    // Sometimes force leading zero bytes.
    size_t zeros = iter % 5 == 0 ? std::min<size_t>(len, rng() % 4) : 0;
    for (size_t i = 0; i < zeros; ++i) in[i] = 0;
    std::string text = Base58Encode(in);
    ASSERT_LE(text.size(), 256u);
    auto back = Base58Decode(text);
    ASSERT_TRUE(back.ok()) << text << ": " << back.status().ToString();
    ASSERT_EQ(*back, in) << text;
    // Re-encoding the decoded bytes gives the same text.
    ASSERT_EQ(Base58Encode(*back), text);
  }
}

TEST(Base58Test, AllZeroAndAllFFBuffers) {
  for (size_t len : {1u, 2u, 31u, 32u, 38u, 100u}) {
    Bytes zeros(len, 0);
    EXPECT_EQ(Base58Encode(zeros), std::string(len, '1'));
    Bytes ff(len, 0xff);
    auto back = Base58Decode(Base58Encode(ff));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, ff);
  }
}

void ExpectRejected(std::string_view text, std::string_view shown, size_t position) {
  auto r = Base58Decode(text);
  ASSERT_FALSE(r.ok()) << text;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("'" + std::string(shown) + "'"), std::string::npos) << m;
  EXPECT_NE(m.find("position " + std::to_string(position)), std::string::npos) << m;
}

TEST(Base58Test, RejectsCharactersOutsideTheAlphabet) {
  ExpectRejected("0", "0", 0);
  ExpectRejected("abcO", "O", 3);
  ExpectRejected("xyIz", "I", 2);
  ExpectRejected("2gl", "l", 2);
  ExpectRejected("11+", "+", 2);  // after leading '1's
  ExpectRejected("a b", " ", 1);
  ExpectRejected("2g/", "/", 2);
}

TEST(Base58Test, RejectsNonAsciiAndControlBytesShownAsHex) {
  ExpectRejected("2g\xc3\xa9", "\\xc3", 2);
  ExpectRejected(std::string_view("ab\0c", 4), "\\x00", 2);
  ExpectRejected("a\x7f", "\\x7f", 1);
  ExpectRejected("\xff", "\\xff", 0);
}

TEST(Base58Test, RejectsOverLongInput) {
  std::string ok_text(256, '2');
  EXPECT_TRUE(Base58Decode(ok_text).ok());
  std::string long_text(257, '2');
  auto r = Base58Decode(long_text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("257"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("256"), std::string::npos) << r.status().message();
}

TEST(Base58Test, MaximumLengthAllZeros) {
  auto r = Base58Decode(std::string(256, '1'));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, Bytes(256, 0));
}

TEST(Base58Test, DecodeThenEncodeIsExact) {
  // Base58 text has a single spelling per byte string: decode->encode reproduces any valid text
  // exactly, leading '1's (zero bytes) included.
  std::mt19937_64 rng(777);
  const std::string alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";
  for (int iter = 0; iter < 1000; ++iter) {
    std::string text;
    size_t len = rng() % 80;
    for (size_t i = 0; i < len; ++i) text.push_back(alphabet[rng() % 58]);
    auto bytes = Base58Decode(text);
    ASSERT_TRUE(bytes.ok()) << text;
    ASSERT_EQ(Base58Encode(*bytes), text);
  }
}

}  // namespace
}  // namespace colony
