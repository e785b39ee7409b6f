// The consistency rules as one range applies them: which steps are open,
// what a stale gradient weighs, and the codes of a push or rows each rule
// refuses, with the refusals it counts.
#include "server/data/step_rules.h"

#include "gtest/gtest.h"
#include "proto/errors.h"
#include "server/data/shard_stats.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::HasReason;
using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

ConsistencySpec Mode(ConsistencyMode mode, int64_t staleness = 0) {
  ConsistencySpec c;
  c.mode = mode;
  c.staleness = staleness;
  return c;
}

ShardMember Joined(int64_t join_step = 0) {
  ShardMember m;
  m.spec.worker_id = "w";
  m.spec.incarnation = 1;
  m.spec.join_step = join_step;
  return m;
}

PushMeta Push(int64_t step, int64_t base, int64_t samples = 4) {
  PushMeta p;
  p.worker_id = "w";
  p.incarnation = 1;
  p.step = step;
  p.base_version = base;
  p.samples = samples;
  return p;
}

TEST(StepRulesTest, WhatEachModeOpensAndStreams) {
  const StepRules bsp(Mode(ConsistencyMode::kBsp), 0, 0);
  EXPECT_EQ(bsp.window(), 0);
  EXPECT_TRUE(bsp.AllowsStreaming());
  EXPECT_EQ(bsp.StagingLimit(3), 2 * 3 + 4);
  ConsistencySpec backups = Mode(ConsistencyMode::kBsp);
  backups.backup_workers = 1;
  EXPECT_FALSE(StepRules(backups, 0, 0).AllowsStreaming());
  EXPECT_EQ(StepRules(backups, 0, 0).backups(), 1);
  const StepRules ssp(Mode(ConsistencyMode::kSsp, 2), 0, 0);
  EXPECT_EQ(ssp.window(), 2);
  EXPECT_EQ(ssp.backups(), 0);
  EXPECT_FALSE(ssp.AllowsStreaming());
  EXPECT_EQ(ssp.StagingLimit(3), 4 * 3 + 4);
  EXPECT_TRUE(
      StepRules(Mode(ConsistencyMode::kSsp, 0), 0, 0).AllowsStreaming());
  const StepRules async(Mode(ConsistencyMode::kAsync), 0, 0);
  EXPECT_TRUE(async.async());
  EXPECT_FALSE(async.AllowsStreaming());
}

TEST(StepRulesTest, AStaleGradientWeighsOneOverItsStalenessWhenScaled) {
  ConsistencySpec c = Mode(ConsistencyMode::kSsp, 4);
  EXPECT_EQ(StepRules(c, 0, 0).Scale(4), 1.0f);  // no lr_scaling
  c.lr_scaling = LrScaling::kStaleness;
  const StepRules scaled(c, 0, 0);
  EXPECT_EQ(scaled.Scale(0), 1.0f);
  EXPECT_EQ(scaled.Scale(1), 1.0f);
  EXPECT_EQ(scaled.Scale(4), 0.25f);
}

TEST(StepRulesTest, BspRefusesPushesOfOtherStepsAndCountsLateOnes) {
  const StepRules bsp(Mode(ConsistencyMode::kBsp), /*max_samples=*/8, 0);
  PushCounts counts;
  bool dup = false;
  ShardMember m = Joined();
  TALLY_EXPECT_OK(bsp.CheckPush(Push(3, 3), m, 3, false, &dup, &counts));
  EXPECT_FALSE(dup);
  EXPECT_THAT(bsp.CheckPush(Push(2, 2), m, 3, false, &dup, &counts),
              HasReason(absl::StatusCode::kAborted, v1::STEP_CLOSED));
  EXPECT_EQ(counts.late, 1);  // required at step 2, and late
  EXPECT_THAT(bsp.CheckPush(Push(4, 3), m, 3, false, &dup, &counts),
              HasReason(absl::StatusCode::kAborted, v1::STEP_NOT_OPEN));
  EXPECT_THAT(bsp.CheckPush(Push(3, 2), m, 3, false, &dup, &counts),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("must be computed from version 3")));
  EXPECT_THAT(bsp.CheckPush(Push(3, 3, 9), m, 3, false, &dup, &counts),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("over the job's batch size 8")));
  EXPECT_THAT(bsp.CheckPush(Push(3, 3), m, 3, /*ended=*/true, &dup, &counts),
              HasReason(absl::StatusCode::kAborted, v1::STEP_CLOSED));
  EXPECT_THAT(bsp.CheckPush(Push(3, 3), Joined(4), 3, false, &dup, &counts),
              HasReason(absl::StatusCode::kAborted, v1::JOIN_LATER));
  m.pushed_step = 3;
  TALLY_EXPECT_OK(bsp.CheckPush(Push(3, 3), m, 3, false, &dup, &counts));
  EXPECT_TRUE(dup);
  EXPECT_EQ(counts.late, 1);
  EXPECT_EQ(counts.stale, 0);
}

TEST(StepRulesTest, BuffersMustBeTheJobsSize) {
  PushCounts counts;
  bool dup = false;
  PushMeta p = Push(0, 0);
  p.buffers = std::make_shared<const std::string>("abc");
  EXPECT_THAT(StepRules(Mode(ConsistencyMode::kBsp), 0, 0)
                  .CheckPush(p, Joined(), 0, false, &dup, &counts),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("keeps no buffers")));
  EXPECT_THAT(StepRules(Mode(ConsistencyMode::kBsp), 0, 4)
                  .CheckPush(p, Joined(), 0, false, &dup, &counts),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("buffers of 3 bytes; the job's are 4")));
}

TEST(StepRulesTest, AsyncRefusesAndCountsGradientsStalerThanItsBound) {
  ConsistencySpec c = Mode(ConsistencyMode::kAsync);
  c.max_staleness = 2;
  const StepRules async(c, 0, 0);
  PushCounts counts;
  bool dup = false;
  ShardMember m = Joined();
  TALLY_EXPECT_OK(async.CheckPush(Push(0, 8), m, 10, false, &dup, &counts));
  EXPECT_THAT(async.CheckPush(Push(0, 7), m, 10, false, &dup, &counts),
              HasReason(absl::StatusCode::kAborted, v1::STALE_GRADIENT));
  EXPECT_EQ(counts.stale, 1);
  EXPECT_THAT(async.CheckPush(Push(0, 11), m, 10, false, &dup, &counts),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not one this shard served")));
  m.pushed_step = 0;  // a member's own clock: step 0 is pushed
  TALLY_EXPECT_OK(async.CheckPush(Push(0, 8), m, 10, false, &dup, &counts));
  EXPECT_TRUE(dup);
}

TEST(StepRulesTest, RowsComeForAnOpenStepBeforeItsCommit) {
  const StepRules ssp(Mode(ConsistencyMode::kSsp, 1), /*max_samples=*/8, 0);
  ShardMember m = Joined();
  TALLY_EXPECT_OK(ssp.CheckRows(m, 4, 8, 3, false));  // in the window
  EXPECT_THAT(ssp.CheckRows(m, 5, 8, 3, false),
              HasReason(absl::StatusCode::kAborted, v1::STEP_NOT_OPEN));
  EXPECT_THAT(ssp.CheckRows(m, 2, 8, 3, false),
              HasReason(absl::StatusCode::kAborted, v1::STEP_CLOSED));
  EXPECT_THAT(ssp.CheckRows(m, 3, 9, 3, false),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("samples 9 outside [0, 8]")));
  m.committed_step = 3;
  EXPECT_THAT(ssp.CheckRows(m, 3, 8, 3, false),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("after its commit")));
  const StepRules async(Mode(ConsistencyMode::kAsync), 0, 0);
  m.pushed_step = 6;
  EXPECT_THAT(async.CheckRows(m, 6, 1, 3, false),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("after its push")));
  TALLY_EXPECT_OK(async.CheckRows(m, 7, 1, 3, false));
}

}  // namespace
}  // namespace tally
