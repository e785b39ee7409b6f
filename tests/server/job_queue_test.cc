// The jobs and their queue: numbering, admission, pages, restore, which
// ended jobs are dropped, who gives a Python model's initial weights, and
// what a report may set.
#include "server/control/job_queue.h"

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "server/control/job_store.h"
#include "tests/server/fake_shard_control.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::HasReason;
using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kSpec[] = TALLY_TINY_MODEL "training: {workers: 2}\n";
constexpr char kPythonSpec[] =
    "model: {python: {code: x, params: [{name: w, shape: [2, 4]}]}}\n"
    "dataset: {name: synthetic, features: 4, classes: 2}\n";

const absl::Time kNow = ::tally::testing::kPartsNow;

class JobQueueTest : public ::testing::Test {
 protected:
  JobEntry& Add(JobQueue& q, const char* text = kSpec,
                const std::string& owner = "") {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(text, SpecLimits());
    EXPECT_TRUE(spec.ok()) << spec.status();
    return q.Add(*std::move(spec), text, owner, kNow);
  }
  // An ended job whose ranges are gone.
  JobEntry& AddEnded(JobQueue& q, absl::Time finished) {
    JobEntry& job = Add(q);
    job.proto.set_state(v1::SUCCEEDED);
    job.proto.set_finished_unix(UnixSeconds(finished));
    job.saved_state = v1::SUCCEEDED;
    return job;
  }
  JobQueue::Options options_;
};

TEST_F(JobQueueTest, JobsAreNumberedInOrderAndWaitPending) {
  JobQueue q(options_);
  JobEntry& a = Add(q);
  JobEntry& b = Add(q, kSpec, "alice");
  EXPECT_EQ(a.id(), "job-1");
  EXPECT_EQ(b.id(), "job-2");
  EXPECT_EQ(b.proto.state(), v1::PENDING);
  EXPECT_EQ(b.proto.owner(), "alice");
  EXPECT_EQ(b.slots.size(), 2u);
  EXPECT_EQ(b.history.events(0).text(), "submitted by alice");
  EXPECT_EQ(q.order(), (std::vector<std::string>{"job-1", "job-2"}));
  EXPECT_EQ(q.Queued(), 2);
  const std::string alice = "alice";
  EXPECT_EQ(q.Queued(&alice), 1);
  EXPECT_THAT(q.Find("job-3"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-3")));
}

TEST_F(JobQueueTest, AdmissionHoldsTheQueueAndEachSubmittersShare) {
  options_.max_queued_jobs = 3;
  options_.max_queued_jobs_per_submitter = 1;
  JobQueue q(options_);
  Add(q, kSpec, "alice");
  EXPECT_THAT(q.Admit("alice"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("--max_queued_jobs_per_submitter")));
  TALLY_EXPECT_OK(q.Admit("bob"));
  // Without tokens every caller is the same nobody, with no share.
  TALLY_EXPECT_OK(q.Admit(""));
  Add(q);
  Add(q);
  EXPECT_THAT(q.Admit(""), StatusIs(absl::StatusCode::kResourceExhausted,
                                    HasSubstr("--max_queued_jobs")));
}

TEST_F(JobQueueTest, PagesFollowTheirTokensAndOwner) {
  JobQueue q(options_);
  for (int i = 0; i < 5; ++i) Add(q, kSpec, i % 2 == 0 ? "alice" : "bob");
  JobQuery query;
  query.page_size = 2;
  std::string next;
  auto page = q.Page(query, &next);
  TALLY_ASSERT_OK(page);
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[1]->id(), "job-2");
  EXPECT_EQ(next, "2");
  query.page_token = next;
  query.owner = "alice";
  page = q.Page(query, &next);
  TALLY_ASSERT_OK(page);
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0]->id(), "job-3");
  EXPECT_EQ((*page)[1]->id(), "job-5");
  EXPECT_EQ(next, "");
  query.page_token = "job-2";
  EXPECT_THAT(q.Page(query, &next),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not one this server gave")));
}

TEST_F(JobQueueTest, ARestoredQueueNumbersPastEveryJobItHad) {
  JobQueue q(options_);
  std::map<std::string, JobEntry> jobs;
  jobs["job-10"].proto.set_id("job-10");
  jobs["job-9"].proto.set_id("job-9");
  TALLY_ASSERT_OK(q.Restore(std::move(jobs), /*next_job=*/4));
  EXPECT_EQ(q.order(), (std::vector<std::string>{"job-9", "job-10"}));
  EXPECT_EQ(q.next_job(), 11);
  EXPECT_EQ(Add(q).id(), "job-11");
  EXPECT_THAT(q.Restore({}, 50), StatusIs(absl::StatusCode::kFailedPrecondition,
                                          HasSubstr("before any job")));
  JobQueue kept(options_);
  TALLY_ASSERT_OK(kept.Restore({}, /*next_job=*/40));  // every file dropped
  EXPECT_EQ(Add(kept).id(), "job-40");
}

TEST_F(JobQueueTest, EndedJobsPastTheLimitGoOldestFirst) {
  options_.max_finished_jobs = 1;
  options_.keep_weights = true;
  JobQueue q(options_);
  JobEntry& old = AddEnded(q, kNow);
  old.final_weights = std::make_shared<std::vector<float>>(10, 1.0f);
  old.proto.mutable_metrics()->set_step(7);
  AddEnded(q, kNow);
  Add(q);  // pending: never dropped
  AddEnded(q, kNow);
  // A worker still leaving job-4 keeps it.
  std::vector<DroppedJob> dropped = q.TakeDroppable(kNow, {"job-4"});
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].id, "job-1");
  ASSERT_NE(dropped[0].weights, nullptr);
  EXPECT_EQ(dropped[0].step, 7);
  EXPECT_EQ(dropped[0].params.size(), 2u);  // weight, bias
  EXPECT_EQ(q.order(), (std::vector<std::string>{"job-2", "job-3", "job-4"}));
  dropped = q.TakeDroppable(kNow, {});
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].id, "job-2");
  EXPECT_EQ(dropped[0].weights, nullptr);  // it had none
}

TEST_F(JobQueueTest, EndedJobsGoPastTheirAgeOnceTheirEndIsOnDisk) {
  options_.finished_job_ttl = absl::Hours(1);
  options_.durable = true;
  JobQueue q(options_);
  AddEnded(q, kNow - absl::Hours(2));
  JobEntry& unsaved = AddEnded(q, kNow - absl::Hours(2));
  unsaved.saved_state = v1::RUNNING;
  AddEnded(q, kNow);
  JobEntry& placed = AddEnded(q, kNow - absl::Hours(2));
  placed.ranges.push_back({"shard-0", 0, 10});  // not retired yet
  std::vector<DroppedJob> dropped = q.TakeDroppable(kNow, {});
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].id, "job-1");
  EXPECT_EQ(q.order().size(), 3u);
}

TEST_F(JobQueueTest, TheLowestRankIsAskedForInitialWeights) {
  options_.initial_weights_timeout = absl::Minutes(10);
  JobQueue q(options_);
  JobEntry& job = Add(q, kPythonSpec);
  job.slots = {"w1"};
  EXPECT_FALSE(JobQueue::AskForWeights(job, "w1", kNow));  // pending
  job.proto.set_state(v1::RUNNING);
  EXPECT_FALSE(JobQueue::AskForWeights(job, "w2", kNow));
  EXPECT_TRUE(JobQueue::AskForWeights(job, "w1", kNow));
  EXPECT_TRUE(JobQueue::AskForWeights(job, "w1", kNow + absl::Minutes(5)));
  EXPECT_EQ(job.weights_asked_at, kNow);  // the clock runs from the first
  EXPECT_TRUE(q.WeightsOverdue(kNow + absl::Minutes(10)).empty());
  auto overdue = q.WeightsOverdue(kNow + absl::Minutes(11));
  ASSERT_EQ(overdue.size(), 1u);
  EXPECT_EQ(overdue[0].first, &job);
  EXPECT_THAT(overdue[0].second, HasSubstr("no initial weights from w1 "
                                           "within 10m"));
  // The asked worker left: the next one is asked afresh.
  job.slots = {"w2"};
  EXPECT_TRUE(q.WeightsOverdue(kNow + absl::Minutes(11)).empty());
  EXPECT_EQ(job.weights_asked_of, "");
}

TEST_F(JobQueueTest, OnlyTheAskedWorkerMayOfferInitialWeights) {
  JobQueue q(options_);
  Add(q);
  JobEntry& py = Add(q, kPythonSpec);
  py.proto.set_state(v1::RUNNING);
  py.slots = {"w1"};
  EXPECT_THAT(q.OfferWanted("job-9", "w1"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-9")));
  EXPECT_THAT(q.OfferWanted("job-1", "w1"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a Python model's")));
  EXPECT_THAT(q.OfferWanted("job-2", "w2"),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::NOT_A_MEMBER));
  auto wanted = q.OfferWanted("job-2", "w1");
  TALLY_ASSERT_OK(wanted);
  EXPECT_EQ(*wanted, &py);
  py.start = std::make_shared<StoredJob>();
  EXPECT_THAT(q.OfferWanted("job-2", "w1"),
              HasReason(absl::StatusCode::kAlreadyExists, v1::WEIGHTS_GIVEN));
  py.proto.set_state(v1::CANCELLED);
  EXPECT_THAT(q.OfferWanted("job-2", "w1"),
              HasReason(absl::StatusCode::kFailedPrecondition, v1::JOB_ENDED));
}

TEST_F(JobQueueTest, AResultMustBeOfTheFinalWeights) {
  JobQueue q(options_);
  JobEntry& job = Add(q);
  job.schedule.total_steps = 10;
  v1::ReportResultRequest r;
  r.set_ok(true);
  r.set_steps(9);
  r.set_test_accuracy(0.75);
  EXPECT_THAT(JobQueue::TakeResult(job, r, 10),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::NOT_FINISHED));
  r.set_steps(10);
  EXPECT_THAT(JobQueue::TakeResult(job, r, 9),
              HasReason(absl::StatusCode::kUnavailable, v1::NOT_FINISHED));
  r.set_buffers("xx");
  EXPECT_THAT(JobQueue::TakeResult(job, r, 10),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("buffers are 2 bytes")));
  EXPECT_EQ(job.proto.metrics().test_accuracy(), 0.0);
  r.clear_buffers();
  TALLY_ASSERT_OK(JobQueue::TakeResult(job, r, 10));
  EXPECT_EQ(job.proto.metrics().test_accuracy(), 0.75);
}

TEST_F(JobQueueTest, AFailureFromAnEarlierPlacementIsNotedOnce) {
  JobQueue q(options_);
  JobEntry& job = Add(q);
  job.map_version = 5;
  v1::ReportResultRequest r;
  r.set_worker_id("w1");
  r.set_ok(false);
  r.set_map_version(5);
  r.set_message("shard gone");
  EXPECT_FALSE(JobQueue::NoteStaleReport(job, r, "w1 (a)", kNow));
  r.set_map_version(4);
  const int events = job.history.events_size();
  EXPECT_TRUE(JobQueue::NoteStaleReport(job, r, "w1 (a)", kNow));
  EXPECT_TRUE(JobQueue::NoteStaleReport(job, r, "w1 (a)", kNow));
  ASSERT_EQ(job.history.events_size(), events + 1);
  EXPECT_THAT(job.history.events(events).text(),
              HasSubstr("w1 (a) stopped on an earlier placement of the job "
                        "(map version 4): shard gone"));
  r.set_reason(v1::SCHEDULE_MISMATCH);  // its own answer, whatever the map
  EXPECT_FALSE(JobQueue::NoteStaleReport(job, r, "w1 (a)", kNow));
}

}  // namespace
}  // namespace tally
