// The control round: which jobs have work, the calls each makes to its
// shards (install, membership, retirement), and what is applied back.
#include "server/control/reconciler.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/control/job_store.h"
#include "server/control/planner.h"
#include "tests/server/fake_shard_control.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::FakeShardControl;
using ::testing::HasSubstr;

constexpr char kSpec[] =
    TALLY_TINY_MODEL "training: {workers: 1, shards: 2}\n";
constexpr char kPythonSpec[] =
    "model: {python: {code: x, params: [{name: w, shape: [2, 4]}]}}\n"
    "dataset: {name: synthetic, features: 4, classes: 2}\n";

const absl::Time kNow = ::tally::testing::kPartsNow;

class ReconcilerTest : public ::testing::Test {
 protected:
  ReconcilerTest()
      : jobs_(JobQueue::Options()),
        registry_(absl::Seconds(3), 100, kNow),
        planner_(&jobs_, &registry_) {
    shards_ = ::tally::testing::AddFakeShards(registry_, 2);
  }
  // A running job on both shards, with one worker in its slot.
  JobEntry& Start(const char* text = kSpec) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(text, SpecLimits());
    EXPECT_TRUE(spec.ok()) << spec.status();
    JobEntry& job = jobs_.Add(*std::move(spec), text, "", kNow);
    Planner::RecordPlan(job);
    v1::RegisterWorkerRequest r;
    r.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
    r.set_python(job.spec.is_python ? "Python 3" : "");
    worker_ = registry_.AddWorker(r, kNow)->worker_id();
    planner_.ScheduleJobs(kNow);
    EXPECT_EQ(job.proto.state(), v1::RUNNING);
    return job;
  }
  std::vector<ControlTask> Take() {
    return reconciler_.Take(jobs_, registry_, kNow);
  }
  bool Apply(ControlTask& t, JobEntry& job) {
    return Reconciler::Apply(t, job, registry_, kNow,
                             [this](const std::string& id) {
                               vacated_.push_back(id);
                             });
  }

  JobQueue jobs_;
  Registry registry_;
  Planner planner_;
  Reconciler reconciler_;
  std::vector<std::shared_ptr<FakeShardControl>> shards_;
  std::string worker_;
  std::vector<std::string> vacated_;
};

TEST_F(ReconcilerTest, APlacedJobIsInstalledThenGetsItsMembers) {
  JobEntry& job = Start();
  std::vector<ControlTask> tasks = Take();
  ASSERT_EQ(tasks.size(), 1u);
  reconciler_.Run(tasks[0]);
  EXPECT_TRUE(tasks[0].installed_now);
  ASSERT_EQ(shards_[0]->installs.size(), 1u);
  ASSERT_EQ(shards_[1]->installs.size(), 1u);
  EXPECT_EQ(shards_[0]->installs[0].slots(), 2);
  EXPECT_NE(shards_[0]->installs[0].slot(), shards_[1]->installs[0].slot());
  EXPECT_TRUE(Apply(tasks[0], job));
  EXPECT_TRUE(job.installed);
  EXPECT_TRUE(job.dirty);  // members next
  tasks = Take();
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_GT(tasks[0].hold_id, 1);
  shards_[0]->version = 3;
  shards_[1]->version = 2;
  reconciler_.Run(tasks[0]);
  EXPECT_TRUE(tasks[0].members_now);
  EXPECT_EQ(shards_[0]->holds, 1);
  ASSERT_EQ(shards_[1]->member_sets.size(), 1u);
  ASSERT_EQ(shards_[1]->member_sets[0].size(), 1u);
  EXPECT_EQ(shards_[1]->member_sets[0][0].worker_id, worker_);
  EXPECT_EQ(shards_[1]->member_sets[0][0].join_step, 3);
  Apply(tasks[0], job);
  EXPECT_EQ(job.members.size(), 1u);
  // Nothing left: the next round finds nothing to do, and says so.
  tasks = Take();
  ASSERT_EQ(tasks.size(), 1u);
  reconciler_.Run(tasks[0]);
  EXPECT_FALSE(Apply(tasks[0], job));
  EXPECT_FALSE(job.dirty);
  EXPECT_TRUE(Take().empty());
}

TEST_F(ReconcilerTest, WhatFailsStaysDueAndNothingIsHalfSet) {
  JobEntry& job = Start();
  shards_[1]->install_status = absl::UnavailableError("away");
  std::vector<ControlTask> tasks = Take();
  reconciler_.Run(tasks[0]);
  EXPECT_TRUE(tasks[0].failed);
  EXPECT_FALSE(Apply(tasks[0], job));
  EXPECT_FALSE(job.installed);
  EXPECT_TRUE(job.dirty);
  shards_[1]->install_status = absl::OkStatus();
  tasks = Take();
  reconciler_.Run(tasks[0]);
  Apply(tasks[0], job);
  // A range that cannot be held: no range is given members.
  shards_[1]->hold_status = absl::UnavailableError("away");
  tasks = Take();
  reconciler_.Run(tasks[0]);
  EXPECT_TRUE(tasks[0].failed);
  EXPECT_TRUE(shards_[0]->member_sets.empty());
  Apply(tasks[0], job);
  EXPECT_TRUE(job.members.empty());
  EXPECT_TRUE(job.dirty);
}

TEST_F(ReconcilerTest, APythonModelWaitsForItsInitialWeights) {
  JobEntry& job = Start(kPythonSpec);
  std::vector<ControlTask> tasks = Take();
  ASSERT_EQ(tasks.size(), 1u);
  reconciler_.Run(tasks[0]);
  EXPECT_FALSE(tasks[0].progressed);
  EXPECT_TRUE(shards_[0]->installs.empty() && shards_[1]->installs.empty());
  auto start = std::make_shared<StoredJob>();
  start->has_state = true;
  start->state.weights = std::make_shared<std::vector<float>>(8, 0.5f);
  job.start = start;
  tasks = Take();
  reconciler_.Run(tasks[0]);
  EXPECT_TRUE(tasks[0].installed_now);
}

TEST_F(ReconcilerTest, AnEndedJobKeepsItsFinalWeightsAndItsTableHomes) {
  JobEntry& job = Start();
  std::vector<ControlTask> tasks = Take();
  reconciler_.Run(tasks[0]);
  Apply(tasks[0], job);
  // Each range holds its own part of the vector.
  for (const Placement& p : job.ranges) {
    for (auto& s : shards_) {
      if (registry_.shard(p.shard_id).control == s) s->count = p.count;
      s->value = 2.0f;
    }
  }
  job.proto.set_state(v1::SUCCEEDED);
  job.awaiting_reports = {worker_};
  job.retire_after = kNow + absl::Seconds(10);
  job.MarkDirty();
  EXPECT_TRUE(Take().empty());  // its members may still pull the weights
  job.awaiting_reports.clear();
  tasks = Take();
  ASSERT_EQ(tasks.size(), 1u);
  reconciler_.Run(tasks[0]);
  EXPECT_TRUE(tasks[0].retired_now);
  EXPECT_EQ(shards_[0]->retires + shards_[1]->retires, 2);
  EXPECT_EQ(shards_[0]->drops, std::vector<std::string>{job.id()});
  Apply(tasks[0], job);
  EXPECT_TRUE(job.retired);
  EXPECT_TRUE(job.ranges.empty());
  ASSERT_NE(job.final_weights, nullptr);
  EXPECT_EQ(*job.final_weights, std::vector<float>(10, 2.0f));
  EXPECT_EQ(job.table_homes.size(), 2u);
  ASSERT_EQ(job.table_home_addresses.size(), 2u);
  EXPECT_EQ(job.table_home_addresses[0].substr(0, 2), "h:");
}

TEST_F(ReconcilerTest, AShardAwayAtTheEndLeavesTheJobItsStart) {
  JobEntry& job = Start();
  std::vector<ControlTask> tasks = Take();
  reconciler_.Run(tasks[0]);
  Apply(tasks[0], job);
  auto start = std::make_shared<StoredJob>();
  start->state.weights = std::make_shared<std::vector<float>>(10, 1.0f);
  job.start = start;
  shards_[0]->retire_status = absl::UnavailableError("away");
  job.proto.set_state(v1::FAILED);
  job.MarkDirty();
  tasks = Take();
  reconciler_.Run(tasks[0]);
  Apply(tasks[0], job);
  EXPECT_TRUE(job.retired);
  EXPECT_EQ(job.final_weights, start->state.weights);
  EXPECT_TRUE(job.table_homes.empty());
}

TEST_F(ReconcilerTest, AWorkerThatCannotJoinIsTakenOff) {
  JobEntry& job = Start();
  job.slots.push_back("late");
  ControlTask t;
  t.job_id = job.id();
  t.map_version = job.map_version;
  t.generation = job.generation;
  t.not_joined = {"late"};
  Apply(t, job);
  EXPECT_EQ(vacated_, std::vector<std::string>{"late"});
  EXPECT_TRUE(job.grown_out);
  EXPECT_THAT(job.history.events(job.history.events_size() - 1).text(),
              HasSubstr("late cannot join"));
}

}  // namespace
}  // namespace tally
