// Expert ids on a grid, as in Learning@home: "ffn.4.17" is the expert at coordinates (4, 17) of
// the grid named "ffn". A prefix names a cell of the grid's first dimensions and ends with the
// delimiter: "ffn.4." holds every expert whose first coordinate is 4. Torch- and I/O-free, so the
// parsers of untrusted ids can be fuzzed.
//
//   auto uid = moe::ParseExpertUid("ffn.4.17");   // {name "ffn", coords {4, 17}}
//   uid->Prefix(1) == "ffn.4.";  uid->ToString() == "ffn.4.17";
//   auto grid = moe::ParseExpertPattern("ffn.[0:16].[0:16]");  // 256 cells
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace colony::moe {

inline constexpr char kUidDelimiter = '.';
inline constexpr size_t kMaxUidBytes = 256;
inline constexpr size_t kMaxGridDims = 8;
// Coordinates lie in [0, kMaxGridSize) in every dimension.
inline constexpr int64_t kMaxGridSize = int64_t{1} << 20;

struct ExpertUid {
  std::string name;             // letters, digits, '_' and '-', not starting with a digit
  std::vector<int64_t> coords;  // 1 to kMaxGridDims coordinates
  // "name.c0.c1...": the id's canonical text.
  std::string ToString() const;
  // The prefix of the first `dims` coordinates (0 <= dims <= coords.size()), with the trailing
  // delimiter: Prefix(0) == "ffn.", Prefix(1) == "ffn.4.".
  std::string Prefix(size_t dims) const;
  friend bool operator==(const ExpertUid&, const ExpertUid&) = default;
};

// Parses an expert id. Coordinates are decimal without leading zeros, so each id has one text.
Result<ExpertUid> ParseExpertUid(std::string_view text);

// A prefix: a grid name and at least one coordinate, ending with the delimiter ("ffn.4.").
// Returns the name and the coordinates it fixes.
Result<ExpertUid> ParseExpertPrefix(std::string_view text);

// A grid of expert ids, "ffn.[0:16].[0:16]": each dimension is a range [begin:end) or one
// coordinate. Servers use it to choose the ids they host.
struct ExpertPattern {
  std::string name;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // [begin, end) per dimension
  uint64_t Size() const;                            // cells in the grid (saturates at 2^63)
  bool Contains(const ExpertUid& uid) const;
  // Up to `count` distinct ids drawn uniformly from the grid, none of them in `taken`.
  std::vector<ExpertUid> Sample(size_t count, const std::vector<ExpertUid>& taken,
                                std::mt19937_64& rng) const;
};
Result<ExpertPattern> ParseExpertPattern(std::string_view text);

}  // namespace colony::moe
