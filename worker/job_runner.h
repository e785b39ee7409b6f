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

namespace tally {

// A job's step times on this worker, for the coordinator's straggler report
// (heartbeats carry them; the clocks come from the shards): means over its
// recent steps.
struct JobProgress {
  std::string job_id;
  double compute_seconds = 0, wait_seconds = 0, push_seconds = 0;
};

// What the daemon lends a job.
struct JobContext {
  std::string worker_id;
  int64_t incarnation = 0;
  std::string coordinator;            // address, for shards without one
  v1::WorkerService::Stub* workers;   // borrowed: ReportResult
  // The dataset a spec names (the daemon keeps the last one across jobs).
  std::function<absl::StatusOr<const TrainTest*>(const JobSpec&)> data;
  // False once the job was taken from this worker, or the daemon stops.
  std::function<bool()> still_assigned;
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
  absl::Status Prepare();
  // Pulls the weights of version >= next_, carrying the pending commit (or
  // waits for the pull sent with the last push).
  absl::StatusOr<int64_t> PullNext();
  // Starts the pull for a worker about to compute step `clock`.
  std::shared_ptr<Work> StartPull(int64_t clock);
  // Cancels a pull that is no longer wanted and waits until it lets go of
  // the parameters.
  void Abandon(const std::shared_ptr<Work>& pull);
  // Forward and backward of step `step` on this rank's batch (an empty
  // contribution where this rank has no batch at that step). With
  // options_.overlap_push the push of the step starts inside: each layer's
  // gradient goes as backward produces it (started_push_).
  // With `pull` (borrowed; the pull of this step's weights, still on its
  // way), each layer waits for its weights; a step whose pull fails or
  // brings another version fails with redo_ set (nothing refused).
  absl::StatusOr<StepStats> Compute(int64_t step, Work* pull = nullptr);
  // Pushes step `step` until its push is settled; progress and the log.
  absl::Status FinishStep(int64_t step, const StepStats& stats);
  // Whether the next step can start while its weights arrive (bsp on one
  // shard, the pull sent with the last push, options_.overlap_pull).
  bool CanOverlapPull() const;
  // What the push of `step` says besides its gradient.
  PushInfo MakePushInfo(int64_t step, const StepStats& stats) const;
  // Pushes step `step` (or waits for the push Compute started); sets next_
  // from the answer, or repush_ when the same push is to go again. An
  // error ends the job here.
  absl::Status PushAndAdvance(int64_t step, const StepStats& stats);
  absl::Status Finish(int64_t version);
  // Tells the coordinator this worker cannot run the job, and why.
  absl::Status Refuse(const absl::Status& why);
  void Backoff();
  static void Smooth(double* mean, double sample);

  const v1::Assignment assignment_;
  const DaemonOptions& options_;  // borrowed from the daemon
  JobContext context_;

  JobSpec spec_;
  const TrainTest* data_ = nullptr;  // borrowed from the daemon's cache
  Schedule schedule_;
  int world_ = 1;
  int64_t rank_batches_ = 0;  // batches this rank has per epoch
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<ParameterClient> client_;
  std::unique_ptr<BatchLoader> loader_;
  int64_t loader_next_ = -1;  // the step the loader's next batch is for

  // The worker's clock: the step it computes next (bsp: the version it
  // pulls; the consistency rule says which versions it may start from).
  int64_t next_ = 0;
  int64_t end_version_ = 0;  // the schedule's last version
  bool clock_set_ = false;   // next_ was set from the first pull
  bool repush_ = false;      // the last push is to be sent again
  bool redo_ = false;        // the step was dropped for its pull
  int64_t refused_step_ = -1;  // a shard refused this step's push
  JobProgress progress_;
  // The version the last pull got (the oldest of its shards'): the base
  // of the next push.
  int64_t base_ = 0;
  // Sent with pulls until one reaches every shard: the last push that all
  // shards answered.
  bool have_commit_ = false;
  v1::StepCommit commit_;
  // bsp on one shard: each push is its own commit, and the pull of the
  // next version goes with it (PushAndAdvance) instead of after its answer.
  bool pipelined_ = false;
  std::shared_ptr<Work> next_pull_;  // that pull, once its push settled
  // The push that Compute started beside the backward pass, whole once
  // Compute returned OK; PushAndAdvance waits for it.
  std::shared_ptr<Work> started_push_;
  // The step last pushed and its figures while the engine still holds its
  // gradient (no step begun since; -1: none): a shard that lost that push
  // (PUSH_AGAIN) gets it again as it was, so a commit other shards kept
  // stays true.
  int64_t held_step_ = -1;
  StepStats held_stats_;
  absl::Duration backoff_ = absl::Milliseconds(100);
  absl::Time last_log_ = absl::Now();
};

}  // namespace tally

#endif  // TALLY_WORKER_JOB_RUNNER_H_
