// A job's consistency rule (training.consistency), on its own so that the
// parameter shard need not see the rest of the job spec.
#ifndef TALLY_COMMON_SPEC_CONSISTENCY_H_
#define TALLY_COMMON_SPEC_CONSISTENCY_H_

#include <cstdint>

namespace tally {

// How the workers of a cluster job wait for each other (docs/cluster.md,
// "Consistency"). A version is a step closed (bsp, ssp) or a push applied
// (async).
enum class ConsistencyMode { kBsp, kSsp, kAsync };
enum class LrScaling { kNone, kStaleness };

struct ConsistencySpec {
  ConsistencyMode mode = ConsistencyMode::kBsp;
  // ssp: a worker computes step c from version c - staleness or later.
  int64_t staleness = 0;
  // kStaleness: a gradient of staleness tau counts 1 / max(1, tau) of its
  // weight (Zhang et al., IJCAI 2016).
  LrScaling lr_scaling = LrScaling::kNone;
  // async: gradients staler than this are refused (STALE_GRADIENT); -1:
  // no bound. (ssp's staleness bounds its gradients' already.)
  int64_t max_staleness = -1;
  // bsp: a step closes once all but this many members committed it.
  int64_t backup_workers = 0;
  // training.consistency.tables: async: each member's row gradients of
  // the open step are stepped as they come, alone (PERSIA's hybrid, the
  // dense part keeping `mode`); sync (false): summed with the step's
  // other members' and stepped when the step closes, as the dense part.
  bool tables_async = false;

  // How many steps a worker may run ahead of the weights' version: the
  // staleness in ssp, 0 in bsp (async has no bound).
  int64_t Window() const {
    return mode == ConsistencyMode::kSsp ? staleness : 0;
  }
  // The versions a worker at `clock` may compute from start here.
  int64_t FirstUsableVersion(int64_t clock) const {
    if (mode == ConsistencyMode::kAsync) return 0;
    const int64_t v = clock - Window();
    return v > 0 ? v : 0;
  }
};
const char* ConsistencyModeName(ConsistencyMode mode);

}  // namespace tally

#endif  // TALLY_COMMON_SPEC_CONSISTENCY_H_
