// A job's weights read back from its ranges: every range at one version
// (asked again past a range that moved on), and retired ranges as they
// stand.
#include "server/control/range_reads.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/errors.h"
#include "tests/server/fake_shard_control.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::FakeShardControl;
using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

class RangeReadsTest : public ::testing::Test {
 protected:
  RangeReadsTest() {
    for (int i = 0; i < 2; ++i) {
      auto s = std::make_shared<FakeShardControl>();
      s->count = i == 0 ? 6 : 4;
      s->value = static_cast<float>(i + 1);
      s->optimizer_slots = 1;
      shards_.push_back(s);
      refs_.push_back({s, i == 0 ? 0 : 6, s->count});
    }
    shards_[0]->buffers = std::make_shared<const std::string>("bn");
  }
  std::vector<std::shared_ptr<FakeShardControl>> shards_;
  std::vector<RangeRef> refs_;
};

absl::Status Closed(int64_t step) {
  return WithReason(absl::AbortedError("closed"), v1::STEP_CLOSED, step);
}

TEST_F(RangeReadsTest, EveryRangeAtOneVersionIsOneVector) {
  auto saved = SaveRanges("job-1", 1, refs_, 5, 100, 10, false);
  TALLY_ASSERT_OK(saved);
  EXPECT_TRUE(saved->has_state);
  EXPECT_EQ(saved->state.metrics.version, 5);
  EXPECT_EQ(*saved->state.weights,
            (std::vector<float>{1, 1, 1, 1, 1, 1, 2, 2, 2, 2}));
  ASSERT_EQ(saved->state.optimizer.slots.size(), 1u);
  EXPECT_EQ(saved->state.optimizer.slots[0][9], 2.0f);
  ASSERT_NE(saved->state.buffers, nullptr);  // the range at offset 0 keeps them
  EXPECT_EQ(*saved->state.buffers, "bn");
  auto weights_only = SaveRanges("job-1", 1, refs_, 5, 100, 10, true);
  TALLY_ASSERT_OK(weights_only);
  EXPECT_TRUE(weights_only->state.optimizer.slots.empty());
}

TEST_F(RangeReadsTest, ARangePastTheVersionIsAskedAgainFurtherOn) {
  shards_[1]->save_errors.push_back(Closed(7));
  auto saved = SaveRanges("job-1", 1, refs_, 5, 100, 10, true);
  TALLY_ASSERT_OK(saved);
  EXPECT_EQ(saved->state.metrics.version, 9);  // past where the fastest was
  EXPECT_EQ(shards_[0]->saves, (std::vector<int64_t>{5, 9}));
  // Never past the schedule's last version.
  shards_[1]->save_errors.push_back(Closed(7));
  saved = SaveRanges("job-1", 1, refs_, 5, 8, 10, true);
  TALLY_ASSERT_OK(saved);
  EXPECT_EQ(saved->state.metrics.version, 8);
}

TEST_F(RangeReadsTest, RangesThatKeepMovingOrFailAreNotSaved) {
  for (int i = 0; i < 5; ++i) shards_[0]->save_errors.push_back(Closed(i));
  EXPECT_THAT(SaveRanges("job-1", 1, refs_, 0, 100, 10, true),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("kept moving")));
  shards_[1]->save_errors.push_back(absl::UnavailableError("away"));
  EXPECT_THAT(SaveRanges("job-1", 1, refs_, 0, 100, 10, true),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("away")));
  refs_[1].count = 5;  // the shard answers 4
  EXPECT_THAT(SaveRanges("job-1", 1, refs_, 0, 100, 10, true),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("another size")));
}

TEST_F(RangeReadsTest, RetiredRangesAreReadAsTheyStand) {
  shards_[0]->version = 12;
  RetiredState retired = RetiredWeights("job-1", 1, 3, 10, refs_);
  ASSERT_NE(retired.weights, nullptr);
  EXPECT_EQ((*retired.weights)[0], 1.0f);
  EXPECT_EQ((*retired.weights)[9], 2.0f);
  EXPECT_EQ(retired.buffers, "bn");
  EXPECT_EQ(shards_[0]->saves, std::vector<int64_t>{12});
  shards_[1]->hold_status = absl::NotFoundError("gone");
  EXPECT_EQ(RetiredWeights("job-1", 1, 4, 10, refs_).weights, nullptr);
}

}  // namespace
}  // namespace tally
