#include "core/base58.h"

#include <array>

namespace colony {
namespace {
constexpr char kAlphabet[] = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";
constexpr size_t kMaxTextLen = 256;

constexpr std::array<int8_t, 128> MakeIndex() {
  std::array<int8_t, 128> idx{};
  for (auto& v : idx) v = -1;
  for (int i = 0; i < 58; ++i) idx[static_cast<size_t>(kAlphabet[i])] = static_cast<int8_t>(i);
  return idx;
}
constexpr auto kIndex = MakeIndex();
}  // namespace

std::string Base58Encode(ByteSpan bytes) {
  size_t zeros = 0;
  while (zeros < bytes.size() && bytes[zeros] == 0) ++zeros;
  // log(256)/log(58) ~ 1.366
  std::vector<uint8_t> digits((bytes.size() - zeros) * 138 / 100 + 1, 0);
  size_t len = 0;
  for (size_t i = zeros; i < bytes.size(); ++i) {
    int carry = bytes[i];
    size_t j = 0;
    for (auto it = digits.rbegin(); (carry != 0 || j < len) && it != digits.rend(); ++it, ++j) {
      carry += 256 * (*it);
      *it = static_cast<uint8_t>(carry % 58);
      carry /= 58;
    }
    len = j;
  }
  std::string out(zeros, '1');
  for (size_t i = digits.size() - len; i < digits.size(); ++i) out.push_back(kAlphabet[digits[i]]);
  return out;
}

Result<Bytes> Base58Decode(std::string_view text) {
  if (text.size() > kMaxTextLen) {
    return InvalidArgument("base58 text is " + std::to_string(text.size()) +
                           " characters; at most " + std::to_string(kMaxTextLen) + " are accepted");
  }
  size_t zeros = 0;
  while (zeros < text.size() && text[zeros] == '1') ++zeros;
  std::vector<uint8_t> bytes(text.size() * 733 / 1000 + 1, 0);  // log(58)/log(256)
  size_t len = 0;
  for (size_t i = zeros; i < text.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    int digit = c < 128 ? kIndex[c] : -1;
    if (digit < 0) {
      std::string shown = c >= 0x20 && c < 0x7f ? std::string(1, static_cast<char>(c))
                                                : "\\x" + HexEncode(ByteSpan(&c, 1));
      return InvalidArgument("invalid base58 character '" + shown + "' at position " +
                             std::to_string(i));
    }
    int carry = digit;
    size_t j = 0;
    for (auto it = bytes.rbegin(); (carry != 0 || j < len) && it != bytes.rend(); ++it, ++j) {
      carry += 58 * (*it);
      *it = static_cast<uint8_t>(carry % 256);
      carry /= 256;
    }
    len = j;
  }
  Bytes out(zeros, 0);
  out.insert(out.end(), bytes.end() - static_cast<ptrdiff_t>(len), bytes.end());
  return out;
}

}  // namespace colony
