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
  int64_t version = 0;  // steps closed: the weights below
  int64_t samples = 0;
  int64_t rejected_pushes = 0;
  double loss = 0.0;
  double accuracy = 0.0;
  double train_seconds = 0.0;
  std::shared_ptr<const std::vector<float>> weights;  // num_params
  int64_t optimizer_step = 0;
  std::vector<std::vector<float>> optimizer_slots;  // num_params each
  v1::JobHistory history;  // curves and events (the dashboard's)
  // A Python model's buffers (JobCheckpoint.buffers): a running job's
  // buffer region, as its first range keeps it; an ended job's, as the
  // report that ended it gave them.
  std::string buffers;
  // A job whose shards checkpoint its tables: the files of its rows at
  // `version`, every range's chain in shard-map order.
  std::vector<std::string> table_files;
  // An ended job's table homes (JobCheckpoint.table_homes): each slot's
  // shard address.
  std::vector<std::string> table_homes;

  // The state of elements [offset, offset + count), as a range holds it,
  // on the wire (has_state must be set): what a shard is installed with.
  // The record through the range codec (server/shard_control.h), the
  // tensors copied once, straight from this job's vectors.
  void EncodeRange(int64_t offset, int64_t count, v1::RangeState* out) const;
  // The record (version, counters, optimizer step) to and from a range's.
  ShardState Record() const;
  void SetRecord(const ShardState& range);
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
  static absl::string_view ReadTensors(const v1::JobCheckpoint& ck,
                                       const JobSpec& spec, StoredJob* out);
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
