// The coordinator (server 0): job records and their lifecycle, worker
// registration and leases, assignment of workers to jobs, and one
// ParameterShard per running job.
//
// Lifecycle: PENDING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED. The
// job's schedule (steps per epoch, total steps) is fixed at submission from
// the spec; workers follow it and one whose dataset disagrees is taken off
// the job (never the job's schedule changed). A job starts when
// `training.workers` workers are idle (jobs start in submission order); a
// slot vacated by a worker whose lease expired is refilled by the next idle
// worker, which rejoins at the next step. Training ends when the weights
// reach the schedule's last version; the job succeeds once a worker has
// reported the test accuracy of the final weights.
//
// Errors carry an ErrorReason (proto/errors.h) wherever a caller must tell
// situations apart; proto/tally.proto lists them per RPC.
//
// Persistence (options.state_dir): every job is kept in <state_dir>/<job
// id>.ckpt, written atomically when its state changes and, while it trains,
// at most every checkpoint_interval; Restore() at start-up brings the jobs
// back. A job that was RUNNING resumes from its last checkpointed step with
// all slots vacant; workers that register fill them and go on from there.
//
// Thread-safe. Subscriber callbacks run without the coordinator's lock.
#ifndef TALLY_SERVER_COORDINATOR_H_
#define TALLY_SERVER_COORDINATOR_H_

#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/spec/job_spec.h"
#include "proto/tally.pb.h"
#include "server/shard.h"

namespace tally {

struct CoordinatorOptions {
  absl::Duration lease_timeout = absl::Seconds(3);
  const Clock* clock = nullptr;  // borrowed; null = real time
  // Where jobs are kept across restarts; empty: in memory only.
  std::string state_dir;
  // How often a training job's weights are written (its state changes are
  // written at the next Tick).
  absl::Duration checkpoint_interval = absl::Seconds(30);
};

class Coordinator {
 public:
  explicit Coordinator(const CoordinatorOptions& options);
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;
  ~Coordinator();

  // Jobs. Submit validates the spec (kInvalidArgument names the field).
  absl::StatusOr<v1::Job> Submit(const std::string& spec_text);
  absl::StatusOr<v1::Job> Get(const std::string& job_id) const;
  std::vector<v1::Job> List() const;
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id);
  // The job's current weights as a .safetensors file.
  absl::StatusOr<std::string> WeightsFile(const std::string& job_id) const;

  // Workers.
  v1::RegisterWorkerResponse Register(const v1::RegisterWorkerRequest& req);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& req);
  absl::Status ReportResult(const v1::ReportResultRequest& req);

  // The shard of a running (or finished) job, for the parameter service.
  // kNotFound for an unknown job, kFailedPrecondition while it is PENDING.
  absl::StatusOr<std::shared_ptr<ParameterShard>> Shard(
      const std::string& job_id) const;
  // kFailedPrecondition unless (worker, incarnation) is the live registration.
  absl::Status CheckWorker(const std::string& worker_id,
                           int64_t incarnation) const;

  // Calls `on_change` after every change of the job (state, a closed step);
  // returns an id for Unsubscribe. kNotFound for an unknown job.
  absl::StatusOr<int64_t> Subscribe(const std::string& job_id,
                                    std::function<void()> on_change);
  void Unsubscribe(int64_t id);

  // Periodic work: expires leases, schedules, releases timed-out pulls and
  // notifies watchers of progress. Call every ~100 ms.
  void Tick();

  absl::Duration lease_timeout() const { return options_.lease_timeout; }

  // Reads every job back from options.state_dir (creating the directory if
  // it is missing) and locks the directory for this coordinator: a second
  // server on it gets kFailedPrecondition. Call once, before serving.
  // kDataLoss names a file that cannot be read; nothing is half-restored
  // then.
  absl::Status Restore();
  // Writes the jobs that changed (all of them with `force`) to
  // options.state_dir; a no-op without one. Tick calls it; call it with
  // `force` at shutdown. Errors name the file; the jobs go on in memory.
  absl::Status Checkpoint(bool force);

 private:
  struct JobEntry {
    v1::Job proto;
    JobSpec spec;
    Schedule schedule;  // fixed at submission, from the spec alone
    std::shared_ptr<ParameterShard> shard;
    std::vector<std::string> slots;  // worker id per rank; "" = vacant
    // Workers that said they cannot train this job (another dataset): they
    // are never given it again.
    std::set<std::string> barred;
    int64_t notified_version = -1;
    // What the last checkpoint holds: state, shard version, and when.
    v1::JobState saved_state = v1::JOB_STATE_UNSPECIFIED;
    int64_t saved_version = -1;
    absl::Time saved_at = absl::InfinitePast();
  };
  struct WorkerEntry {
    std::string name, devices, address;
    int64_t incarnation = 0;
    absl::Time lease_expiry;
    std::string job_id;  // "" = idle
    int rank = -1;
  };
  using Notes = std::vector<std::function<void()>>;

  v1::Job Render(const JobEntry& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job, if it exists and has started (has a shard): kNotFound or
  // kFailedPrecondition otherwise.
  absl::StatusOr<const JobEntry*> StartedJobLocked(
      const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleLocked(Notes* notes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One checkpoint file as a job, checked; kDataLoss naming the file.
  absl::StatusOr<JobEntry> LoadJob(const std::string& path) const;
  void AssignLocked(JobEntry& job, int rank, const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked(JobEntry& job, v1::JobState state,
                    const std::string& message, Notes* notes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropWorkerLocked(const std::string& worker_id, Notes* notes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a worker off its job's slot (the shard forgets it outside the
  // lock, through `notes`); the worker stays registered and idle.
  void VacateLocked(JobEntry& job, const std::string& worker_id, Notes* notes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyLocked(const std::string& job_id, Notes* notes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time Now() const { return options_.clock->Now(); }

  CoordinatorOptions options_;
  RealClock real_clock_;

  absl::Mutex checkpoint_mu_;  // serialises Checkpoint calls (taken first)
  int lock_fd_ = -1;           // flock on <state_dir>/LOCK, after Restore
  mutable absl::Mutex mu_;
  int64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_worker_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_incarnation_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_subscription_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::string, JobEntry> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> job_order_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, WorkerEntry> workers_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::pair<std::string, std::function<void()>>> subscribers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tally

#endif  // TALLY_SERVER_COORDINATOR_H_
