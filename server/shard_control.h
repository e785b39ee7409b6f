// One parameter shard as the coordinator drives it: install a job's range,
// hold it and set its members, save it, retire and drop it. Two kinds: the
// coordinator's own ShardHost, called in process, and a shard process,
// called over ShardService. The seam also lets tests replace a shard.
//
// Every call is bounded (`timeout`, or the control plane's default of a few
// seconds); a shard that does not answer is kUnavailable or
// kDeadlineExceeded and the coordinator tries again later. Thread-safe.
#ifndef TALLY_SERVER_SHARD_CONTROL_H_
#define TALLY_SERVER_SHARD_CONTROL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/tally.pb.h"
#include "proto/transport.h"
#include "server/shard.h"

namespace tally {

class ShardHost;

class ShardControl {
 public:
  virtual ~ShardControl() = default;
  virtual absl::Status Install(const v1::InstallRangeRequest& req) = 0;
  // These name the placement they are about (map_version; 0: any): a range
  // placed again since is not touched (kNotFound).
  virtual absl::StatusOr<HoldReport> Hold(const std::string& job_id,
                                          int64_t map_version,
                                          int64_t hold_id,
                                          absl::Duration hold) = 0;
  virtual absl::Status SetMembers(const std::string& job_id,
                                  int64_t map_version,
                                  const std::vector<MemberSpec>& members,
                                  int64_t hold_id) = 0;
  virtual absl::Status Retire(const std::string& job_id,
                              int64_t map_version) = 0;
  // Forgets the job's range (`ended`: the job is over, ShardHost::Drop). A
  // shard process is told by its next heartbeat answer instead
  // (drop_jobs): this is a no-op for it.
  virtual void Drop(const std::string& job_id, bool ended) = 0;
  // The range's state at exactly `version`, waiting at most `wait` for it.
  // `count` is the range's length as placed: a shard that sends more than
  // that many values in any part is cut off at once (kDataLoss), so a
  // rogue shard process cannot make the caller hold more than the range.
  virtual absl::StatusOr<ShardState> Save(const std::string& job_id,
                                          int64_t map_version,
                                          int64_t version, int64_t count,
                                          absl::Duration wait,
                                          bool weights_only) = 0;
  // The shard's ranges and their progress.
  virtual absl::StatusOr<std::vector<v1::RangeStatus>> Status() = 0;
  // Whether Status is cheap and live (in process) rather than remote.
  virtual bool local() const = 0;
};

// `host` is borrowed and must outlive the control.
std::unique_ptr<ShardControl> MakeLocalShardControl(ShardHost* host);
// Over ShardService at `address`, dialled with `transport`.
std::unique_ptr<ShardControl> MakeRemoteShardControl(
    const std::string& address, const TransportOptions& transport);

}  // namespace tally

#endif  // TALLY_SERVER_SHARD_CONTROL_H_
