// Learning-rate schedules by global epoch (optimizer step), as transformers'
// get_linear_schedule_with_warmup and get_cosine_schedule_with_warmup define them, which is what
// hivemind users pass as the collaborative optimizer's scheduler. Every peer of a run steps at
// the same global epoch, so every peer computes the same rate without exchanging it.
//
//   LrSchedule s{.kind = LrSchedule::Kind::kLinear, .warmup_epochs = 5, .total_epochs = 100};
//   COLONY_RETURN_IF_ERROR(s.Check());
//   SetLearningRates(optimizer, base_lrs, s.Factor(epoch));  // before the step at `epoch`
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace colony::train {

// What an error of LrSchedule::Check calls the schedule's fields: a command passes its flags'
// names (e.g. {"--lr-schedule", "--warmup-steps", "--total-steps"}), so that its users read the
// flags they gave.
struct LrScheduleNames {
  std::string_view kind = "learning-rate schedule";
  std::string_view warmup = "warmup epochs";
  std::string_view total = "total epochs";
};

struct LrSchedule {
  enum class Kind { kConstant, kLinear, kCosine };
  Kind kind = Kind::kConstant;
  // The rate grows linearly from 0 over the first warmup_epochs steps (step e of them: e / W).
  int64_t warmup_epochs = 0;
  // kLinear and kCosine: the step at which the rate reaches 0 (it stays 0 after).
  int64_t total_epochs = 0;

  // The factor of the base rate at the step that starts from global epoch `epoch` (the number
  // of optimizer steps the run took before it):
  //   epoch < W:  epoch / W
  //   linear:     max(0, (T - epoch) / (T - W))
  //   cosine:     0.5 (1 + cos(pi p)), p = (epoch - W) / (T - W), 0 beyond T
  double Factor(int64_t epoch) const;
  // Whether the schedule changes the rate at all (kConstant without warmup does not).
  bool Active() const { return kind != Kind::kConstant || warmup_epochs > 0; }
  // An error naming the field (as `names` calls it): negative epochs, or a decaying schedule
  // whose T is not above W.
  Status Check(const LrScheduleNames& names = {}) const;
};

// "constant", "linear" or "cosine"; anything else is an error that lists them.
Result<LrSchedule::Kind> ParseLrScheduleKind(std::string_view name);
std::string LrScheduleKindName(LrSchedule::Kind kind);

// The learning rate of each of the optimizer's parameter groups, in order.
std::vector<double> LearningRates(torch::optim::Optimizer& optimizer);
// Sets group i's learning rate to base[i] x factor (base: LearningRates at the start).
void SetLearningRates(torch::optim::Optimizer& optimizer, std::span<const double> base,
                      double factor);

}  // namespace colony::train
