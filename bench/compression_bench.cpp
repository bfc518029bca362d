// Compression benchmark: encode and decode speed of every codec vs memcpy of the same buffer.
//
// The input is --mib MiB of N(0,1) float32 values (fixed seed). For each codec, Encode and Decode
// run --repeats times on one thread and on all threads (OpenMP default); the median is reported in
// GB/s of float32 input bytes, next to a single-thread memcpy of the same buffer: each encode and
// decode repetition is preceded by a memcpy repetition, so that both see the same machine load
// (the ratios use the memcpy median of the same codec's runs). Also printed: encoded size relative
// to float32, and the mean squared error.
// The last lines are RESULT key=value pairs (see scripts/bench).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "test_support.h"

namespace {

using namespace colony;
using namespace colony::compression;
using SteadyClock = std::chrono::steady_clock;

using colony::test::Median;

// Median GB/s of `bytes` processed by fn() over `repeats` runs (after one warm-up run); before()
// runs, untimed, ahead of each run.
template <typename F, typename B>
double MedianGbps(size_t bytes, int repeats, const F& fn, const B& before) {
  fn();
  std::vector<double> gbps;
  for (int i = 0; i < repeats; ++i) {
    before();
    auto t0 = SteadyClock::now();
    fn();
    double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    gbps.push_back(static_cast<double>(bytes) / secs / 1e9);
  }
  return Median(gbps);
}
template <typename F>
double MedianGbps(size_t bytes, int repeats, const F& fn) {
  return MedianGbps(bytes, repeats, fn, [] {});
}

// The largest MSE a codec may leave on N(0,1) input (see the codec tests for the reasoning).
double MaxMse(Codec codec) {
  switch (codec) {
    case Codec::kNone:
      return 0;
    case Codec::kFloat16:
    case Codec::kScaledFloat16:
      return 5e-8;
    case Codec::kBFloat16:
      return 1e-5;
    case Codec::kUniform8:
    case Codec::kQuantile8:
    case Codec::kBlockwise8:
      return 8e-4;
    case Codec::kBlockwise4:
      return 3e-2;
    case Codec::kTopK:
      return 1.01;  // E[x^2] of N(0,1), with the sample's slack: no worse than zeros
  }
  return 0;
}

void Check(const Status& st, const char* what) {
  if (st.ok()) return;
  std::fprintf(stderr, "%s failed: %s\n", what, st.ToString().c_str());
  std::exit(1);
}

struct Row {
  Codec codec;
  double enc1 = 0, encn = 0, dec1 = 0, decn = 0, memcpy = 0, size_ratio = 0, mse = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Colony compression benchmark: codec encode/decode speed vs memcpy"};
  size_t mib = 64;
  int repeats = 5;
  int threads = 0;
  std::string only;
  app.add_option("--mib", mib, "MiB of float32 input")->capture_default_str();
  app.add_option("--repeats", repeats, "runs per measurement (median reported)")
      ->capture_default_str();
  app.add_option("--threads", threads, "threads for the parallel runs (0: OpenMP default)")
      ->capture_default_str();
  app.add_option("--codec", only, "measure only this codec (e.g. blockwise8)");
  CLI11_PARSE(app, argc, argv);

  const size_t n = (mib << 20) / sizeof(float);
  const size_t bytes = n * sizeof(float);
  std::vector<float> x(n);
  std::mt19937_64 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : x) v = normal(rng);
  std::vector<float> copy(n);
  std::vector<float> back(n);

  const double memcpy_gbps =
      MedianGbps(bytes, repeats, [&] { std::memcpy(copy.data(), x.data(), bytes); });
  std::printf(
      "compression benchmark: %zu MiB of N(0,1) float32, median of %d runs, GB/s of "
      "float32 bytes\n",
      mib, repeats);
  std::printf("memcpy (1 thread): %.2f GB/s\n\n", memcpy_gbps);

  std::vector<Row> rows;
  for (uint8_t id = 0; id <= kMaxCodecId; ++id) {
    const Codec codec = static_cast<Codec>(id);
    if (!only.empty() && CodecName(codec) != only) continue;
    Row r{codec};
    CodecOptions single, all;
    single.max_threads = 1;
    all.max_threads = threads;
    Bytes enc;
    enc.reserve(MaxEncodedSize(codec, n, single));
    std::vector<double> memcpy_runs;
    auto timed_memcpy = [&] {
      auto t0 = SteadyClock::now();
      std::memcpy(copy.data(), x.data(), bytes);
      double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
      memcpy_runs.push_back(static_cast<double>(bytes) / secs / 1e9);
    };
    r.enc1 = MedianGbps(
        bytes, repeats,
        [&] {
          enc.clear();
          Check(Encode(codec, x, enc, single), "encode");
        },
        timed_memcpy);
    r.encn = MedianGbps(bytes, repeats, [&] {
      enc.clear();
      Check(Encode(codec, x, enc, all), "encode");
    });
    r.dec1 = MedianGbps(
        bytes, repeats, [&] { Check(Decode(enc, back, 1), "decode"); }, timed_memcpy);
    r.memcpy = Median(memcpy_runs);
    r.decn = MedianGbps(bytes, repeats, [&] { Check(Decode(enc, back, threads), "decode"); });
    r.size_ratio = static_cast<double>(enc.size()) / static_cast<double>(bytes);
    double se = 0;
    for (size_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(back[i]) - x[i];
      se += d * d;
    }
    r.mse = se / static_cast<double>(n);
    // What was timed must decode to the input within the codec's error bound on N(0,1) (the
    // bounds of CodecQuality.MeanSquaredErrorOnStandardNormal); a codec without one (top-k) must
    // at least not do worse than sending zeros.
    const double bound = MaxMse(codec);
    if (!(r.mse <= bound)) {
      std::fprintf(stderr, "%s: the decoded values are wrong (MSE %.3g, bound %.3g)\n",
                   std::string(CodecName(codec)).c_str(), r.mse, bound);
      return 1;
    }
    rows.push_back(r);
    std::fprintf(stderr, "  measured %s\n", std::string(CodecName(codec)).c_str());
  }

  std::printf("%-12s %8s %8s %8s %8s %8s %9s %9s %6s %9s\n", "codec", "enc 1t", "enc all", "dec 1t",
              "dec all", "memcpy", "enc/memcp", "dec/memcp", "size", "mse");
  for (const Row& r : rows) {
    std::printf("%-12s %8.2f %8.2f %8.2f %8.2f %8.2f %9.2f %9.2f %6.3f %9.3g\n",
                std::string(CodecName(r.codec)).c_str(), r.enc1, r.encn, r.dec1, r.decn, r.memcpy,
                r.enc1 / r.memcpy, r.dec1 / r.memcpy, r.size_ratio, r.mse);
  }
  std::printf(
      "(memcpy: single-thread memcpy timed between that codec's runs; enc/memcp, dec/memcp: "
      "single-thread codec speed relative to it; size: encoded bytes / float32 bytes)\n");

  std::printf("RESULT compression_memcpy_gbps=%.3f\n", memcpy_gbps);
  for (const Row& r : rows) {
    if (r.codec != Codec::kFloat16) continue;
    std::printf("RESULT fp16_decode_vs_memcpy=%.3f\n", r.dec1 / r.memcpy);
    std::printf("RESULT fp16_encode_vs_memcpy=%.3f\n", r.enc1 / r.memcpy);
  }
  // The headline ratio last.
  for (const Row& r : rows) {
    if (r.codec == Codec::kBlockwise8)
      std::printf("RESULT blockwise8_vs_memcpy=%.3f\n", r.enc1 / r.memcpy);
  }
  return 0;
}
