#include "common/optim/optimizer.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::LoadGolden;
using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

struct Case {
  const char* fixture;
  OptimizerConfig config;
  friend void PrintTo(const Case& c, std::ostream* os) { *os << c.fixture; }
};

OptimizerConfig Sgd(double lr, double momentum = 0, double dampening = 0,
                    bool nesterov = false, double wd = 0) {
  OptimizerConfig c;
  c.type = OptimizerType::kSgd;
  c.lr = lr;
  c.momentum = momentum;
  c.dampening = dampening;
  c.nesterov = nesterov;
  c.weight_decay = wd;
  return c;
}

OptimizerConfig Adam(OptimizerType t, double lr, double b1, double b2,
                     double wd) {
  OptimizerConfig c;
  c.type = t;
  c.lr = lr;
  c.beta1 = b1;
  c.beta2 = b2;
  c.weight_decay = wd;
  return c;
}

class GoldenOptimizerTest : public ::testing::TestWithParam<Case> {};

TEST_P(GoldenOptimizerTest, ThreeStepsMatchPyTorch) {
  TensorMap t = LoadGolden(GetParam().fixture);
  std::vector<float> p = t.at("p0").data;
  auto opt = Optimizer::Create(GetParam().config, p.size());
  ASSERT_TRUE(opt.ok()) << opt.status();
  for (int s = 0; s < 3; ++s) {
    (*opt)->Step(p.data(), t.at(absl::StrCat("g", s)).data.data());
    const auto& want = t.at(absl::StrCat("p", s + 1)).data;
    for (size_t i = 0; i < p.size(); ++i) {
      ASSERT_NEAR(p[i], want[i], 1e-6f * (1 + std::fabs(want[i])))
          << GetParam().fixture << " step " << s << " index " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, GoldenOptimizerTest,
    ::testing::Values(
        Case{"sgd_plain", Sgd(0.1)},
        Case{"sgd_momentum", Sgd(0.1, 0.9, 0.1, false, 0.01)},
        Case{"sgd_nesterov", Sgd(0.1, 0.9, 0, true, 0.01)},
        Case{"adam", Adam(OptimizerType::kAdam, 0.01, 0.8, 0.99, 0.1)},
        Case{"adamw", Adam(OptimizerType::kAdamW, 0.01, 0.9, 0.999, 0.1)}),
    [](const auto& info) { return std::string(info.param.fixture); });

TEST(OptimizerTest, RejectsBadHyperParametersNamingTheField) {
  EXPECT_THAT(Optimizer::Create(Sgd(-0.1), 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lr")));
  EXPECT_THAT(
      Optimizer::Create(Sgd(0.1, -1), 4),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("momentum")));
  EXPECT_THAT(
      Optimizer::Create(Sgd(0.1, 0, 0, true), 4),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nesterov")));
  EXPECT_THAT(
      Optimizer::Create(Adam(OptimizerType::kAdam, 0.1, 1.0, 0.9, 0), 4),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("beta1")));
  EXPECT_THAT(
      ParseOptimizerType("rmsprop"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rmsprop")));
}

TEST(OptimizerTest, StateRoundTripsSoAResumedRunMatches) {
  OptimizerConfig c = Adam(OptimizerType::kAdamW, 0.01, 0.9, 0.999, 0.01);
  std::vector<float> p(5, 1.0f), g = {0.1f, -0.2f, 0.3f, 0.0f, 1.0f};
  auto a = Optimizer::Create(c, 5);
  ASSERT_TRUE(a.ok());
  (*a)->Step(p.data(), g.data());
  auto b = Optimizer::Create(c, 5);
  ASSERT_TRUE(b.ok());
  TALLY_ASSERT_OK((*b)->LoadState((*a)->SaveState()));
  std::vector<float> pa = p, pb = p;
  (*a)->Step(pa.data(), g.data());
  (*b)->Step(pb.data(), g.data());
  EXPECT_EQ(pa, pb);
  EXPECT_THAT((*b)->LoadState(OptimizerState{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("state")));
}

// A shard process's saved state is refused past kMaxSlots slots
// (RemoteShardControl::Save): every optimizer must keep within it.
TEST(OptimizerTest, EveryOptimizerKeepsAtMostMaxSlots) {
  for (const OptimizerConfig& c :
       {Sgd(0.1), Sgd(0.1, 0.9), Adam(OptimizerType::kAdam, 0.01, 0.9, 0.999, 0),
        Adam(OptimizerType::kAdamW, 0.01, 0.9, 0.999, 0.01)}) {
    auto o = Optimizer::Create(c, 3);
    ASSERT_TRUE(o.ok());
    EXPECT_LE((*o)->SaveState().slots.size(),
              static_cast<size_t>(OptimizerState::kMaxSlots));
  }
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// Warm-up then cosine, and step decay, against PyTorch's schedulers (1.13:
// SequentialLR(LinearLR(1/3, 1, 2), CosineAnnealingLR(7, 0.01), [3]) and
// StepLR(2, 0.5), lr 0.1, read before each optimizer step).
TEST(ScheduleTest, LearningRatesAreThoseOfPyTorchsSchedulers) {
  OptimizerConfig c;
  c.lr = 0.1;
  c.warmup_steps = 3;
  c.schedule = OptimizerConfig::Schedule::kCosine;
  c.min_lr = 0.01;
  const double cosine[] = {0.03333333333333333,  0.06666666666666667,
                           0.1,                  0.1,
                           0.09554359905560886,  0.08305704108364301,
                           0.06501344202803415,  0.04498655797196586,
                           0.026942958916356993, 0.014456400944391143};
  for (int s = 0; s < 10; ++s)
    EXPECT_NEAR(ScheduledLr(c, s, 10), cosine[s], 1e-12) << s;
  c = OptimizerConfig();
  c.lr = 0.1;
  c.schedule = OptimizerConfig::Schedule::kStep;
  c.step_size = 2;
  c.gamma = 0.5;
  const double step[] = {0.1, 0.1, 0.05, 0.05, 0.025, 0.025};
  for (int s = 0; s < 6; ++s)
    EXPECT_NEAR(ScheduledLr(c, s, 6), step[s], 1e-12) << s;
}

// The optimizer steps with the schedule's rate for its own step count, and
// a restored one goes on from where its state was.
TEST(ScheduleTest, AnOptimizerFollowsItsScheduleAcrossARestore) {
  OptimizerConfig c;
  c.lr = 0.1;
  c.schedule = OptimizerConfig::Schedule::kStep;
  c.step_size = 1;
  c.gamma = 0.5;
  auto opt = Optimizer::Create(c, 1);
  ASSERT_TRUE(opt.ok());
  float p = 1.0f;
  const float g = 1.0f;
  (*opt)->Step(&p, &g);  // lr 0.1
  (*opt)->Step(&p, &g);  // lr 0.05
  EXPECT_FLOAT_EQ(p, 1.0f - 0.1f - 0.05f);
  auto restored = Optimizer::Create(c, 1);
  ASSERT_TRUE(restored.ok());
  ASSERT_TRUE((*restored)->LoadState((*opt)->SaveState()).ok());
  (*restored)->Step(&p, &g);  // lr 0.025
  EXPECT_FLOAT_EQ(p, 1.0f - 0.1f - 0.05f - 0.025f);
  c.min_lr = 1.0;  // above lr
  EXPECT_THAT(Optimizer::Create(c, 1).status(),
              ::tally::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                         ::testing::HasSubstr("min_lr")));
}

}  // namespace
}  // namespace tally
