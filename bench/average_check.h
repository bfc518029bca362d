// Checks what `colony average` peers computed in a benchmark run, as the references check their
// sums: every round's parts tile the values and hold the data of all n peers, and each peer ends
// with the exact mean of the n peers' synthetic values (seeds 1..n, `colony average --seed`),
// computed here in double precision: to float rounding uncompressed, or within the 8-bit codec's
// error (relative RMS, growing with the rounds since every round quantizes again).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "averaging/averager.h"

namespace colony::bench {

struct AveragedPart {
  uint64_t begin = 0, end = 0;
  size_t contributors = 0;
};

// The "parts" of a `colony average` round event: [[begin, end, [contributor, ...]], ...].
inline std::vector<AveragedPart> PartsOfRoundEvent(const nlohmann::json& event) {
  std::vector<AveragedPart> parts;
  if (!event.contains("parts")) return parts;
  for (const auto& p : event.at("parts")) {
    parts.push_back({p.at(0).get<uint64_t>(), p.at(1).get<uint64_t>(), p.at(2).size()});
  }
  return parts;
}

// Empty when every peer's result is right; otherwise what is wrong. `summary` gets the errors.
// `Peer` is a benchmark's record of one `colony average` process: `output_path` (its --output,
// the values after its last round) and `rounds` (round number -> report with `ok` and `parts`).
template <typename Peer>
std::string CheckColonyMeans(size_t values, int n, const std::string& codec,
                             const std::vector<Peer>& peers, std::string& summary) {
  for (size_t i = 0; i < peers.size(); ++i) {
    for (const auto& [r, round] : peers[i].rounds) {
      if (!round.ok) continue;
      const std::vector<AveragedPart>& parts = round.parts;
      const std::string where = "peer " + std::to_string(i) + " round " + std::to_string(r);
      uint64_t covered = 0;
      for (const AveragedPart& p : parts) {
        if (p.begin != covered || p.end <= p.begin) return where + ": its parts do not tile";
        covered = p.end;
        if (p.contributors != static_cast<size_t>(n)) {
          return where + ": part [" + std::to_string(p.begin) + ", " + std::to_string(p.end) +
                 ") holds the data of " + std::to_string(p.contributors) + " of " +
                 std::to_string(n) + " peers";
        }
      }
      if (covered != values) {
        return where + ": its parts cover " + std::to_string(covered) + " of " +
               std::to_string(values) + " values";
      }
    }
  }
  std::vector<double> mean(values, 0.0);
  std::vector<float> v(values);
  for (int k = 0; k < n; ++k) {
    averaging::SyntheticValues(static_cast<uint64_t>(k + 1), 0, v);
    for (size_t x = 0; x < values; ++x) mean[x] += static_cast<double>(v[x]) / n;
  }
  double mean_sq = 0;
  for (double m : mean) mean_sq += m * m;
  double worst_all = 0, rms_all = 0;
  for (size_t i = 0; i < peers.size(); ++i) {
    std::ifstream in(peers[i].output_path, std::ios::binary);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
    if (!in) return "peer " + std::to_string(i) + " wrote no averaged values";
    double worst = 0, err_sq = 0;
    for (size_t x = 0; x < values; ++x) {
      const double e = static_cast<double>(v[x]) - mean[x];
      worst = std::max(worst, std::abs(e));
      err_sq += e * e;
    }
    const double rel_rms = std::sqrt(err_sq / std::max(mean_sq, 1e-30));
    worst_all = std::max(worst_all, worst);
    rms_all = std::max(rms_all, rel_rms);
    const double rounds = static_cast<double>(std::max<size_t>(peers[i].rounds.size(), 1));
    const bool right = codec == "none" ? worst <= 1e-5 : rel_rms <= 0.01 * std::sqrt(rounds);
    if (!right) {
      return "peer " + std::to_string(i) + "'s values are not the mean of the " +
             std::to_string(n) + " peers' (max |error| " + std::to_string(worst) +
             ", relative RMS error " + std::to_string(rel_rms) + ")";
    }
  }
  char text[160];
  std::snprintf(text, sizeof(text),
                "every peer holds the mean of all %d (max |error| %.1e, relative RMS %.1e)", n,
                worst_all, rms_all);
  summary = text;
  return {};
}

}  // namespace colony::bench
