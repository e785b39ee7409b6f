// A job's record: its history's bounds (events, curve points) and the
// small rules every part reads (ended, lowest rank, job numbers).
#include "server/control/job_entry.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

const absl::Time kNow = absl::UnixEpoch() + absl::Hours(1);

TEST(JobEntryTest, EventsKeepTheLastTwoHundred) {
  JobEntry job;
  for (int i = 0; i < 250; ++i) job.AddEvent(kNow, absl::StrCat("event ", i));
  ASSERT_EQ(job.history.events_size(), 200);
  EXPECT_EQ(job.history.events(0).text(), "event 50");
  EXPECT_EQ(job.history.events(199).text(), "event 249");
  EXPECT_DOUBLE_EQ(job.history.events(0).unix_time(), 3600.0);
}

TEST(JobEntryTest, ACurveHasAPointAStepAndHalvesWhenFull) {
  JobEntry job;
  v1::JobMetrics m;
  job.AddCurvePoint(kNow, m);  // step 0: no loss to show
  EXPECT_EQ(job.history.curve_size(), 0);
  m.set_step(1);
  m.set_loss(0.5);
  job.AddCurvePoint(kNow, m);
  job.AddCurvePoint(kNow + absl::Seconds(1), m);  // the same step
  ASSERT_EQ(job.history.curve_size(), 1);
  EXPECT_DOUBLE_EQ(job.history.curve(0).loss(), 0.5);
  EXPECT_EQ(job.last_point, kNow);
  for (int step = 2; step <= 1001; ++step) {
    m.set_step(step);
    job.AddCurvePoint(kNow, m);
  }
  // Full at 1000 points: every other one kept, then the new one.
  EXPECT_EQ(job.history.curve_size(), 501);
  EXPECT_EQ(job.history.curve(0).step(), 1);
  EXPECT_EQ(job.history.curve(1).step(), 3);
  EXPECT_EQ(job.history.curve(500).step(), 1001);
  EXPECT_EQ(job.point_every, absl::Seconds(1));
}

TEST(JobEntryTest, DirtyMarksBumpTheGeneration) {
  JobEntry job;
  job.dirty = false;
  const int64_t before = job.generation;
  job.MarkDirty();
  EXPECT_TRUE(job.dirty);
  EXPECT_EQ(job.generation, before + 1);
}

TEST(JobEntryTest, LowestRankIsTheFirstOccupiedSlot) {
  JobEntry job;
  EXPECT_EQ(job.LowestRank(), "");
  job.slots = {"", "w2", "w1"};
  EXPECT_EQ(job.LowestRank(), "w2");
}

TEST(JobEntryTest, EndedStatesAndJobNumbers) {
  JobEntry job;
  for (v1::JobState s : {v1::PENDING, v1::RUNNING}) {
    job.proto.set_state(s);
    EXPECT_FALSE(job.ended());
  }
  for (v1::JobState s : {v1::SUCCEEDED, v1::FAILED, v1::CANCELLED}) {
    job.proto.set_state(s);
    EXPECT_TRUE(job.ended());
  }
  EXPECT_EQ(JobNumber("job-12"), 12);
  EXPECT_EQ(JobNumber("job-x"), 0);
  EXPECT_EQ(JobNumber("12"), 0);
  EXPECT_THAT(NoJob("job-9"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-9")));
}

}  // namespace
}  // namespace tally
