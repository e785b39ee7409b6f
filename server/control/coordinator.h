// The coordinator: the control plane. It keeps job records and their
// lifecycle, registers workers and parameter shards and holds their leases,
// assigns workers to jobs, places each job's parameters on shards (the
// versioned shard map), and decides every job's membership, so that all of
// a job's shards close each step with the same workers. Shards and workers
// follow; the data (gradients, weights) never passes through here except
// for checkpoints and fetches.
//
// Lifecycle: PENDING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED. The
// job's schedule (steps per epoch, total steps) is fixed at submission from
// the spec; workers follow it and one whose dataset disagrees is taken off
// the job (never the job's schedule changed). A job starts when
// `training.workers` workers are idle and enough shards are live (jobs
// start in submission order); its vector is split over shards
// (server/control/partition.h) and each range installed. A slot vacated by a
// worker whose lease expired is refilled by the next idle worker, which joins
// at the next step. Training ends when the weights reach the schedule's last
// version; the job succeeds once a worker has reported the test accuracy of
// the final weights, which the coordinator then keeps (for fetching) while
// the shards drop the job: once every other member has reported too (each
// may still be pulling the final weights), or final_pull_grace later.
//
// Membership. The coordinator's word on who belongs to which steps reaches
// every range of the job through ShardControl: it holds every range (no
// step closes), reads each one's version and every member's progress, and
// then sets, on every range, each member's [join_step, leave_step): a new
// worker joins at the highest version any range has; a leaving one belongs
// to every step that any range saw it commit. A worker gets its assignment
// only once it is a member on every range.
//
// Lost shards. A shard whose lease expires takes its ranges with it; every
// running job with a range there is placed again, on the live shards, from
// its last checkpoint (or from the start without one), with a new shard-map
// version; every range of the job restarts from that same step, and the
// workers, seeing the new map, pull it and go on: none restarts.
//
// Persistence (options.state_dir, server/control/job_store.h): every job's
// record, and for a running job the whole vector at one version, taken from
// every range at exactly that version (ShardControl::Save).
//
// Control-plane work (installs, membership, retirement) runs after the
// state change that needs it, outside the coordinator's lock, in the
// calling thread, serialised, each call to a shard bounded; what fails is
// tried again at the next Tick.
//
// Parts. The coordinator holds the locks, the order of operations and the
// protocol above, and owns its parts, each not thread-safe and guarded by
// one of its locks: JobQueue (the jobs and their queue, job_queue.h),
// Registry (workers, shards and their leases, registry.h), Planner (slots,
// placement, plans and membership decisions, planner.h), Reconciler (the
// control round's calls to shards, reconciler.h) and JobArchive
// (persistence, job_archive.h). What a client sees of a job is rendered by
// job_render.h, and its weights file made by job_export.h.
//
// Thread-safe. Subscriber callbacks run without the coordinator's lock.
// Errors carry an ErrorReason (proto/errors.h) wherever a caller must tell
// situations apart; proto/tally.proto lists them per RPC.
#ifndef TALLY_SERVER_CONTROL_COORDINATOR_H_
#define TALLY_SERVER_CONTROL_COORDINATOR_H_

#include <functional>
#include <map>
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
#include "proto/transport.h"
#include "server/control/control_task.h"
#include "server/control/job_archive.h"
#include "server/control/job_entry.h"
#include "server/control/job_queue.h"
#include "server/control/planner.h"
#include "server/control/reconciler.h"
#include "server/control/registry.h"
#include "server/control/table_export.h"
#include "server/control/weight_offers.h"
#include "server/shard_control.h"

namespace tally {

struct CoordinatorOptions {
  absl::Duration lease_timeout = absl::Seconds(3);
  const Clock* clock = nullptr;  // borrowed; null = real time
  // Where jobs are kept across restarts; empty: in memory only.
  std::string state_dir;
  // How often a training job's weights are written (its state changes are
  // written at the next Checkpoint).
  absl::Duration checkpoint_interval = absl::Seconds(30);
  // How long a succeeded job's ranges keep serving its final weights to
  // members that have not reported yet (each report shortens it; a member
  // that died never reports).
  absl::Duration final_pull_grace = absl::Seconds(10);
  // How long a Python model's lowest rank may take to build the module and
  // send its initial weights (HeartbeatResponse.initial_weights) before the
  // job fails, saying so.
  absl::Duration initial_weights_timeout = absl::Minutes(10);
  // The bytes of initial weights being read at once, all offers together
  // (server/control/weight_offers.h; one offer alone may be larger).
  int64_t max_offer_bytes = int64_t{1} << 30;
  // This process's own parameter shard ("shard-0"; server/data/
  // local_shard_control.h); null: the coordinator holds no parameters and
  // jobs wait for shard processes.
  std::shared_ptr<ShardControl> local_shard;
  // Where workers reach local_shard, as shard maps name it: "host:port", or
  // ":port" on the host they dial for the coordinator (ResolveShardAddress,
  // proto/transport.h).
  std::string local_shard_address;
  // What a submitted spec may ask for (docs/job-spec.md, "Limits").
  SpecLimits spec_limits;
  // How a registered shard process is reached (a seam for tests).
  std::function<std::unique_ptr<ShardControl>(const std::string& address)>
      connect_shard;
  // How shard processes are dialled (TLS, the coordinator's own token).
  TransportOptions transport;
  // Jobs waiting for workers (PENDING) beyond this: SubmitJob answers
  // kResourceExhausted.
  int64_t max_queued_jobs = 1000;
  // A named submitter's share of them (servers with tokens; without, every
  // caller is the same anonymous submitter and only max_queued_jobs holds):
  // one submitter cannot fill the queue and lock the others out.
  int64_t max_queued_jobs_per_submitter = 100;
  // Registered workers beyond this: RegisterWorker answers
  // kResourceExhausted (a lapsed lease frees its place).
  int64_t max_workers = 4096;
  // Ended jobs kept (in memory and in state_dir) beyond this many, oldest
  // first, and ended longer ago than finished_job_ttl (zero: no age limit),
  // are dropped. With keep_weights_dir, a dropped job's final weights are
  // written there first, as <job id>.safetensors.
  int64_t max_finished_jobs = 1000;
  absl::Duration finished_job_ttl = absl::ZeroDuration();
  std::string keep_weights_dir;
};

// Counters and gauges of the coordinator, for its metrics.
struct CoordinatorStats {
  int64_t workers = 0;       // registered (holding a lease)
  int64_t idle_workers = 0;  // of them, without a job
  int64_t live_shards = 0;
  int64_t lease_expiries = 0;       // workers' and shards', since start
  // Workers and shards whose Attend call ended (a dead process), so their
  // lease.
  int64_t leases_ended = 0;
  int64_t checkpoints_written = 0;  // job files, since start
  double checkpoint_seconds = 0.0;  // spent writing them
  // Running jobs that have a checkpoint: seconds since it was written.
  std::map<std::string, double> checkpoint_age_seconds;
};

struct JobPage {
  std::vector<v1::Job> jobs;
  std::string next_page_token;  // empty: no more
};

class Coordinator {
 public:
  explicit Coordinator(const CoordinatorOptions& options);
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;
  ~Coordinator();

  // Jobs. Submit validates the spec (kInvalidArgument names the field;
  // kResourceExhausted when max_queued_jobs wait already). `owner` is the
  // submitter's name (empty without tokens).
  absl::StatusOr<v1::Job> Submit(const std::string& spec_text,
                                 const std::string& owner = "");
  absl::StatusOr<v1::Job> Get(const std::string& job_id) const;
  // Every job, in submission order; without their specs when asked (what
  // a scrape or the dashboard's list needs).
  std::vector<v1::Job> List(bool with_specs = true) const;
  // A page of jobs in submission order; kInvalidArgument for a page token
  // this coordinator did not give.
  absl::StatusOr<JobPage> ListPage(const JobQuery& query) const;
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id);
  // The job's current weights as a .safetensors file. For a running job,
  // every range at one version (waits for it, bounded). An ended job's
  // tables follow the weights, read from its shards as the file is sent
  // (`tables`, whose bytes complete `head`); a running job's file has
  // none, and says so in its metadata ("tables"). A Python model's
  // buffers come from the report that ended the job, else from its
  // ranges' buffer region; a file without them says why in its metadata
  // ("buffers") and in `buffers_note`.
  struct WeightsExport {
    std::string head;
    std::unique_ptr<TableExport> tables;  // null: none
    std::string buffers_note;             // empty: complete
  };
  absl::StatusOr<WeightsExport> ExportWeights(const std::string& job_id);
  // The same file whole, in memory.
  absl::StatusOr<std::string> WeightsFile(const std::string& job_id);

  // Workers. kFailedPrecondition + PROTOCOL_TOO_OLD for a worker whose
  // protocol_version is below WORKER_PROTOCOL_OLDEST (none sent: 0), which
  // is never registered, so never given a job; kResourceExhausted past
  // max_workers; kInvalidArgument for a name, devices or address longer
  // than 256 bytes.
  absl::StatusOr<v1::RegisterWorkerResponse> Register(
      const v1::RegisterWorkerRequest& req);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& req);
  // kFailedPrecondition + REGISTER_AGAIN unless (id, incarnation) is a
  // live registration of a worker or a shard (an Attend call's first
  // check).
  absl::Status CheckLease(const std::string& id, int64_t incarnation);
  // A worker's or a shard's Attend call ended (its process died, or it let
  // go): its lease ends now, and the next tick drops it as if it had run
  // out (a shard's jobs are placed again). A stale registration, and the
  // coordinator's own shard, are ignored.
  void Gone(const std::string& id, int64_t incarnation);
  absl::Status ReportResult(const v1::ReportResultRequest& req);
  // A Python model's initial weights from the worker asked for them
  // (HeartbeatResponse.initial_weights: the job's lowest rank), in two calls
  // around the transfer, each checking the worker and the job:
  // kFailedPrecondition + REGISTER_AGAIN, NOT_A_MEMBER (not the worker
  // asked) or JOB_ENDED; kAlreadyExists + WEIGHTS_GIVEN once the job has
  // its weights; kNotFound, kInvalidArgument (not a Python model's).
  // BeginInitialWeights lets the offer in (WeightOffers: one a job, within
  // max_offer_bytes; else kResourceExhausted + OFFER_BUSY), which then
  // holds its place until the caller drops it; Offer::values() is how many
  // to read. `end` is called once, without the coordinator's lock, if the
  // job ends (JOB_ENDED) or the worker leaves it (NOT_A_MEMBER) first.
  absl::StatusOr<std::unique_ptr<WeightOffers::Offer>> BeginInitialWeights(
      const std::string& job_id, const std::string& worker_id,
      int64_t incarnation, std::function<void(absl::Status)> end);
  // Installs `weights` (num_params, finite) as the job's step 0.
  absl::Status SetInitialWeights(const std::string& job_id,
                                 const std::string& worker_id,
                                 int64_t incarnation,
                                 std::vector<float> weights);
  // The offers of initial weights being read now.
  const WeightOffers& offers() const { return offers_; }

  // Shards.
  v1::RegisterShardResponse RegisterShard(const v1::RegisterShardRequest& req);
  absl::StatusOr<v1::ShardHeartbeatResponse> ShardHeartbeat(
      const v1::ShardHeartbeatRequest& req);
  std::vector<v1::ShardInfo> ListShards() const;
  CoordinatorStats Stats() const;
  // A job's curves and events; kNotFound for an unknown job.
  absl::StatusOr<v1::JobHistory> History(const std::string& job_id) const;
  // The workers on a job now, by rank; kNotFound for an unknown job.
  absl::StatusOr<std::vector<v1::JobWorker>> JobWorkers(
      const std::string& job_id) const;

  // Calls `on_change` after every change of the job (state, a closed step);
  // returns an id for Unsubscribe. kNotFound for an unknown job.
  absl::StatusOr<int64_t> Subscribe(const std::string& job_id,
                                    std::function<void()> on_change);
  void Unsubscribe(int64_t id);

  // Periodic work: expires leases, schedules, places jobs of lost shards,
  // retries pending control work and notifies watchers of progress. Call
  // every ~100 ms.
  void Tick();

  absl::Duration lease_timeout() const { return options_.lease_timeout; }

  // Reads every job back from options.state_dir (creating the directory if
  // it is missing) and locks the directory for this coordinator: a second
  // server on it gets kFailedPrecondition. Call once, before serving.
  // kDataLoss names a file that cannot be read; nothing is half-restored
  // then.
  absl::Status Restore();
  // Writes the jobs that changed (all of them with `force`) to
  // options.state_dir; a no-op without one. Call it periodically from one
  // thread, and with `force` at shutdown. Errors name the file; the jobs go
  // on in memory.
  absl::Status Checkpoint(bool force);

  // Drops ended jobs past max_finished_jobs or finished_job_ttl (Tick calls
  // it; skipped while a checkpoint is being written); returns how many.
  int DropOldJobs();

 private:
  using Notes = std::vector<std::function<void()>>;

  absl::Time Now() const { return options_.clock->Now(); }
  // Gives idle workers to jobs (Planner::ScheduleJobs); their watchers
  // hear.
  void ScheduleLocked(Notes* notes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job ends in `state`: the figures as they stand are kept with its
  // record, its workers go idle, its ranges are retired by the next
  // control round (a success's after final_pull_grace at most), and an
  // offer of its initial weights being read ends.
  void FinishLocked(JobEntry& job, v1::JobState state,
                    const std::string& message, Notes* notes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a worker off its job's slot; the worker stays registered, idle.
  void VacateLocked(JobEntry& job, const std::string& worker_id, Notes* notes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyLocked(const std::string& job_id, Notes* notes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tick's first phase. Expires leases; a lost shard's jobs lose their
  // ranges (returned: their checkpoints are read next, without the lock).
  std::vector<std::string> ExpireLocked(Notes* notes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Control-plane work for every job that needs it (Reconciler): taken
  // under mu_, done without it, applied under mu_ again.
  void RunControl() ABSL_LOCKS_EXCLUDED(mu_);
  // What a control task did, into its job (unless the job was placed
  // again since); whether another round is worth it.
  bool ApplyTaskLocked(ControlTask& task, Notes* notes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `notes`, then the control work they may have made due.
  void Settle(Notes& notes) ABSL_LOCKS_EXCLUDED(mu_);

  CoordinatorOptions options_;
  RealClock real_clock_;
  // Initial weights being read; let in under mu_, ended by Notes.
  WeightOffers offers_;
  // The jobs in state_dir (job_archive.h says which calls need which
  // lock).
  JobArchive archive_;

  // Serialises Checkpoint calls and DropOldJobs (taken first).
  absl::Mutex checkpoint_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex control_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // serialises RunControl
  Reconciler reconciler_ ABSL_GUARDED_BY(control_mu_);
  mutable absl::Mutex mu_;
  JobQueue jobs_ ABSL_GUARDED_BY(mu_);
  Registry registry_ ABSL_GUARDED_BY(mu_);
  Planner planner_ ABSL_GUARDED_BY(mu_);  // borrows jobs_ and registry_
  int64_t checkpoints_written_ ABSL_GUARDED_BY(mu_) = 0;
  double checkpoint_seconds_ ABSL_GUARDED_BY(mu_) = 0.0;
  int64_t next_subscription_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, std::pair<std::string, std::function<void()>>> subscribers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_COORDINATOR_H_
