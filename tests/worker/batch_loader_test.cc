#include "worker/batch_loader.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"

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

// Samples i of a source that fails on one sample, recording the contexts
// it was asked with.
class Failing final : public SampleSource {
 public:
  explicit Failing(int64_t n, int64_t bad) : n_(n), bad_(bad) {}
  int64_t size() const override { return n_; }
  void Describe(Fingerprint*) const override {}
  absl::Status Gather(std::span<const int64_t> indices,
                      const GatherContext& context, float* x,
                      int32_t* y) const override {
    for (size_t j = 0; j < indices.size(); ++j) {
      if (indices[j] == bad_) {
        return absl::InvalidArgumentError(
            absl::StrCat("sample ", bad_, " does not decode"));
      }
      x[j] = static_cast<float>(indices[j] * 1000 + context.epoch);
      y[j] = static_cast<int32_t>(indices[j] % 3);
    }
    return absl::OkStatus();
  }

 private:
  int64_t n_, bad_;
};

TEST(BatchLoaderTest, ThreadsSplitABatchAndKeepItsOrder) {
  Dataset d;
  d.sample_shape = {1};
  d.num_classes = 3;
  d.source = std::make_shared<Failing>(103, -1);
  std::vector<std::vector<float>> seen[2];
  for (int threads : {1, 3}) {
    LoaderOptions o;
    o.batch_size = 16;
    o.seed = 5;
    o.epochs = 2;
    o.threads = threads;
    BatchLoader loader(&d, o);
    while (true) {
      auto b = loader.Next(absl::Seconds(10));
      if (absl::IsOutOfRange(b.status())) break;
      ASSERT_TRUE(b.ok()) << b.status();
      seen[threads == 3].emplace_back((*b)->x.begin(),
                                      (*b)->x.begin() + (*b)->size);
      loader.Recycle(*std::move(b));
    }
  }
  ASSERT_EQ(seen[0].size(), 14u);  // 7 a epoch, the last of 7 samples
  EXPECT_EQ(seen[0], seen[1]);
  // Each sample was gathered with its epoch (augmentations draw from it).
  EXPECT_EQ(static_cast<int64_t>(seen[0][13][0]) % 1000, 1);
  EXPECT_EQ(static_cast<int64_t>(seen[0][0][0]) % 1000, 0);
}

TEST(BatchLoaderTest, ASampleThatCannotBeReadEndsTheBatchesWithItsError) {
  Dataset d;
  d.sample_shape = {1};
  d.num_classes = 3;
  d.source = std::make_shared<Failing>(40, 37);
  for (int threads : {1, 2}) {
    LoaderOptions o;
    o.batch_size = 8;
    o.threads = threads;
    BatchLoader loader(&d, o);
    const std::vector<int64_t> order = EpochOrder(40, 0, 0);
    const int64_t at = std::find(order.begin(), order.end(), 37) - order.begin();
    for (int64_t b = 0; b < at / 8; ++b) {
      auto ok = loader.Next(absl::Seconds(10));
      ASSERT_TRUE(ok.ok()) << ok.status();
      loader.Recycle(*std::move(ok));
    }
    EXPECT_THAT(loader.Next(absl::Seconds(10)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::HasSubstr("sample 37 does not decode")));
    EXPECT_GT(loader.waited(), absl::ZeroDuration());
  }
}

// Token ids (int64 inputs) with a label a token, as a text dataset gives
// them: the batch carries them in ids and y, each sample whole.
TEST(BatchLoaderTest, Int64InputsAndALabelATokenTravelWhole) {
  Dataset d;
  d.sample_shape = {3};
  d.input_type = InputType::kInt64;
  d.label_shape = {3};
  d.num_classes = 1000;
  for (int i = 0; i < 21; ++i) {
    for (int k = 0; k < 3; ++k) {
      d.ids.push_back(int64_t{1} << 40 | (10 * i + k));
      d.labels.push_back(10 * i + k + 1);
    }
  }
  for (int threads : {1, 2}) {
    LoaderOptions o;
    o.batch_size = 4;
    o.seed = 3;
    o.threads = threads;
    BatchLoader loader(&d, o);
    std::vector<int64_t> got;
    while (true) {
      auto b = loader.Next(absl::Seconds(10));
      if (absl::IsOutOfRange(b.status())) break;
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_TRUE((*b)->x.empty());
      for (int i = 0; i < (*b)->size; ++i) {
        const int64_t first = (*b)->ids[3 * i] & 0xffffff;
        got.push_back(first / 10);
        for (int k = 0; k < 3; ++k) {
          EXPECT_EQ((*b)->ids[3 * i + k], int64_t{1} << 40 | (first + k));
          EXPECT_EQ((*b)->y[3 * i + k], first + k + 1);
        }
      }
      loader.Recycle(*std::move(b));
    }
    EXPECT_EQ(got, EpochOrder(21, 3, 0));
  }
}

}  // namespace
}  // namespace tally
