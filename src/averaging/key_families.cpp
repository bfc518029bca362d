#include "averaging/key_families.h"

#include "averaging/wire.h"

namespace colony::averaging {
namespace {

constexpr std::string_view kGroupInfix = ".0b";
constexpr size_t kMaxGroupBits = 32;  // CheckGroupBits
constexpr std::string_view kStateSuffix = ".state";

bool IsGroupKey(std::string_view key) {
  const size_t at = key.rfind(kGroupInfix);
  if (at == std::string_view::npos || at == 0) return false;
  const std::string_view bits = key.substr(at + kGroupInfix.size());
  return bits.size() <= kMaxGroupBits && bits.find_first_not_of("01") == std::string_view::npos;
}

}  // namespace

dht::KeyFamily GroupKeyFamily() {
  return {.name = "averaging group declarations",
          .matches = IsGroupKey,
          .check = [](std::string_view, const PeerId&, std::string_view value) {
            return DecodeDeclaration(value).status();
          }};
}

dht::KeyFamily StateAdvertFamily() {
  return {.name = "state donor adverts",
          .matches =
              [](std::string_view key) {
                return key.size() > kStateSuffix.size() && key.ends_with(kStateSuffix);
              },
          .check = [](std::string_view, const PeerId&,
                      std::string_view value) { return DecodeStateAdvert(value).status(); }};
}

std::vector<dht::KeyFamily> AveragingKeyFamilies() {
  return {GroupKeyFamily(), StateAdvertFamily()};
}

}  // namespace colony::averaging
