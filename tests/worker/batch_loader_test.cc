#include "worker/batch_loader.h"

#include <set>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;

Dataset Numbered(int n) {
  Dataset d;
  d.sample_shape = {2};
  d.num_classes = n;
  for (int i = 0; i < n; ++i) {
    d.features.push_back(i);
    d.features.push_back(-i);
    d.labels.push_back(i);
  }
  return d;
}

TEST(BatchLoaderTest, YieldsTheShardInOrderWithAShortLastBatch) {
  Dataset d = Numbered(23);
  LoaderOptions o;
  o.batch_size = 4;
  o.seed = 7;
  o.rank = 1;
  o.world = 2;
  o.epochs = 2;
  BatchLoader loader(&d, o);
  EXPECT_EQ(loader.batches_per_epoch(), 3);  // rank 1 holds 11 samples
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> want = EpochOrder(23, 7, epoch, 1, 2);
    std::vector<int64_t> got;
    for (int b = 0; b < 3; ++b) {
      auto batch = loader.Next(absl::Seconds(10));
      ASSERT_TRUE(batch.ok()) << batch.status();
      EXPECT_EQ((*batch)->epoch, epoch);
      EXPECT_EQ((*batch)->index, b);
      EXPECT_EQ((*batch)->size, b < 2 ? 4 : 3);
      for (int i = 0; i < (*batch)->size; ++i) {
        got.push_back((*batch)->y[i]);
        EXPECT_EQ((*batch)->x[2 * i], (*batch)->y[i]);
      }
      loader.Recycle(*std::move(batch));
    }
    EXPECT_EQ(got, want);
  }
  EXPECT_THAT(loader.Next(absl::Seconds(10)),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
}

TEST(BatchLoaderTest, MaxBatchesStopsEarlyAndDestructionWhileFullDoesNotHang) {
  Dataset d = Numbered(100);
  LoaderOptions o;
  o.batch_size = 10;
  o.epochs = 5;
  o.max_batches = 3;
  {
    BatchLoader loader(&d, o);
    for (int i = 0; i < 3; ++i)
      ASSERT_TRUE(loader.Next(absl::Seconds(10)).ok());
    EXPECT_THAT(loader.Next(absl::Seconds(10)),
                StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
  }
  o.max_batches = 0;
  BatchLoader full(&d, o);  // fills its queue, then must stop on destruction
}

}  // namespace
}  // namespace tally
