// Job lifecycle, scheduling and leases, with a fake clock (no sleeping).
#include "server/control/coordinator.h"

#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/io/safetensors.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "proto/checkpoint.pb.h"
#include "server/data/local_shard_control.h"
#include "server/data/shard_host.h"
#include "tests/test_util.h"

namespace tally {
namespace {

// A member's push of a step, accepted and then committed, as the member's
// next pull would commit it once every shard answered.
absl::Status PushAndCommit(ParameterShard& s, const PushMeta& m,
                           const float* g, bool* dup) {
  absl::Status st = s.Accept(m, g, dup);
  if (st.ok()) s.Commit(m.worker_id, m.incarnation, m.step, true);
  return st;
}

// Each worker's push of step 0 (one sample, `value` everywhere), committed.
absl::Status CloseFirstStep(
    ParameterShard& s, std::initializer_list<v1::RegisterWorkerResponse> workers,
    float value = 0.1f) {
  std::vector<float> g(s.num_params(), value);
  for (const v1::RegisterWorkerResponse& w : workers) {
    PushMeta m;
    m.worker_id = w.worker_id();
    m.incarnation = w.incarnation();
    m.samples = 1;
    bool dup;
    TALLY_RETURN_IF_ERROR(PushAndCommit(s, m, g.data(), &dup));
  }
  return absl::OkStatus();
}

// A worker's report that it evaluated `steps` steps' weights.
v1::ReportResultRequest Success(const v1::RegisterWorkerResponse& w,
                                const std::string& job_id, int64_t steps) {
  v1::ReportResultRequest r;
  r.set_worker_id(w.worker_id());
  r.set_incarnation(w.incarnation());
  r.set_job_id(job_id);
  r.set_ok(true);
  r.set_steps(steps);
  return r;
}

using ::tally::testing::HasReason;
using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kSpec[] = R"(
name: tiny
model: {layers: [{linear: {in_features: 4, out_features: 2}}]}
dataset: {name: synthetic, features: 4, classes: 2}
training: {workers: 2}
)";

// kSpec with more training keys ("max_steps: 1") and lines after it.
std::string SpecWith(const std::string& training, const std::string& more = "") {
  std::string s = kSpec;
  const std::string key = "{workers: 2}";
  s.replace(s.find(key), key.size(), "{workers: 2, " + training + "}");
  return s + more;
}

// The job's range on a host (the whole vector, with one shard).
absl::StatusOr<std::shared_ptr<ParameterShard>> ShardOf(
    const ShardHost& host, const std::string& job_id) {
  absl::StatusOr<Range> r = host.Find(job_id);
  if (!r.ok()) return r.status();
  return r->shard;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  CoordinatorTest() : host_(&clock_), coord_(Options()) {}
  CoordinatorOptions Options() {
    CoordinatorOptions o;
    o.clock = &clock_;
    o.lease_timeout = absl::Seconds(3);
    o.local_shard = MakeLocalShardControl(&host_);
    return o;
  }
  absl::StatusOr<std::shared_ptr<ParameterShard>> Shard(
      const std::string& job_id) {
    return ShardOf(host_, job_id);
  }
  v1::RegisterWorkerResponse Register(const std::string& name) {
    v1::RegisterWorkerRequest r;
    r.set_name(name);
    r.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
    return *coord_.Register(r);
  }
  absl::StatusOr<v1::HeartbeatResponse> Beat(
      const v1::RegisterWorkerResponse& w) {
    v1::HeartbeatRequest r;
    r.set_worker_id(w.worker_id());
    r.set_incarnation(w.incarnation());
    return coord_.Heartbeat(r);
  }
  FakeClock clock_;
  ShardHost host_;
  Coordinator coord_;
};

TEST_F(CoordinatorTest, BadSpecIsRejectedWithTheFieldAndNothingIsStored) {
  EXPECT_THAT(
      coord_.Submit("model: {preset: mlp}\ndataset: {name: nope}\n"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dataset.name")));
  EXPECT_TRUE(coord_.List().empty());
  EXPECT_THAT(coord_.Get("job-9"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-9")));
  EXPECT_THAT(coord_.Cancel("job-9"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-9")));
  EXPECT_THAT(coord_.WeightsFile("job-9"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-9")));
}

TEST_F(CoordinatorTest, JobWaitsForEnoughWorkersThenRunsWithRanks) {
  auto job = coord_.Submit(kSpec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::PENDING);
  EXPECT_THAT(coord_.WeightsFile(job->id()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("not started")));
  auto a = Register("a");
  EXPECT_EQ(coord_.Get(job->id())->state(), v1::PENDING);
  auto b = Register("b");
  EXPECT_EQ(coord_.Get(job->id())->state(), v1::RUNNING);
  auto ha = Beat(a), hb = Beat(b);
  ASSERT_TRUE(ha.ok() && hb.ok());
  ASSERT_TRUE(ha->has_assignment() && hb->has_assignment());
  EXPECT_EQ(ha->assignment().world(), 2);
  EXPECT_NE(ha->assignment().rank(), hb->assignment().rank());
  EXPECT_TRUE(coord_.WeightsFile(job->id()).ok());
}

// A worker that says no protocol version (a release before versions) or an
// older one than the coordinator takes is refused at registration with its
// own reason: it gets no id, counts for no job, and so never fails one. A
// current worker, and a newer one, are taken and given the job.
TEST_F(CoordinatorTest, WorkerWithoutProtocolVersionIsRefusedNeverAssigned) {
  auto job = coord_.Submit(kSpec);
  ASSERT_TRUE(job.ok()) << job.status();
  v1::RegisterWorkerRequest old;
  old.set_name("old");
  for (int i = 0; i < 2; ++i) {  // two old workers: as many as the job needs
    const absl::StatusOr<v1::RegisterWorkerResponse> refused =
        coord_.Register(old);
    EXPECT_THAT(refused, HasReason(absl::StatusCode::kFailedPrecondition,
                                   v1::PROTOCOL_TOO_OLD));
    EXPECT_THAT(refused, StatusIs(absl::StatusCode::kFailedPrecondition,
                                  HasSubstr("worker protocol 0")));
    EXPECT_THAT(refused, StatusIs(absl::StatusCode::kFailedPrecondition,
                                  HasSubstr("':PORT'")));
  }
  old.set_protocol_version(static_cast<uint32_t>(v1::WORKER_PROTOCOL_OLDEST) -
                           1);
  EXPECT_THAT(coord_.Register(old),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::PROTOCOL_TOO_OLD));
  coord_.Tick();
  EXPECT_EQ(coord_.Get(job->id())->state(), v1::PENDING);

  auto a = Register("a");  // WORKER_PROTOCOL_CURRENT
  v1::RegisterWorkerRequest newer;
  newer.set_name("b");
  newer.set_protocol_version(
      static_cast<uint32_t>(v1::WORKER_PROTOCOL_CURRENT) + 1);
  absl::StatusOr<v1::RegisterWorkerResponse> b = coord_.Register(newer);
  TALLY_ASSERT_OK(b);
  EXPECT_EQ(coord_.Get(job->id())->state(), v1::RUNNING);
  auto ha = Beat(a), hb = Beat(*b);
  TALLY_ASSERT_OK(ha);
  TALLY_ASSERT_OK(hb);
  EXPECT_TRUE(ha->has_assignment());
  EXPECT_TRUE(hb->has_assignment());
  EXPECT_EQ(ha->assignment().job_id(), job->id());
}

TEST_F(CoordinatorTest, ExpiredLeaseFreesTheSlotAndANewWorkerTakesIt) {
  auto job = coord_.Submit(kSpec);
  auto a = Register("a");
  auto b = Register("b");
  auto shard = Shard(job->id());
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ((*shard)->Metrics().members, 2);
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(Beat(a).ok());  // a keeps its lease, b goes silent
  clock_.Advance(absl::Seconds(2));
  coord_.Tick();
  EXPECT_EQ((*shard)->Metrics().members, 1);
  EXPECT_THAT(Beat(b), HasReason(absl::StatusCode::kFailedPrecondition,
                                 v1::REGISTER_AGAIN));
  auto b2 = Register("b");  // b comes back: a new incarnation
  EXPECT_NE(b2.incarnation(), b.incarnation());
  auto hb = Beat(b2);
  ASSERT_TRUE(hb.ok());
  EXPECT_TRUE(hb->has_assignment());
  EXPECT_EQ((*shard)->Metrics().members, 2);
  EXPECT_EQ(coord_.Get(job->id())->state(), v1::RUNNING);
}

// The schedule is the job's, fixed at submission: a worker whose dataset
// gives another one cannot change it by pulling first, and when it says it
// cannot train the job, the job goes on with the right workers and says why.
TEST_F(CoordinatorTest, AWorkerWithAnotherDatasetCannotStallTheJob) {
  auto job = coord_.Submit(kSpec);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->metrics().total_steps(), 32);  // 4096 / 2 / 64
  auto wrong = Register("wrong");
  auto right = Register("right");
  auto shard = *Shard(job->id());
  // The wrong worker pulls first, claiming its own schedule: refused, and
  // the job's stays.
  EXPECT_THAT(shard->SetSchedule(1, 1),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::SCHEDULE_MISMATCH));
  EXPECT_EQ(shard->Metrics().total_steps, 32);
  v1::ReportResultRequest refuse;
  refuse.set_worker_id(wrong.worker_id());
  refuse.set_incarnation(wrong.incarnation());
  refuse.set_job_id(job->id());
  refuse.set_ok(false);
  refuse.set_reason(v1::SCHEDULE_MISMATCH);
  refuse.set_message("its training set has 10 samples");
  TALLY_ASSERT_OK(coord_.ReportResult(refuse));
  v1::Job j = *coord_.Get(job->id());
  EXPECT_EQ(j.state(), v1::RUNNING);
  EXPECT_THAT(j.message(), HasSubstr("cannot train this job"));
  EXPECT_EQ(shard->Metrics().members, 1);
  auto beat = Beat(wrong);
  ASSERT_TRUE(beat.ok());
  EXPECT_FALSE(beat->has_assignment());  // never given this job again
  // Another worker takes the free slot; the right one trains on.
  auto other = Register("other");
  auto other_beat = Beat(other);
  ASSERT_TRUE(other_beat.ok());
  EXPECT_EQ(other_beat->assignment().job_id(), job->id());
  EXPECT_EQ(other_beat->assignment().schedule().total_steps(), 32);
  EXPECT_EQ(other_beat->assignment().shard_map().shards(0).count(),
            shard->num_params());
  EXPECT_TRUE(Beat(wrong).ok() && !Beat(wrong)->has_assignment());
  bool dup = false;
  std::vector<float> g(shard->num_params(), 0.1f);
  for (const auto& w : {right, other}) {
    PushMeta m;
    m.worker_id = w.worker_id();
    m.incarnation = w.incarnation();
    m.samples = 1;
    TALLY_ASSERT_OK(PushAndCommit(*shard, m, g.data(), &dup));
  }
  EXPECT_EQ(shard->version(), 1);
}

TEST_F(CoordinatorTest, ResultMustEvaluateTheFinalWeightsThenTheJobSucceeds) {
  auto job = coord_.Submit(SpecWith("max_steps: 1"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->metrics().total_steps(), 1);  // fixed at submission
  auto a = Register("a");
  auto b = Register("b");
  auto shard = *Shard(job->id());
  v1::ReportResultRequest r;
  r.set_worker_id(a.worker_id());
  r.set_incarnation(a.incarnation());
  r.set_job_id(job->id());
  r.set_ok(true);
  r.set_test_accuracy(0.9);
  r.set_steps(0);
  EXPECT_THAT(coord_.ReportResult(r),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::NOT_FINISHED));
  r.set_steps(1);  // the final version, not reached yet: retry later
  EXPECT_THAT(coord_.ReportResult(r),
              HasReason(absl::StatusCode::kUnavailable, v1::NOT_FINISHED));
  bool dup;
  std::vector<float> g(shard->num_params(), 0.1f);
  for (const auto& w : {a, b}) {
    PushMeta m;
    m.worker_id = w.worker_id();
    m.incarnation = w.incarnation();
    m.samples = 1;
    TALLY_ASSERT_OK(PushAndCommit(*shard, m, g.data(), &dup));
  }
  r.set_steps(1);
  TALLY_ASSERT_OK(coord_.ReportResult(r));
  auto done = coord_.Get(job->id());
  EXPECT_EQ(done->state(), v1::SUCCEEDED);
  EXPECT_DOUBLE_EQ(done->metrics().test_accuracy(), 0.9);
  // Both workers are idle again.
  EXPECT_FALSE(Beat(a)->has_assignment());
  EXPECT_FALSE(Beat(b)->has_assignment());
}

// After a success the ranges keep serving the final weights to the members
// that have not reported yet: they are retired once every member reported,
// or once final_pull_grace is over.
TEST_F(CoordinatorTest, FinalWeightsAreServedUntilEveryMemberReported) {
  auto job = coord_.Submit(SpecWith("max_steps: 1"));
  auto a = Register("a");
  auto b = Register("b");
  auto shard = Shard(job->id());
  ASSERT_TRUE(shard.ok());
  ASSERT_TRUE(Beat(a).ok() && Beat(b).ok());
  std::vector<float> g((*shard)->num_params(), 0.1f);
  bool dup;
  for (const auto& w : {a, b}) {
    PushMeta m;
    m.worker_id = w.worker_id();
    m.incarnation = w.incarnation();
    m.samples = 1;
    TALLY_ASSERT_OK(PushAndCommit(**shard, m, g.data(), &dup));
  }
  auto report = [&](const v1::RegisterWorkerResponse& w) {
    v1::ReportResultRequest r;
    r.set_worker_id(w.worker_id());
    r.set_incarnation(w.incarnation());
    r.set_job_id(job->id());
    r.set_ok(true);
    r.set_steps(1);
    return coord_.ReportResult(r);
  };
  TALLY_ASSERT_OK(report(a));
  coord_.Tick();
  EXPECT_EQ(coord_.Get(job->id())->state(), v1::SUCCEEDED);
  // b may still pull: the range is there, its weights the final ones.
  EXPECT_TRUE(Shard(job->id()).ok());
  EXPECT_TRUE((*shard)->CheckMember(b.worker_id(), b.incarnation()).ok());
  TALLY_ASSERT_OK(report(b));  // acknowledged: the job ended already
  coord_.Tick();
  EXPECT_FALSE(Shard(job->id()).ok());  // every member has them: retired
  EXPECT_TRUE(coord_.WeightsFile(job->id()).ok());
}

TEST_F(CoordinatorTest, WorkerFailureFailsTheJobAndCancelReleasesWorkers) {
  auto j1 = coord_.Submit(kSpec);
  auto j2 = coord_.Submit(kSpec);
  auto a = Register("a");
  auto b = Register("b");
  EXPECT_EQ(coord_.Get(j2->id())->state(), v1::PENDING);  // queued behind j1
  v1::ReportResultRequest r;
  r.set_worker_id(a.worker_id());
  r.set_incarnation(a.incarnation());
  r.set_job_id(j1->id());
  r.set_ok(false);
  r.set_message("dataset not found");
  TALLY_ASSERT_OK(coord_.ReportResult(r));
  auto failed = coord_.Get(j1->id());
  EXPECT_EQ(failed->state(), v1::FAILED);
  EXPECT_THAT(failed->message(), HasSubstr("dataset not found"));
  EXPECT_EQ(coord_.Get(j2->id())->state(),
            v1::RUNNING);  // took the freed workers
  auto cancelled = coord_.Cancel(j2->id());
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_THAT(coord_.Cancel(j2->id()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("already ended")));
  EXPECT_FALSE(Beat(a)->has_assignment());
}

// A runner of a placement the job has left (a shard was lost and the job
// placed again from its checkpoint) may stop on an answer of that old
// placement: its failure is noted, and the job goes on. A failure on the
// job's own placement, or one that names none, fails it as before.
TEST_F(CoordinatorTest, AFailureOnAnEarlierPlacementDoesNotFailTheJob) {
  auto job = coord_.Submit(kSpec);
  ASSERT_TRUE(job.ok()) << job.status();
  auto a = Register("a");
  auto b = Register("b");
  auto beat = Beat(a);
  ASSERT_TRUE(beat.ok() && beat->has_assignment());
  const int64_t placed = beat->assignment().shard_map().version();
  ASSERT_GT(placed, 1);
  v1::ReportResultRequest r;
  r.set_worker_id(a.worker_id());
  r.set_incarnation(a.incarnation());
  r.set_job_id(job->id());
  r.set_ok(false);
  r.set_message("step 273 is not open; the weights are at version 221");
  r.set_map_version(placed - 1);
  TALLY_ASSERT_OK(coord_.ReportResult(r));
  EXPECT_EQ(coord_.Get(job->id())->state(), v1::RUNNING);
  ASSERT_TRUE(Beat(a).ok() && Beat(a)->has_assignment());  // still its
  r.set_map_version(placed);
  TALLY_ASSERT_OK(coord_.ReportResult(r));
  v1::Job failed = *coord_.Get(job->id());
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_THAT(failed.message(), HasSubstr("step 273 is not open"));
}

// A member that heartbeats but never pulls holds a bsp job at step 0: it is
// named in waiting_on (members that never pulled were skipped before).
TEST_F(CoordinatorTest, AMemberThatNeverPullsIsNamedInWaitingOn) {
  auto job = coord_.Submit(kSpec);
  auto a = Register("a");
  auto b = Register("b");
  ASSERT_EQ(coord_.Get(job->id())->state(), v1::RUNNING);
  coord_.Tick();
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(absl::Seconds(2));
    ASSERT_TRUE(Beat(a).ok() && Beat(b).ok());
    coord_.Tick();
  }
  const v1::JobMetrics m = coord_.Get(job->id())->metrics();
  EXPECT_GE(m.stalled_seconds(), 3.0);
  std::vector<std::string> waiting(m.waiting_on().begin(),
                                   m.waiting_on().end());
  EXPECT_THAT(waiting, ::testing::UnorderedElementsAre(
                           a.worker_id() + " (a): has not pulled yet",
                           b.worker_id() + " (b): has not pulled yet"));
}

// Once the last step has closed the workers evaluate the final weights:
// no step is open, so nothing waits on them (tally status said "step N
// has waited ... on" both workers), and the ended job's record keeps no
// wait either.
TEST_F(CoordinatorTest, NoStallIsShownAtTheLastStepNorOnceTheJobEnded) {
  auto job = coord_.Submit(SpecWith("max_steps: 1"));
  ASSERT_TRUE(job.ok()) << job.status();
  auto a = Register("a");
  auto b = Register("b");
  TALLY_ASSERT_OK(CloseFirstStep(**Shard(job->id()), {a, b}));
  coord_.Tick();
  for (int i = 0; i < 3; ++i) {  // a long evaluation
    clock_.Advance(absl::Seconds(2));
    ASSERT_TRUE(Beat(a).ok() && Beat(b).ok());
    coord_.Tick();
  }
  const v1::JobMetrics evaluating = coord_.Get(job->id())->metrics();
  EXPECT_EQ(evaluating.step(), 1);
  EXPECT_TRUE(evaluating.waiting_on().empty());
  EXPECT_EQ(evaluating.stalled_seconds(), 0.0);
  TALLY_ASSERT_OK(coord_.ReportResult(Success(a, job->id(), 1)));
  const v1::Job done = *coord_.Get(job->id());
  ASSERT_EQ(done.state(), v1::SUCCEEDED);
  EXPECT_TRUE(done.metrics().waiting_on().empty());
  EXPECT_EQ(done.metrics().stalled_seconds(), 0.0);
}

// A job that ends while a step waits (cancelled here) does not keep the
// wait of its last moment in its record.
TEST_F(CoordinatorTest, AnEndedJobKeepsNoWait) {
  auto job = coord_.Submit(kSpec);
  auto a = Register("a");
  auto b = Register("b");
  coord_.Tick();
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(absl::Seconds(2));
    ASSERT_TRUE(Beat(a).ok() && Beat(b).ok());
    coord_.Tick();
  }
  ASSERT_FALSE(coord_.Get(job->id())->metrics().waiting_on().empty());
  auto cancelled = coord_.Cancel(job->id());
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  for (const v1::Job& j : {*cancelled, *coord_.Get(job->id())}) {
    EXPECT_EQ(j.state(), v1::CANCELLED);
    EXPECT_TRUE(j.metrics().waiting_on().empty());
    EXPECT_EQ(j.metrics().stalled_seconds(), 0.0);
  }
}

// A job whose dataset has no test split ends saying so (no test figures
// shown as zeros): the report says it and the job's metrics keep it.
TEST_F(CoordinatorTest, AJobWithoutATestSplitSaysSo) {
  auto job = coord_.Submit(SpecWith("max_steps: 1"));
  ASSERT_TRUE(job.ok()) << job.status();
  auto a = Register("a");
  auto b = Register("b");
  TALLY_ASSERT_OK(CloseFirstStep(**Shard(job->id()), {a, b}));
  EXPECT_FALSE(coord_.Get(job->id())->metrics().no_test_split());
  v1::ReportResultRequest r = Success(b, job->id(), 1);
  r.set_no_test_split(true);
  TALLY_ASSERT_OK(coord_.ReportResult(r));
  const v1::Job done = *coord_.Get(job->id());
  ASSERT_EQ(done.state(), v1::SUCCEEDED);
  EXPECT_TRUE(done.metrics().no_test_split());
  EXPECT_EQ(done.metrics().test_accuracy(), 0.0);
  EXPECT_EQ(done.metrics().test_loss(), 0.0);
}

TEST_F(CoordinatorTest, StaleIncarnationMustRegisterAgain) {
  auto a = Register("a");
  v1::HeartbeatRequest r;
  r.set_worker_id(a.worker_id());
  r.set_incarnation(a.incarnation() + 100);
  EXPECT_THAT(coord_.Heartbeat(r),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("stale incarnation")));
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// Jobs kept in a state directory come back in a new coordinator: records,
// weights of the last checkpoint, schedule; running jobs take new workers.
TEST(CoordinatorStateTest, JobsSurviveARestartFromTheStateDirectory) {
  FakeClock clock;
  CoordinatorOptions o;
  o.clock = &clock;
  ShardHost host_a(&clock), host_b(&clock);
  o.state_dir = testing::TempDir("coordinator_state") + "/jobs";
  o.checkpoint_interval = absl::Seconds(1);
  auto reg = [](Coordinator& c, const std::string& name) {
    v1::RegisterWorkerRequest r;
    r.set_name(name);
    r.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
    return *c.Register(r);
  };
  std::vector<float> weights_at_3;
  OptimizerState optimizer_at_3;
  std::set<std::string> first_ids;
  // Adam: two state slots and a step count to carry over.
  const std::string adam_spec =
      SpecWith("epochs: 10, max_steps: 100",
               "optimizer: {type: adam, lr: 0.01}\n");
  {
    o.local_shard = MakeLocalShardControl(&host_a);
    Coordinator a(o);
    TALLY_ASSERT_OK(a.Restore());  // creates the directory
    auto running = a.Submit(adam_spec);
    auto queued = a.Submit(kSpec);
    auto cancelled = a.Submit(kSpec);
    ASSERT_TRUE(running.ok() && queued.ok() && cancelled.ok());
    TALLY_ASSERT_OK(a.Cancel(cancelled->id()).status());
    auto w1 = reg(a, "a"), w2 = reg(a, "b");
    first_ids = {w1.worker_id(), w2.worker_id()};
    ASSERT_EQ(a.Get(running->id())->state(), v1::RUNNING);
    auto shard = ShardOf(host_a, running->id());
    ASSERT_TRUE(shard.ok());
    EXPECT_EQ((*shard)->Metrics().total_steps, 100);  // from the spec
    auto step = [&](int64_t t) {
      for (const auto& w : {w1, w2}) {
        PushMeta m;
        m.worker_id = w.worker_id();
        m.incarnation = w.incarnation();
        m.step = t;
        m.base_version = t;
        m.samples = 4;
        std::vector<float> g((*shard)->num_params(), 0.25f * (t + 1));
        bool dup = false;
        ASSERT_TRUE(PushAndCommit(**shard, m, g.data(), &dup).ok());
      }
    };
    step(0);
    step(1);
    a.Tick();  // notices step 2: a point on the job's curve
    TALLY_ASSERT_OK(a.Checkpoint(false));  // new jobs: written at once
    step(2);
    TALLY_ASSERT_OK(a.Checkpoint(false));  // progress only: not yet due
    {
      v1::JobCheckpoint ck;
      ASSERT_TRUE(ck.ParseFromString(*ReadFile(o.state_dir + "/job-1.ckpt")));
      EXPECT_EQ(ck.state().version(), 2);
      // The directory is this coordinator's while it lives.
      Coordinator second(o);
      EXPECT_THAT(second.Restore(),
                  StatusIs(absl::StatusCode::kFailedPrecondition,
                           HasSubstr("in use by another tally-server")));
    }
    clock.Advance(absl::Seconds(2));
    TALLY_ASSERT_OK(a.Checkpoint(false));  // due now: version 3
    int64_t v = 0;
    weights_at_3 = *(*shard)->Snapshot(&v);
    ASSERT_EQ(v, 3);
    optimizer_at_3 = (*shard)->Save().optimizer;
    ASSERT_EQ(optimizer_at_3.slots.size(), 2u);
    step(3);  // never checkpointed: redone after the restart
  }
  o.local_shard = MakeLocalShardControl(&host_b);
  Coordinator b(o);
  TALLY_ASSERT_OK(b.Restore());
  std::vector<v1::Job> jobs = b.List();
  ASSERT_EQ(jobs.size(), 3u);
  EXPECT_EQ(jobs[0].id(), "job-1");
  EXPECT_EQ(jobs[0].state(), v1::RUNNING);
  EXPECT_EQ(jobs[0].metrics().step(), 3);
  EXPECT_EQ(jobs[0].metrics().total_steps(), 100);
  EXPECT_EQ(jobs[0].metrics().samples(), 24);
  EXPECT_EQ(jobs[0].metrics().workers(), 0);
  EXPECT_EQ(jobs[1].state(), v1::PENDING);
  EXPECT_EQ(jobs[2].state(), v1::CANCELLED);
  // The dashboard's history came back with the jobs.
  auto history = b.History("job-1");
  ASSERT_TRUE(history.ok());
  ASSERT_GE(history->curve_size(), 1);
  EXPECT_EQ(history->curve(0).step(), 2);
  std::string events;
  for (const auto& e : history->events()) events += e.text() + "; ";
  EXPECT_THAT(events, HasSubstr("submitted; "));
  EXPECT_THAT(events, HasSubstr("joined as rank 0"));
  EXPECT_THAT(events, HasSubstr("started: 2 workers, 1 parameter shard"));
  EXPECT_THAT(events, HasSubstr("checkpoint at step 2"));
  EXPECT_THAT((*b.History("job-3")).events(1).text(), HasSubstr("cancelled"));
  EXPECT_THAT(b.History("job-9").status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  int64_t v = 0;
  EXPECT_EQ(*(*ShardOf(host_b, "job-1"))->Snapshot(&v), weights_at_3);
  const OptimizerState restored = (*ShardOf(host_b, "job-1"))->Save().optimizer;
  EXPECT_EQ(restored.step, optimizer_at_3.step);
  EXPECT_EQ(restored.slots, optimizer_at_3.slots);
  // The restart is in the events, and the message says what the job
  // waits for only while it waits.
  events.clear();
  history = b.History("job-1");
  ASSERT_TRUE(history.ok());
  for (const auto& e : history->events()) events += e.text() + "; ";
  EXPECT_THAT(events, HasSubstr("the coordinator restarted; the job resumes "
                                "from the checkpoint of step 3"));
  EXPECT_THAT(events, HasSubstr("placed again on 1 parameter shard at step 3"));
  EXPECT_THAT(b.Get("job-1")->message(), ::testing::Not(HasSubstr("resum")));
  // New workers fill the running job's slots first.
  auto n1 = reg(b, "c");
  auto n2 = reg(b, "d");
  EXPECT_EQ(b.Get("job-1")->metrics().workers(), 2);
  // Each is listed once (not beside the previous lifetime's workers), under
  // an id the first coordinator never gave.
  const v1::JobMetrics now = b.Get("job-1")->metrics();
  ASSERT_EQ(now.progress_size(), 2);
  std::set<std::string> names;
  for (const v1::WorkerProgress& p : now.progress()) {
    names.insert(p.name());
    EXPECT_EQ(first_ids.count(p.worker_id()), 0u) << p.worker_id();
  }
  EXPECT_EQ(names, (std::set<std::string>{"c", "d"}));
  EXPECT_EQ(first_ids.count(n1.worker_id()) + first_ids.count(n2.worker_id()),
            0u);
  v1::HeartbeatRequest hb;
  hb.set_worker_id(n1.worker_id());
  hb.set_incarnation(n1.incarnation());
  auto beat = b.Heartbeat(hb);
  ASSERT_TRUE(beat.ok());
  EXPECT_EQ(beat->assignment().job_id(), "job-1");
  EXPECT_EQ(b.Get("job-2")->state(), v1::PENDING);
  // Ids go on after the restored ones.
  EXPECT_EQ(b.Submit(kSpec)->id(), "job-4");
  // Restore runs once, before any job.
  EXPECT_THAT(b.Restore(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                    HasSubstr("before any job")));
}

TEST(CoordinatorStateTest, AnUnreadableCheckpointStopsTheRestoreAndSaysWhich) {
  CoordinatorOptions o;
  o.state_dir = testing::TempDir("coordinator_bad_state");
  TALLY_ASSERT_OK(WriteFileAtomic(o.state_dir + "/job-7.ckpt", "garbage"));
  Coordinator c(o);
  EXPECT_THAT(c.Restore(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("job-7.ckpt")));
  EXPECT_TRUE(c.List().empty());
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// Limits and retention: each refused with its code, nothing half-done.
class CoordinatorLimitsTest : public ::testing::Test {
 protected:
  void Make(const CoordinatorOptions& base) {
    CoordinatorOptions o = base;
    o.clock = &clock_;
    o.local_shard = MakeLocalShardControl(&host_);
    coord_ = std::make_unique<Coordinator>(o);
  }
  FakeClock clock_;
  ShardHost host_{&clock_};
  std::unique_ptr<Coordinator> coord_;
};

constexpr char kPythonSpec[] =
    "model: {python: {code: x, params: [{name: w, shape: [2, 4]}]}}\n"
    "dataset: {name: synthetic, features: 4, classes: 2}\n";

// A Python model's lowest rank that never sends the initial weights (its
// build() hangs) fails the job, saying so, once initial_weights_timeout is
// over.
TEST_F(CoordinatorLimitsTest, InitialWeightsThatNeverComeFailTheJob) {
  CoordinatorOptions o;
  o.lease_timeout = absl::Hours(1);
  o.initial_weights_timeout = absl::Minutes(10);
  Make(o);
  auto job = coord_->Submit(kPythonSpec);
  TALLY_ASSERT_OK(job);
  v1::RegisterWorkerRequest reg;
  reg.set_python("Python 3, PyTorch");
  reg.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
  auto w = coord_->Register(reg);
  TALLY_ASSERT_OK(w);
  v1::HeartbeatRequest hb;
  hb.set_worker_id(w->worker_id());
  hb.set_incarnation(w->incarnation());
  auto r = coord_->Heartbeat(hb);
  TALLY_ASSERT_OK(r);
  ASSERT_TRUE(r->has_initial_weights());
  clock_.Advance(absl::Minutes(9));
  TALLY_ASSERT_OK(coord_->Heartbeat(hb));
  coord_->Tick();
  EXPECT_EQ(coord_->Get(job->id())->state(), v1::RUNNING);
  clock_.Advance(absl::Minutes(2));
  TALLY_ASSERT_OK(coord_->Heartbeat(hb));
  coord_->Tick();
  auto ended = coord_->Get(job->id());
  TALLY_ASSERT_OK(ended);
  EXPECT_EQ(ended->state(), v1::FAILED);
  EXPECT_THAT(ended->message(), HasSubstr("no initial weights from " +
                                          w->worker_id() + " within 10m"));
}

// A Python model with BatchNorm: w, and buffers of 8 + 8 bytes.
constexpr char kBatchNormSpec[] =
    "model: {python: {code: x, params: [{name: w, shape: [2, 4]}], buffers: "
    "[{name: bn.running_mean, dtype: F32, shape: [2]}, {name: "
    "bn.num_batches_tracked, dtype: I64, shape: []}]}}\n"
    "dataset: {name: synthetic, features: 4, classes: 2}\n";

// A Python model that fails has no report to give its buffers: its export
// takes them from the ranges' buffer region, so the file loads with
// strict=True (it had the parameters alone). Before any step set the
// region, the file says they are missing, in its metadata and to the
// client, rather than leaving them out silently.
TEST_F(CoordinatorLimitsTest, AFailedPythonModelsExportHasItsBuffers) {
  CoordinatorOptions o;
  o.lease_timeout = absl::Hours(1);
  Make(o);
  auto job = coord_->Submit(kBatchNormSpec);
  TALLY_ASSERT_OK(job);
  v1::RegisterWorkerRequest reg;
  reg.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
  reg.set_python("Python 3, PyTorch");
  auto w = coord_->Register(reg);
  TALLY_ASSERT_OK(w);
  v1::HeartbeatRequest hb;
  hb.set_worker_id(w->worker_id());
  hb.set_incarnation(w->incarnation());
  ASSERT_TRUE(coord_->Heartbeat(hb)->has_initial_weights());
  TALLY_ASSERT_OK(coord_->SetInitialWeights(job->id(), w->worker_id(),
                                            w->incarnation(),
                                            std::vector<float>(8, 0.5f)));
  ASSERT_TRUE(coord_->Heartbeat(hb)->has_assignment());
  auto early = coord_->ExportWeights(job->id());
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_THAT(early->buffers_note, HasSubstr("missing"));
  EXPECT_THAT(early->buffers_note, HasSubstr("bn.running_mean"));
  EXPECT_THAT(early->head, HasSubstr("\"buffers\":\"missing"));
  auto shard = ShardOf(host_, job->id());
  ASSERT_TRUE(shard.ok()) << shard.status();
  const std::string buffers = "0123456789abcdef";
  PushMeta m;
  m.worker_id = w->worker_id();
  m.incarnation = w->incarnation();
  m.samples = 1;
  m.buffers = std::make_shared<const std::string>(buffers);
  std::vector<float> g(8, 0.1f);
  bool dup = false;
  TALLY_ASSERT_OK(PushAndCommit(**shard, m, g.data(), &dup));
  ASSERT_EQ((*shard)->version(), 1);
  v1::ReportResultRequest r;
  r.set_worker_id(w->worker_id());
  r.set_incarnation(w->incarnation());
  r.set_job_id(job->id());
  r.set_ok(false);
  r.set_message("CUDA out of memory");
  TALLY_ASSERT_OK(coord_->ReportResult(r));
  ASSERT_EQ(coord_->Get(job->id())->state(), v1::FAILED);
  EXPECT_FALSE(ShardOf(host_, job->id()).ok());  // retired: the record's now
  auto file = coord_->ExportWeights(job->id());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->buffers_note, "");
  EXPECT_THAT(file->head, HasSubstr("\"bn.running_mean\""));
  EXPECT_THAT(file->head, HasSubstr("\"bn.num_batches_tracked\""));
  EXPECT_THAT(file->head, ::testing::Not(HasSubstr("\"buffers\":")));
  ASSERT_GT(file->head.size(), buffers.size());
  EXPECT_EQ(file->head.substr(file->head.size() - buffers.size()), buffers);
}

// The asked worker left (its lease ran out): the job waits for a worker
// without failing, and the next one asked gets a clock of its own.
TEST_F(CoordinatorLimitsTest, AnotherWorkerAskedForInitialWeightsStartsAfresh) {
  CoordinatorOptions o;
  o.lease_timeout = absl::Minutes(1);
  o.initial_weights_timeout = absl::Minutes(10);
  Make(o);
  auto job = coord_->Submit(kPythonSpec);
  TALLY_ASSERT_OK(job);
  v1::RegisterWorkerRequest reg;
  reg.set_python("Python 3, PyTorch");
  reg.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
  auto first = coord_->Register(reg);
  TALLY_ASSERT_OK(first);
  v1::HeartbeatRequest hb;
  hb.set_worker_id(first->worker_id());
  hb.set_incarnation(first->incarnation());
  ASSERT_TRUE(coord_->Heartbeat(hb)->has_initial_weights());
  clock_.Advance(absl::Minutes(9));  // the first worker is gone by now
  coord_->Tick();
  clock_.Advance(absl::Minutes(2));  // no one asked: the job only waits
  coord_->Tick();
  EXPECT_EQ(coord_->Get(job->id())->state(), v1::RUNNING);
  auto second = coord_->Register(reg);
  TALLY_ASSERT_OK(second);
  hb.set_worker_id(second->worker_id());
  hb.set_incarnation(second->incarnation());
  coord_->Tick();
  ASSERT_TRUE(coord_->Heartbeat(hb)->has_initial_weights());
  clock_.Advance(absl::Seconds(30));
  TALLY_ASSERT_OK(coord_->Heartbeat(hb));
  clock_.Advance(absl::Seconds(50));
  TALLY_ASSERT_OK(coord_->Heartbeat(hb));
  coord_->Tick();
  EXPECT_EQ(coord_->Get(job->id())->state(), v1::RUNNING);
}

// A Python worker registered and asked for its job's initial weights (the
// job it is given, in submission order).
struct AskedWorker {
  std::string job_id, worker_id;
  int64_t incarnation = 0;
};
AskedWorker Ask(Coordinator& coord) {
  v1::RegisterWorkerRequest reg;
  reg.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
  reg.set_python("Python 3, PyTorch");
  auto w = coord.Register(reg);
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return {};
  v1::HeartbeatRequest hb;
  hb.set_worker_id(w->worker_id());
  hb.set_incarnation(w->incarnation());
  auto r = coord.Heartbeat(hb);
  EXPECT_TRUE(r.ok() && r->has_initial_weights());
  if (!r.ok()) return {};
  return {r->initial_weights().job_id(), w->worker_id(), w->incarnation()};
}

// One offer of a job's initial weights is read at a time; once they are
// installed a new offer is refused as such (before anything is read),
// and an offer being read when its job ends is ended then.
TEST_F(CoordinatorLimitsTest, InitialWeightsAreOfferedOnceAndEndWithTheJob) {
  CoordinatorOptions o;
  o.lease_timeout = absl::Hours(1);
  Make(o);
  TALLY_ASSERT_OK(coord_->Submit(kPythonSpec));
  TALLY_ASSERT_OK(coord_->Submit(kPythonSpec));
  const AskedWorker a = Ask(*coord_), b = Ask(*coord_);
  ASSERT_EQ(a.job_id, "job-1");
  ASSERT_EQ(b.job_id, "job-2");
  std::vector<absl::Status> ended;
  auto record = [&ended](absl::Status s) { ended.push_back(s); };
  auto offer =
      coord_->BeginInitialWeights(a.job_id, a.worker_id, a.incarnation, record);
  TALLY_ASSERT_OK(offer);
  EXPECT_EQ((*offer)->values(), 8);
  EXPECT_THAT(
      coord_->BeginInitialWeights(a.job_id, a.worker_id, a.incarnation, record),
      HasReason(absl::StatusCode::kResourceExhausted, v1::OFFER_BUSY));
  TALLY_ASSERT_OK(coord_->SetInitialWeights(a.job_id, a.worker_id,
                                            a.incarnation,
                                            std::vector<float>(8, 0.5f)));
  offer->reset();
  // Installed: the same worker's offer again is refused at its start.
  EXPECT_THAT(
      coord_->BeginInitialWeights(a.job_id, a.worker_id, a.incarnation, record),
      HasReason(absl::StatusCode::kAlreadyExists, v1::WEIGHTS_GIVEN));
  EXPECT_THAT(coord_->SetInitialWeights(a.job_id, a.worker_id, a.incarnation,
                                        std::vector<float>(8, 0.25f)),
              HasReason(absl::StatusCode::kAlreadyExists, v1::WEIGHTS_GIVEN));
  // The other job is cancelled while its offer is read: ended, once.
  offer =
      coord_->BeginInitialWeights(b.job_id, b.worker_id, b.incarnation, record);
  TALLY_ASSERT_OK(offer);
  EXPECT_TRUE(ended.empty());
  TALLY_ASSERT_OK(coord_->Cancel(b.job_id));
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_THAT(ended[0],
              HasReason(absl::StatusCode::kFailedPrecondition, v1::JOB_ENDED));
  offer->reset();
  EXPECT_EQ(coord_->offers().bytes(), 0);
  EXPECT_THAT(
      coord_->BeginInitialWeights(b.job_id, b.worker_id, b.incarnation, record),
      HasReason(absl::StatusCode::kFailedPrecondition, v1::JOB_ENDED));
  EXPECT_EQ(ended.size(), 1u);
}

// Offers of several jobs share max_offer_bytes; an offer whose worker
// leaves the job (its lease ran out) is ended, and its bytes come back
// with it.
TEST_F(CoordinatorLimitsTest, OffersOfInitialWeightsShareABudget) {
  CoordinatorOptions o;
  o.lease_timeout = absl::Minutes(1);
  o.max_offer_bytes = 40;  // one model of 8 values (32 bytes) at a time
  Make(o);
  TALLY_ASSERT_OK(coord_->Submit(kPythonSpec));
  TALLY_ASSERT_OK(coord_->Submit(kPythonSpec));
  const AskedWorker a = Ask(*coord_), b = Ask(*coord_);
  ASSERT_EQ(b.job_id, "job-2");
  std::vector<absl::Status> ended;
  auto record = [&ended](absl::Status s) { ended.push_back(s); };
  auto first =
      coord_->BeginInitialWeights(a.job_id, a.worker_id, a.incarnation, record);
  TALLY_ASSERT_OK(first);
  EXPECT_THAT(
      coord_->BeginInitialWeights(b.job_id, b.worker_id, b.incarnation, record),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("--max_offer_bytes (40)")));
  // a goes quiet; b keeps its lease.
  v1::HeartbeatRequest hb;
  hb.set_worker_id(b.worker_id);
  hb.set_incarnation(b.incarnation);
  clock_.Advance(absl::Seconds(45));
  TALLY_ASSERT_OK(coord_->Heartbeat(hb));
  clock_.Advance(absl::Seconds(30));
  coord_->Tick();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_THAT(ended[0], HasReason(absl::StatusCode::kFailedPrecondition,
                                  v1::NOT_A_MEMBER));
  EXPECT_EQ(coord_->offers().bytes(), 32);  // until its reader lets it go
  first->reset();
  TALLY_EXPECT_OK(
      coord_->BeginInitialWeights(b.job_id, b.worker_id, b.incarnation, record));
}

TEST_F(CoordinatorLimitsTest, QueuedJobsAndWorkersAreBounded) {
  CoordinatorOptions o;
  o.max_queued_jobs = 2;
  o.max_workers = 1;
  Make(o);
  ASSERT_TRUE(coord_->Submit(kSpec).ok());
  ASSERT_TRUE(coord_->Submit(kSpec).ok());
  EXPECT_THAT(coord_->Submit(kSpec),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("--max_queued_jobs")));
  EXPECT_EQ(coord_->List().size(), 2u);
  // A cancelled job no longer counts.
  ASSERT_TRUE(coord_->Cancel("job-1").ok());
  EXPECT_TRUE(coord_->Submit(kSpec).ok());

  v1::RegisterWorkerRequest r;
  r.set_name("a");
  r.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
  ASSERT_TRUE(coord_->Register(r).ok());
  EXPECT_THAT(coord_->Register(r),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("--max_workers")));
  r.set_name(std::string(100000, 'n'));
  EXPECT_THAT(coord_->Register(r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("at most 256 bytes")));
}

// One submitter cannot fill the queue: each named one has a share of it.
TEST_F(CoordinatorLimitsTest, EachSubmitterHasAShareOfTheQueue) {
  CoordinatorOptions o;
  o.max_queued_jobs = 10;
  o.max_queued_jobs_per_submitter = 2;
  Make(o);
  ASSERT_TRUE(coord_->Submit(kSpec, "alice").ok());
  ASSERT_TRUE(coord_->Submit(kSpec, "alice").ok());
  EXPECT_THAT(coord_->Submit(kSpec, "alice"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("--max_queued_jobs_per_submitter")));
  EXPECT_TRUE(coord_->Submit(kSpec, "bob").ok());
  // Without tokens nobody has a name: only the whole queue's limit holds.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(coord_->Submit(kSpec).ok());
  EXPECT_EQ(coord_->List().size(), 6u);
  // A job of alice's that ends frees her place.
  ASSERT_TRUE(coord_->Cancel("job-1").ok());
  EXPECT_TRUE(coord_->Submit(kSpec, "alice").ok());
}

TEST_F(CoordinatorLimitsTest, ListPagesInOrderAndFiltersByOwner) {
  Make(CoordinatorOptions{});
  for (int i = 0; i < 7; ++i)
    ASSERT_TRUE(coord_->Submit(kSpec, i % 2 == 0 ? "alice" : "bob").ok());
  JobQuery q;
  q.page_size = 3;
  q.omit_spec = true;
  std::vector<std::string> seen;
  for (int pages = 1;; ++pages) {
    auto page = coord_->ListPage(q);
    ASSERT_TRUE(page.ok()) << page.status();
    ASSERT_LE(page->jobs.size(), 3u);
    for (const v1::Job& j : page->jobs) {
      EXPECT_TRUE(j.spec().empty());
      seen.push_back(j.id());
    }
    if (page->next_page_token.empty()) {
      EXPECT_EQ(pages, 3);
      break;
    }
    q.page_token = page->next_page_token;
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"job-1", "job-2", "job-3", "job-4",
                                            "job-5", "job-6", "job-7"}));
  JobQuery mine;
  mine.owner = "bob";
  auto page = coord_->ListPage(mine);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->jobs.size(), 3u);
  EXPECT_EQ(page->jobs[0].id(), "job-2");
  EXPECT_FALSE(page->jobs[0].spec().empty());
  q.page_token = "job-1";
  EXPECT_THAT(coord_->ListPage(q),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("page_token")));
}

TEST_F(CoordinatorLimitsTest, EndedJobsBeyondTheRetentionAreDropped) {
  CoordinatorOptions o;
  o.max_finished_jobs = 2;
  o.finished_job_ttl = absl::Hours(1);
  o.keep_weights_dir = testing::TempDir("retention");
  Make(o);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(coord_->Submit(kSpec).ok());
  for (const char* id : {"job-1", "job-2", "job-3"})
    ASSERT_TRUE(coord_->Cancel(id).ok());
  coord_->Tick();
  // Three ended, two kept: the oldest went; the pending one stays.
  std::vector<std::string> ids;
  for (const v1::Job& j : coord_->List()) ids.push_back(j.id());
  EXPECT_EQ(ids, (std::vector<std::string>{"job-2", "job-3", "job-4"}));
  EXPECT_THAT(coord_->Get("job-1"),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  // An hour later the others go by age; job-4 has not ended.
  clock_.Advance(absl::Hours(2));
  coord_->Tick();
  ASSERT_EQ(coord_->List().size(), 1u);
  EXPECT_EQ(coord_->List()[0].id(), "job-4");
}

TEST_F(CoordinatorLimitsTest, JobNumbersAreNotGivenTwiceAfterEveryFileIsGone) {
  CoordinatorOptions o;
  o.max_finished_jobs = 0;
  o.state_dir = testing::TempDir("next_job") + "/state";
  {
    Make(o);
    TALLY_ASSERT_OK(coord_->Restore());
    auto job = coord_->Submit(kSpec);
    ASSERT_TRUE(job.ok());
    ASSERT_TRUE(coord_->Cancel(job->id()).ok());
    TALLY_ASSERT_OK(coord_->Checkpoint(false));  // the end on disk
    coord_->Tick();                               // then dropped
    ASSERT_TRUE(coord_->List().empty());
    coord_.reset();
  }
  Make(o);
  TALLY_ASSERT_OK(coord_->Restore());
  EXPECT_TRUE(coord_->List().empty());
  auto next = coord_->Submit(kSpec);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->id(), "job-2");
}

TEST_F(CoordinatorLimitsTest, ADroppedJobLeavesItsFinalWeightsWhenAsked) {
  CoordinatorOptions o;
  o.max_finished_jobs = 0;  // drop every ended job
  o.keep_weights_dir = testing::TempDir("kept_weights");
  o.final_pull_grace = absl::ZeroDuration();  // one member reports
  Make(o);
  auto job = coord_->Submit(SpecWith("max_steps: 1"));
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<v1::RegisterWorkerResponse> workers;
  for (const char* name : {"a", "b"}) {
    v1::RegisterWorkerRequest r;
    r.set_name(name);
    r.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
    workers.push_back(*coord_->Register(r));
  }
  auto shard = *ShardOf(host_, job->id());
  std::vector<float> g(shard->num_params(), 0.1f);
  bool dup;
  for (const auto& w : workers) {
    PushMeta m;
    m.worker_id = w.worker_id();
    m.incarnation = w.incarnation();
    m.samples = 1;
    TALLY_ASSERT_OK(PushAndCommit(*shard, m, g.data(), &dup));
  }
  v1::ReportResultRequest r;
  r.set_worker_id(workers[0].worker_id());
  r.set_incarnation(workers[0].incarnation());
  r.set_job_id(job->id());
  r.set_ok(true);
  r.set_steps(1);
  TALLY_ASSERT_OK(coord_->ReportResult(r));
  coord_->Tick();
  EXPECT_THAT(coord_->Get(job->id()),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  auto kept = ReadFile(o.keep_weights_dir + "/" + job->id() + ".safetensors");
  ASSERT_TRUE(kept.ok()) << kept.status();
  auto tensors = DecodeSafetensors(*kept);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  EXPECT_EQ(tensors->size(), 2u);  // the linear layer's weight and bias
}

}  // namespace
}  // namespace tally
