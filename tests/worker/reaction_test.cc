// The worker's one decision on an answer: by reason first, then by code,
// and the same for the codes of servers before and after a code changed.
#include "worker/reaction.h"

#include "gtest/gtest.h"
#include "proto/errors.h"

namespace tally {
namespace {

absl::Status Why(absl::Status s, v1::ErrorReason r, int64_t step = 0) {
  return WithReason(std::move(s), r, step);
}

TEST(ReactionTest, PushAnswers) {
  EXPECT_EQ(ReactTo(Call::kPush, absl::OkStatus()), Reaction::kDone);
  EXPECT_EQ(ReactTo(Call::kPush, absl::UnavailableError("away")),
            Reaction::kRetry);
  EXPECT_EQ(ReactTo(Call::kPush, absl::DeadlineExceededError("slow")),
            Reaction::kRetry);
  EXPECT_EQ(ReactTo(Call::kPush, absl::ResourceExhaustedError("busy")),
            Reaction::kRetry);
  EXPECT_EQ(ReactTo(Call::kPush, absl::CancelledError("ours")),
            Reaction::kRetry);
  EXPECT_EQ(ReactTo(Call::kPush, absl::NotFoundError("no range")),
            Reaction::kStaleMap);
  EXPECT_EQ(ReactTo(Call::kPush, Why(absl::AbortedError(""), v1::PUSH_AGAIN)),
            Reaction::kRetryNow);
  EXPECT_EQ(ReactTo(Call::kPush, Why(absl::AbortedError(""), v1::STEP_CLOSED)),
            Reaction::kNextStep);
  EXPECT_EQ(
      ReactTo(Call::kPush, Why(absl::InvalidArgumentError(""), v1::NON_FINITE)),
      Reaction::kNotCounted);
  EXPECT_EQ(
      ReactTo(Call::kPush, Why(absl::AbortedError(""), v1::STALE_GRADIENT)),
      Reaction::kNotCounted);
  EXPECT_EQ(ReactTo(Call::kPush, absl::InvalidArgumentError("malformed")),
            Reaction::kNotCounted);
  EXPECT_EQ(ReactTo(Call::kPush, absl::AbortedError("no reason")),
            Reaction::kGiveUp);
  EXPECT_EQ(ReactTo(Call::kPush, absl::InternalError("bug")),
            Reaction::kGiveUp);
}

// STEP_NOT_OPEN and JOIN_LATER are ABORTED now and were
// FAILED_PRECONDITION before: both mean the same to a worker.
TEST(ReactionTest, ReasonsWhoseCodeChangedReadTheSameEitherWay) {
  for (absl::Status code :
       {absl::AbortedError("now"), absl::FailedPreconditionError("before")}) {
    EXPECT_EQ(ReactTo(Call::kPush, Why(code, v1::STEP_NOT_OPEN, 4)),
              Reaction::kPullAgain);
    EXPECT_EQ(ReactTo(Call::kPush, Why(code, v1::JOIN_LATER, 9)),
              Reaction::kJoinLater);
  }
}

TEST(ReactionTest, APlanChangeTakesTheNewPlan) {
  EXPECT_EQ(ReactTo(Call::kPull, Why(absl::AbortedError(""), v1::PLAN_CHANGED, 2)),
            Reaction::kNewPlan);
  EXPECT_STREQ(ReactionName(Reaction::kNewPlan), "new plan");
}

TEST(ReactionTest, LeavingWinsOverTheCode) {
  EXPECT_EQ(ReactTo(Call::kPush,
                    Why(absl::PermissionDeniedError(""), v1::NOT_A_MEMBER)),
            Reaction::kLeave);
  EXPECT_EQ(ReactTo(Call::kPull,
                    Why(absl::FailedPreconditionError(""), v1::JOB_ENDED)),
            Reaction::kLeave);
  EXPECT_EQ(ReactTo(Call::kReport,
                    Why(absl::FailedPreconditionError(""), v1::REGISTER_AGAIN)),
            Reaction::kLeave);
}

TEST(ReactionTest, PullAndReportAnswers) {
  EXPECT_EQ(ReactTo(Call::kPull, absl::AbortedError("versions differ")),
            Reaction::kRetry);
  EXPECT_EQ(ReactTo(Call::kPull, absl::NotFoundError("no range")),
            Reaction::kStaleMap);
  EXPECT_EQ(ReactTo(Call::kPull, Why(absl::FailedPreconditionError(""),
                                     v1::SCHEDULE_MISMATCH)),
            Reaction::kGiveUp);
  EXPECT_EQ(ReactTo(Call::kPull, absl::InvalidArgumentError("dtype")),
            Reaction::kGiveUp);
  // A report: NOT_FINISHED while the coordinator catches up is retried;
  // an unknown job is final (it was retried before, for 30 s).
  EXPECT_EQ(
      ReactTo(Call::kReport, Why(absl::UnavailableError(""), v1::NOT_FINISHED)),
      Reaction::kRetry);
  EXPECT_EQ(ReactTo(Call::kReport,
                    Why(absl::FailedPreconditionError(""), v1::NOT_FINISHED)),
            Reaction::kGiveUp);
  EXPECT_EQ(ReactTo(Call::kReport, absl::NotFoundError("no job")),
            Reaction::kGiveUp);
  EXPECT_EQ(ReactTo(Call::kReport, absl::UnavailableError("away")),
            Reaction::kRetry);
}

// A row call fails inside a step, before its dense push: nothing was
// committed, so every answer of the data path but a refusal of the rows
// themselves does the step again. After a shard is lost and the job is
// placed again from its checkpoint, a push of rows for a step past the
// restored version is STEP_NOT_OPEN: pull again, never the job's failure.
TEST(ReactionTest, RowAnswersDoTheStepAgain) {
  EXPECT_EQ(ReactTo(Call::kRows, Why(absl::AbortedError("not open"),
                                     v1::STEP_NOT_OPEN, 221)),
            Reaction::kPullAgain);
  EXPECT_EQ(ReactTo(Call::kRows, Why(absl::AbortedError(""), v1::STEP_CLOSED)),
            Reaction::kRetry);
  EXPECT_EQ(
      ReactTo(Call::kRows, Why(absl::AbortedError(""), v1::JOIN_LATER, 9)),
      Reaction::kJoinLater);
  EXPECT_EQ(ReactTo(Call::kRows, absl::AbortedError("no reason")),
            Reaction::kRetry);
  EXPECT_EQ(ReactTo(Call::kRows, absl::NotFoundError("map version 7, not 6")),
            Reaction::kStaleMap);
  EXPECT_EQ(ReactTo(Call::kRows, absl::UnavailableError("away")),
            Reaction::kRetry);
  EXPECT_EQ(ReactTo(Call::kRows, absl::DeadlineExceededError("slow")),
            Reaction::kRetry);
  EXPECT_EQ(ReactTo(Call::kRows,
                    Why(absl::FailedPreconditionError(""), v1::JOB_ENDED)),
            Reaction::kLeave);
  // The rows themselves refused, or a table past its memory bound (the
  // step would ask for the same rows again): the job's failure.
  EXPECT_EQ(ReactTo(Call::kRows, absl::InvalidArgumentError("another shard's")),
            Reaction::kGiveUp);
  EXPECT_EQ(
      ReactTo(Call::kRows, Why(absl::InvalidArgumentError(""), v1::NON_FINITE)),
      Reaction::kGiveUp);
  EXPECT_EQ(ReactTo(Call::kRows, Why(absl::ResourceExhaustedError("full"),
                                     v1::TABLE_FULL)),
            Reaction::kGiveUp);
  // A bare RESOURCE_EXHAUSTED (gRPC's memory quota) and waiting pulls at
  // their bound are busy-for-now, on rows as elsewhere.
  EXPECT_EQ(ReactTo(Call::kRows, absl::ResourceExhaustedError("quota")),
            Reaction::kRetry);
  EXPECT_EQ(ReactTo(Call::kRows, Why(absl::ResourceExhaustedError(""),
                                     v1::PULLS_WAITING)),
            Reaction::kRetry);
  EXPECT_EQ(ReactTo(Call::kPull, absl::ResourceExhaustedError("busy")),
            Reaction::kRetry);
}

}  // namespace
}  // namespace tally
