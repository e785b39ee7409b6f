// The coordinator's jobs on disk (--state_dir): one file per job,
// <dir>/<job id>.ckpt, a v1::JobCheckpoint replaced atomically (write,
// fsync, rename, fsync the directory). A job that has started also keeps
// its whole flat vector's weights and optimizer state at one version, so a
// restarted coordinator, or one that lost a shard, can place it again on
// whatever shards are live.
//
// One coordinator per directory: Open() takes <dir>/LOCK (flock) for the
// store's lifetime. Not thread-safe: the coordinator serialises its calls.
#ifndef TALLY_SERVER_CONTROL_JOB_STORE_H_
#define TALLY_SERVER_CONTROL_JOB_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "proto/tally.pb.h"
#include "server/shard_control.h"

namespace tally {
namespace v1 {
class JobCheckpoint;
}  // namespace v1

// A job as kept: its record and, once started, its parameters.
struct StoredJob {
  v1::Job job;
  bool has_state = false;
  // The job's whole flat vector at one version (has_state): the record a
  // range keeps of its own elements (server/shard_control.h), with
  // weights and each optimizer slot of num_params values. Its buffers: a
  // running job's buffer region, as its first range keeps it; an ended
  // job's, as the report that ended it gave them. Its table files: a job
  // whose shards checkpoint its tables, every range's chain in shard-map
  // order.
  ShardState state;
  v1::JobHistory history;  // curves and events (the dashboard's)
  // An ended job's table homes (JobCheckpoint.table_homes): each slot's
  // shard address.
  std::vector<std::string> table_homes;

  // The state of elements [offset, offset + count), as a range holds it,
  // on the wire (has_state must be set): what a shard is installed with.
  // The record through the range codec (server/shard_control.h), the
  // tensors copied once, straight from this job's vectors.
  void EncodeRange(int64_t offset, int64_t count, v1::RangeState* out) const;
};

class JobStore {
 public:
  // Specs are read back under `limits` (the coordinator's).
  JobStore(std::string dir, const SpecLimits& limits)
      : dir_(std::move(dir)), limits_(limits) {}
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;
  ~JobStore();

  // Creates the directory if needed, locks it (kFailedPrecondition when
  // another server holds it) and removes leftovers of cut writes.
  absl::Status Open();
  // Every job, checked against its spec (sizes); kDataLoss names a file
  // that cannot be read, and then nothing is returned.
  absl::StatusOr<std::vector<StoredJob>> LoadAll() const;
  // One job's file; kNotFound when it has none.
  absl::StatusOr<StoredJob> Load(const std::string& job_id) const;
  // Replaces the job's file. kResourceExhausted past 2 GiB (protobuf's
  // limit); errors name the file.
  absl::Status Save(const StoredJob& job) const;
  // A checkpoint file's bytes, checked (format, job id against the file
  // name `path`, spec under `limits`, sizes, checksum); kDataLoss names the
  // file and what is wrong.
  static absl::StatusOr<StoredJob> ParseCheckpoint(absl::string_view bytes,
                                                   const std::string& path,
                                                   const SpecLimits& limits);
  // A format 1 file's state, moved into JobCheckpoint.state.
  static void UpgradeFormat1(v1::JobCheckpoint* ck);
  // The next job number, kept beside the jobs (<dir>/NEXT_JOB) so that
  // numbers are not given again after every file was dropped; 0 when none.
  absl::Status SaveNextJob(int64_t next) const;
  int64_t LoadNextJob() const;
  // Deletes the job's file (OK when it has none).
  absl::Status Remove(const std::string& job_id) const;

 private:
  std::string PathOf(const std::string& job_id) const;
  absl::StatusOr<StoredJob> LoadFile(const std::string& path) const;

  const std::string dir_;
  const SpecLimits limits_;
  int lock_fd_ = -1;
};

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_JOB_STORE_H_
