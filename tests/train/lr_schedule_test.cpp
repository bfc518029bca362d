// Learning-rate schedules against the values of transformers' definitions
// (get_linear_schedule_with_warmup, get_cosine_schedule_with_warmup), computed by hand here.
#include "train/lr_schedule.h"

#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

namespace colony::train {
namespace {

TEST(LrSchedule, LinearWarmsUpThenDecaysToZeroAtTheTotal) {
  const LrSchedule s{.kind = LrSchedule::Kind::kLinear, .warmup_epochs = 2, .total_epochs = 6};
  const double expected[] = {0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0};
  for (int64_t e = 0; e < 8; ++e) EXPECT_DOUBLE_EQ(s.Factor(e), expected[e]) << e;
}

TEST(LrSchedule, CosineFollowsHalfACosineToZero) {
  const LrSchedule s{.kind = LrSchedule::Kind::kCosine, .warmup_epochs = 0, .total_epochs = 4};
  // 0.5 (1 + cos(pi e / 4)) for e = 0..4, then 0.
  const double expected[] = {1.0, 0.8535533905932737, 0.5, 0.14644660940672627, 0.0, 0.0};
  for (int64_t e = 0; e < 6; ++e) EXPECT_NEAR(s.Factor(e), expected[e], 1e-15) << e;
}

TEST(LrSchedule, ConstantWithWarmupOnlyWarmsUp) {
  const LrSchedule s{.kind = LrSchedule::Kind::kConstant, .warmup_epochs = 4};
  EXPECT_TRUE(s.Active());
  EXPECT_DOUBLE_EQ(s.Factor(1), 0.25);
  EXPECT_DOUBLE_EQ(s.Factor(4), 1.0);
  EXPECT_DOUBLE_EQ(s.Factor(1000), 1.0);
  EXPECT_FALSE(LrSchedule{}.Active());
  EXPECT_DOUBLE_EQ(LrSchedule{}.Factor(7), 1.0);
}

TEST(LrSchedule, BadSchedulesAreErrorsThatNameWhatIsWrong) {
  EXPECT_TRUE(LrSchedule{}.Check().ok());
  auto st = LrSchedule{.kind = LrSchedule::Kind::kLinear, .total_epochs = 0}.Check();
  EXPECT_NE(st.message().find("learning-rate schedule linear decays the rate to 0 at total "
                              "epochs (0), which must be above warmup epochs (0)"),
            std::string::npos)
      << st.ToString();
  // A command's flags name the fields.
  st = LrSchedule{.kind = LrSchedule::Kind::kCosine, .warmup_epochs = 3, .total_epochs = 2}.Check(
      {.kind = "--sched", .warmup = "--warm", .total = "--end"});
  EXPECT_EQ(st.message(),
            "--sched cosine decays the rate to 0 at --end (2), which must be above "
            "--warm (3)");
  st = LrSchedule{.warmup_epochs = -1}.Check();
  EXPECT_NE(st.message().find("warmup epochs must be >= 0"), std::string::npos) << st.ToString();
  auto kind = ParseLrScheduleKind("exponential");
  ASSERT_FALSE(kind.ok());
  EXPECT_NE(kind.status().message().find("'exponential' (known: constant, linear, cosine)"),
            std::string::npos);
  EXPECT_EQ(*ParseLrScheduleKind("cosine"), LrSchedule::Kind::kCosine);
}

TEST(LrSchedule, SetsEachParameterGroupsRateFromItsOwnBase) {
  at::Tensor a = at::zeros({2}), b = at::zeros({3});
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{a}, std::make_unique<torch::optim::SGDOptions>(0.5));
  groups.emplace_back(std::vector<at::Tensor>{b}, std::make_unique<torch::optim::SGDOptions>(0.1));
  torch::optim::SGD sgd(std::move(groups), torch::optim::SGDOptions(1.0));
  const std::vector<double> base = LearningRates(sgd);
  ASSERT_EQ(base, (std::vector<double>{0.5, 0.1}));
  SetLearningRates(sgd, base, 0.5);
  EXPECT_EQ(LearningRates(sgd), (std::vector<double>{0.25, 0.05}));
}

}  // namespace
}  // namespace colony::train
