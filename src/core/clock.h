// Injectable clocks. Protocol cores take a Clock so tests and simulations can drive time.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace colony {

using SteadyTime = std::chrono::steady_clock::time_point;
using Duration = std::chrono::nanoseconds;

// Fractional seconds (a command-line option, a config field) as whole milliseconds.
inline std::chrono::milliseconds SecondsToMillis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic time, for deadlines and intervals.
  virtual SteadyTime Now() const = 0;
  // Wall-clock seconds since the Unix epoch (fractional), for record expirations shared between
  // peers.
  virtual double WallSeconds() const = 0;
};

// The real clocks of this machine.
class SystemClock final : public Clock {
 public:
  SteadyTime Now() const override { return std::chrono::steady_clock::now(); }
  double WallSeconds() const override;
  // Process-wide instance.
  static const SystemClock& Instance();
};

// A clock that moves only when told to. Thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(double wall_seconds = 1.7e9)
      : wall_ns_(static_cast<int64_t>(wall_seconds * 1e9)) {}
  SteadyTime Now() const override { return SteadyTime(Duration(steady_ns_.load())); }
  double WallSeconds() const override { return static_cast<double>(wall_ns_.load()) / 1e9; }
  void Advance(Duration d) {
    steady_ns_ += d.count();
    wall_ns_ += d.count();
  }

 private:
  std::atomic<int64_t> steady_ns_{1'000'000'000};
  std::atomic<int64_t> wall_ns_;
};

}  // namespace colony
