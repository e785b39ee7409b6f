// The plans: which workers a job gets and when it starts, where its ranges
// go, what a lost shard does to it, the assignment a worker is sent, the
// plan kept in the record, and the membership decisions of a control
// round.
#include "server/control/planner.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/control/job_store.h"
#include "tests/server/fake_shard_control.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::FakeShardControl;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kSpec[] =
    TALLY_TINY_MODEL "training: {workers: 2, shards: 2}\n";
constexpr char kOneWorker[] =
    "model: {layers: [{linear: {in_features: 4, out_features: 2}}]}\n"
    "dataset: {name: synthetic, features: 4, classes: 2}\n"
    "training: {workers: 1}\n";
constexpr char kPythonSpec[] =
    "model: {python: {code: x, params: [{name: w, shape: [2, 4]}]}}\n"
    "dataset: {name: synthetic, features: 4, classes: 2}\n";
constexpr char kGrowing[] =
    "model: {layers: [{linear: {in_features: 4, out_features: 2}}]}\n"
    "dataset: {name: synthetic, features: 4, classes: 2, train_size: 8}\n"
    "training: {workers: {min: 2, max: 3}, batch_size: 1, epochs: 10}\n";

constexpr char kRanks[] =
    "model: {layers: [{linear: {in_features: 4, out_features: 2}}]}\n"
    "dataset: {name: synthetic, features: 4, classes: 2}\n"
    "training: {ranks: 4, workers: 2}\n";

const absl::Time kNow = ::tally::testing::kPartsNow;

class PlannerTest : public ::testing::Test {
 protected:
  PlannerTest()
      : jobs_(JobQueue::Options()),
        registry_(absl::Seconds(3), 100, kNow),
        planner_(&jobs_, &registry_) {}

  JobEntry& Submit(const char* text) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(text, SpecLimits());
    EXPECT_TRUE(spec.ok()) << spec.status();
    JobEntry& job = jobs_.Add(*std::move(spec), text, "", kNow);
    Planner::RecordPlan(job);
    return job;
  }
  std::string AddWorker(const std::string& python = "") {
    v1::RegisterWorkerRequest r;
    r.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
    r.set_python(python);
    return registry_.AddWorker(r, kNow)->worker_id();
  }
  std::shared_ptr<FakeShardControl> AddShard(const std::string& address) {
    auto shard = std::make_shared<FakeShardControl>();
    registry_.AddShard(address, shard, kNow);
    return shard;
  }

  JobQueue jobs_;
  Registry registry_;
  Planner planner_;
};

TEST_F(PlannerTest, AJobStartsOnceEverySlotAndItsShardsAreThere) {
  JobEntry& job = Submit(kSpec);
  const std::string a = AddWorker();
  EXPECT_TRUE(planner_.ScheduleJobs(kNow).empty());
  EXPECT_EQ(job.proto.state(), v1::PENDING);
  const std::string b = AddWorker();
  EXPECT_TRUE(planner_.ScheduleJobs(kNow).empty());  // no shard yet
  AddShard("h:1");
  AddShard("h:2");
  EXPECT_THAT(planner_.ScheduleJobs(kNow), ElementsAre("job-1"));
  EXPECT_EQ(job.proto.state(), v1::RUNNING);
  ASSERT_EQ(job.ranges.size(), 2u);
  EXPECT_EQ(job.ranges[0].offset + job.ranges[0].count, job.ranges[1].offset);
  EXPECT_EQ(job.ranges[1].offset + job.ranges[1].count, 10);
  EXPECT_EQ(job.map_version, absl::ToUnixMicros(kNow));
  EXPECT_TRUE(job.dirty);
  EXPECT_EQ(registry_.worker(a)->job_id, "job-1");
  EXPECT_EQ(registry_.worker(b)->job_id, "job-1");
  EXPECT_NE(registry_.worker(a)->rank, registry_.worker(b)->rank);
  EXPECT_THAT(job.history.events(job.history.events_size() - 1).text(),
              HasSubstr("started: 2 workers, 2 parameter shards"));
}

TEST_F(PlannerTest, JobsStartInSubmissionOrderButAJobNobodyRunsWaitsAside) {
  AddShard("h:1");
  AddShard("h:2");
  JobEntry& py = Submit(kPythonSpec);
  JobEntry& first = Submit(kSpec);
  JobEntry& second = Submit(kOneWorker);
  AddWorker();
  planner_.ScheduleJobs(kNow);
  EXPECT_THAT(py.condition, HasSubstr("waiting for Python workers"));
  // First come, first served: the second waits behind the first.
  EXPECT_EQ(first.proto.state(), v1::PENDING);
  EXPECT_EQ(second.proto.state(), v1::PENDING);
  AddWorker();
  planner_.ScheduleJobs(kNow);
  EXPECT_EQ(first.proto.state(), v1::RUNNING);
  EXPECT_EQ(second.proto.state(), v1::PENDING);
}

TEST_F(PlannerTest, AVacantSlotIsRefilledAndTheLeastLoadedShardTakesAJob) {
  AddShard("h:1");
  AddShard("h:2");
  // One copy each: two would load both shards alike.
  constexpr char kOneCopy[] =
      "model: {layers: [{linear: {in_features: 4, out_features: 2}}]}\n"
      "dataset: {name: synthetic, features: 4, classes: 2}\n"
      "training: {workers: 1, replicas: 1}\n";
  JobEntry& job = Submit(kOneCopy);
  AddWorker();
  planner_.ScheduleJobs(kNow);
  ASSERT_EQ(job.ranges.size(), 1u);
  EXPECT_TRUE(job.ranges[0].backup_shard_id.empty());
  const std::string first_home = job.ranges[0].shard_id;
  JobEntry& other = Submit(kOneCopy);
  AddWorker();
  planner_.ScheduleJobs(kNow);
  ASSERT_EQ(other.ranges.size(), 1u);
  EXPECT_NE(other.ranges[0].shard_id, first_home);
  // A slot vacated (its worker left) is the next idle worker's.
  job.slots[0].clear();
  const std::string c = AddWorker();
  EXPECT_THAT(planner_.ScheduleJobs(kNow), ElementsAre(job.id()));
  EXPECT_EQ(job.slots[0], c);
}

TEST_F(PlannerTest, ALostShardTakesEveryRangeOfItsJobs) {
  auto s1 = AddShard("h:1");
  auto s2 = AddShard("h:2");
  JobEntry& job = Submit(kSpec);
  AddWorker();
  AddWorker();
  planner_.ScheduleJobs(kNow);
  ASSERT_EQ(job.ranges.size(), 2u);
  job.installed = true;
  const std::string lost = job.ranges[0].shard_id;
  const int64_t map_version = job.map_version;
  EXPECT_THAT(planner_.LoseShard(lost, kNow), ElementsAre(job.id()));
  EXPECT_TRUE(job.ranges.empty());
  EXPECT_FALSE(job.installed);
  EXPECT_TRUE(job.awaiting_start);
  EXPECT_EQ(job.map_version, map_version + 1);
  // The other range is dropped from its shard; the lost one is gone.
  EXPECT_EQ(s1->drops.size() + s2->drops.size(), 1u);
  EXPECT_TRUE(planner_.PlacedShards().empty());
  auto start = std::make_shared<StoredJob>();
  start->has_state = true;
  start->state.metrics.version = 7;
  Planner::Restart(job, start, kNow);
  EXPECT_FALSE(job.awaiting_start);
  EXPECT_EQ(job.proto.metrics().step(), 7);
  EXPECT_THAT(job.condition, HasSubstr("resuming from the checkpoint of "
                                       "step 7"));
}

constexpr char kReplicated[] =
    TALLY_TINY_MODEL "training: {workers: 1, replicas: 2}\n";

// training.replicas: 2 puts each range's backup on a shard of its own; a
// lost primary's backup takes over in the same placement (no roll-back),
// and the workers' assignments change with the address; losing the last
// copy of a range starts the job again from its checkpoint.
TEST_F(PlannerTest, ABackupTakesOverTheRangeOfItsLostPrimary) {
  AddShard("h:1");
  AddShard("h:2");
  AddShard("h:3");
  JobEntry& job = Submit(kReplicated);
  const std::string w = AddWorker();
  planner_.ScheduleJobs(kNow);
  ASSERT_EQ(job.ranges.size(), 1u);
  const Placement placed = job.ranges[0];
  ASSERT_FALSE(placed.backup_shard_id.empty());
  EXPECT_NE(placed.backup_shard_id, placed.shard_id);
  EXPECT_EQ(planner_.PlacedShards().size(), 2u);
  job.installed = true;
  job.members = {MemberSpec{job.MemberOf(0), registry_.worker(w)->incarnation}};
  v1::HeartbeatRequest req;
  req.set_worker_id(w);
  v1::HeartbeatResponse before;
  planner_.Assignment(req, *registry_.worker(w), job, &before);
  ASSERT_TRUE(before.has_assignment());
  const int64_t map_version = job.map_version;
  EXPECT_TRUE(planner_.LoseShard(placed.shard_id, kNow).empty());
  EXPECT_EQ(job.map_version, map_version);
  EXPECT_TRUE(job.installed);
  EXPECT_EQ(job.ranges[0].shard_id, placed.backup_shard_id);
  EXPECT_TRUE(job.ranges[0].promote);
  EXPECT_TRUE(job.ranges[0].backup_shard_id.empty());
  EXPECT_THAT(job.history.events().rbegin()->text(),
              HasSubstr("1 backup range took over"));
  req.set_held(before.assignment().key());
  v1::HeartbeatResponse after;
  planner_.Assignment(req, *registry_.worker(w), job, &after);
  ASSERT_TRUE(after.has_assignment());  // the same map, a new address
  EXPECT_EQ(after.assignment().shard_map().version(), map_version);
  EXPECT_NE(after.assignment().shard_map().shards(0).address(),
            before.assignment().shard_map().shards(0).address());
  EXPECT_THAT(planner_.LoseShard(job.ranges[0].shard_id, kNow),
              ElementsAre(job.id()));
  EXPECT_TRUE(job.ranges.empty());
}

// A backup goes on another host than its primary's where one has a shard
// free, though a shard on the primary's host is as little loaded: when
// the range is placed, and when a new backup replaces a lost one.
TEST_F(PlannerTest, ABackupGoesOnAnotherHostWhereOneHasAShard) {
  AddShard("a:1");
  AddShard("a:2");
  AddShard("b:1");
  JobEntry& job = Submit(TALLY_TINY_MODEL
                         "training: {workers: 1, replicas: 2, shards: 1}\n");
  AddWorker();
  planner_.ScheduleJobs(kNow);
  ASSERT_EQ(job.ranges.size(), 1u);
  EXPECT_EQ(registry_.shard(job.ranges[0].shard_id).address, "a:1");
  EXPECT_EQ(registry_.shard(job.ranges[0].backup_shard_id).address, "b:1");
  job.installed = true;
  job.ranges[0].backup_shard_id.clear();
  planner_.ReplaceBackups(job, kNow);
  EXPECT_EQ(registry_.shard(job.ranges[0].backup_shard_id).address, "b:1");
  EXPECT_TRUE(job.ranges[0].seed);
}

// A backup seeded while the job trains counts as a copy only once its
// primary says it is in step: before, the primary's loss rolls the job
// back; after, the backup takes over.
TEST_F(PlannerTest, ANewBackupCountsAsACopyOnceItsPrimarySaysItIsInStep) {
  std::vector<std::shared_ptr<FakeShardControl>> shards = {
      AddShard("a:1"), AddShard("b:1"), AddShard("c:1")};
  JobEntry& job = Submit(kReplicated);
  AddWorker();
  planner_.ScheduleJobs(kNow);
  ASSERT_EQ(job.ranges.size(), 1u);
  job.installed = true;
  Placement& p = job.ranges[0];
  p.seed = p.seeding = true;  // installed, catching up from version 5
  p.seeded_at = 5;
  auto control_of = [&](const std::string& id) {
    for (auto& s : shards)
      if (registry_.shard(id).control == s) return s;
    return std::shared_ptr<FakeShardControl>();
  };
  v1::RangeStatus status;
  status.set_job_id(job.id());
  status.set_map_version(job.map_version);
  status.set_peer_address(registry_.shard(p.backup_shard_id).address);
  status.set_version(7);
  control_of(p.shard_id)->ranges = {status};
  planner_.ScheduleJobs(kNow);
  EXPECT_TRUE(p.seed);  // not in step yet
  // A report from before the seed (its predecessor in step), or about
  // another backup, does not count.
  status.set_backup_in_step(true);
  status.set_version(5);
  control_of(p.shard_id)->ranges = {status};
  planner_.ScheduleJobs(kNow);
  EXPECT_TRUE(p.seed);
  status.set_version(7);
  status.set_peer_address("elsewhere:1");
  control_of(p.shard_id)->ranges = {status};
  planner_.ScheduleJobs(kNow);
  EXPECT_TRUE(p.seed);
  status.set_peer_address(registry_.shard(p.backup_shard_id).address);
  control_of(p.shard_id)->ranges = {status};
  planner_.ScheduleJobs(kNow);
  EXPECT_FALSE(p.seed);
  EXPECT_FALSE(p.seeding);
  EXPECT_THAT(job.history.events().rbegin()->text(),
              HasSubstr("caught up with its primary at step 7"));
  const std::string backup = p.backup_shard_id;
  EXPECT_TRUE(planner_.LoseShard(p.shard_id, kNow).empty());  // taken over
  EXPECT_EQ(job.ranges[0].shard_id, backup);
}

// Lost while its new backup still catches up, a primary takes the range's
// last copy with it: the job starts again from its checkpoint.
TEST_F(PlannerTest, APrimaryLostWhileItsNewBackupCatchesUpRollsTheJobBack) {
  AddShard("a:1");
  AddShard("b:1");
  JobEntry& job = Submit(kReplicated);
  AddWorker();
  planner_.ScheduleJobs(kNow);
  ASSERT_EQ(job.ranges.size(), 1u);
  job.installed = true;
  job.ranges[0].seed = job.ranges[0].seeding = true;
  EXPECT_THAT(planner_.LoseShard(job.ranges[0].shard_id, kNow),
              ElementsAre(job.id()));
  EXPECT_TRUE(job.ranges.empty());
}

// With one live shard, a job that asks for two copies runs with one.
TEST_F(PlannerTest, AReplicatedJobOnOneShardKeepsOneCopy) {
  AddShard("h:1");
  JobEntry& job = Submit(kReplicated);
  AddWorker();
  planner_.ScheduleJobs(kNow);
  ASSERT_EQ(job.ranges.size(), 1u);
  EXPECT_TRUE(job.ranges[0].backup_shard_id.empty());
}

TEST_F(PlannerTest, AMemberIsSentItsAssignmentOnce) {
  AddShard("h:1");
  JobEntry& job = Submit(kOneWorker);
  const std::string a = AddWorker();
  planner_.ScheduleJobs(kNow);
  const WorkerEntry& w = *registry_.worker(a);
  v1::HeartbeatRequest req;
  req.set_worker_id(a);
  v1::HeartbeatResponse out;
  planner_.Assignment(req, w, job, &out);
  EXPECT_FALSE(out.has_assignment());  // not installed yet
  job.installed = true;
  MemberSpec m;
  m.worker_id = a;
  m.incarnation = w.incarnation;
  job.members = {m};
  planner_.Assignment(req, w, job, &out);
  ASSERT_TRUE(out.has_assignment());
  EXPECT_EQ(out.assignment().shard_map().shards(0).address(), "h:1");
  EXPECT_EQ(out.assignment().world(), 1);
  req.set_held(out.assignment().key());
  v1::HeartbeatResponse again;
  planner_.Assignment(req, w, job, &again);
  EXPECT_FALSE(again.has_assignment());
  EXPECT_TRUE(again.unchanged());
}

TEST_F(PlannerTest, APlanIsReadBackFromItsRecord) {
  JobEntry& job = Submit(kGrowing);
  Schedule grown = GrowSchedule(job.schedule, 2, 3, 0);
  Planner::AdoptPlan(job, grown, kNow);
  EXPECT_THAT(job.history.events(job.history.events_size() - 1).text(),
              HasSubstr("grows to 3 workers"));
  ASSERT_EQ(job.proto.membership_size(), 2);
  EXPECT_EQ(job.proto.membership(1).world(), 3);
  JobEntry restored;
  restored.proto = job.proto;
  restored.spec = job.spec;
  Planner::RestorePlan(restored);
  EXPECT_EQ(restored.schedule.total_steps, job.schedule.total_steps);
  EXPECT_EQ(restored.schedule.plan, job.schedule.plan);
  EXPECT_EQ(restored.slots.size(), 3u);
}

// A control task of a job with members `a` (and `b` leaving) on two ranges.
ControlTask Task(const JobEntry& job) {
  ControlTask t;
  t.schedule = job.schedule;
  t.world = job.schedule.last_world();
  t.next_plan = job.schedule.plan + 1;
  MemberSpec a, b;
  a.worker_id = "a";
  a.rank = 0;
  b.worker_id = "b";
  b.rank = 1;
  t.members = {a, b};
  t.desired = {a};
  return t;
}

TEST_F(PlannerTest, ALeaverBelongsToEveryStepItCommittedAndAJoinerComesNext) {
  JobEntry& job = Submit(kSpec);
  ControlTask t = Task(job);
  MemberSpec c;
  c.worker_id = "c";
  c.rank = 1;
  t.desired.push_back(c);
  std::vector<MemberSpec> active;
  EXPECT_TRUE(Planner::MembersDiffer(t, &active));
  EXPECT_EQ(active.size(), 2u);
  HoldReport r1, r2;
  r1.version = 3;
  r2.version = 4;
  MemberProgress p;
  p.worker_id = "b";
  p.committed_step = 3;
  r2.members = {p};
  std::vector<MemberSpec> next = Planner::DecideMembers(t, active, {r1, r2});
  ASSERT_EQ(next.size(), 3u);
  EXPECT_EQ(next[1].worker_id, "b");
  EXPECT_EQ(next[1].leave_step, 4);  // it belongs to step 3
  EXPECT_EQ(next[2].worker_id, "c");
  EXPECT_EQ(next[2].join_step, 4);  // the highest version any range has
  EXPECT_EQ((t.new_leaves[{"b", 0}]), std::make_pair(int64_t{4}, false));
  EXPECT_FALSE(t.new_schedule.has_value());
}

TEST_F(PlannerTest, AWorkerPastTheWorldJoinsALaterEpochWithANewPlan) {
  JobEntry& job = Submit(kGrowing);  // 4 steps an epoch, 10 epochs
  ControlTask t = Task(job);
  t.members.pop_back();
  MemberSpec c;
  c.worker_id = "c";
  c.rank = 2;
  t.desired = {t.members[0], c};
  t.world = 3;
  std::vector<MemberSpec> active = t.members;
  HoldReport r;
  r.version = 5;
  std::vector<MemberSpec> next = Planner::DecideMembers(t, active, {r});
  ASSERT_TRUE(t.new_schedule.has_value());
  EXPECT_EQ(t.new_schedule->plan, t.next_plan);
  EXPECT_EQ(t.new_schedule->last_world(), 3);
  ASSERT_EQ(next.size(), 2u);
  // Past version 5 and the margin: the start of epoch 2.
  EXPECT_EQ(next[1].join_step, t.new_schedule->EpochStart(2));
  EXPECT_EQ(Planner::JoinEpoch(job.schedule, 5 + Planner::kJoinMargin, 0), 2);
  // No epoch left near the end: nobody joins.
  EXPECT_EQ(Planner::JoinEpoch(job.schedule, job.schedule.total_steps, 0), -1);
  EXPECT_EQ(Planner::JoinEpoch(job.schedule, 3, /*max_steps=*/4), -1);
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

TEST_F(PlannerTest, FixedRanksGoInBlocksAndALeaversRanksToWhoHoldsFewest) {
  AddShard("h:1");
  JobEntry& job = Submit(kRanks);
  ASSERT_EQ(job.slots.size(), 4u);  // the world is the ranks
  const std::string a = AddWorker();
  const std::string b = AddWorker();
  EXPECT_THAT(planner_.ScheduleJobs(kNow), ElementsAre(job.id()));
  EXPECT_EQ(job.proto.state(), v1::RUNNING);
  // Two workers, two ranks each, in blocks.
  EXPECT_EQ(job.slots[0], job.slots[1]);
  EXPECT_EQ(job.slots[2], job.slots[3]);
  EXPECT_NE(job.slots[0], job.slots[2]);
  EXPECT_EQ(job.MemberOf(3), job.slots[3] + "#3.1");
  EXPECT_EQ(registry_.worker(job.slots[2])->rank, 2);  // its lowest
  // Its holder of ranks 2 and 3 left: the survivor takes both.
  const std::string survivor = job.slots[0];
  job.slots[2].clear();
  job.slots[3].clear();
  EXPECT_THAT(planner_.ScheduleJobs(kNow), ElementsAre(job.id()));
  EXPECT_THAT(job.slots, ElementsAre(survivor, survivor, survivor, survivor));
  EXPECT_EQ(job.RanksOf(survivor), (std::vector<int>{0, 1, 2, 3}));
  // Each holding of a rank is a member of its own (a rank that comes back
  // to a worker it left is not the member that left).
  EXPECT_EQ(job.MemberOf(2), survivor + "#2.2");
  // A spare (the job may have two workers) takes a rank from it once the
  // job is installed and nothing in the queue could take the spare.
  job.installed = true;
  const std::string spare = AddWorker();
  EXPECT_THAT(planner_.ScheduleJobs(kNow), ElementsAre(job.id()));
  EXPECT_EQ(job.RanksOf(spare), (std::vector<int>{3}));
  EXPECT_EQ(job.RanksOf(survivor), (std::vector<int>{0, 1, 2}));
  // A worker of an older protocol is never given a job of fixed ranks.
  JobEntry& other = Submit(kRanks);
  v1::RegisterWorkerRequest old;
  old.set_protocol_version(2);
  ASSERT_TRUE(registry_.AddWorker(old, kNow).ok());
  planner_.ScheduleJobs(kNow);
  EXPECT_EQ(other.proto.state(), v1::PENDING);
  EXPECT_THAT(other.condition, HasSubstr("workers of protocol 3 or later"));
}

TEST_F(PlannerTest, AHolderOfSeveralRanksIsSentThemAll) {
  AddShard("h:1");
  JobEntry& job = Submit(kRanks);
  const std::string a = AddWorker();
  const std::string b = AddWorker();
  planner_.ScheduleJobs(kNow);
  const std::string& w = job.slots[2];
  job.installed = true;
  for (int r = 0; r < 4; ++r) {
    MemberSpec m;
    m.worker_id = job.MemberOf(r);
    m.incarnation = registry_.worker(job.slots[r])->incarnation;
    m.rank = r;
    m.join_step = r == 3 ? 9 : 0;
    job.members.push_back(m);
  }
  v1::HeartbeatRequest req;
  req.set_worker_id(w);
  v1::HeartbeatResponse out;
  planner_.Assignment(req, *registry_.worker(w), job, &out);
  ASSERT_TRUE(out.has_assignment());
  const v1::Assignment& got = out.assignment();
  EXPECT_EQ(got.rank(), 2);
  EXPECT_EQ(got.world(), 4);
  ASSERT_EQ(got.ranks_size(), 2);
  EXPECT_EQ(got.ranks(0).rank(), 2);
  EXPECT_EQ(got.ranks(1).rank(), 3);
  EXPECT_EQ(got.ranks(1).join_step(), 9);
  EXPECT_EQ(got.ranks(1).member(), job.MemberOf(3));
}

// Fixed ranks: rank 1's holder "b" died. While nobody takes the rank, b
// stays a member and the steps wait for it; the worker that takes it joins
// at b's leave step, whatever the versions.
TEST_F(PlannerTest, AFixedRankWaitsForItsHolderAndTheNextJoinsAtItsLeave) {
  JobEntry& job = Submit(kRanks);
  ControlTask t = Task(job);
  t.fixed_ranks = true;
  std::vector<MemberSpec> active;
  // Ranks 2 and 3 have no member: nothing is set until they do.
  MemberSpec c;
  c.worker_id = "a#1";
  c.rank = 1;
  t.desired.push_back(c);
  EXPECT_FALSE(Planner::MembersDiffer(t, &active));
  t.desired.pop_back();
  t.world = 2;
  EXPECT_FALSE(Planner::MembersDiffer(t, &active));  // nothing to decide
  HoldReport r1, r2;
  r1.version = 6;
  r2.version = 7;
  MemberProgress p;
  p.worker_id = "b";
  p.committed_step = 7;
  r2.members = {p};
  std::vector<MemberSpec> next = Planner::DecideMembers(t, active, {r1, r2});
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[1].worker_id, "b");
  EXPECT_EQ(next[1].leave_step, MemberSpec::kNoStep);  // still waited for
  t.desired.push_back(c);
  EXPECT_TRUE(Planner::MembersDiffer(t, &active));
  next = Planner::DecideMembers(t, active, {r1, r2});
  ASSERT_EQ(next.size(), 3u);
  EXPECT_EQ(next[1].leave_step, 8);  // b belongs to step 7
  EXPECT_EQ(next[2].worker_id, "a#1");
  EXPECT_EQ(next[2].join_step, 8);  // no step without rank 1
}

}  // namespace
}  // namespace tally
