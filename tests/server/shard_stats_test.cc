// A range's figures: runs of steps closed with the same members, the
// latency from a step's last push and commit to its publishing, the
// training clock and the throughput of the last few seconds.
#include "server/data/shard_stats.h"

#include <vector>

#include "gtest/gtest.h"

namespace tally {
namespace {

ShardMember Of(const std::string& id, int64_t incarnation = 1) {
  ShardMember m;
  m.spec.worker_id = id;
  m.spec.incarnation = incarnation;
  return m;
}

TEST(ShardStatsTest, StepsClosedWithTheSameMembersAreOneRun) {
  FakeClock clock;
  ShardStats stats(&clock, true, nullptr);
  ShardMember a = Of("a"), b = Of("b"), b2 = Of("b", 2);
  stats.Closed({&a, &b}, 0, 8);
  stats.Closed({&a, &b}, 1, 8);
  stats.Closed({&a, &b2}, 2, 4);  // b registered again: another run
  stats.Closed({&a, &b2}, 4, 4);  // not the next step: another run
  const std::vector<ClosedSpan> spans = stats.Spans();
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].first_step, 0);
  EXPECT_EQ(spans[0].end_step, 2);
  EXPECT_EQ(spans[0].members, 2);
  EXPECT_EQ(spans[0].samples, 16);
  EXPECT_NE(spans[0].members_hash, spans[1].members_hash);
  EXPECT_EQ(spans[1].members_hash, spans[2].members_hash);
  EXPECT_EQ(spans[2].first_step, 4);
  for (int64_t s = 5; s < 5 + 2 * int64_t{ShardStats::kMaxSpans}; s += 2)
    stats.Closed({&a}, s, 1);
  EXPECT_EQ(stats.Spans().size(), ShardStats::kMaxSpans);
}

TEST(ShardStatsTest, APublishedStepIsTimedFromItsLastPushAndCommit) {
  FakeClock clock;
  std::vector<PublishTimes> seen;
  ShardStats stats(&clock, true,
                   [&seen](const PublishTimes& t) { seen.push_back(t); });
  stats.Arrived(0, 0, /*commit=*/false);
  clock.Advance(absl::Seconds(1));
  stats.Arrived(0, 0, /*commit=*/true);
  stats.Arrived(1, 0, /*commit=*/false);  // the next step's: kept
  clock.Advance(absl::Seconds(2));
  ReadyCalls ready;
  stats.Published(0, &ready);
  EXPECT_TRUE(seen.empty());  // called with the lock let go
  RunReady(ready);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_DOUBLE_EQ(seen[0].since_push, 3.0);
  EXPECT_DOUBLE_EQ(seen[0].since_commit, 2.0);
  ready.clear();
  stats.Published(1, &ready);
  EXPECT_EQ(ready.size(), 1u);
  // A job without shared steps (async) times nothing.
  ShardStats async(&clock, false,
                   [&seen](const PublishTimes& t) { seen.push_back(t); });
  async.Arrived(0, 0, false);
  ready.clear();
  async.Published(0, &ready);
  EXPECT_TRUE(ready.empty());
}

TEST(ShardStatsTest, TrainingTimeAndThroughputAndARestoredRange) {
  FakeClock clock;
  ShardStats stats(&clock, true, nullptr);
  ShardMetrics m;
  stats.Fill(&m);
  EXPECT_EQ(m.train_seconds, 0.0);  // not started
  stats.Start();
  clock.Advance(absl::Seconds(1));
  stats.Start();  // once
  stats.Advanced({4, 2.0, 3}, false);
  clock.Advance(absl::Seconds(1));
  stats.Advanced({4, 1.0, 4}, /*finished=*/true);
  clock.Advance(absl::Seconds(10));
  ++stats.counts()->rejected;
  stats.Fill(&m);
  EXPECT_DOUBLE_EQ(m.train_seconds, 2.0);  // to the last step
  EXPECT_DOUBLE_EQ(m.loss, 0.25);
  EXPECT_DOUBLE_EQ(m.accuracy, 1.0);
  EXPECT_EQ(m.samples, 8);
  EXPECT_EQ(m.rejected_pushes, 1);
  EXPECT_DOUBLE_EQ(m.samples_per_sec, 4.0);
  // Restored, the range goes on from those figures.
  m.version = 2;
  m.total_steps = 10;
  ShardStats restored(&clock, true, nullptr);
  restored.GoOnFrom(m);
  clock.Advance(absl::Seconds(3));
  ShardMetrics again;
  restored.Fill(&again);
  EXPECT_DOUBLE_EQ(again.train_seconds, 5.0);
  EXPECT_EQ(again.samples, 8);
  EXPECT_EQ(again.rejected_pushes, 1);
}

}  // namespace
}  // namespace tally
