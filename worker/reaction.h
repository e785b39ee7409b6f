// What a worker does with an answer from a shard or the coordinator, read
// from the status code and its ErrorReason (proto/errors.h) in this one
// place, never from a message. The codes follow Abseil's rule (UNAVAILABLE:
// retry the call; ABORTED: retry at a higher level, re-pull and redo the
// step; FAILED_PRECONDITION: do not retry as it is); the reason says which
// higher-level retry. docs/cluster.md lists every call's answers.
//
// Compatibility: STEP_NOT_OPEN and JOIN_LATER came with FAILED_PRECONDITION
// from servers of earlier releases and come with ABORTED now; a reaction
// is decided by the reason first, so answers of either kind of server are
// understood (for one release; docs/cluster.md).
//
// Thread-safe (a pure function).
#ifndef TALLY_WORKER_REACTION_H_
#define TALLY_WORKER_REACTION_H_

#include "absl/status/status.h"

namespace tally {

// The call the answer is to.
enum class Call {
  kPush,    // PushGradients, or a push on an Exchange stream
  kPull,    // PullWeights, or a pull on an Exchange stream
  // PullRows or PushRows (a job's tables), inside the engine's step,
  // before the step's dense push: whatever the answer, nothing of the step
  // was committed, so a step that cannot go on is done again from a pull
  // (kRetry, kStaleMap, kPullAgain) or from a later one (kJoinLater), as a
  // dense push's answer would say. After a roll-back (a lost shard, the
  // job placed again from its checkpoint) a push of a step past the
  // restored version is STEP_NOT_OPEN: kPullAgain, never the job's failure.
  // A row the call itself refused (INVALID_ARGUMENT, NON_FINITE) or a
  // table past its memory bound (RESOURCE_EXHAUSTED: the step would ask for
  // the same rows again) is kGiveUp.
  kRows,
  kReport,  // ReportResult
};

enum class Reaction {
  kDone,  // OK
  // The same call again after a backoff: the server is away or busy
  // (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED but on rows, our
  // own CANCELLED); on a pull or rows, also ABORTED without a reason the
  // worker acts on (the shards sent different versions), and on rows
  // STEP_CLOSED (the pull brings the version past it).
  kRetry,
  // A shard holds no range of the job, or one of another placement than
  // the call's map_version (NOT_FOUND on a push, pull or rows): the job is
  // being (or was) placed again and the worker's shard map is stale. Back off
  // and pull again while the coordinator still assigns the job; its
  // heartbeat brings the new map.
  kStaleMap,
  kRetryNow,   // PUSH_AGAIN: the same push again at once
  kNextStep,   // STEP_CLOSED: commit nothing, pull the next step
  kPullAgain,  // STEP_NOT_OPEN: the shards are behind; pull this step again
  kJoinLater,  // JOIN_LATER: a member from ErrorDetail.step; pull that
  // PLAN_CHANGED: the job grew; take its new plan (ErrorDetail.step: its
  // number) from the daemon's next assignment and pull again.
  kNewPlan,
  // NON_FINITE, STALE_GRADIENT, or any other INVALID_ARGUMENT on a push:
  // the shard refused its content; commit it as not contributed, go on.
  kNotCounted,
  kLeave,   // JOB_ENDED, NOT_A_MEMBER, REGISTER_AGAIN: not ours any more
  kGiveUp,  // anything else: report the failure (a report: stop trying)
};

Reaction ReactTo(Call call, const absl::Status& status);

// For logs and tests.
const char* ReactionName(Reaction r);

}  // namespace tally

#endif  // TALLY_WORKER_REACTION_H_
