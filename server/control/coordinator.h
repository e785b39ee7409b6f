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
// Thread-safe. Subscriber callbacks run without the coordinator's lock.
// Errors carry an ErrorReason (proto/errors.h) wherever a caller must tell
// situations apart; proto/tally.proto lists them per RPC.
#ifndef TALLY_SERVER_CONTROL_COORDINATOR_H_
#define TALLY_SERVER_CONTROL_COORDINATOR_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
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
#include "server/control/job_store.h"
#include "server/control/leases.h"
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
  int64_t checkpoints_written = 0;  // job files, since start
  double checkpoint_seconds = 0.0;  // spent writing them
  // Running jobs that have a checkpoint: seconds since it was written.
  std::map<std::string, double> checkpoint_age_seconds;
};

struct JobQuery {
  int page_size = 100;     // 0 or less: 100
  std::string page_token;  // empty: from the first job
  bool omit_spec = false;
  std::string owner;  // non-empty: only this submitter's jobs
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
  struct Placement {
    std::string shard_id;
    int64_t offset = 0;
    int64_t count = 0;
  };
  struct JobEntry {
    v1::Job proto;
    JobSpec spec;
    Schedule schedule;               // fixed at submission, from the spec alone
    std::vector<std::string> slots;  // worker id per rank; "" = vacant
    // Workers that said they cannot train this job (another dataset): they
    // are never given it again.
    std::set<std::string> barred;
    // "worker@map" of failures reported from placements the job has left
    // (noted once each; map versions below the job's own, so bounded).
    std::set<std::string> stale_reports;
    // The data plane: the shard map (ranges in order) and its version.
    int64_t map_version = 0;
    std::vector<Placement> ranges;
    bool installed = false;  // every range installed at map_version
    // The membership every range has (set after a hold of every range).
    std::vector<MemberSpec> members;
    // What the ranges start from when (re)installed: a checkpoint's state;
    // null: the spec's initial weights.
    std::shared_ptr<const StoredJob> start;
    // A Python model without weights yet: whom the coordinator asked for
    // them, and since when.
    std::string weights_asked_of;
    absl::Time weights_asked_at;
    // After the end: the final weights, kept here; the shards drop the job.
    std::shared_ptr<const std::vector<float>> final_weights;
    // A job with tables: the shard of each slot when it ended, which keeps
    // the tables (ShardHost::ReadTable); empty when one was away.
    std::vector<std::shared_ptr<ShardControl>> table_homes;
    // Their addresses, kept with the job (JobCheckpoint.table_homes): a
    // restarted coordinator finds the shards by them.
    std::vector<std::string> table_home_addresses;
    // A Python model's buffers: from the report that ended the job, or
    // (no report: it failed or was cancelled) its retired ranges' region.
    std::string final_buffers;
    bool retired = false;  // the ranges were retired (and dropped)
    // After a success: the members that have not reported yet, for whom the
    // ranges keep serving the final weights until retire_after.
    std::set<std::string> awaiting_reports;
    absl::Time retire_after = absl::InfinitePast();
    // A shard of the job was lost: its checkpoint is being read; it is
    // placed again once `start` is set.
    bool awaiting_start = false;
    // What the job waits for now (a restart, a lost shard), shown before
    // its message until its ranges are installed again; the events keep
    // the history.
    std::string condition;
    // The highest plan number sent to any range (Schedule.plan): a new
    // plan is numbered past it, even when a round that sent one failed.
    int64_t plan_sent = 0;
    // A worker could not join: no epoch is left, and none will be.
    bool grown_out = false;
    bool dirty = true;       // control-plane work pending
    int64_t generation = 0;  // bumped with every change that needs work
    // Leave steps decided and sent to some range: never decided again
    // (a range that took one may already have closed that step).
    // (leave step, whether its last commit said "nothing").
    std::map<std::pair<std::string, int64_t>, std::pair<int64_t, bool>> leaves;
    int64_t notified_version = -1;
    // When the weights last moved (Tick), for the stall report; and when
    // watchers were last told about a stall.
    absl::Time moved_at = absl::InfinitePast();
    absl::Time stall_noted = absl::InfinitePast();
    // What the last checkpoint holds: state, version, and when.
    v1::JobState saved_state = v1::JOB_STATE_UNSPECIFIED;
    int64_t saved_version = -1;
    absl::Time saved_at = absl::InfinitePast();
    // The dashboard's curves and events (v1::JobHistory says the bounds).
    v1::JobHistory history;
    absl::Time last_point = absl::InfinitePast();
    absl::Duration point_every = absl::Milliseconds(500);
  };
  struct WorkerEntry {
    std::string name, devices, address;
    std::string python;       // the Python runtime it offers; "": none
    int64_t incarnation = 0;  // its lease's (leases_)
    std::string job_id;       // "" = idle
    int rank = -1;
    // Its step times on job_id, as its heartbeats say (v1::WorkerProgress).
    double compute_seconds = 0, wait_seconds = 0, push_seconds = 0,
           loader_seconds = 0;
  };
  // An ended job's table homes: as it ended, or after a restart the live
  // shards at its addresses (*map_version then 0); empty, with *away
  // naming the shard, when one is not here.
  std::vector<std::shared_ptr<ShardControl>> TableHomesLocked(
      const JobEntry& job, int64_t* map_version, std::string* away) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The export of an ended job's tables from their homes, or null with
  // *note saying why the file has none.
  std::unique_ptr<TableExport> TablesLocked(const std::string& job_id,
                                            const JobEntry& job,
                                            std::string* note) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct ShardEntry {
    std::string address;      // "" for the coordinator's own
    int64_t incarnation = 0;  // its lease's (leases_)
    absl::Time last_seen;
    bool live = true;
    std::shared_ptr<ShardControl> control;
    std::vector<v1::RangeStatus> ranges;  // last reported (remote shards)
  };
  using Notes = std::vector<std::function<void()>>;

  v1::Job Render(const JobEntry& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (10 s at most) until an ended job with tables has retired its
  // ranges: ExportWeights' file then has the tables.
  void AwaitRetiredLocked(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AnyPythonWorkerLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Heartbeat's answer of the worker's assignment, if it is a member.
  void AssignmentLocked(const v1::HeartbeatRequest& req, const WorkerEntry& w,
                        const JobEntry& job, v1::HeartbeatResponse* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReportResult's success: the job ends with the report's figures.
  absl::Status SucceedLocked(JobEntry& job, const v1::ReportResultRequest& req,
                             Notes* notes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `worker_id` is to build `job`'s initial weights (its lowest
  // rank, the job without them); notes when it was first asked.
  bool AskForWeightsLocked(JobEntry& job, const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails the Python jobs whose asked worker has not sent their initial
  // weights within initial_weights_timeout.
  void ExpireInitialWeightsLocked(Notes* notes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> CheckOfferLocked(const std::string& job_id,
                                           const std::string& worker_id,
                                           int64_t incarnation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> EligibleLocked(
      const JobEntry& job, const std::vector<std::string>& idle) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A pending job whose slots are filled and ranges placed: RUNNING.
  void StartLocked(JobEntry& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Growth (training.workers: {min, max}): running jobs take idle workers
  // (ScheduleLocked, last); a decided plan becomes the job's.
  void GrowLocked(std::vector<std::string>& idle, Notes* notes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdoptPlanLocked(JobEntry& job, const Schedule& grown)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's schedule into its record (Job.membership, workers_max, plan).
  static void RecordPlan(JobEntry& job);
  // The schedule and slots of a job read back from its record.
  static void RestorePlan(JobEntry& job);
  // Steps between the furthest a worker may have begun and the first it
  // may join at (a step computed beside its pull, and one more).
  static constexpr int64_t kJoinMargin = 2;
  // The worker in the job's lowest occupied rank; "" if none.
  std::string LowestRankLocked(const JobEntry& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every worker's clock, lag and times; the slowest; a stall and whom it
  // waits on (after kStallReport seconds).
  void RenderProgressLocked(const JobEntry& job, int64_t version,
                            const std::vector<v1::RangeStatus>& ranges,
                            v1::JobMetrics* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RenderStallLocked(const JobEntry& job, int64_t version,
                         v1::JobMetrics* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static constexpr double kStallReport = 3.0;
  // Append to the job's history (bounded; a step is on the curve once).
  // Tick adds a point every point_every; the end adds one always.
  void EventLocked(JobEntry& job, std::string text)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CurvePointLocked(JobEntry& job, const v1::JobMetrics& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Jobs PENDING (of `owner` alone when given).
  int64_t QueuedLocked(const std::string* owner = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // kResourceExhausted when the queue, or `owner`'s share of it, is full.
  absl::Status AdmitLocked(const std::string& owner) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live progress of a job's ranges, in map order (empty entries for
  // ranges not reported yet).
  std::vector<v1::RangeStatus> RangeStatusLocked(const JobEntry& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t VersionLocked(const JobEntry& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleLocked(Notes* notes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tick's phases. Expires leases; a lost shard's jobs lose their ranges
  // (returned: their checkpoints are read next, without the lock).
  std::vector<std::string> ExpireLocked(Notes* notes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A lost shard's job starts again from `start` (null: the beginning).
  void RestartLocked(JobEntry& job, std::shared_ptr<const StoredJob> start)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteProgressLocked(Notes* notes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Splits the job over live shards (a new map version); false when too
  // few are live.
  bool PlaceLocked(JobEntry& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AssignLocked(JobEntry& job, int rank, const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked(JobEntry& job, v1::JobState state,
                    const std::string& message, Notes* notes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropWorkerLocked(const std::string& worker_id, Notes* notes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a worker off its job's slot; the worker stays registered, idle.
  void VacateLocked(JobEntry& job, const std::string& worker_id, Notes* notes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyLocked(const std::string& job_id, Notes* notes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JobEntry FromStored(StoredJob stored) const;
  // DropOldJobs' phases: which ended jobs go (under mu_), then their
  // weights and files (without it).
  struct DroppedJob;
  std::vector<DroppedJob> TakeDroppableLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetDropped(const DroppedJob& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(checkpoint_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // Checkpoint's phases: which jobs are due (under mu_), then each one's
  // file (without it).
  struct CheckpointDue;
  std::vector<CheckpointDue> DueLocked(bool force)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteCheckpoint(CheckpointDue& due)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(checkpoint_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // The job needs control-plane work (RunControl).
  static void MarkDirty(JobEntry& job) {
    job.dirty = true;
    ++job.generation;
  }

  // Control-plane work for every job that needs it, outside mu_.
  void RunControl() ABSL_LOCKS_EXCLUDED(mu_);
  struct ControlTask;
  // RunControl's phases: the jobs' pending work taken under mu_, done
  // without it (Reconcile), and what it did applied under mu_ again.
  std::vector<ControlTask> TakeTasksLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ApplyTaskLocked(ControlTask& task, Notes* notes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reconcile's phases: the end (retire, keep the final weights, drop),
  // the install, the membership.
  void Reconcile(ControlTask& task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(control_mu_);
  void RetireRanges(ControlTask& task)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(control_mu_);
  void InstallRanges(ControlTask& task)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(control_mu_);
  void SetMembership(ControlTask& task)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(control_mu_);
  static std::vector<MemberSpec> DecideMembers(
      ControlTask& task, const std::vector<MemberSpec>& active,
      const std::vector<HoldReport>& reports);
  // The first epoch a worker may join at: no earlier than the last world
  // decided, starting at or past `bound`, before the end and max_steps;
  // -1 when there is none.
  static int64_t JoinEpoch(const Schedule& s, int64_t bound,
                           int64_t max_steps);
  // The furthest clock the held ranges saw a member at (async), ignoring
  // values past the schedule's end.
  static int64_t MaxClock(const std::vector<HoldReport>& reports,
                          int64_t total_steps);
  // DecideMembers' joiners past the world: their epoch and the new plan.
  static void Grow(ControlTask& task, int64_t vmax,
                   const std::vector<HoldReport>& reports,
                   std::vector<MemberSpec>& growing,
                   std::vector<MemberSpec>* next);
  // Runs `notes`, then the control work they may have made due.
  void Settle(Notes& notes) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Time Now() const { return options_.clock->Now(); }

  CoordinatorOptions options_;
  // In every worker and shard id ("worker-k3x9a2-1"): ids never repeat
  // across the coordinator's lifetimes.
  const std::string lifetime_;
  RealClock real_clock_;
  std::unique_ptr<JobStore> store_;  // with a state_dir, after Restore
  // Initial weights being read; let in under mu_, ended by Notes.
  WeightOffers offers_;

  // Serialises Checkpoint calls and DropOldJobs (taken first).
  absl::Mutex checkpoint_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex control_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // serialises RunControl
  mutable absl::Mutex mu_;
  int64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t lease_expiries_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t checkpoints_written_ ABSL_GUARDED_BY(mu_) = 0;
  double checkpoint_seconds_ ABSL_GUARDED_BY(mu_) = 0.0;
  int64_t next_worker_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_shard_ ABSL_GUARDED_BY(mu_) = 1;
  // Workers' and shard processes' registrations.
  Leases leases_ ABSL_GUARDED_BY(mu_);
  int64_t next_subscription_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_hold_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::string, JobEntry> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> job_order_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, WorkerEntry> workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ShardEntry> shards_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::pair<std::string, std::function<void()>>> subscribers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_COORDINATOR_H_
