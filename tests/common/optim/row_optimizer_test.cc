// The update rules of embedding rows: sgd is the dense SGD's rule, bit for
// bit; adagrad and lazy Adam follow PyTorch's formulas.
#include "common/optim/row_optimizer.h"

#include <cmath>
#include <vector>

#include "common/optim/optimizer.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(RowOptimizerTest, SgdOnARowIsTheDenseSgdStepBitForBit) {
  OptimizerConfig c;
  c.type = OptimizerType::kSgd;
  c.lr = 0.1;
  c.weight_decay = 0.01;
  std::vector<float> dense(37), row(37), g(37);
  for (int i = 0; i < 37; ++i) {
    dense[i] = row[i] = std::sin(0.7f * i) * 3.0f;
    g[i] = std::cos(1.3f * i) / 7.0f;
  }
  auto opt = Optimizer::Create(c, 37);
  ASSERT_TRUE(opt.ok()) << opt.status();
  for (int step = 0; step < 3; ++step) {
    (*opt)->Step(dense.data(), g.data());
    SgdRow(static_cast<float>(c.lr), static_cast<float>(c.weight_decay), 37,
           g.data(), row.data());
    ASSERT_EQ(row, dense) << "step " << step;
  }
}

TEST(RowOptimizerTest, AdagradDividesByTheRootOfTheSquaredSums) {
  std::vector<float> p = {1, -2, 0.5f}, sums(3, 0.1f);
  std::vector<double> want_p = {1, -2, 0.5}, want_s(3, 0.1);
  for (int step = 0; step < 4; ++step) {
    const std::vector<float> g = {0.5f * (step + 1), -1.0f, 0.25f};
    AdagradRow(0.5f, 0.0f, 1e-10f, 3, g.data(), p.data(), sums.data());
    for (int j = 0; j < 3; ++j) {
      want_s[j] += g[j] * g[j];
      want_p[j] -= 0.5 * g[j] / (std::sqrt(want_s[j]) + 1e-10);
    }
  }
  for (int j = 0; j < 3; ++j) {
    EXPECT_NEAR(p[j], want_p[j], 1e-6) << j;
    EXPECT_NEAR(sums[j], want_s[j], 1e-6) << j;
  }
}

// At its first step lazy Adam's bias-corrected moments are g and g * g:
// each value moves by lr against the sign of its gradient.
TEST(RowOptimizerTest, LazyAdamsFirstStepMovesEachValueByLr) {
  std::vector<float> p = {1, -2, 0.5f}, moments(6, 0.0f);
  const std::vector<float> g = {0.5f, -3.0f, 0.25f};
  SparseAdamRow(0.01, 0.9, 0.999, 1e-8, /*step=*/1, 3, g.data(), p.data(),
                moments.data());
  EXPECT_NEAR(p[0], 0.99, 1e-6);
  EXPECT_NEAR(p[1], -1.99, 1e-6);
  EXPECT_NEAR(p[2], 0.49, 1e-6);
  EXPECT_NEAR(moments[0], 0.1 * 0.5, 1e-7);     // m
  EXPECT_NEAR(moments[3], 0.001 * 0.25, 1e-7);  // v
}

}  // namespace
}  // namespace tally
