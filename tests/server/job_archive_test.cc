// What is kept of jobs across restarts: which jobs are due, each one's
// file, jobs read back as records, and dropped jobs forgotten.
#include "server/control/job_archive.h"

#include <memory>
#include <string>
#include <vector>

#include "common/io/safetensors.h"
#include "gtest/gtest.h"
#include "server/control/planner.h"
#include "tests/server/fake_shard_control.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::FakeShardControl;
using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kSpec[] = TALLY_TINY_MODEL "training: {workers: 2}\n";

const absl::Time kNow = ::tally::testing::kPartsNow;

StoredJob Stored(v1::JobState state, bool with_state) {
  StoredJob s;
  s.job.set_id("job-3");
  s.job.set_state(state);
  s.job.set_spec(kSpec);
  s.has_state = with_state;
  if (with_state) {
    s.state.metrics.version = 7;
    s.state.metrics.loss = 0.25;
    s.state.weights = std::make_shared<std::vector<float>>(10, 0.5f);
  }
  s.table_homes = {"h:1"};
  return s;
}

TEST(JobArchiveTest, ARunningJobResumesFromItsCheckpoint) {
  JobEntry job = JobArchive::FromStored(Stored(v1::RUNNING, true),
                                        SpecLimits(), kNow);
  EXPECT_EQ(job.proto.state(), v1::RUNNING);
  ASSERT_NE(job.start, nullptr);
  EXPECT_EQ(job.start->state.metrics.version, 7);
  EXPECT_EQ(job.proto.metrics().step(), 7);
  EXPECT_EQ(job.proto.metrics().loss(), 0.25);
  EXPECT_EQ(job.saved_version, 7);
  EXPECT_EQ(job.saved_state, v1::RUNNING);
  EXPECT_EQ(job.slots.size(), 2u);
  EXPECT_THAT(job.condition, HasSubstr("resuming from the checkpoint of "
                                       "step 7"));
  EXPECT_FALSE(job.retired);
}

TEST(JobArchiveTest, ARunningJobWithoutCheckpointWaitsToStartAgain) {
  StoredJob grown = Stored(v1::RUNNING, false);
  for (int world : {2, 3}) {
    v1::MembershipPeriod* p = grown.job.add_membership();
    p->set_first_epoch(world == 2 ? 0 : 1);
    p->set_world(world);
  }
  grown.job.set_plan(1);
  JobEntry job = JobArchive::FromStored(grown, SpecLimits(), kNow);
  EXPECT_EQ(job.proto.state(), v1::PENDING);
  EXPECT_EQ(job.start, nullptr);
  // With the workers it was submitted with, under a new plan.
  EXPECT_EQ(job.slots.size(), 2u);
  EXPECT_EQ(job.proto.plan(), 2);
  EXPECT_THAT(job.history.events(0).text(), HasSubstr("had no checkpoint"));
}

TEST(JobArchiveTest, AnEndedJobKeepsItsFinalWeightsAndTableHomes) {
  JobEntry job = JobArchive::FromStored(Stored(v1::SUCCEEDED, true),
                                        SpecLimits(), kNow);
  EXPECT_TRUE(job.retired);
  EXPECT_FALSE(job.dirty);
  ASSERT_NE(job.final_weights, nullptr);
  EXPECT_EQ(job.final_weights->size(), 10u);
  EXPECT_EQ(job.table_home_addresses, std::vector<std::string>{"h:1"});
}

class JobArchiveDueTest : public ::testing::Test {
 protected:
  JobArchiveDueTest()
      : jobs_(JobQueue::Options()),
        registry_(absl::Seconds(3), 10, kNow),
        local_(std::make_shared<FakeShardControl>()) {
    registry_.AddLocalShard(local_, "", kNow);
    options_.checkpoint_interval = absl::Seconds(30);
  }
  JobEntry& Add() {
    JobEntry& job = jobs_.Add(*ParseJobSpec(kSpec, SpecLimits()), kSpec, "",
                              kNow);
    Planner::RecordPlan(job);
    job.saved_state = v1::PENDING;
    job.saved_at = kNow;
    return job;
  }
  JobQueue jobs_;
  Registry registry_;
  std::shared_ptr<FakeShardControl> local_;
  JobArchive::Options options_;
};

TEST_F(JobArchiveDueTest, AJobIsDueWhenItChangedOrMovedAtItsInterval) {
  JobArchive archive(options_);
  JobEntry& job = Add();
  EXPECT_TRUE(archive.Due(jobs_, registry_, false, kNow).empty());
  job.proto.set_state(v1::RUNNING);  // state changed
  std::vector<CheckpointDue> due = archive.Due(jobs_, registry_, false, kNow);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_TRUE(due[0].ranges.empty());  // not placed
  job.saved_state = v1::RUNNING;
  job.ranges = {{Registry::kLocalShard, 0, 10}};
  job.installed = true;
  v1::RangeStatus r;
  r.set_job_id(job.id());
  r.set_version(4);
  local_->ranges = {r};
  // Moved: due at its interval, or when forced.
  EXPECT_TRUE(archive.Due(jobs_, registry_, false, kNow).empty());
  due = archive.Due(jobs_, registry_, true, kNow);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].version, 4);
  ASSERT_EQ(due[0].ranges.size(), 1u);
  EXPECT_EQ(due[0].job.metrics().progress_size(), 0);
  EXPECT_EQ(archive.Due(jobs_, registry_, false, kNow + absl::Seconds(30))
                .size(),
            1u);
  // An ended job waits for its final weights (its ranges retired).
  job.proto.set_state(v1::FAILED);
  EXPECT_TRUE(archive.Due(jobs_, registry_, true, kNow).empty());
}

TEST_F(JobArchiveDueTest, AWrittenJobIsReadBack) {
  options_.state_dir = ::tally::testing::TempDir("job_archive_written");
  JobArchive archive(options_);
  EXPECT_TRUE(archive.enabled());
  JobEntry& job = Add();
  job.proto.set_state(v1::SUCCEEDED);
  job.proto.mutable_metrics()->set_step(9);
  job.retired = true;
  job.final_weights = std::make_shared<std::vector<float>>(10, 0.5f);
  TALLY_ASSERT_OK(archive.Open());
  std::vector<CheckpointDue> due = archive.Due(jobs_, registry_, false, kNow);
  ASSERT_EQ(due.size(), 1u);
  auto written = archive.Write(due[0]);
  TALLY_ASSERT_OK(written);
  EXPECT_TRUE(*written);
  EXPECT_EQ(due[0].saved_version, 9);
  JobArchive::NoteWritten(due[0], job, kNow);
  EXPECT_EQ(job.saved_state, v1::SUCCEEDED);
  EXPECT_EQ(job.saved_version, 9);
  EXPECT_NE(archive.LastState(job.id()), nullptr);
  archive.SaveNextJob(5);
  // Another server on the directory is refused; this one reads it back.
  JobArchive other(options_);
  EXPECT_THAT(other.Open(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                     ::testing::_));
  auto restored = archive.LoadAll(kNow);
  TALLY_ASSERT_OK(restored);
  EXPECT_EQ(restored->next_job, 5);
  ASSERT_EQ(restored->jobs.count(job.id()), 1u);
  EXPECT_EQ(restored->jobs.at(job.id()).proto.metrics().step(), 9);
  EXPECT_EQ(*restored->jobs.at(job.id()).final_weights, *job.final_weights);
}

TEST_F(JobArchiveDueTest, ADroppedJobsWeightsAreKeptAndItsFileGoes) {
  options_.state_dir = ::tally::testing::TempDir("job_archive_dropped");
  options_.keep_weights_dir = ::tally::testing::TempDir("job_archive_kept");
  JobArchive archive(options_);
  TALLY_ASSERT_OK(archive.Open());
  StoredJob stored = Stored(v1::SUCCEEDED, true);
  JobEntry job = JobArchive::FromStored(stored, SpecLimits(), kNow);
  CheckpointDue d;
  d.job = job.proto;
  d.final_weights = job.final_weights;
  TALLY_ASSERT_OK(archive.Write(d));
  EXPECT_NE(archive.LastState("job-3"), nullptr);
  DroppedJob dropped;
  dropped.id = "job-3";
  dropped.weights = job.final_weights;
  dropped.params = job.spec.layout.params;
  dropped.step = 7;
  archive.Forget(dropped);
  EXPECT_EQ(archive.LastState("job-3"), nullptr);
  auto kept = LoadSafetensors(options_.keep_weights_dir + "/job-3.safetensors",
                              job.spec.layout.params);
  TALLY_ASSERT_OK(kept);
  EXPECT_EQ(*kept, std::vector<float>(10, 0.5f));
}

}  // namespace
}  // namespace tally
