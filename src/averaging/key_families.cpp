#include "averaging/key_families.h"

#include "averaging/ban_evidence.h"
#include "averaging/wire.h"

namespace colony::averaging {
namespace {

constexpr std::string_view kGroupInfix = ".0b";
constexpr size_t kMaxGroupBits = 32;  // CheckGroupBits
constexpr std::string_view kStateSuffix = ".state";
constexpr std::string_view kBansSuffix = ".bans";

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

dht::KeyFamily BanListFamily() {
  return {.name = "averaging bans",
          .matches =
              [](std::string_view key) {
                return key.size() > kBansSuffix.size() && key.ends_with(kBansSuffix);
              },
          // Structure only: the evidence's signatures and numbers are checked by the readers
          // (a bounded number per reading), not on every store and lookup.
          .check = [](std::string_view, const PeerId&, std::string_view value) -> Status {
            COLONY_ASSIGN_OR_RETURN(auto bans, DecodeBanList(value));
            for (const BanEvidence& b : bans.evidence) {
              COLONY_RETURN_IF_ERROR(DecodeVerifyStatement(b.statement, kMaxGroupSize).status());
            }
            return {};
          }};
}

std::vector<dht::KeyFamily> AveragingKeyFamilies() {
  return {GroupKeyFamily(), StateAdvertFamily(), BanListFamily()};
}

}  // namespace colony::averaging
