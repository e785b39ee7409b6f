// The open step's one sum, made as pushes arrive: each element in rank
// order whatever order the blocks come in (a block a lower rank has not
// added yet waits), so it is bit for bit the staged sum; a push in it that
// can no longer count drops it, and the others push again.
#include "server/data/streamed_sum.h"

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/errors.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::HasReason;
using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kN = 4;

class StreamedSumAloneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MemberSpec a, b;
    a.worker_id = "a";
    a.incarnation = 1;
    a.rank = 0;
    b.worker_id = "b";
    b.incarnation = 1;
    b.rank = 1;
    std::deque<StagedPush> queue;
    members_.Set({a, b}, false, &queue);
  }
  PushMeta Meta(const std::string& id, int64_t samples) {
    PushMeta m;
    m.worker_id = id;
    m.incarnation = 1;
    m.samples = samples;
    m.loss_sum = samples;
    return m;
  }
  // Begins `id`'s push of step 0 (weight: its samples) and finds its part.
  StreamedSum::Part* Begin(const std::string& id, int64_t samples) {
    EXPECT_TRUE(sum_.Begin(Meta(id, samples), samples, 0, &ready_));
    bool dup = false;
    auto part = sum_.Find(Meta(id, samples), sum_.generation(), 0, false, &dup);
    EXPECT_TRUE(part.ok()) << part.status();
    return part.ok() ? *part : nullptr;
  }
  // Adds [b, e) of `g` for `id`: true once in; false when it waits.
  bool Add(const std::string& id, StreamedSum::Part* part, int64_t b, int64_t e,
           const std::vector<float>& g) {
    auto added = sum_.Add(
        id, *part, b, e - b, g.data() + b, [this] { ++woken_; }, 0, &ready_);
    EXPECT_TRUE(added.ok()) << added.status();
    RunReady(ready_);
    ready_.clear();
    return added.ok() && *added;
  }

  StagingPool pool_{kN};
  ShardMembers members_{&pool_};
  VersionWaiters waiters_;
  StreamedSum sum_{kN, true, &members_, &pool_, &waiters_};
  ReadyCalls ready_;
  int woken_ = 0;
};

TEST_F(StreamedSumAloneTest, BlocksAreAddedInRankOrderWhateverOrderTheyCome) {
  const std::vector<float> ga = {1, 2, 3, 4}, gb = {0.5f, 0.25f, 8, 16};
  StreamedSum::Part* a = Begin("a", 1);
  StreamedSum::Part* b = Begin("b", 2);
  EXPECT_FALSE(Add("b", b, 0, 4, gb));  // a's values are not in yet
  EXPECT_TRUE(Add("a", a, 0, 2, ga));
  EXPECT_EQ(woken_, 1);                 // b is told to try again
  EXPECT_FALSE(Add("b", b, 0, 4, gb));  // [2, 4) of a still missing
  EXPECT_TRUE(Add("b", b, 0, 2, gb));
  EXPECT_TRUE(Add("a", a, 2, 4, ga));
  EXPECT_TRUE(Add("b", b, 2, 4, gb));
  EXPECT_TRUE(Add("b", b, 1, 3, gb));  // sent again: added once
  TALLY_EXPECT_OK(sum_.Finish(*a));
  TALLY_EXPECT_OK(sum_.Finish(*b));
  for (auto& [id, m] : members_.all()) m.committed_step = 0;
  std::vector<ShardMember*> required = {&members_.at("a"), &members_.at("b")};
  StepTally tally;
  ASSERT_TRUE(sum_.Tally(required, 0, &tally, &ready_));
  EXPECT_EQ(tally.samples, 3);
  EXPECT_EQ(std::vector<float>(sum_.data(), sum_.data() + kN),
            (std::vector<float>{2, 2.5f, 19, 36}));  // 1 * a + 2 * b
  EXPECT_EQ(sum_.generation(), 2);  // the next step's tokens are new
  EXPECT_EQ(sum_.resets(), 0);
}

TEST_F(StreamedSumAloneTest, APushOnlyPartlyAddedCannotCount) {
  StreamedSum::Part* a = Begin("a", 1);
  ASSERT_TRUE(Add("a", a, 0, 2, {1, 1, 1, 1}));
  EXPECT_THAT(sum_.Finish(*a), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("covers 2 of 4")));
  members_.at("a").committed_step = 0;
  std::vector<ShardMember*> required = {&members_.at("a")};
  StepTally tally;
  EXPECT_FALSE(sum_.Tally(required, 0, &tally, &ready_));  // the sum drops
  EXPECT_EQ(sum_.resets(), 1);
  EXPECT_EQ(members_.at("a").push_again, 0);
}

// a's push, in the sum, is refused elsewhere: the sum drops; b, whose push
// was in it, pushes again (its wait for the step's end is told so, and its
// stream's token is stale); a's counts as nothing.
TEST_F(StreamedSumAloneTest, ADroppedPartResetsTheSumAndTheOthersPushAgain) {
  const std::vector<float> g = {1, 1, 1, 1};
  StreamedSum::Part* a = Begin("a", 1);
  StreamedSum::Part* b = Begin("b", 1);
  const int64_t token = sum_.generation();
  ASSERT_TRUE(Add("a", a, 0, 4, g));
  ASSERT_TRUE(Add("b", b, 0, 4, g));
  TALLY_ASSERT_OK(sum_.Finish(*b));
  ShardMember& mb = members_.at("b");
  mb.pushed_step = 0;
  mb.committed_step = 0;
  absl::Status waited = absl::UnknownError("waiting");
  waiters_.Add(
      1, absl::InfiniteFuture(), [&waited](absl::Status s) { waited = s; },
      "b");
  sum_.DropPart("a", 0, &ready_);
  RunReady(ready_);
  EXPECT_EQ(sum_.resets(), 1);
  EXPECT_THAT(waited, HasReason(absl::StatusCode::kAborted, v1::PUSH_AGAIN));
  EXPECT_EQ(mb.pushed_step, -1);
  EXPECT_EQ(mb.committed_step, -1);
  EXPECT_EQ(mb.push_again, 0);
  EXPECT_EQ(members_.at("a").push_again, -1);  // nothing asked of a
  bool dup = false;
  EXPECT_THAT(sum_.Find(Meta("b", 1), token, 0, false, &dup),
              HasReason(absl::StatusCode::kAborted, v1::PUSH_AGAIN));
  EXPECT_FALSE(sum_.HasPart("a"));
  EXPECT_FALSE(sum_.HasPart("b"));
}

// Accept's whole push waits for the lower ranks; a lower rank settled as
// nothing (refused, pushed no samples) lets it in.
TEST_F(StreamedSumAloneTest, AWholePushGoesInOnceTheLowerRanksAreSettled) {
  sum_.Keep(Meta("b", 2), 2, std::make_unique<std::vector<float>>(kN, 3.0f), 0,
            &ready_);
  sum_.Progress(0, &ready_);
  members_.at("a").pushed_step = 0;  // settled here as nothing
  sum_.Progress(0, &ready_);
  members_.at("a").committed_step = 0;
  members_.at("b").committed_step = 0;
  std::vector<ShardMember*> required = {&members_.at("a"), &members_.at("b")};
  StepTally tally;
  ASSERT_TRUE(sum_.Tally(required, 0, &tally, &ready_));
  EXPECT_EQ(tally.samples, 2);
  EXPECT_EQ(std::vector<float>(sum_.data(), sum_.data() + kN),
            std::vector<float>(kN, 6.0f));
}

TEST_F(StreamedSumAloneTest, TheSamePushBegunAgainGoesOnAndAnotherReplacesIt) {
  StreamedSum::Part* a = Begin("a", 1);
  ASSERT_TRUE(Add("a", a, 0, 2, {1, 1, 1, 1}));
  EXPECT_FALSE(sum_.Begin(Meta("a", 1), 1, 0, &ready_));  // goes on
  EXPECT_EQ(a->added.covered(), 2);
  EXPECT_TRUE(sum_.Begin(Meta("a", 3), 3, 0, &ready_));  // another push
  EXPECT_EQ(sum_.resets(), 1);         // what the first added could not stay
  EXPECT_TRUE(sum_.Retire().empty());  // no block was waiting
  EXPECT_FALSE(sum_.on());
}

}  // namespace
}  // namespace tally
