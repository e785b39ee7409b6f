#include "worker/job_runner.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "proto/errors.h"
#include "proto/schedule.h"
#include "worker/reaction.h"
#include "worker/worker_metrics.h"

namespace tally {

JobRunner::JobRunner(const v1::Assignment& assignment,
                     const DaemonOptions& options, JobContext context)
    : assignment_(assignment), options_(options), context_(std::move(context)) {}

JobRunner::~JobRunner() {
  // A pull sent with the last push may still be writing the parameters.
  if (next_pull_ != nullptr) Abandon(next_pull_);
  if (engine_ != nullptr && rows_ != nullptr) engine_->SetTableRows(nullptr);
}

absl::Status JobRunner::Run() {
  if (absl::Status s = Prepare(); !s.ok()) return Refuse(s);
  State state = State::kNextStep;
  while (state != State::kStopped) state = Enter(state);
  return stop_status_;
}

JobRunner::State JobRunner::Enter(State s) {
  switch (s) {
    case State::kNextStep:
      return NextStep();
    case State::kOverlapped:
      return Overlapped();
    case State::kPull:
      return Pull();
    case State::kCompute:
      return ComputeStep();
    case State::kRepush:
      if (!context_.still_assigned())
        return Stop(absl::AbortedError("no longer assigned to this job"));
      return Push();
    case State::kPush:
      return Push();
    case State::kFinish:
      return Stop(Finish(final_version_));
    case State::kStopped:
      break;
  }
  return State::kStopped;
}

JobRunner::State JobRunner::Stop(absl::Status why) {
  stop_status_ = std::move(why);
  return State::kStopped;
}

JobRunner::State JobRunner::NextStep() {
  if (!context_.still_assigned())
    return Stop(absl::AbortedError("no longer assigned to this job"));
  return CanOverlapPull() ? State::kOverlapped : State::kPull;
}

// The step's weights are on their way (the pull went with the last push):
// its forward pass starts on the first layers while the last still arrive.
JobRunner::State JobRunner::Overlapped() {
  std::shared_ptr<Work> pull = std::move(next_pull_);
  step_ = next_;
  StepWork work;
  work.pull = pull.get();
  absl::StatusOr<StepStats> stats = Compute(step_, work);
  if (stats.ok()) {
    backoff_ = options_.min_backoff;
    stats_ = *stats;
    return State::kPush;
  }
  if (!work.pull_failed) {
    Abandon(pull);  // it may still be writing the parameters
    // A row call's answer decides the step (its pull is not kept: the
    // step starts again from a new one).
    if (work.rows_failed) return RowsFailed(step_, stats.status());
    return Stop(stats.status());
  }
  // The pull failed or brought other weights than this step's (a step
  // closed without us): the step is dropped, and the pull's answer is taken
  // the plain way.
  loader_next_ = -1;  // its batch was taken: the loader starts again
  if (pull->Done()) {
    next_pull_ = std::move(pull);
  } else {
    Abandon(pull);
  }
  return State::kPull;
}

JobRunner::State JobRunner::Pull() {
  absl::StatusOr<int64_t> pulled = PullNext();
  if (!pulled.ok()) {
    const absl::Status& s = pulled.status();
    switch (ReactTo(Call::kPull, s)) {
      case Reaction::kRetryNow:
        return PushAgain(s);
      case Reaction::kLeave:
        return Stop(s);
      case Reaction::kGiveUp:
        // SCHEDULE_MISMATCH, or what should not happen: said to the
        // coordinator, so the slot does not wait for us.
        return Stop(Refuse(s));
      case Reaction::kNewPlan:
        return NewPlan(ReasonStep(s));
      case Reaction::kRetry:
      case Reaction::kStaleMap:
      case Reaction::kNextStep:
      case Reaction::kPullAgain:
      case Reaction::kJoinLater:
      case Reaction::kNotCounted:
      case Reaction::kDone:
        break;
    }
    // Others are slow, a shard is away, or the job is being placed again
    // (a new shard map comes with the assignment): pull again.
    Backoff();
    return State::kNextStep;
  }
  backoff_ = options_.min_backoff;
  const int64_t version = *pulled;
  if (version >= end_version_) {
    final_version_ = version;
    return State::kFinish;
  }
  base_ = version;
  const bool async = spec_.training.consistency.mode == ConsistencyMode::kAsync;
  if (async && !clock_set_) {
    // A runner that starts on a running async job (a new shard map, a
    // replacement worker) goes on about where its rank would be.
    next_ = std::max(next_, schedule_.ClockOfVersion(version));
  }
  clock_set_ = true;
  // bsp and ssp: a step below the weights' version closed without us (we
  // joined late, or were away): go on from the version.
  step_ = async ? next_ : std::max(next_, version);
  return State::kCompute;
}

// PUSH_AGAIN on a pull: a shard's sum lost our push (another push in it
// could not count). Its gradient still the engine's: the same push again
// (a shard that kept it answers "duplicate"), then the pull that commits
// it. Otherwise (a step was begun since: one shard, so no other shard kept
// the commit) the step is done again from its weights.
JobRunner::State JobRunner::PushAgain(const absl::Status& s) {
  const int64_t step = ReasonStep(s);
  context_.log(absl::StrCat("step ", step, ": ", s.message()));
  commit_.reset();
  if (held_.has_value() && held_->step == step) {
    step_ = step;
    stats_ = held_->stats;
    return State::kPush;
  }
  next_ = step;
  loader_next_ = -1;
  return State::kNextStep;
}

JobRunner::State JobRunner::NewPlan(int64_t plan) {
  // The coordinator gives the plan to workers once every shard has it; a
  // heartbeat brings it within a second.
  const absl::Time give_up = absl::Now() + options_.rpc_timeout;
  std::optional<v1::Assignment> a;
  while (true) {
    a = context_.assignment ? context_.assignment() : std::nullopt;
    if (!a.has_value())
      return Stop(absl::AbortedError("no longer assigned to this job"));
    if (a->schedule().plan() >= plan && a->rank() == assignment_.rank()) break;
    if (absl::Now() > give_up) {
      context_.log(absl::StrCat(assignment_.job_id(), ": plan ", plan,
                                " has not come; pulling again"));
      Backoff();
      return State::kNextStep;
    }
    context_.sleep(absl::Milliseconds(50));
  }
  assignment_ = *std::move(a);
  if (absl::Status s = CheckSchedule(); !s.ok()) return Stop(Refuse(s));
  end_version_ = schedule_.total_steps;
  if (next_pull_ != nullptr) Abandon(std::exchange(next_pull_, nullptr));
  if (absl::Status s = MakeClient(); !s.ok()) return Stop(Refuse(s));
  loader_next_ = -1;  // the epochs ahead are split anew
  const WorldPeriod& w = schedule_.worlds.back();
  context_.log(absl::StrCat(assignment_.job_id(), ": plan ", schedule_.plan,
                            ": ", w.world, " workers from epoch ",
                            w.first_epoch, ", ", schedule_.total_steps,
                            " steps in all"));
  return State::kNextStep;
}

JobRunner::State JobRunner::ComputeStep() {
  StepWork work;
  absl::StatusOr<StepStats> stats = Compute(step_, work);
  // (No pull goes with this step, so only its rows can have failed it
  // without a refusal.)
  if (!stats.ok() && (work.rows_failed || work.pull_failed))
    return RowsFailed(step_, stats.status());
  if (!stats.ok()) return Stop(stats.status());
  stats_ = *stats;
  return State::kPush;
}

// A row call of `step` failed (the Python engine keeps its code and
// reason). Nothing of the step was committed (rows go before the dense
// push), so as a dense push's answer would: the step again from a pull (a
// shard away, a stale map, the job rolled back to its checkpoint while we
// computed), from the step the worker joins at, the new plan, or not at
// all (the job is not ours). A runner whose job was placed again ends at
// the next step's check, and the daemon starts one on the new map.
JobRunner::State JobRunner::RowsFailed(int64_t step, const absl::Status& s) {
  context_.log(absl::StrCat("step ", step, ": ", s.message()));
  loader_next_ = -1;  // its batch was taken: the loader starts again
  next_ = step;
  switch (ReactTo(Call::kRows, s)) {
    case Reaction::kLeave:
      return Stop(s);
    case Reaction::kNewPlan:
      return NewPlan(ReasonStep(s));
    case Reaction::kJoinLater:
      next_ = std::max(step, ReasonStep(s));
      break;
    case Reaction::kGiveUp:  // not rows_failed: Compute reports those
    case Reaction::kNotCounted:
      return Stop(s);
    case Reaction::kDone:
    case Reaction::kRetry:
    case Reaction::kStaleMap:
    case Reaction::kRetryNow:
    case Reaction::kNextStep:
    case Reaction::kPullAgain:
      break;
  }
  Backoff();
  return State::kNextStep;
}

// Pushes step_ (or waits for the push Compute started) and reads every
// shard's answer.
JobRunner::State JobRunner::Push() {
  const int64_t step = step_;
  // From the end of the step: a push started beside the backward pass
  // counts only the time the worker waits for it.
  const absl::Time began = absl::Now();
  std::shared_ptr<Work> push =
      started_push_ != nullptr
          ? std::move(started_push_)
          : client_->Push(MakePushInfo(step, stats_), engine_->grads());
  // The weights this push helps make, asked for at once; kept only if the
  // shard committed the push (otherwise the pull that commits it follows).
  std::shared_ptr<Work> pull = pipelined_ ? StartPull(step + 1) : nullptr;
  absl::Status s = push->Wait(absl::Now() + options_.rpc_timeout);
  if (s.ok()) {
    const double seconds = absl::ToDoubleSeconds(absl::Now() - began);
    Smooth(&progress_.push_seconds, seconds);
    if (options_.metrics != nullptr)
      options_.metrics->push_seconds.Observe(seconds);
  }
  if (absl::IsDeadlineExceeded(s) && !push->Done()) {
    push->Cancel();
    push->Wait(absl::Now() + options_.release_wait).IgnoreError();
  }
  if (pull != nullptr) {
    if (push->Committed()) {  // settled, and committed as it was answered
      next_pull_ = std::move(pull);
      next_ = step + 1;
      StepDone(step, stats_);
      return State::kNextStep;
    }
    Abandon(pull);
  }
  PushAnswers answers = ReadAnswers(step, *push);
  if (answers.other.ok()) answers.other = s;
  return Advance(step, answers);
}

// Every shard answered OK (or duplicate), or refused the push's content (a
// non-finite value, a gradient too stale; a malformed push, a bug of ours):
// the push is settled everywhere, and the next pull commits it, as nothing
// if any shard refused it. Otherwise each shard's answer counts, not the
// first to arrive: one shard's refusal with another's passing failure is a
// push to send again.
JobRunner::PushAnswers JobRunner::ReadAnswers(int64_t step, Work& push) {
  PushAnswers a;
  a.settled = push.Done();
  a.retry = !push.Done();
  for (const absl::Status& r : push.Results()) {
    const Reaction reaction = ReactTo(Call::kPush, r);
    if (reaction == Reaction::kDone) continue;
    if (reaction == Reaction::kNotCounted) {
      // Remembered across attempts: the shard that refused it answers a
      // second attempt as a duplicate.
      refused_step_ = step;
      if (a.refusal.ok()) a.refusal = r;
      continue;
    }
    if (reaction == Reaction::kLeave) {
      a.leave = r;  // ended, taken off the job, stale registration
      return a;
    }
    a.settled = false;
    // PUSH_AGAIN (kRetryNow): the shard dropped the step's sum while
    // reading this push.
    a.retry = a.retry || reaction == Reaction::kRetry ||
              reaction == Reaction::kStaleMap ||
              reaction == Reaction::kRetryNow;
    if (a.other.ok()) a.other = r;
  }
  a.contributed = refused_step_ != step;
  return a;
}

JobRunner::State JobRunner::Advance(int64_t step, const PushAnswers& a) {
  if (!a.leave.ok()) return Stop(a.leave);
  if (a.settled) {
    if (!a.contributed) {
      context_.log(absl::StrCat("step ", step, ": ", a.refusal.message()));
    }
    v1::StepCommit commit;
    commit.set_step(step);
    commit.set_contributed(a.contributed);
    commit_ = commit;
    next_ = step + 1;
    StepDone(step, stats_);
    return State::kNextStep;
  }
  if (a.retry) {
    // Pushes are idempotent: the same push goes again; a shard that had it
    // answers "duplicate", and if the step closed meanwhile, the answer
    // moves us on.
    context_.log(absl::StrCat("step ", step, ": push failed (",
                              a.other.message(), "); retrying"));
    // A dropped sum wants the push back at once; anything else, later.
    if (ReactTo(Call::kPush, a.other) != Reaction::kRetryNow) Backoff();
    return State::kRepush;
  }
  switch (ReactTo(Call::kPush, a.other)) {
    case Reaction::kNextStep:  // closed without us: pull its successor
      context_.log(absl::StrCat("step ", step, ": ", a.other.message()));
      next_ = step + 1;
      break;
    case Reaction::kJoinLater:  // a member only from a later step
      next_ = ReasonStep(a.other);
      break;
    case Reaction::kPullAgain:  // we are ahead of the shards: pull this again
      next_ = step;
      break;
    case Reaction::kLeave:  // ended, taken off the job, stale registration
      return Stop(a.other);
    case Reaction::kGiveUp:
    case Reaction::kDone:
    case Reaction::kRetry:
    case Reaction::kStaleMap:
    case Reaction::kRetryNow:
    case Reaction::kNotCounted:
    case Reaction::kNewPlan:  // pushes carry no plan
      return Stop(Refuse(a.other));
  }
  StepDone(step, stats_);
  return State::kNextStep;
}

void JobRunner::StepDone(int64_t step, const StepStats& stats) {
  held_ = HeldPush{step, stats};
  if (context_.progress) context_.progress(progress_);
  if (absl::Now() - last_log_ > options_.log_every) {
    last_log_ = absl::Now();
    context_.log(absl::StrFormat(
        "%s step %d/%d loss %.4f", assignment_.job_id(), step + 1,
        schedule_.total_steps,
        stats.samples > 0 ? stats.loss_sum / stats.samples : 0.0));
  }
}

bool JobRunner::CanOverlapPull() const {
  // bsp on one shard, where the pull of step t was sent with the push of
  // t - 1 and brings version t unless the step closed without us; and a
  // step this rank has a batch for.
  if (!options_.overlap_pull || !pipelined_ || next_pull_ == nullptr ||
      !clock_set_ || next_ >= end_version_) {
    return false;
  }
  const Schedule::Place p = schedule_.Locate(next_);
  return p.index < RankBatches(p.world);
}

absl::Status JobRunner::Prepare() {
  TALLY_ASSIGN_OR_RETURN(spec_, ParseJobSpec(assignment_.spec()));
  TALLY_ASSIGN_OR_RETURN(data_, context_.data(spec_));
  if (const SampleSource* source = data_->train.source.get()) {
    loader_bytes_seen_ = source->bytes_read();  // earlier jobs' counted
    loader_substituted_seen_ = source->substituted();
  }
  if (data_->train.sample_shape != spec_.input_shape) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the dataset's samples are [", absl::StrJoin(data_->train.sample_shape, ", "),
        "]; the job's model takes [", absl::StrJoin(spec_.input_shape, ", "),
        "]"));
  }
  TALLY_RETURN_IF_ERROR(CheckSchedule());
  end_version_ = schedule_.total_steps;
  // A worker that joins a running job (a grown one, or a vacant slot)
  // starts at the step it is a member from.
  next_ = std::max<int64_t>(0, assignment_.join_step());
  progress_.job_id = assignment_.job_id();

  EngineOptions eo;
  eo.devices = options_.devices;
  eo.allow_tf32 = spec_.training.tf32;
  buffers_on_ = spec_.is_python && spec_.python.buffer_bytes > 0;
  if (spec_.is_python) {
    if (options_.python_engine == nullptr) {
      return absl::FailedPreconditionError(
          "this worker trains models of layers only (a Python model needs "
          "python3 -m tally.worker)");
    }
    TALLY_ASSIGN_OR_RETURN(engine_, options_.python_engine(spec_, eo));
  } else {
    TALLY_ASSIGN_OR_RETURN(engine_,
                           Engine::Create(spec_.layers, spec_.input_shape, eo));
  }
  if (engine_->num_params() != spec_.layout.num_params) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model has ", engine_->num_params(), " parameters, the job ",
        spec_.layout.num_params));
  }
  if (engine_->num_replicas() > 1) {
    context_.log(absl::StrCat(
        assignment_.job_id(), ": ", engine_->num_replicas(),
        " replicas, gradients reduced by ", engine_->reduction(),
        engine_->reduction_note().empty() ? "" : " (NCCL: ",
        engine_->reduction_note(),
        engine_->reduction_note().empty() ? "" : ")"));
  }
  TALLY_RETURN_IF_ERROR(MakeClient());
  if (options_.overlap_push) {
    context_.log(absl::StrCat(assignment_.job_id(),
                              ": pushes overlap the backward pass (buckets of ",
                              options_.chunk_elements, " elements)"));
  }
  return absl::OkStatus();
}

// The job's schedule was fixed by the coordinator from the spec; this
// worker can follow it only if its training set has the size the job
// expects (every rank's share and step count follow from that).
absl::Status JobRunner::CheckSchedule() {
  const int64_t train_size = data_->train.size();
  schedule_ = ScheduleOf(
      spec_, train_size,
      DecodeWorlds(assignment_.schedule(), std::max(1, assignment_.world())),
      assignment_.schedule().plan());
  if (!assignment_.has_schedule()) return absl::OkStatus();
  const v1::Schedule& job = assignment_.schedule();
  if (job.train_size() != train_size ||
      job.total_steps() != schedule_.total_steps ||
      job.steps_per_epoch() != schedule_.steps_per_epoch) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "its training set has ", train_size, " samples (",
            schedule_.total_steps, " steps) where the job expects ",
            job.train_size(), " (", job.total_steps(), " steps)")),
        v1::SCHEDULE_MISMATCH);
  }
  return absl::OkStatus();
}

absl::Status JobRunner::MakeClient() {
  ParamClientOptions po;
  po.job_id = assignment_.job_id();
  po.worker_id =
      context_.member_id.empty() ? context_.worker_id : context_.member_id;
  po.incarnation = context_.incarnation;
  po.dtype = spec_.training.wire_dtype == WireDtype::kBfloat16 ? v1::BFLOAT16
                                                               : v1::FLOAT32;
  po.chunk_elements = options_.chunk_elements;
  po.rpc_timeout = options_.rpc_timeout;
  po.pull_wait = options_.pull_wait;
  po.transport = options_.transport;
  po.exchange = options_.exchange_stream;
  po.shared_memory = options_.shared_memory;
  po.total_steps = schedule_.total_steps;
  po.steps_per_epoch = schedule_.steps_per_epoch;
  po.plan = schedule_.plan;
  po.data_fingerprint = data_->fingerprint;
  po.mixed_versions =
      spec_.training.consistency.mode != ConsistencyMode::kBsp;
  v1::ShardMap map = assignment_.shard_map();
  if (map.shards().empty()) {
    // A coordinator that predates shard maps holds the whole vector.
    v1::ShardMap::Entry* e = map.add_shards();
    e->set_count(engine_->num_params());
  }
  TALLY_ASSIGN_OR_RETURN(
      client_, ParameterClient::Create(map, engine_->num_params(),
                                       context_.coordinator, po));
  // One shard: a push that reached it reached them all, so it can be its
  // own commit and the next pull need not wait for its answer. Only bsp:
  // its pull waits for the step to close whenever it arrives, so the
  // weights it gets are the same; an ssp or async pull sent before the
  // push could get older weights than one sent after it.
  pipelined_ = client_->num_shards() == 1 &&
               spec_.training.consistency.mode == ConsistencyMode::kBsp;
  if (!spec_.embeddings.empty()) {
    RowClientOptions ro;
    ro.job_id = po.job_id;
    ro.worker_id = po.worker_id;
    ro.incarnation = po.incarnation;
    ro.pull_wait = po.pull_wait;
    ro.rpc_timeout = po.rpc_timeout;
    ro.transport = po.transport;
    // A shard away is not waited for once the job has another map (or is
    // not ours): the runner then ends, and the next one has the new map.
    ro.keep_trying = context_.still_assigned;
    TALLY_ASSIGN_OR_RETURN(rows_, RowClient::Create(map, spec_.embeddings,
                                                    context_.coordinator, ro));
    engine_->SetTableRows(rows_.get());
  }
  return absl::OkStatus();
}

std::shared_ptr<Work> JobRunner::StartPull(int64_t clock) {
  // The shards wait as the job's rule says for a worker at `clock`; past
  // its last step (bsp, ssp) a worker waits for the final weights.
  const bool sync = spec_.training.consistency.mode != ConsistencyMode::kAsync;
  const int64_t at_least = sync && clock >= end_version_ ? end_version_ : 0;
  if (buffers_on_) pulled_buffers_ = std::make_shared<std::string>();
  return client_->Pull(at_least, engine_->params(),
                       commit_.has_value() ? &*commit_ : nullptr, clock,
                       pulled_buffers_);
}

void JobRunner::Abandon(const std::shared_ptr<Work>& pull) {
  if (pull->Done()) return;
  pull->Cancel();
  if (absl::IsDeadlineExceeded(
          pull->Wait(absl::Now() + options_.release_wait))) {
    context_.log("a cancelled pull did not let go of the parameters in time");
  }
}

absl::StatusOr<int64_t> JobRunner::PullNext() {
  const absl::Time began = absl::Now();
  // The pull sent with the last push (it carried the same pending commit,
  // if any), or a new one.
  std::shared_ptr<Work> pull =
      next_pull_ != nullptr ? std::move(next_pull_) : StartPull(next_);
  // The server bounds its wait (pull_wait); rpc_timeout covers the transfer.
  absl::StatusOr<int64_t> v = pull->WaitVersion(
      absl::Now() + options_.pull_wait + options_.rpc_timeout);
  if (!v.ok()) {
    Abandon(pull);
    return v;
  }
  commit_.reset();  // every shard has it
  const double seconds = absl::ToDoubleSeconds(absl::Now() - began);
  Smooth(&progress_.wait_seconds, seconds);
  if (options_.metrics != nullptr)
    options_.metrics->pull_seconds.Observe(seconds);
  return v;
}

absl::StatusOr<StepStats> JobRunner::Compute(int64_t step, StepWork& work) {
  const Schedule::Place place = schedule_.Locate(step);
  const int64_t batches = RankBatches(place.world);
  if (place.index >= batches) return StepStats{};  // no batch at this step
  SeekLoader(step, place);
  held_.reset();  // the engine's gradient is about to change
  const absl::Time asked = absl::Now();
  absl::StatusOr<std::unique_ptr<HostBatch>> next =
      loader_->Next(options_.batch_wait);
  CountLoader(absl::Now() - asked);
  // Said to the coordinator: a runner that stops quietly would hold its
  // slot (its daemon still heartbeats) and a bsp job would wait for ever.
  if (!next.ok()) return Refuse(next.status());
  std::unique_ptr<HostBatch> batch = *std::move(next);
  BatchView view{batch->x.data(), batch->y.data(), batch->size,
                 batch->ids.empty() ? nullptr : batch->ids.data()};
  const absl::Time began = absl::Now();
  work.pull_deadline = began + options_.pull_wait + options_.rpc_timeout;
  StepHooks hooks = HooksFor(step, work);
  // The step's rows are as fresh as its weights must be: the step's
  // version (bsp), within the staleness (ssp), any (async).
  if (rows_ != nullptr) {
    rows_->BeginStep(step, spec_.training.consistency.FirstUsableVersion(step));
  }
  absl::StatusOr<StepStats> stats =
      engine_->Step(view, spec_.training.seed + step, {}, &hooks);
  // Everything was offered if the step succeeded; otherwise the parts not
  // whole are cancelled (a shard stages nothing of a push it did not get
  // whole), and so is the rest.
  if (work.feed != nullptr) work.feed->Close();
  if (work.push != nullptr && !stats.ok()) {
    work.push->Cancel();
    work.push->Wait(absl::Now() + options_.release_wait).IgnoreError();
    work.push = nullptr;
  }
  started_push_ = std::move(work.push);
  // What the step waited for its weights counts as the pull's.
  CountStep(stats, work, absl::Now() - began - work.blocked);
  loader_->Recycle(std::move(batch));
  // A step dropped for its pull is done again the plain way (Overlapped);
  // one whose table rows could not be pulled or pushed goes as the row
  // call's answer says (RowsFailed): a shard away, the job placed again
  // (its new map comes with the assignment) or rolled back to its
  // checkpoint are not the job's failure. The model's own errors (and
  // rows the shards refused) are.
  if (!stats.ok() && rows_ != nullptr && !work.pull_failed) {
    const Reaction r = ReactTo(Call::kRows, stats.status());
    work.rows_failed = r != Reaction::kGiveUp && r != Reaction::kNotCounted;
  }
  if (!stats.ok()) {
    return work.pull_failed || work.rows_failed ? stats.status()
                                                : Refuse(stats.status());
  }
  loader_next_ = place.index + 1 < batches
                     ? step + 1
                     : step - place.index + place.steps_per_epoch;
  return stats;
}

int64_t JobRunner::RankBatches(int world) const {
  const int rank = assignment_.rank();
  if (rank >= world) return 0;  // a rank that joins later
  const int64_t n = data_->train.size();
  const int64_t samples = n / world + (rank < n % world ? 1 : 0);
  return (samples + spec_.training.batch_size - 1) / spec_.training.batch_size;
}

void JobRunner::SeekLoader(int64_t step, const Schedule::Place& place) {
  if (loader_ != nullptr && loader_next_ == step && step < loader_end_)
    return;
  // First step, a jump (rejoining, a skipped step), or a new world (the
  // job grew: the epoch's split is another): restart the loader at this
  // step's batch.
  const int64_t epoch = place.epoch;
  loader_end_ = place.period_end;
  LoaderOptions lo;
  lo.batch_size = spec_.training.batch_size;
  lo.seed = spec_.training.seed;
  lo.rank = assignment_.rank();
  lo.world = place.world;
  lo.first_epoch = epoch;
  lo.first_batch = place.index;
  lo.threads = spec_.dataset.threads;
  // An async worker faster than others goes round its data shard more
  // often than the spec's epochs (the job ends on versions, not epochs):
  // its loader goes on (epochs are shuffled as they come).
  lo.epochs = spec_.training.consistency.mode == ConsistencyMode::kAsync
                  ? int64_t{1} << 40
                  : std::max<int64_t>(1, spec_.training.epochs - epoch);
  loader_.reset();
  loader_ = std::make_unique<BatchLoader>(&data_->train, lo);
}

// With a pull still arriving, each layer waits for its weights, and the
// loss for the whole pull (its version is the push's base). The push goes
// out beside the backward pass: its header once the loss is known, each
// layer's gradient once backward has produced it.
StepHooks JobRunner::HooksFor(int64_t step, StepWork& work) {
  StepHooks hooks;
  hooks.buffers = pulled_buffers_.get();
  if (work.pull != nullptr) {
    hooks.params_ready = [&work](int64_t b, int64_t e) {
      const absl::Time t0 = absl::Now();
      absl::Status s = work.pull->WaitRange(b, e, work.pull_deadline);
      work.blocked += absl::Now() - t0;
      if (!s.ok()) work.pull_failed = true;
      return s;
    };
  }
  if (work.pull != nullptr || options_.overlap_push) {
    hooks.loss_known = [this, step, &work](const StepStats& s) -> absl::Status {
      if (work.pull != nullptr) {
        const absl::Time t0 = absl::Now();
        absl::StatusOr<int64_t> v = work.pull->WaitVersion(work.pull_deadline);
        work.blocked += absl::Now() - t0;
        if (!v.ok() || *v != step) {
          work.pull_failed = true;
          return v.ok() ? absl::AbortedError("the pull brought another version")
                        : v.status();
        }
        base_ = *v;
        commit_.reset();  // the pull carried it to the shard
      }
      if (options_.overlap_push) {
        work.push =
            client_->Push(MakePushInfo(step, s), engine_->grads(), &work.feed);
      }
      return absl::OkStatus();
    };
  }
  if (options_.overlap_push) {
    hooks.grads_ready = [&work](int64_t b, int64_t e) {
      work.feed->Offer(b, e);
    };
  }
  return hooks;
}

void JobRunner::CountLoader(absl::Duration waited) {
  Smooth(&progress_.loader_seconds, absl::ToDoubleSeconds(waited));
  if (options_.metrics == nullptr) return;
  options_.metrics->loader_wait_seconds.Observe(absl::ToDoubleSeconds(waited));
  const SampleSource* source = data_->train.source.get();
  if (source == nullptr) return;
  // The source counts for its life (the daemon keeps it between jobs).
  const int64_t bytes = source->bytes_read();
  const int64_t substituted = source->substituted();
  options_.metrics->loader_bytes.Increment(
      static_cast<double>(bytes - loader_bytes_seen_));
  options_.metrics->loader_substituted.Increment(
      static_cast<double>(substituted - loader_substituted_seen_));
  loader_bytes_seen_ = bytes;
  loader_substituted_seen_ = substituted;
}

void JobRunner::CountStep(const absl::StatusOr<StepStats>& stats,
                          const StepWork& work, absl::Duration computing) {
  if (!stats.ok()) return;
  Smooth(&progress_.compute_seconds, absl::ToDoubleSeconds(computing));
  if (work.pull != nullptr) {
    Smooth(&progress_.wait_seconds, absl::ToDoubleSeconds(work.blocked));
    if (options_.metrics != nullptr)
      options_.metrics->pull_seconds.Observe(
          absl::ToDoubleSeconds(work.blocked));
  }
  if (options_.metrics != nullptr) {
    options_.metrics->compute_seconds.Observe(absl::ToDoubleSeconds(computing));
    options_.metrics->steps.Increment();
    options_.metrics->samples.Increment(static_cast<double>(stats->samples));
  }
}

PushInfo JobRunner::MakePushInfo(int64_t step, const StepStats& stats) {
  PushInfo info;
  if (buffers_on_ && stats.samples > 0) {
    absl::StatusOr<std::string> buffers = engine_->Buffers();
    if (buffers.ok()) {
      pushed_buffers_ = *std::move(buffers);
      info.buffers = &pushed_buffers_;
    } else {  // the step counts; the region keeps another rank's
      context_.log(absl::StrCat("step ", step, ": ", buffers.status().message()));
    }
  }
  info.step = step;
  info.samples = stats.samples;
  info.loss_sum = stats.loss_sum;
  info.correct = stats.correct;
  info.base_version = base_;
  info.commit = pipelined_;
  return info;
}

namespace {

// The final evaluation's figures for the worker's log. Without a test
// split there are none: zeros would read as a model that learnt nothing.
std::string TestFigures(const StepStats& test, bool classifies) {
  if (test.samples == 0) return "no test split, so no test figures";
  return absl::StrCat(
      absl::StrFormat("test loss %.4f", test.loss_sum / test.samples),
      classifies ? absl::StrFormat(", accuracy %.4f",
                                   static_cast<double>(test.correct) /
                                       test.samples)
                 : "",
      test.auc >= 0 ? absl::StrFormat(", AUC %.4f", test.auc) : "");
}

}  // namespace

absl::Status JobRunner::Finish(int64_t version) {
  // The worker's other ranks end here: its lowest evaluates and reports.
  if (context_.reports && !context_.reports()) return absl::OkStatus();
  // Evaluated (and reported) with the job's buffer region, which the last
  // pull brought: what the export holds.
  if (pulled_buffers_ != nullptr && !pulled_buffers_->empty()) {
    if (absl::Status s = engine_->LoadBuffers(*pulled_buffers_); !s.ok())
      return Refuse(s);
  }
  if (rows_ != nullptr) rows_->BeginStep(-1, version);
  absl::StatusOr<StepStats> test = engine_->Evaluate(data_->test);
  if (!test.ok()) return Refuse(test.status());
  const double accuracy =
      test->samples > 0 ? static_cast<double>(test->correct) / test->samples
                        : 0.0;
  absl::StatusOr<std::string> buffers = engine_->Buffers();
  if (!buffers.ok()) return Refuse(buffers.status());
  // A classifier's accuracy; other losses (mse, a model's, tokens') have
  // none to show.
  const absl::string_view loss_name = MetricLossName(spec_);
  const bool classifies =
      loss_name == "cross_entropy" || loss_name == "binary_cross_entropy";
  context_.log(absl::StrCat(assignment_.job_id(), " finished at step ",
                            version, ": ", TestFigures(*test, classifies)));
  v1::ReportResultRequest req;
  req.set_buffers(*std::move(buffers));
  req.set_worker_id(context_.worker_id);
  req.set_incarnation(context_.incarnation);
  req.set_job_id(assignment_.job_id());
  req.set_ok(true);
  if (test->samples > 0) {
    req.set_test_accuracy(accuracy);
    req.set_test_loss(test->loss_sum / test->samples);
    if (test->auc >= 0) req.set_test_auc(test->auc);
  } else {
    req.set_no_test_split(true);
  }
  req.set_steps(version);
  // The coordinator may not have seen the last step close yet
  // (UNAVAILABLE + NOT_FINISHED): a bounded number of retries.
  const absl::Time give_up = absl::Now() + options_.rpc_timeout;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.report_timeout));
    v1::ReportResultResponse resp;
    absl::Status s =
        FromGrpc(context_.workers->ReportResult(&ctx, req, &resp));
    if (ReactTo(Call::kReport, s) != Reaction::kRetry ||
        absl::Now() > give_up) {
      return s;
    }
    Backoff();
  }
}

absl::Status JobRunner::Refuse(const absl::Status& why) {
  v1::ReportResultRequest req;
  req.set_worker_id(context_.worker_id);
  req.set_incarnation(context_.incarnation);
  req.set_job_id(assignment_.job_id());
  req.set_ok(false);
  req.set_message(std::string(why.message()));
  req.set_reason(ReasonOf(why));
  // A runner whose job was placed again since (its failure may be the old
  // placement's answer) does not fail the job: the coordinator checks.
  req.set_map_version(assignment_.shard_map().version());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.report_timeout));
  v1::ReportResultResponse resp;
  context_.workers->ReportResult(&ctx, req, &resp);
  return why;
}

void JobRunner::Smooth(double* mean, double sample) {
  // An exponential mean over about the last ten steps.
  *mean = *mean == 0 ? sample : 0.9 * *mean + 0.1 * sample;
}

void JobRunner::Backoff() {
  context_.sleep(backoff_);
  backoff_ = std::min(backoff_ * 2, options_.max_backoff);
  FollowShardMap();
}

void JobRunner::FollowShardMap() {
  if (!context_.assignment) return;
  std::optional<v1::Assignment> now = context_.assignment();
  if (!now.has_value()) return;
  const v1::ShardMap& map = now->shard_map();
  const v1::ShardMap& held = assignment_.shard_map();
  if (map.version() != held.version() ||
      map.shards_size() != held.shards_size())
    return;  // placed again: the runner ends at its next check
  bool moved = false;
  for (int i = 0; i < map.shards_size(); ++i)
    moved = moved || map.shards(i).address() != held.shards(i).address();
  if (!moved) return;
  *assignment_.mutable_shard_map() = map;
  if (next_pull_ != nullptr) Abandon(std::exchange(next_pull_, nullptr));
  context_.log(absl::StrCat(assignment_.job_id(),
                            ": a range moved to its backup; going on"));
  if (absl::Status s = MakeClient(); !s.ok())
    context_.log(absl::StrCat("the new shard map: ", s.message()));
}

}  // namespace tally
