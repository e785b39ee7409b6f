// A range's members: the coordinator's decisions taken (a leaver's last
// push counts as committed; async leavers are out at once), the members a
// step needs to close in the order of summation, and the staged sum.
#include "server/data/shard_members.h"

#include <deque>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "proto/errors.h"
#include "server/data/shard_stats.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::HasReason;

MemberSpec Spec(const std::string& id, int rank,
                int64_t leave_step = MemberSpec::kNoStep) {
  MemberSpec s;
  s.worker_id = id;
  s.incarnation = 1;
  s.rank = rank;
  s.leave_step = leave_step;
  return s;
}

class ShardMembersTest : public ::testing::Test {
 protected:
  // Stages `id`'s push of `step`: `samples` of gradient `g` everywhere.
  void Stage(const std::string& id, int64_t step, int64_t samples, float g) {
    PushMeta meta;
    meta.worker_id = id;
    meta.incarnation = 1;
    meta.step = step;
    meta.base_version = step;
    meta.samples = samples;
    meta.loss_sum = samples;
    members_.Stage(members_.at(id), meta,
                   std::make_unique<std::vector<float>>(2, g));
    members_.at(id).pushed_step = step;
  }

  StagingPool pool_{2};
  ShardMembers members_{&pool_};
  std::deque<StagedPush> queue_;
};

TEST_F(ShardMembersTest, AMembersCheckNamesWhatIsWrong) {
  members_.Set({Spec("a", 0, /*leave_step=*/3)}, false, &queue_);
  TALLY_EXPECT_OK(members_.Check("a", 1, 2, false));
  EXPECT_THAT(members_.Check("a", 1, 2, /*retired=*/true),
              HasReason(absl::StatusCode::kFailedPrecondition, v1::JOB_ENDED));
  EXPECT_THAT(members_.Check("b", 1, 2, false),
              HasReason(absl::StatusCode::kPermissionDenied, v1::NOT_A_MEMBER));
  EXPECT_THAT(
      members_.Check("a", 2, 2, false),
      HasReason(absl::StatusCode::kFailedPrecondition, v1::REGISTER_AGAIN));
  EXPECT_THAT(members_.Check("a", 1, 3, false),  // past its leave step
              HasReason(absl::StatusCode::kPermissionDenied, v1::NOT_A_MEMBER));
}

TEST_F(ShardMembersTest, AStepClosesWithItsRequiredMembersInRankOrder) {
  members_.Set({Spec("z", 0), Spec("b", 1), Spec("a", 1)}, false, &queue_);
  std::vector<ShardMember*> required;
  EXPECT_FALSE(members_.ReadyToClose(0, 0, &required));
  for (auto& [id, m] : members_.all()) m.committed_step = id == "z" ? -1 : 0;
  required.clear();
  EXPECT_FALSE(members_.ReadyToClose(0, /*backups=*/0, &required));
  required.clear();
  ASSERT_TRUE(members_.ReadyToClose(0, /*backups=*/1, &required));
  ASSERT_EQ(required.size(), 3u);
  EXPECT_EQ(required[0]->spec.worker_id, "z");
  EXPECT_EQ(required[1]->spec.worker_id, "a");  // rank 1, then by id
  EXPECT_EQ(required[2]->spec.worker_id, "b");
}

TEST_F(ShardMembersTest, TheStagedSumIsWeightedBySamplesAndALatePushCounted) {
  members_.Set({Spec("a", 0), Spec("b", 1), Spec("c", 2)}, false, &queue_);
  Stage("a", 0, 1, 1.0f);
  Stage("b", 0, 3, 4.0f);
  Stage("c", 0, 2, 8.0f);
  members_.at("a").committed_step = 0;
  members_.at("b").committed_step = 0;  // c has not committed: a backup
  std::vector<ShardMember*> required;
  ASSERT_TRUE(members_.ReadyToClose(0, 1, &required));
  PushCounts counts;
  StepTally tally;
  std::unique_ptr<std::vector<float>> sum = members_.SumStaged(
      required, 0, StepRules(ConsistencySpec{}, 0, 0), &counts, &tally);
  ASSERT_NE(sum, nullptr);
  EXPECT_EQ(*sum, (std::vector<float>{13, 13}));  // 1 * 1 + 3 * 4
  EXPECT_EQ(tally.samples, 4);
  EXPECT_EQ(tally.loss, 4.0);
  EXPECT_EQ(counts.late, 1);
  EXPECT_TRUE(members_.at("c").staged.empty());
}

// A leaver's push of its last step counts as committed (another shard had
// its commit), as nothing if that commit said it was refused; what it
// pushed past its last step goes.
TEST_F(ShardMembersTest, ALeaversLastPushCountsAsCommitted) {
  members_.Set({Spec("a", 0), Spec("b", 1)}, false, &queue_);
  Stage("a", 0, 1, 1.0f);
  Stage("a", 1, 1, 1.0f);
  Stage("b", 0, 1, 1.0f);
  MemberSpec a_leaves = Spec("a", 0, /*leave_step=*/1);
  MemberSpec b_leaves = Spec("b", 1, /*leave_step=*/1);
  b_leaves.last_refused = true;
  members_.Set({a_leaves, b_leaves}, false, &queue_);
  EXPECT_EQ(members_.at("a").committed_step, 0);
  EXPECT_EQ(members_.at("a").staged.count(0), 1u);
  EXPECT_EQ(members_.at("a").staged.count(1), 0u);  // past its last step
  EXPECT_EQ(members_.at("b").committed_step, 0);
  EXPECT_TRUE(members_.at("b").last_refused);
  EXPECT_TRUE(members_.at("b").staged.empty());
  // Another incarnation is another member: nothing of the first goes on.
  MemberSpec again = Spec("a", 0);
  again.incarnation = 2;
  members_.Set({again}, false, &queue_);
  EXPECT_EQ(members_.size(), 1u);
  EXPECT_EQ(members_.at("a").committed_step, -1);
  EXPECT_TRUE(members_.at("a").staged.empty());
  EXPECT_TRUE(queue_.empty());
}

// async: a leaver is out at once; its last push, which another shard had
// the commit of, is one version here too.
TEST_F(ShardMembersTest, AnAsyncLeaverIsOutAndItsLastPushQueued) {
  members_.Set({Spec("a", 0), Spec("b", 1)}, true, &queue_);
  Stage("a", 4, 2, 1.0f);
  members_.Set({Spec("a", 0, /*leave_step=*/5), Spec("b", 1)}, true, &queue_);
  EXPECT_EQ(members_.size(), 1u);
  ASSERT_EQ(queue_.size(), 1u);
  EXPECT_EQ(queue_.front().samples, 2);
  ASSERT_NE(queue_.front().grads, nullptr);
  EXPECT_TRUE(members_.Lowest(1));  // b is the lowest rank left
}

TEST_F(ShardMembersTest, AnAsyncCommitQueuesItsPushAndDropsAbandonedOnes) {
  members_.Set({Spec("a", 0)}, true, &queue_);
  Stage("a", 1, 1, 1.0f);
  Stage("a", 2, 1, 2.0f);
  PushMeta with_buffers;
  with_buffers.worker_id = "a";
  with_buffers.step = 2;
  with_buffers.buffers = std::make_shared<const std::string>("b");
  members_.KeepBuffers(with_buffers);
  StagedPush st = members_.QueueCommitted(members_.at("a"), 2, true);
  ASSERT_NE(st.grads, nullptr);
  EXPECT_EQ((*st.grads)[0], 2.0f);
  ASSERT_NE(st.buffers, nullptr);
  EXPECT_EQ(*st.buffers, "b");
  EXPECT_TRUE(members_.at("a").staged.empty());  // step 1's went
  EXPECT_EQ(members_.at("a").committed_step, 2);
  EXPECT_FALSE(members_.at("a").last_refused);
}

}  // namespace
}  // namespace tally
