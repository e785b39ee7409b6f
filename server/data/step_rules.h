// A job's consistency rule (training.consistency, docs/cluster.md) as one
// range applies it, with the job's bounds on what a push carries: which
// steps are open, how many members a step needs, what a stale gradient
// weighs, and which pushes and rows a member may send (the codes of
// ParameterShard::CheckPush and StageRows).
//   bsp     one open step, version(); with backup_workers b it closes once
//           all but b required members committed it.
//   ssp(s)  steps version() .. version() + s are open; a push of step c is
//           computed from a version in [c - s, c].
//   async   no step is shared: a member's pushes are its own clock.
// A gradient of staleness tau weighs 1 / max(1, tau) with lr_scaling, and
// is refused beyond max_staleness.
//
// Immutable once made: its calls may run from any thread. What its checks
// count goes into the PushCounts they are given, which the ParameterShard
// that owns it guards with its lock.
#ifndef TALLY_SERVER_DATA_STEP_RULES_H_
#define TALLY_SERVER_DATA_STEP_RULES_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/spec/consistency.h"
#include "server/data/shard_member.h"
#include "server/shard_control.h"

namespace tally {

struct PushCounts;

class StepRules {
 public:
  // `max_samples`: the job's batch size (0: no bound); `buffer_bytes`: the
  // size of the buffers a push may carry (0: none).
  StepRules(const ConsistencySpec& spec, int64_t max_samples,
            int64_t buffer_bytes)
      : spec_(spec), max_samples_(max_samples), buffer_bytes_(buffer_bytes) {}

  const ConsistencySpec& spec() const { return spec_; }
  bool async() const { return spec_.mode == ConsistencyMode::kAsync; }
  // The steps open past the version (ssp's staleness, else 0).
  int64_t window() const { return spec_.Window(); }
  // The required members a step may close without (bsp's backups).
  int64_t backups() const {
    return spec_.mode == ConsistencyMode::kBsp ? spec_.backup_workers : 0;
  }
  // Whether the open step's pushes may be summed as they arrive: one open
  // step, closed by every required member (bsp without backups, ssp(0)).
  bool AllowsStreaming() const;
  // How much a gradient of staleness `tau` weighs (lr_scaling).
  float Scale(int64_t tau) const;
  // The staging buffers a range may have out with `members` members: a push
  // in flight and one staged per open step each, and 4 more.
  int StagingLimit(size_t members) const;
  int64_t buffer_bytes() const { return buffer_bytes_; }

  // A push of member `m` against the range at `version` (`ended`: the
  // training is over), after the member's own check: ParameterShard::
  // CheckPush's codes from its samples on. OK with *duplicate = true when
  // the member pushed this step already. Counts stale and late pushes.
  absl::Status CheckPush(const PushMeta& meta, const ShardMember& m,
                         int64_t version, bool ended, bool* duplicate,
                         PushCounts* counts) const;
  // Rows of `step` with `samples` from member `m` (StageRows' codes after
  // the member's check).
  absl::Status CheckRows(const ShardMember& m, int64_t step, int64_t samples,
                         int64_t version, bool ended) const;

 private:
  absl::Status CheckAsyncPush(const PushMeta& meta, const ShardMember& m,
                              int64_t version, bool ended, bool* duplicate,
                              PushCounts* counts) const;
  absl::Status CheckStepPush(const PushMeta& meta, const ShardMember& m,
                             int64_t version, bool ended, bool* duplicate,
                             PushCounts* counts) const;
  absl::Status CheckRowsStep(const ShardMember& m, int64_t step,
                             int64_t version, bool ended) const;
  // STALE_GRADIENT for a push of staleness `staleness`, counted.
  absl::Status Stale(const PushMeta& meta, int64_t staleness, int64_t version,
                     PushCounts* counts) const;

  const ConsistencySpec spec_;
  const int64_t max_samples_;
  const int64_t buffer_bytes_;
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_STEP_RULES_H_
