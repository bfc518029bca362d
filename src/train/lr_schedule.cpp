// Learning-rate schedules by global epoch (lr_schedule.h).
#include "train/lr_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

namespace colony::train {

double LrSchedule::Factor(int64_t epoch) const {
  epoch = std::max<int64_t>(epoch, 0);
  if (epoch < warmup_epochs) {
    return static_cast<double>(epoch) / static_cast<double>(warmup_epochs);
  }
  if (kind == Kind::kConstant) return 1.0;
  const auto span = static_cast<double>(total_epochs - warmup_epochs);
  const double p = std::min(1.0, static_cast<double>(epoch - warmup_epochs) / span);
  if (kind == Kind::kLinear) return 1.0 - p;
  return 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

Status LrSchedule::Check(const LrScheduleNames& names) const {
  if (warmup_epochs < 0) {
    return InvalidArgument(fmt::format("{} must be >= 0, not {}", names.warmup, warmup_epochs));
  }
  if (kind == Kind::kConstant) return Status::Ok();
  if (total_epochs <= warmup_epochs) {
    return InvalidArgument(fmt::format(
        "{} {} decays the rate to 0 at {} ({}), which must be above {} ({})", names.kind,
        LrScheduleKindName(kind), names.total, total_epochs, names.warmup, warmup_epochs));
  }
  return Status::Ok();
}

namespace {
constexpr std::pair<std::string_view, LrSchedule::Kind> kKinds[] = {
    {"constant", LrSchedule::Kind::kConstant},
    {"linear", LrSchedule::Kind::kLinear},
    {"cosine", LrSchedule::Kind::kCosine},
};
}  // namespace

Result<LrSchedule::Kind> ParseLrScheduleKind(std::string_view name) {
  for (const auto& [known, kind] : kKinds) {
    if (name == known) return kind;
  }
  return InvalidArgument(
      fmt::format("unknown learning-rate schedule '{}' (known: constant, linear, cosine)", name));
}

std::string LrScheduleKindName(LrSchedule::Kind kind) {
  for (const auto& [name, known] : kKinds) {
    if (kind == known) return std::string(name);
  }
  return "unknown";
}

std::vector<double> LearningRates(torch::optim::Optimizer& optimizer) {
  std::vector<double> out;
  for (auto& group : optimizer.param_groups()) out.push_back(group.options().get_lr());
  return out;
}

void SetLearningRates(torch::optim::Optimizer& optimizer, std::span<const double> base,
                      double factor) {
  auto& groups = optimizer.param_groups();
  for (size_t i = 0; i < groups.size() && i < base.size(); ++i) {
    groups[i].options().set_lr(base[i] * factor);
  }
}

}  // namespace colony::train
