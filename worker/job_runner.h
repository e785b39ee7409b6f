// One assigned job, run to its end by a worker daemon: the training loop
// as a class, its state in members.
//
//   Prepare   parse the spec, check the dataset against the job's schedule
//             (a worker that sees another dataset refuses the job with
//             SCHEDULE_MISMATCH, and the coordinator gives it to others),
//             build the engine and the parameter client for the shard map;
//   loop      pull the weights for step t from every shard (a version
//             the job's consistency rule allows: bsp t, ssp(s) t - s or
//             later, async any) -> the batch of step t from this rank's
//             data shard -> engine step -> push step t to every shard ->
//             decide the next step from the answers; the next pull then
//             tells every shard the push reached them all (the commit,
//             without which no shard counts it);
//   Finish    evaluate the final weights on the test set and report.
//
// What the worker does after each answer is decided by the status code and
// its ErrorReason (proto/tally.proto lists them), never by a message.
//
// Not thread-safe: Run is called once, from one thread. A JobRunner owns its
// engine, loader and parameter client; work in flight is cancelled and
// waited for before they go.
#ifndef TALLY_WORKER_JOB_RUNNER_H_
#define TALLY_WORKER_JOB_RUNNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/data/dataset.h"
#include "common/spec/job_spec.h"
#include "proto/tally.grpc.pb.h"
#include "worker/batch_loader.h"
#include "worker/daemon.h"
#include "worker/engine.h"
#include "worker/param_client.h"
#include "worker/row_client.h"

namespace tally {

// A job's step times on this worker, for the coordinator's straggler report
// (heartbeats carry them; the clocks come from the shards): means over its
// recent steps.
struct JobProgress {
  std::string job_id;
  double compute_seconds = 0, wait_seconds = 0, push_seconds = 0;
  double loader_seconds = 0;  // waiting for the loader's batch
};

// What the daemon lends a job.
struct JobContext {
  std::string worker_id;
  int64_t incarnation = 0;
  // Who its pushes and pulls say they are: the worker itself, or with
  // training.ranks the member of its rank (Assignment.HeldRank.member);
  // empty: the worker.
  std::string member_id;
  // Whether it evaluates the final weights and reports the result, asked
  // at the end: with training.ranks only the runner of the lowest rank the
  // worker holds then does. Null: it does.
  std::function<bool()> reports;
  std::string coordinator;            // address, for shards without one
  v1::WorkerService::Stub* workers;   // borrowed: ReportResult
  // The dataset a spec names (the daemon keeps the last one across jobs).
  std::function<absl::StatusOr<const TrainTest*>(const JobSpec&)> data;
  // False once the job was taken from this worker, or the daemon stops.
  std::function<bool()> still_assigned;
  // The job's assignment as the coordinator's last heartbeat answer gave
  // it (a grown job's new plan comes this way); none once not assigned.
  std::function<std::optional<v1::Assignment>()> assignment;
  // Sleeps, returning early when the daemon stops.
  std::function<void(absl::Duration)> sleep;
  std::function<void(const std::string&)> log;
  // Publishes the job's progress (read by the heartbeat thread).
  std::function<void(const JobProgress&)> progress;
};

class JobRunner {
 public:
  JobRunner(const v1::Assignment& assignment, const DaemonOptions& options,
            JobContext context);
  JobRunner(const JobRunner&) = delete;
  JobRunner& operator=(const JobRunner&) = delete;
  ~JobRunner();

  // Trains to the end and reports the result. OK once reported; otherwise
  // why the job stopped here (it was taken away, it ended, it failed).
  absl::Status Run();

 private:
  // The runner is a state machine. Run calls the current state's method,
  // which does that state's work and returns the next state: the one place
  // each transition is decided. What a state works on (the step, its
  // figures, the pulls in flight) is in the members below.
  //
  //   kNextStep ---> kOverlapped (bsp on one shard: the step's pull went
  //      |              |          with the last push)
  //      v              | its pull failed or brought another version
  //   kPull <-----------+
  //      |  the final version ---------------------------> kFinish
  //      v
  //   kCompute ---> kPush <---> kRepush (the same push again)
  //                   |
  //                   +--> kNextStep
  // Any state may go to kStopped (stop_status_: why).
  enum class State {
    kNextStep,    // decide how step next_ starts
    kOverlapped,  // compute next_ while its weights arrive
    kPull,        // pull weights for next_, carrying the pending commit
    kCompute,     // compute step_ from the pulled weights
    kPush,        // push step_ and read the shards' answers
    kRepush,      // the same push again (a shard did not take it)
    kFinish,      // evaluate the final weights and report
    kStopped,
  };
  State Enter(State s);  // runs the state; returns the next
  State NextStep();
  State Overlapped();
  State Pull();
  State PushAgain(const absl::Status& why);
  // PLAN_CHANGED: takes plan `plan` (or a later one) from the daemon's
  // assignment, then pulls again.
  State NewPlan(int64_t plan);
  State ComputeStep();
  // A row call of `step` failed (work.rows_failed): the step again from a
  // pull, a later one, the new plan, or stop, as the answer says.
  State RowsFailed(int64_t step, const absl::Status& s);
  State Push();
  State Stop(absl::Status why);

  absl::Status Prepare();
  // The job's schedule against this worker's data (SCHEDULE_MISMATCH).
  absl::Status CheckSchedule();
  absl::Status MakeClient();
  // Pulls the weights of version >= next_, carrying the pending commit (or
  // waits for the pull sent with the last push).
  absl::StatusOr<int64_t> PullNext();
  // Starts the pull for a worker about to compute step `clock`.
  std::shared_ptr<Work> StartPull(int64_t clock);
  // Cancels a pull that is no longer wanted and waits until it lets go of
  // the parameters.
  void Abandon(const std::shared_ptr<Work>& pull);

  // One step's forward and backward, with what overlaps it.
  struct StepWork {
    Work* pull = nullptr;  // borrowed: this step's weights, still arriving
    absl::Time pull_deadline;
    std::unique_ptr<PushFeed> feed;  // the push beside the backward pass
    std::shared_ptr<Work> push;
    absl::Duration blocked;    // waiting for weights
    bool pull_failed = false;  // the pull failed or brought another version
    // A row call (PullRows, PushRows) failed with an answer that is not
    // the job's failure (Call::kRows): RowsFailed decides what follows.
    bool rows_failed = false;
  };
  // Forward and backward of step `step` on this rank's batch (an empty
  // contribution where this rank has no batch at that step). With
  // options_.overlap_push the push of the step starts inside: each layer's
  // gradient goes as backward produces it (started_push_). With work.pull
  // each layer waits for its weights; a step whose pull fails or brings
  // another version fails with work.pull_failed set (nothing refused), and
  // one whose row call failed with work.rows_failed set (nothing refused)
  // unless the answer was a refusal of the rows themselves.
  absl::StatusOr<StepStats> Compute(int64_t step, StepWork& work);
  // The loader at `step`'s batch (a new one after a jump, or in a new
  // world); `place` is the step's (Schedule::Locate).
  void SeekLoader(int64_t step, const Schedule::Place& place);
  // The batches this rank has in an epoch of `world` workers (none when
  // the rank is past it: it joins in a later epoch).
  int64_t RankBatches(int world) const;
  StepHooks HooksFor(int64_t step, StepWork& work);
  void CountStep(const absl::StatusOr<StepStats>& stats, const StepWork& work,
                 absl::Duration computing);
  // A step's wait for its batch; what the loader read since the last.
  void CountLoader(absl::Duration waited);
  // Whether the next step can start while its weights arrive (bsp on one
  // shard, the pull sent with the last push, options_.overlap_pull).
  bool CanOverlapPull() const;
  // What the push of `step` says besides its gradient (a Python model's
  // buffers, read from the engine into pushed_buffers_, when it has some
  // and the step had a batch).
  PushInfo MakePushInfo(int64_t step, const StepStats& stats);

  // How the shards answered a push.
  struct PushAnswers {
    bool settled = false;     // every shard took it or refused its content
    bool contributed = true;  // no shard refused its content
    bool retry = false;       // send it again
    absl::Status refusal;     // a shard's refusal of its content
    absl::Status other;       // the first other failure
    absl::Status leave;       // not ours any more (JOB_ENDED, ...)
  };
  PushAnswers ReadAnswers(int64_t step, Work& push);
  // After the step's push: sets next_ and the pending commit, or says the
  // push is to go again (kRepush), or stops.
  State Advance(int64_t step, const PushAnswers& answers);
  // The step is pushed and settled: progress, the log.
  void StepDone(int64_t step, const StepStats& stats);
  absl::Status Finish(int64_t version);
  // Tells the coordinator this worker cannot run the job, and why.
  absl::Status Refuse(const absl::Status& why);
  void Backoff();
  // A replicated range's backup took over from its lost primary: the job
  // keeps its placement (map version) and this runner its step, and the
  // assignment brings the range's new address. The client is made again
  // for it, so the push or pull being retried goes there.
  void FollowShardMap();
  static void Smooth(double* mean, double sample);

  // As assigned; replaced by a later plan's (NewPlan).
  v1::Assignment assignment_;
  const DaemonOptions& options_;  // borrowed from the daemon
  JobContext context_;

  JobSpec spec_;
  const TrainTest* data_ = nullptr;  // borrowed from the daemon's cache
  int64_t loader_bytes_seen_ = 0, loader_substituted_seen_ = 0;
  // The job's schedule: its worlds (one, unless the job grew) and plan.
  Schedule schedule_;
  std::unique_ptr<ModelEngine> engine_;
  std::unique_ptr<ParameterClient> client_;
  // The job's tables (model.embeddings), which the engine reaches.
  std::unique_ptr<RowClient> rows_;
  std::unique_ptr<BatchLoader> loader_;
  int64_t loader_next_ = -1;  // the step the loader's next batch is for
  int64_t loader_end_ = 0;    // the first step of the next world
  // bsp on one shard (fixed by Prepare): each push is its own commit, and
  // the pull of the next version goes with it instead of after its answer.
  bool pipelined_ = false;

  // The worker's clock: the step it computes next (bsp: the version it
  // pulls; the consistency rule says which versions it may start from).
  int64_t next_ = 0;
  int64_t end_version_ = 0;  // the schedule's last version
  bool clock_set_ = false;   // next_ was set from the first pull
  // The step being computed and pushed, and its figures.
  int64_t step_ = 0;
  StepStats stats_;
  int64_t final_version_ = 0;  // kFinish: the version pulled
  absl::Status stop_status_;   // kStopped: why
  int64_t refused_step_ = -1;  // a shard refused this step's push
  JobProgress progress_;
  // The version the last pull got (the oldest of its shards'): the base
  // of the next push.
  int64_t base_ = 0;
  // Sent with pulls until one reaches every shard: the last push that all
  // shards answered.
  std::optional<v1::StepCommit> commit_;
  std::shared_ptr<Work> next_pull_;  // pipelined: the pull sent with a push
  // The push that Compute started beside the backward pass, whole once
  // Compute returned OK; Push waits for it.
  std::shared_ptr<Work> started_push_;
  // The step last pushed and its figures while the engine still holds its
  // gradient (no step begun since): a shard that lost that push
  // (PUSH_AGAIN) gets it again as it was, so a commit other shards kept
  // stays true.
  struct HeldPush {
    int64_t step = 0;
    StepStats stats;
  };
  std::optional<HeldPush> held_;
  // A Python model with buffers (DDP's broadcast_buffers): each pull
  // brings the job's buffer region into a string of its own (empty while
  // the region is), pulled_buffers_ the last one started (the pull a step
  // uses), loaded before the step's forward pass; each push carries the
  // engine's buffers after it.
  bool buffers_on_ = false;
  std::shared_ptr<std::string> pulled_buffers_;
  std::string pushed_buffers_;
  absl::Duration backoff_ = options_.min_backoff;
  absl::Time last_log_ = absl::Now();
};

}  // namespace tally

#endif  // TALLY_WORKER_JOB_RUNNER_H_
