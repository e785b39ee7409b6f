// A job as clients see it (v1::Job): its record, with the figures of the
// moment taken from its ranges as their shards report them (registry.h):
// the version every range has reached, that step's loss and accuracy,
// the tables' sums, every worker's clock, lag and times, the slowest
// one, and how long the weights have not moved and whom the open step
// waits on. An ended job is its record: the figures at its end.
//
// Reads the records it is given; the caller holds the coordinator's lock.
#ifndef TALLY_SERVER_CONTROL_JOB_RENDER_H_
#define TALLY_SERVER_CONTROL_JOB_RENDER_H_

#include "absl/time/time.h"
#include "server/control/job_entry.h"
#include "server/control/registry.h"

namespace tally {

// Seconds the weights may stand still before a stalled step names whom it
// waits on.
inline constexpr double kStallReport = 3.0;

v1::Job RenderJob(const JobEntry& job, const Registry& registry,
                  absl::Time now);

// Tick's look at a placed job: when its weights moved (for the stall
// report; a curve point when one is due) and whether its watchers are to
// hear (the weights moved, or a stalled step's report is due, once a
// second).
bool NoteProgress(JobEntry& job, const Registry& registry, absl::Time now);

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_JOB_RENDER_H_
