// What an attack test measures for `scripts/bench adversary` (bench/adversary_bench.cpp), which
// reads it from gtest's JSON output: how much slower the honest workload beside the attack ran
// than without it, and the victim process's peak resident memory. The tests assert their own
// bounds; the benchmark reports the worst over the suite.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "test_support.h"

namespace colony::test {

// Records `honest_slowdown`, the median latency under attack over the unattacked median, and
// returns the ratio the test bounds, whose baseline is floored at `floor_s` (a baseline of a
// millisecond or less is mostly scheduling noise, which would make any bound flaky).
inline double RecordHonestSlowdown(const std::vector<double>& before,
                                   const std::vector<double>& during, double floor_s = 0.01) {
  const double base = Median(before);
  const double under = Median(during);
  ::testing::Test::RecordProperty("honest_slowdown", std::to_string(base > 0 ? under / base : 1.0));
  return under / std::max(base, floor_s);
}

// The victim's peak resident memory in MiB, recorded as `victim_peak_mib`.
inline void RecordVictimPeakMib(double mib) {
  ::testing::Test::RecordProperty("victim_peak_mib", std::to_string(mib));
}

}  // namespace colony::test
