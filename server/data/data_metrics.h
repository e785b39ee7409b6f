// The data plane's metrics (common/metrics), counted as pushes and pulls
// happen, on every shard (the coordinator's own included).
//
// Data plane series (every shard, the coordinator's own included):
//   tally_push_bytes_total, tally_pull_bytes_total        counter
//   tally_push_seconds, tally_pull_seconds                histogram, per call
//   tally_pull_wait_seconds                 histogram, waiting for the version
//   tally_pushes_total{result}              counter; result: ok, duplicate,
//       step_closed, non_finite, not_member, invalid, other
//   tally_step_publish_seconds              histogram, from a step's last
//       push to its version published (bsp, ssp); buckets 1.25x apart, so
//       a quantile read from them is within 12%
//   tally_step_close_seconds                the same from its last commit
//       (on several shards commits come with the next pulls)
#ifndef TALLY_SERVER_DATA_DATA_METRICS_H_
#define TALLY_SERVER_DATA_DATA_METRICS_H_

#include "absl/status/status.h"
#include "common/metrics/metrics.h"

namespace tally {

class DataPlaneMetrics {
 public:
  explicit DataPlaneMetrics(prometheus::Registry& registry);
  DataPlaneMetrics(const DataPlaneMetrics&) = delete;
  DataPlaneMetrics& operator=(const DataPlaneMetrics&) = delete;

  // A push call that ended with `status` (its answer), after `seconds`,
  // having received `bytes` of tensor data.
  void Pushed(const absl::Status& status, bool duplicate, double seconds,
              double bytes);
  // A pull that waited `wait_seconds` for its version and took `seconds`
  // in all, sending `bytes`.
  void Pulled(double wait_seconds, double seconds, double bytes);
  // A worker's word on the memory a stream offered it: mapped, or not.
  void SharedMemory(bool mapped);
  // A step of some range was published this long after its last push and
  // after its last commit.
  void Published(double since_push, double since_commit) {
    publish_seconds_.Observe(since_push);
    close_seconds_.Observe(since_commit);
  }

 private:
  prometheus::Counter& push_bytes_;
  prometheus::Counter& pull_bytes_;
  prometheus::Histogram& push_seconds_;
  prometheus::Histogram& pull_seconds_;
  prometheus::Histogram& pull_wait_seconds_;
  prometheus::Histogram& publish_seconds_;
  prometheus::Histogram& close_seconds_;
  prometheus::Family<prometheus::Counter>& pushes_;
  prometheus::Family<prometheus::Counter>& shared_;
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_DATA_METRICS_H_
