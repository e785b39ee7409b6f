// Reading a job's weights back from the shards that hold its ranges: every
// range at one version (SaveRanges: what a checkpoint and a running job's
// fetch take), or an ended job's retired ranges as they stand
// (RetiredWeights: its final weights).
//
// Every call to a shard is bounded; these block the calling thread (never
// under the coordinator's lock) and hold no state between calls.
#ifndef TALLY_SERVER_CONTROL_RANGE_READS_H_
#define TALLY_SERVER_CONTROL_RANGE_READS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/control/job_store.h"
#include "server/shard_control.h"

namespace tally {

// A range of a job's vector and the shard that holds it.
struct RangeRef {
  std::shared_ptr<ShardControl> control;
  int64_t offset = 0;
  int64_t count = 0;
};

// Every range of a job at one version, as one StoredJob (the weights, and
// unless `weights_only` the optimizer state and the tables' files). All
// ranges are asked at once to stop at `version` (at most `last_version`)
// and hand their state over there; a range that was past it already (the
// coordinator's view of a shard process lags by a heartbeat) says where it
// is, and all are asked again a little further on. No range can get more
// than a step ahead of another, so they all get there; kAborted if they
// keep moving past it. kDataLoss for a range that answers with another
// size or another optimizer.
absl::StatusOr<StoredJob> SaveRanges(const std::string& job_id,
                                     int64_t map_version,
                                     const std::vector<RangeRef>& ranges,
                                     int64_t version, int64_t last_version,
                                     int64_t num_params, bool weights_only);

// What an ended job's ranges hold: its weights (null when a range cannot
// be read) and a Python model's buffer region, which the range at offset
// 0 keeps (empty when no step has set it).
struct RetiredState {
  std::shared_ptr<const std::vector<float>> weights;
  std::string buffers;
};
// Retired ranges do not move: each is held (hold_id) and saved as it
// stands.
RetiredState RetiredWeights(const std::string& job_id, int64_t map_version,
                            int64_t hold_id, int64_t num_params,
                            const std::vector<RangeRef>& refs);

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_RANGE_READS_H_
