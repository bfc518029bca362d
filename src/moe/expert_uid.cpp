#include "moe/expert_uid.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace colony::moe {
namespace {

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

// A clipped copy of untrusted text for error messages.
std::string Shown(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 48)) out += (c >= ' ' && c < 127) ? c : '?';
  return text.size() > 48 ? out + "..." : out;
}

Result<int64_t> ParseCoordinate(std::string_view digits, std::string_view whole) {
  if (digits.empty() || digits.size() > 7 || (digits.size() > 1 && digits[0] == '0')) {
    return InvalidArgument(fmt::format(
        "expert id '{}': a coordinate must be a decimal number without leading zeros below {}",
        Shown(whole), kMaxGridSize));
  }
  int64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') {
      return InvalidArgument(fmt::format("expert id '{}': coordinate '{}' is not a number",
                                         Shown(whole), Shown(digits)));
    }
    v = v * 10 + (c - '0');
  }
  if (v >= kMaxGridSize) {
    return InvalidArgument(fmt::format("expert id '{}': coordinate {} is not below {}",
                                       Shown(whole), v, kMaxGridSize));
  }
  return v;
}

std::vector<std::string_view> Split(std::string_view text) {
  std::vector<std::string_view> parts;
  size_t begin = 0;
  for (;;) {
    const size_t at = text.find(kUidDelimiter, begin);
    if (at == std::string_view::npos) {
      parts.push_back(text.substr(begin));
      return parts;
    }
    parts.push_back(text.substr(begin, at - begin));
    begin = at + 1;
  }
}

Status CheckName(std::string_view name, std::string_view whole) {
  if (name.empty() || name.size() > 64 || (name[0] >= '0' && name[0] <= '9') ||
      !std::all_of(name.begin(), name.end(), IsNameChar)) {
    return InvalidArgument(fmt::format(
        "expert id '{}': the grid name must be 1-64 letters, digits, '_' or '-', not starting "
        "with a digit",
        Shown(whole)));
  }
  return Status::Ok();
}

Result<ExpertUid> ParseParts(std::string_view text, bool prefix) {
  if (text.size() > kMaxUidBytes) {
    return InvalidArgument(fmt::format("expert id longer than {} bytes", kMaxUidBytes));
  }
  std::vector<std::string_view> parts = Split(text);
  if (prefix) {
    if (parts.back() != "") {
      return InvalidArgument(
          fmt::format("expert prefix '{}' must end with '{}'", Shown(text), kUidDelimiter));
    }
    parts.pop_back();
  }
  if (parts.size() < 2 || parts.size() - 1 > kMaxGridDims) {
    return InvalidArgument(fmt::format("expert {} '{}' needs a grid name and 1 to {} coordinates",
                                       prefix ? "prefix" : "id", Shown(text), kMaxGridDims));
  }
  COLONY_RETURN_IF_ERROR(CheckName(parts[0], text));
  ExpertUid uid;
  uid.name = std::string(parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) {
    COLONY_ASSIGN_OR_RETURN(int64_t c, ParseCoordinate(parts[i], text));
    uid.coords.push_back(c);
  }
  return uid;
}

}  // namespace

std::string ExpertUid::ToString() const {
  std::string out = name;
  for (int64_t c : coords) out += fmt::format("{}{}", kUidDelimiter, c);
  return out;
}

std::string ExpertUid::Prefix(size_t dims) const {
  std::string out = name + kUidDelimiter;
  for (size_t i = 0; i < dims && i < coords.size(); ++i) {
    out += fmt::format("{}{}", coords[i], kUidDelimiter);
  }
  return out;
}

Result<ExpertUid> ParseExpertUid(std::string_view text) { return ParseParts(text, false); }

Result<ExpertUid> ParseExpertPrefix(std::string_view text) { return ParseParts(text, true); }

uint64_t ExpertPattern::Size() const {
  uint64_t n = 1;
  for (const auto& [b, e] : ranges) {
    const auto w = static_cast<uint64_t>(e - b);
    if (n > (uint64_t{1} << 63) / w) return uint64_t{1} << 63;
    n *= w;
  }
  return n;
}

bool ExpertPattern::Contains(const ExpertUid& uid) const {
  if (uid.name != name || uid.coords.size() != ranges.size()) return false;
  for (size_t d = 0; d < ranges.size(); ++d) {
    if (uid.coords[d] < ranges[d].first || uid.coords[d] >= ranges[d].second) return false;
  }
  return true;
}

std::vector<ExpertUid> ExpertPattern::Sample(size_t count, const std::vector<ExpertUid>& taken,
                                             std::mt19937_64& rng) const {
  std::set<std::vector<int64_t>> used;
  for (const auto& t : taken) {
    if (Contains(t)) used.insert(t.coords);
  }
  const auto cell = [&](uint64_t index) {
    ExpertUid uid{.name = name, .coords = std::vector<int64_t>(ranges.size())};
    for (size_t d = ranges.size(); d-- > 0;) {
      const auto w = static_cast<uint64_t>(ranges[d].second - ranges[d].first);
      uid.coords[d] = ranges[d].first + static_cast<int64_t>(index % w);
      index /= w;
    }
    return uid;
  };
  std::vector<ExpertUid> out;
  const uint64_t size = Size();
  if (size <= (uint64_t{1} << 16)) {  // small grid: every free cell, shuffled
    std::vector<ExpertUid> free;
    for (uint64_t i = 0; i < size; ++i) {
      ExpertUid uid = cell(i);
      if (!used.contains(uid.coords)) free.push_back(std::move(uid));
    }
    std::shuffle(free.begin(), free.end(), rng);
    if (free.size() > count) free.resize(count);
    return free;
  }
  // A large grid is mostly free: draw cells until `count` new ones (bounded attempts).
  std::uniform_int_distribution<uint64_t> pick(0, size - 1);
  for (size_t attempt = 0; out.size() < count && attempt < 64 * count + 64; ++attempt) {
    ExpertUid uid = cell(pick(rng));
    if (used.insert(uid.coords).second) out.push_back(std::move(uid));
  }
  return out;
}

Result<ExpertPattern> ParseExpertPattern(std::string_view text) {
  if (text.size() > kMaxUidBytes) {
    return InvalidArgument(fmt::format("expert pattern longer than {} bytes", kMaxUidBytes));
  }
  const std::vector<std::string_view> parts = Split(text);
  if (parts.size() < 2 || parts.size() - 1 > kMaxGridDims) {
    return InvalidArgument(fmt::format(
        "expert pattern '{}' needs a grid name and 1 to {} dimensions, e.g. 'ffn.[0:16].[0:16]'",
        Shown(text), kMaxGridDims));
  }
  COLONY_RETURN_IF_ERROR(CheckName(parts[0], text));
  ExpertPattern p;
  p.name = std::string(parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) {
    std::string_view dim = parts[i];
    if (dim.size() >= 2 && dim.front() == '[' && dim.back() == ']') {
      dim = dim.substr(1, dim.size() - 2);
      const size_t colon = dim.find(':');
      if (colon == std::string_view::npos) {
        return InvalidArgument(fmt::format(
            "expert pattern '{}': a range is written [begin:end], e.g. [0:16]", Shown(text)));
      }
      COLONY_ASSIGN_OR_RETURN(int64_t b, ParseCoordinate(dim.substr(0, colon), text));
      const std::string_view end_text = dim.substr(colon + 1);
      // The end is exclusive, so it may be kMaxGridSize itself.
      int64_t e = kMaxGridSize;
      if (end_text != fmt::format("{}", kMaxGridSize)) {
        COLONY_ASSIGN_OR_RETURN(e, ParseCoordinate(end_text, text));
      }
      if (e <= b) {
        return InvalidArgument(
            fmt::format("expert pattern '{}': range [{}:{}] is empty", Shown(text), b, e));
      }
      p.ranges.emplace_back(b, e);
    } else {
      COLONY_ASSIGN_OR_RETURN(int64_t c, ParseCoordinate(dim, text));
      p.ranges.emplace_back(c, c + 1);
    }
  }
  return p;
}

}  // namespace colony::moe
