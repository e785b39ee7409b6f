// A job as clients see it: its record with the figures of the moment from
// its ranges, its workers' progress, and a stalled step's report.
#include "server/control/job_render.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/control/planner.h"
#include "tests/server/fake_shard_control.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::FakeShardControl;
using ::testing::HasSubstr;

constexpr char kSpec[] =
    TALLY_TINY_MODEL "training: {workers: 2, shards: 2}\n";

const absl::Time kNow = ::tally::testing::kPartsNow;

class JobRenderTest : public ::testing::Test {
 protected:
  JobRenderTest()
      : jobs_(JobQueue::Options()),
        registry_(absl::Seconds(3), 10, kNow),
        planner_(&jobs_, &registry_) {
    shards_ = ::tally::testing::AddFakeShards(registry_, 2);
  }
  // A running job, installed, both workers members from step 0.
  JobEntry& Running() {
    JobEntry& job = jobs_.Add(*ParseJobSpec(kSpec, SpecLimits()), kSpec, "",
                              kNow);
    Planner::RecordPlan(job);
    for (const char* name : {"a", "b"}) {
      v1::RegisterWorkerRequest r;
      r.set_name(name);
      r.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
      workers_.push_back(registry_.AddWorker(r, kNow)->worker_id());
    }
    planner_.ScheduleJobs(kNow);
    job.installed = true;
    for (const std::string& id : workers_) {
      MemberSpec m;
      m.worker_id = id;
      job.members.push_back(m);
    }
    return job;
  }
  // What range `i` of the job reports: its version, loss, and clocks.
  void Report(const JobEntry& job, int i, int64_t version, double loss,
              int64_t clock_a, int64_t clock_b) {
    v1::RangeStatus r;
    r.set_job_id(job.id());
    r.set_map_version(job.map_version);
    r.set_version(version);
    r.set_loss(loss);
    r.set_rejected_pushes(1);
    for (int w = 0; w < 2; ++w) {
      v1::MemberProgress* p = r.add_member_progress();
      p->set_worker_id(workers_[w]);
      p->set_clock(w == 0 ? clock_a : clock_b);
    }
    for (auto& s : shards_) {
      if (registry_.shard(job.ranges[i].shard_id).control == s)
        s->ranges = {r};
    }
  }
  JobQueue jobs_;
  Registry registry_;
  Planner planner_;
  std::vector<std::shared_ptr<FakeShardControl>> shards_;
  std::vector<std::string> workers_;
};

TEST_F(JobRenderTest, APendingJobShowsItsConditionAndNoFigures) {
  JobEntry& job = jobs_.Add(*ParseJobSpec(kSpec, SpecLimits()), kSpec, "",
                            kNow);
  job.schedule.total_steps = 40;
  job.condition = "the coordinator restarted";
  job.proto.set_message("a note");
  v1::Job j = RenderJob(job, registry_, kNow);
  EXPECT_EQ(j.message(), "the coordinator restarted; a note");
  EXPECT_EQ(j.metrics().total_steps(), 40);
  EXPECT_EQ(j.metrics().workers(), 0);
  EXPECT_FALSE(j.loss().empty());
}

TEST_F(JobRenderTest, ARunningJobIsAtTheVersionEveryRangeReached) {
  JobEntry& job = Running();
  Report(job, 0, 5, 0.5, 5, 4);
  v1::Job j = RenderJob(job, registry_, kNow);
  EXPECT_EQ(j.metrics().step(), 0);  // a range not reported yet
  Report(job, 1, 4, 0.75, 5, 4);
  j = RenderJob(job, registry_, kNow);
  EXPECT_EQ(j.metrics().step(), 4);
  EXPECT_EQ(j.metrics().loss(), 0.75);  // the range at that version
  EXPECT_EQ(j.metrics().rejected_pushes(), 2);
  EXPECT_EQ(j.metrics().workers(), 2);
  ASSERT_EQ(j.metrics().progress_size(), 2);
  for (const v1::WorkerProgress& p : j.metrics().progress()) {
    EXPECT_EQ(p.lag(), p.name() == "a" ? 0 : 1);
    EXPECT_EQ(p.slowest(), p.name() == "b");
  }
}

TEST_F(JobRenderTest, AStalledStepNamesWhomItWaitsOn) {
  JobEntry& job = Running();
  Report(job, 0, 4, 0.5, 5, 4);
  Report(job, 1, 4, 0.5, 5, 4);
  EXPECT_TRUE(NoteProgress(job, registry_, kNow));  // moved to 4
  EXPECT_FALSE(NoteProgress(job, registry_, kNow + absl::Seconds(2)));
  v1::Job j = RenderJob(job, registry_, kNow + absl::Seconds(2));
  EXPECT_EQ(j.metrics().stalled_seconds(), 2.0);
  EXPECT_EQ(j.metrics().waiting_on_size(), 0);  // not for long enough
  const absl::Time later = kNow + absl::Seconds(4);
  j = RenderJob(job, registry_, later);
  ASSERT_EQ(j.metrics().waiting_on_size(), 1);
  EXPECT_THAT(j.metrics().waiting_on(0), HasSubstr(workers_[1] + " (b)"));
  // Watchers hear of it once a second.
  EXPECT_TRUE(NoteProgress(job, registry_, later));
  EXPECT_FALSE(NoteProgress(job, registry_, later + absl::Milliseconds(500)));
  EXPECT_TRUE(NoteProgress(job, registry_, later + absl::Seconds(1)));
  EXPECT_EQ(job.history.curve_size(), 1);
}

TEST_F(JobRenderTest, AnEndedJobIsItsRecord) {
  JobEntry& job = Running();
  Report(job, 0, 4, 0.5, 5, 4);
  Report(job, 1, 4, 0.5, 5, 4);
  job.proto.set_state(v1::SUCCEEDED);
  job.proto.mutable_metrics()->set_step(9);
  job.condition = "not shown";
  v1::Job j = RenderJob(job, registry_, kNow);
  EXPECT_EQ(j.metrics().step(), 9);
  EXPECT_EQ(j.message(), "");
}

}  // namespace
}  // namespace tally
