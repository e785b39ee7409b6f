// What the coordinator keeps of its jobs across restarts (state_dir,
// server/control/job_store.h): every job's record, a running job's whole
// vector at one version, taken from every range at exactly that version
// (range_reads.h), and an ended job's final weights. It decides which jobs
// are due to be written (their state changed; or they moved, at
// checkpoint_interval or when forced), builds each one's StoredJob, reads
// jobs back as records (a running job resumes from its checkpoint; one
// without one waits to start again), and forgets dropped jobs (their final
// weights kept first in keep_weights_dir, when asked).
//
// Not thread-safe: guarded by its owner. The Coordinator serialises Open,
// Write, SaveNextJob and Forget (its checkpoint_mu_), calls LoadAll once
// before serving, and calls Due under its mu_. LastState (a lost job's
// checkpoint) may run beside a Write: files are replaced atomically.
#ifndef TALLY_SERVER_CONTROL_JOB_ARCHIVE_H_
#define TALLY_SERVER_CONTROL_JOB_ARCHIVE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/control/job_entry.h"
#include "server/control/job_queue.h"
#include "server/control/job_store.h"
#include "server/control/range_reads.h"
#include "server/control/registry.h"

namespace tally {

// A job whose record is due to be written: taken under the coordinator's
// lock (JobArchive::Due) and written without it (JobArchive::Write).
struct CheckpointDue {
  v1::Job job;  // the record as it is to be kept
  int64_t num_params = 0;
  int64_t total_steps = 0;
  int64_t map_version = 0;
  int64_t version = -1;  // of the ranges, to save at
  std::vector<RangeRef> ranges;  // a running job's; empty otherwise
  std::shared_ptr<const std::vector<float>> final_weights;
  std::string final_buffers;
  std::shared_ptr<const StoredJob> start;
  v1::JobHistory history;
  std::vector<std::string> table_homes;  // an ended job's, by address
  // What Write wrote: the version of its weights (-1: none).
  int64_t saved_version = -1;
};

class JobArchive {
 public:
  struct Options {
    std::string state_dir;  // empty: nothing is kept
    SpecLimits spec_limits;
    absl::Duration checkpoint_interval = absl::Seconds(30);
    std::string keep_weights_dir;  // empty: dropped jobs' weights go
  };

  explicit JobArchive(Options options) : options_(std::move(options)) {}
  JobArchive(const JobArchive&) = delete;
  JobArchive& operator=(const JobArchive&) = delete;

  bool enabled() const { return !options_.state_dir.empty(); }
  // Creates the directory if needed and locks it for this archive's
  // lifetime, once (kFailedPrecondition when another server holds it).
  absl::Status Open();

  // Every job read back as a record, by id, with the next job number kept
  // on disk. Opens first. kDataLoss names a file that cannot be read, or a
  // job in two files; nothing is returned then.
  struct Restored {
    std::map<std::string, JobEntry> jobs;
    int64_t next_job = 0;
  };
  absl::StatusOr<Restored> LoadAll(absl::Time now);
  // One job as read back (its spec parsed under `limits`).
  static JobEntry FromStored(StoredJob stored, const SpecLimits& limits,
                             absl::Time now);
  // A job's last checkpoint with its state (null: none, or no store).
  std::shared_ptr<const StoredJob> LastState(const std::string& job_id) const;

  // The jobs due to be written (all that moved, with `force`). An ended
  // job is due once its ranges are retired, so that its file keeps its
  // final weights.
  std::vector<CheckpointDue> Due(const JobQueue& jobs, const Registry& registry,
                                 bool force, absl::Time now) const;
  // Writes one job's file: a running job's ranges at one version, an ended
  // job's final weights, a restored job not placed yet as it was read.
  // false, with nothing written, when a running job's ranges cannot be
  // saved now (training moves on; the next interval tries again). Errors
  // name the file.
  absl::StatusOr<bool> Write(CheckpointDue& due);
  // What a written file holds, into its job.
  static void NoteWritten(const CheckpointDue& due, JobEntry& job,
                          absl::Time now);

  // The next job number, kept so that numbers are never given twice, even
  // once every file is gone. A dropped job: its final weights to
  // keep_weights_dir as <job id>.safetensors (when it has them), then its
  // file removed (kept when its weights could not be). Errors are logged.
  void SaveNextJob(int64_t next);
  void Forget(const DroppedJob& job);

 private:
  const Options options_;
  // Set by Open (under the coordinator's checkpoint_mu_), which Restore
  // runs before the coordinator serves; read without that lock after.
  std::unique_ptr<JobStore> store_;
};

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_JOB_ARCHIVE_H_
