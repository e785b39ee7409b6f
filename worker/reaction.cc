#include "worker/reaction.h"

#include "proto/errors.h"

namespace tally {

Reaction ReactTo(Call call, const absl::Status& s) {
  if (s.ok()) return Reaction::kDone;
  // The reason first: it says more than the code, and keeps its meaning
  // when a code changes between releases.
  switch (ReasonOf(s)) {
    case v1::JOB_ENDED:
    case v1::NOT_A_MEMBER:
    case v1::REGISTER_AGAIN:
      return Reaction::kLeave;
    case v1::PUSH_AGAIN:
      return Reaction::kRetryNow;
    case v1::STEP_CLOSED:
      return call == Call::kPush ? Reaction::kNextStep : Reaction::kRetry;
    case v1::STEP_NOT_OPEN:
      return Reaction::kPullAgain;
    case v1::JOIN_LATER:
      return Reaction::kJoinLater;
    case v1::PLAN_CHANGED:
      return Reaction::kNewPlan;
    case v1::PULLS_WAITING:  // the shard holds its bound of waiting pulls
      return Reaction::kRetry;
    case v1::TABLE_FULL:  // the step would ask for the same rows again
      return Reaction::kGiveUp;
    case v1::NON_FINITE:
    case v1::STALE_GRADIENT:
      return call == Call::kPush ? Reaction::kNotCounted : Reaction::kGiveUp;
    case v1::NOT_FINISHED:
      // UNAVAILABLE: the coordinator has not seen the last step close
      // yet; FAILED_PRECONDITION: the report is not of the final weights.
      return absl::IsUnavailable(s) ? Reaction::kRetry : Reaction::kGiveUp;
    default:
      break;
  }
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
      return Reaction::kRetry;
    case absl::StatusCode::kResourceExhausted:
      // Busy for now (gRPC's memory quota, pushes in flight); a full table
      // says so with TABLE_FULL, above.
      return Reaction::kRetry;
    case absl::StatusCode::kNotFound:
      // An unknown job in a report is final; a shard without the range is
      // a stale shard map.
      return call == Call::kReport ? Reaction::kGiveUp : Reaction::kStaleMap;
    case absl::StatusCode::kAborted:
      return call == Call::kPull || call == Call::kRows ? Reaction::kRetry
                                                        : Reaction::kGiveUp;
    case absl::StatusCode::kInvalidArgument:
      return call == Call::kPush ? Reaction::kNotCounted : Reaction::kGiveUp;
    default:
      return Reaction::kGiveUp;
  }
}

const char* ReactionName(Reaction r) {
  switch (r) {
    case Reaction::kDone:
      return "done";
    case Reaction::kRetry:
      return "retry";
    case Reaction::kStaleMap:
      return "stale map";
    case Reaction::kRetryNow:
      return "retry now";
    case Reaction::kNextStep:
      return "next step";
    case Reaction::kPullAgain:
      return "pull again";
    case Reaction::kJoinLater:
      return "join later";
    case Reaction::kNewPlan:
      return "new plan";
    case Reaction::kNotCounted:
      return "not counted";
    case Reaction::kLeave:
      return "leave";
    case Reaction::kGiveUp:
      return "give up";
  }
  return "?";
}

}  // namespace tally
