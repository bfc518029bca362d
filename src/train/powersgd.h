// PowerSGD gradient rounds (Vogels et al., 2019; hivemind's PowerSGDGradientAverager): each
// gradient matrix M (a parameter's gradient seen as shape[0] x the rest) is averaged as two
// thin factors instead of whole, in two all-reduces of the same group:
//   1. M += e (this peer's error feedback: what earlier rounds' approximations left out);
//   2. P = M Q (rows x rank; Q is the last round's averaged right factor), averaged with the
//      group together with the gradients of the parameters left uncompressed (vectors, and
//      matrices too small to gain);
//   3. P is orthonormalized (low_rank.h: bit for bit alike on every member), Q = M^T P
//      (cols x rank) is averaged in the same group (averaging::StepOptions::in_group);
//   4. the gradient applied is P Q^T, the mean's projection on P's columns, and e is what the
//      projection of this peer's own M leaves out, M - P P^T M (bounded by |M|; the members'
//      weighted mean of e is the mean's remainder, so that over rounds nothing is lost).
// A matrix costs rank x (rows + cols) values on the wire instead of rows x cols. Every member
// applies the same gradient (the projection is linear in the members' weighted gradients), so the
// group's parameters stay equal as with exact averaging. Q starts from values every peer draws
// alike and is refined by every round (one step of power iteration per round).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "averaging/averager.h"
#include "core/status.h"
#include "dht/node.h"

namespace colony::train {

// Matrices are compressed when rank x (rows + cols) is at most this share of rows x cols
// (hivemind's min_compression_ratio).
inline constexpr double kPowerSgdMinCompression = 0.5;
inline constexpr int kMaxPowerSgdRank = 256;

// Where PowerSGD's factors live for a model's parameters, in the flat gradient's order.
struct LowRankLayout {
  struct Matrix {
    size_t offset = 0;  // in the flat gradient
    int64_t rows = 0, cols = 0;
    size_t p_offset = 0;  // in the first phase's values
    size_t q_offset = 0;  // in the second phase's values
  };
  std::vector<Matrix> matrices;
  // [begin, end) ranges of the flat gradient averaged as they are, in the first phase after
  // the P factors.
  std::vector<std::pair<size_t, size_t>> plain;
  size_t plain_offset = 0;  // where the plain values start in the first phase's values
  size_t p_values = 0;      // P factors and plain values
  size_t q_values = 0;      // Q factors
  size_t total = 0;         // values of the flat gradient
};
// `shapes`: every parameter's shape, in the flat gradient's order.
LowRankLayout PlanLowRank(const std::vector<std::vector<int64_t>>& shapes, int rank);

class PowerSgd {
 public:
  // `options`: the first phase's averager (its prefix is the run's gradient prefix; the second
  // phase's averager takes prefix + ".q" and the same options otherwise). Not with
  // verification or CenteredClip: their checks and clipping act on factors, not gradients.
  static Result<std::unique_ptr<PowerSgd>> Create(dht::Node& node, LowRankLayout layout, int rank,
                                                  averaging::AveragerOptions options);
  ~PowerSgd();
  PowerSgd(const PowerSgd&) = delete;
  PowerSgd& operator=(const PowerSgd&) = delete;

  // Averages `gradient` (layout.total values, in host memory) with a group, in place: the
  // result is every member's same low-rank approximation of the weighted mean. Returns the
  // first phase's result, with the second phase's parts appended (a member that dropped out of
  // either is not in every part). On error the gradient's values are unspecified (the caller
  // restores its copy) and this peer's error feedback is unchanged.
  Result<averaging::StepResult> Average(std::span<float> gradient, averaging::StepOptions so);
  // An auxiliary peer's part in both phases (weight 0).
  Result<averaging::StepResult> Join(averaging::StepOptions so);
  // Forgets the error feedback (after a state download: it belongs to other parameters).
  void ResetErrors();
  // The first phase's averager (state sharing goes through it).
  averaging::Averager& first() { return *first_; }
  void Shutdown();
  const LowRankLayout& layout() const { return layout_; }

 private:
  PowerSgd(LowRankLayout layout, int rank);
  // Gives matrix i's columns of warm_q_ that are all zeros the shared initial values.
  void RestartDeadColumns(size_t i);
  // Runs both phases; `gradient` is null for an auxiliary peer.
  Result<averaging::StepResult> Run(float* gradient, averaging::StepOptions so);

  const LowRankLayout layout_;
  const int rank_;
  std::vector<float> p_, q_;   // the phases' values (P factors and plain values; Q factors)
  std::vector<float> warm_q_;  // each matrix's Q for the next round
  std::vector<float> own_q_;   // this peer's Q of this round, before averaging
  std::mutex error_mu_;        // guards error_ and error_generation_ (ResetErrors)
  std::vector<float> error_;   // error feedback, one value per compressed gradient value
  std::vector<size_t> error_offsets_;
  uint64_t error_generation_ = 0;  // ResetErrors() calls: a round across one keeps the reset
  std::unique_ptr<averaging::Averager> first_, second_;
};

}  // namespace colony::train
