#include "train/powersgd.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "train/low_rank.h"

namespace colony::train {
namespace {

// The phase name of the second all-reduce (averaging::StepOptions::phase).
constexpr const char* kSecondPhase = "powersgd.q";

at::Tensor Matrix(float* data, int64_t rows, int64_t cols) {
  return at::from_blob(data, {rows, cols}, at::TensorOptions().dtype(at::kFloat));
}

}  // namespace

LowRankLayout PlanLowRank(const std::vector<std::vector<int64_t>>& shapes, int rank) {
  LowRankLayout layout;
  size_t offset = 0, plain_values = 0;
  for (const auto& shape : shapes) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const auto n = static_cast<size_t>(numel);
    const int64_t rows = shape.size() >= 2 ? shape[0] : 1;
    const int64_t cols = rows > 0 ? numel / rows : 0;
    const bool compress =
        shape.size() >= 2 && rank < std::min(rows, cols) &&
        static_cast<double>(rank) * static_cast<double>(rows + cols) <=
            kPowerSgdMinCompression * static_cast<double>(rows) * static_cast<double>(cols);
    if (compress) {
      layout.matrices.push_back({.offset = offset,
                                 .rows = rows,
                                 .cols = cols,
                                 .p_offset = layout.p_values,
                                 .q_offset = layout.q_values});
      layout.p_values += static_cast<size_t>(rows * rank);
      layout.q_values += static_cast<size_t>(cols * rank);
    } else if (n > 0) {
      if (!layout.plain.empty() && layout.plain.back().second == offset) {
        layout.plain.back().second += n;
      } else {
        layout.plain.emplace_back(offset, offset + n);
      }
      plain_values += n;
    }
    offset += n;
  }
  layout.plain_offset = layout.p_values;
  layout.p_values += plain_values;
  layout.total = offset;
  return layout;
}

PowerSgd::PowerSgd(LowRankLayout layout, int rank) : layout_(std::move(layout)), rank_(rank) {
  p_.assign(layout_.p_values, 0.0f);
  q_.assign(layout_.q_values, 0.0f);
  warm_q_.assign(layout_.q_values, 0.0f);
  own_q_.assign(layout_.q_values, 0.0f);
  size_t errors = 0;
  for (size_t i = 0; i < layout_.matrices.size(); ++i) {
    const auto& m = layout_.matrices[i];
    error_offsets_.push_back(errors);
    errors += static_cast<size_t>(m.rows * m.cols);
    RestartDeadColumns(i);  // all of them: every peer starts from the same Q
  }
  error_.assign(errors, 0.0f);
}

void PowerSgd::RestartDeadColumns(size_t i) {
  const auto& m = layout_.matrices[i];
  const auto cols = static_cast<size_t>(m.cols), rank = static_cast<size_t>(rank_);
  float* q = warm_q_.data() + m.q_offset;  // cols x rank, row-major
  std::vector<float> draw;
  for (size_t j = 0; j < rank; ++j) {
    bool dead = true;
    for (size_t c = 0; c < cols && dead; ++c) dead = q[c * rank + j] == 0.0f;
    if (!dead) continue;
    // Any start works (see the header); the same on every peer.
    if (draw.empty()) {
      draw.resize(cols * rank);
      averaging::SyntheticValues(0x5057'5347'0000 + i, 0, draw);
    }
    for (size_t c = 0; c < cols; ++c) q[c * rank + j] = draw[c * rank + j];
  }
}

PowerSgd::~PowerSgd() { Shutdown(); }

Result<std::unique_ptr<PowerSgd>> PowerSgd::Create(dht::Node& node, LowRankLayout layout, int rank,
                                                   averaging::AveragerOptions options) {
  if (rank < 1 || rank > kMaxPowerSgdRank) {
    return InvalidArgument(
        fmt::format("the PowerSGD rank must be 1 to {}, got {}", kMaxPowerSgdRank, rank));
  }
  if (options.verify || options.centered_clip) {
    return InvalidArgument(
        "PowerSGD cannot be combined with verified rounds or CenteredClip: their checks and "
        "clipping would act on the low-rank factors, not on the gradients");
  }
  std::unique_ptr<PowerSgd> p(new PowerSgd(std::move(layout), rank));
  averaging::AveragerOptions second = options;
  second.prefix += ".q";
  COLONY_ASSIGN_OR_RETURN(p->first_, averaging::Averager::Create(node, {p->p_}, options));
  COLONY_ASSIGN_OR_RETURN(p->second_, averaging::Averager::Create(node, {p->q_}, second));
  return p;
}

void PowerSgd::Shutdown() {
  if (first_) first_->Shutdown();
  if (second_) second_->Shutdown();
}

void PowerSgd::ResetErrors() {
  std::lock_guard lock(error_mu_);
  std::fill(error_.begin(), error_.end(), 0.0f);
  ++error_generation_;
}

Result<averaging::StepResult> PowerSgd::Average(std::span<float> gradient,
                                                averaging::StepOptions so) {
  if (gradient.size() != layout_.total) {
    return InvalidArgument(fmt::format("PowerSGD expects a gradient of {} values, got {}",
                                       layout_.total, gradient.size()));
  }
  return Run(gradient.data(), std::move(so));
}

Result<averaging::StepResult> PowerSgd::Join(averaging::StepOptions so) {
  so.weight = 0;
  return Run(nullptr, std::move(so));
}

Result<averaging::StepResult> PowerSgd::Run(float* g, averaging::StepOptions so) {
  const auto deadline = std::chrono::steady_clock::now() + so.timeout;
  const int64_t r = rank_;
  at::NoGradGuard no_grad;
  uint64_t generation = 0;
  if (g != nullptr) {
    {
      std::lock_guard lock(error_mu_);
      generation = error_generation_;
      for (size_t i = 0; i < layout_.matrices.size(); ++i) {
        const auto& m = layout_.matrices[i];
        const float* e = error_.data() + error_offsets_[i];
        float* x = g + m.offset;
        for (int64_t k = 0; k < m.rows * m.cols; ++k) x[k] += e[k];
      }
    }
    for (const auto& m : layout_.matrices) {
      auto out = Matrix(p_.data() + m.p_offset, m.rows, r);
      at::mm_out(out, Matrix(g + m.offset, m.rows, m.cols),
                 Matrix(warm_q_.data() + m.q_offset, m.cols, r));
    }
    size_t at = layout_.plain_offset;
    for (const auto& [b, e] : layout_.plain) {
      std::copy(g + b, g + e, p_.begin() + static_cast<ptrdiff_t>(at));
      at += e - b;
    }
  } else {
    std::fill(p_.begin(), p_.end(), 0.0f);
  }
  auto first = first_->StepSync(so);
  if (!first.ok()) {
    return first.status().WithContext("averaging PowerSGD's left factors and plain gradients");
  }
  if (g != nullptr) {
    size_t at = layout_.plain_offset;
    for (const auto& [b, e] : layout_.plain) {
      std::copy(p_.begin() + static_cast<ptrdiff_t>(at),
                p_.begin() + static_cast<ptrdiff_t>(at + (e - b)), g + b);
      at += e - b;
    }
  }
  for (const auto& m : layout_.matrices) {
    OrthonormalizeColumns(std::span<float>(p_).subspan(m.p_offset, static_cast<size_t>(m.rows * r)),
                          m.rows, r);
    auto out = Matrix(q_.data() + m.q_offset, m.cols, r);
    if (g != nullptr) {
      at::mm_out(out, Matrix(g + m.offset, m.rows, m.cols).t(),
                 Matrix(p_.data() + m.p_offset, m.rows, r));
    } else {
      out.zero_();
    }
  }
  // This peer's own Q, before the group's mean replaces it: its error feedback is what the
  // projection of its own M leaves out (M - P Q_own^T), which stays bounded by |M|.
  std::copy(q_.begin(), q_.end(), own_q_.begin());
  averaging::StepOptions second_options;
  second_options.weight = so.weight;
  second_options.timeout = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        deadline - std::chrono::steady_clock::now()),
                                    std::chrono::milliseconds(1));
  second_options.in_group = first->group;
  second_options.phase = kSecondPhase;
  auto second = second_->StepSync(second_options);
  if (!second.ok()) {
    return second.status().WithContext("averaging PowerSGD's right factors");
  }
  std::copy(q_.begin(), q_.end(), warm_q_.begin());
  // A column of the mean Q that is all zeros (every member's M was zero on it, e.g. a round of
  // peers without samples) would make every later P zero there for good: it starts again from
  // the shared draw. Every member holds the same mean Q, so every member restarts the same
  // columns.
  for (size_t i = 0; i < layout_.matrices.size(); ++i) RestartDeadColumns(i);
  if (g != nullptr) {
    std::lock_guard lock(error_mu_);
    const bool keep = generation == error_generation_;  // not reset meanwhile
    std::vector<float> own;
    for (size_t i = 0; i < layout_.matrices.size(); ++i) {
      const auto& m = layout_.matrices[i];
      const auto n = static_cast<size_t>(m.rows * m.cols);
      const auto p =
          std::span<const float>(p_).subspan(m.p_offset, static_cast<size_t>(m.rows * r));
      const auto q_size = static_cast<size_t>(m.cols * r);
      float* x = g + m.offset;
      if (keep) {
        own.resize(n);
        LowRankProduct(p, std::span<const float>(own_q_).subspan(m.q_offset, q_size), m.rows,
                       m.cols, r, own);
        float* e = error_.data() + error_offsets_[i];
        for (size_t k = 0; k < n; ++k) e[k] = x[k] - own[k];
      }
      LowRankProduct(p, std::span<const float>(q_).subspan(m.q_offset, q_size), m.rows, m.cols, r,
                     std::span<float>(x, n));
    }
  }
  averaging::StepResult out = std::move(*first);
  for (auto part : second->parts) {
    part.begin += layout_.p_values;
    part.end += layout_.p_values;
    out.parts.push_back(std::move(part));
  }
  out.allreduce_seconds += second->allreduce_seconds;
  return out;
}

}  // namespace colony::train
