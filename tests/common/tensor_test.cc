#include "common/tensor.h"

#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(TensorTest, ElementCountsAndNames) {
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(NumElements({64, 1, 28, 28}), 50176);
  EXPECT_EQ(NumElements({3, 0}), 0);
  EXPECT_EQ(ShapeString({64, 1, 28, 28}), "[64, 1, 28, 28]");
  EXPECT_EQ(ShapeString({}), "[]");
  float data[6];
  Tensor t{data, {2, 3}};
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.rank(), 2);
  EXPECT_EQ(t.dim(1), 3);
}

}  // namespace
}  // namespace tally
