// A range's staging buffers: counted out within a bound, recycled up to
// what a step stages, and kept no more once the range retired.
#include "server/data/staging_pool.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

TEST(StagingPoolTest, BuffersOutStayWithinTheLimit) {
  StagingPool pool(3);
  auto a = pool.Acquire(2);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, nullptr);  // none pooled: the caller makes one
  ASSERT_TRUE(pool.Acquire(2).ok());
  EXPECT_EQ(pool.out(), 2);
  EXPECT_THAT(pool.Acquire(2),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("2 pushes already in flight for this job "
                                 "(limit 2)")));
  EXPECT_EQ(pool.out(), 2);  // a refusal counts nothing
}

TEST(StagingPoolTest, ABufferBackIsHandedOutAgain) {
  StagingPool pool(3);
  ASSERT_TRUE(pool.Acquire(4).ok());
  auto made = std::make_unique<std::vector<float>>(3);
  const float* at = made->data();
  pool.Release(std::move(made), /*members=*/2);
  EXPECT_EQ(pool.out(), 0);
  auto again = pool.Acquire(4);
  ASSERT_TRUE(again.ok());
  ASSERT_NE(*again, nullptr);
  EXPECT_EQ((*again)->data(), at);
  // The sum takes a pooled one too, or a new one, counted either way.
  pool.Release(*std::move(again), 2);
  EXPECT_EQ(pool.Take()->data(), at);
  EXPECT_NE(pool.Take(), nullptr);
  EXPECT_EQ(pool.out(), 2);
  pool.Release(nullptr, 2);  // nothing
  EXPECT_EQ(pool.out(), 2);
  pool.Forget();  // one that comes back in no shape to reuse
  EXPECT_EQ(pool.out(), 1);
}

TEST(StagingPoolTest, AsManyAreKeptAsAStepStages) {
  StagingPool pool(3);
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(pool.Acquire(100).ok());
  for (int i = 0; i < 12; ++i)
    pool.Release(std::make_unique<std::vector<float>>(3), /*members=*/1);
  int kept = 0;
  for (int i = 0; i < 12; ++i) {
    auto b = pool.Acquire(100);
    ASSERT_TRUE(b.ok());
    kept += *b != nullptr;
  }
  EXPECT_EQ(kept, 9);  // members + 8
}

TEST(StagingPoolTest, AClosedPoolKeepsNothing) {
  StagingPool pool(3);
  pool.Prime(std::make_unique<std::vector<float>>(3));
  EXPECT_FALSE(pool.empty());
  pool.Prime(std::make_unique<std::vector<float>>(3));  // one is enough
  ASSERT_TRUE(pool.Acquire(4).ok());
  EXPECT_TRUE(pool.empty());
  pool.Close();
  pool.Release(std::make_unique<std::vector<float>>(3), 2);
  EXPECT_TRUE(pool.empty());
  EXPECT_EQ(pool.out(), 0);
  pool.Prime(std::make_unique<std::vector<float>>(3));
  EXPECT_TRUE(pool.empty());
}

}  // namespace
}  // namespace tally
