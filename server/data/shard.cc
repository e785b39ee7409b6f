#include "server/data/shard.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/bfloat16.h"
#include "common/status_macros.h"
#include "proto/errors.h"
#include "server/data/internal/sum_kernels.h"

namespace tally {

namespace {

absl::Status JobEnded() {
  return WithReason(absl::FailedPreconditionError("the job ended"),
                    v1::JOB_ENDED);
}

}  // namespace

ParameterShard::Options::Options() = default;

ParameterShard::ParameterShard(std::vector<float> weights,
                               std::unique_ptr<Optimizer> optimizer,
                               const Clock* clock, Options options)
    : num_params_(static_cast<int64_t>(weights.size())),
      clock_(clock),
      rules_(options.consistency, options.max_samples, options.buffer_bytes),
      optimizer_(std::move(optimizer)),
      weights_(std::move(weights)),
      schedule_(options.plan),
      pool_(num_params_),
      members_(&pool_),
      sum_(num_params_, options.streamed_sums && rules_.AllowsStreaming(),
           &members_, &pool_, &waiters_),
      rows_(std::move(options.tables)),
      stats_(clock, !rules_.async(), std::move(options.publish_observer)),
      replica_(std::move(options.forward), options.backup) {
  absl::MutexLock lock(&mu_);
  // The step's one sum, made (and its pages touched) now rather than by the
  // first push of the job, under the lock every other push of that step
  // waits on while their data piles up in the transport. (A rule that
  // stages needs none.)
  if (sum_.on()) pool_.Prime(std::make_unique<std::vector<float>>(num_params_));
}

ShardState ParameterShard::Save(TableCapture* capture) const {
  absl::MutexLock lock(&mu_);
  return SaveLocked(capture);
}

ShardState ParameterShard::SaveLocked(TableCapture* capture) const {
  if (capture != nullptr && rows_.tables() != nullptr && !retired_) {
    capture->file = rows_.tables()->TakeSave(capture->base);
    capture->file.version = version_;
    capture->taken = true;
  }
  ShardState s;
  s.metrics = MetricsLocked();
  s.retired = retired_;
  s.weights = weights_.current();
  if (optimizer_ != nullptr) s.optimizer = optimizer_->SaveState();
  s.buffers = buffers_;
  return s;
}

void ParameterShard::SaveAt(
    int64_t v, absl::Time deadline,
    std::function<void(absl::StatusOr<ShardState>)> done,
    std::shared_ptr<TableCapture> capture) {
  // The state at v (or why not), then v's mark off: what it held from
  // closing may close.
  auto take = [this, v, done, capture](absl::Status s) {
    absl::StatusOr<ShardState> state =
        s.ok() ? absl::StatusOr<ShardState>(Save(capture.get()))
               : absl::StatusOr<ShardState>(s);
    Ready ready;
    {
      absl::MutexLock lock(&mu_);
      save_at_.erase(save_at_.find(v));
      MaybeCloseLocked(&ready);
    }
    RunReady(ready);
    done(std::move(state));
  };
  bool now = false;
  absl::Status closed;
  {
    absl::MutexLock lock(&mu_);
    closed = closed_;
    if (!closed.ok()) {
      // Nothing to wait for: the range is gone.
    } else if (version_ > v) {
      now = true;
    } else {
      save_at_.insert(v);
      if (version_ < v) {
        // Released by the close that reaches v, or by its deadline.
        waiters_.Add(v, deadline, std::move(take), /*worker_id=*/"");
        return;
      }
    }
  }
  if (!closed.ok()) {
    done(closed);
    return;
  }
  if (now) {
    done(WithReason(absl::FailedPreconditionError(
                        absl::StrCat("the range is past version ", v)),
                    v1::STEP_CLOSED, version()));
    return;
  }
  // At v already: the state is taken before anything can close.
  take(absl::OkStatus());
}

absl::StatusOr<std::unique_ptr<ParameterShard>> ParameterShard::Restore(
    const ShardState& state, std::unique_ptr<Optimizer> optimizer,
    const Clock* clock, Options options) {
  if (state.weights == nullptr) {
    return absl::InvalidArgumentError("a shard state needs its weights");
  }
  if (!state.retired) {
    if (optimizer == nullptr) {
      return absl::InvalidArgumentError("a running shard needs an optimizer");
    }
    // A state with no optimizer step and no slots is a start from given
    // weights (a Python model's, built by a worker): a fresh optimizer.
    const bool fresh =
        state.optimizer.step == 0 && state.optimizer.slots.empty();
    if (absl::Status s =
            fresh ? absl::OkStatus() : optimizer->LoadState(state.optimizer);
        !s.ok()) {
      return s;
    }
  }
  // A retired range sums nothing: it needs no sum buffer.
  if (state.retired) options.streamed_sums = false;
  auto shard = std::make_unique<ParameterShard>(
      *state.weights, std::move(optimizer), clock, std::move(options));
  {
    absl::MutexLock lock(&shard->mu_);
    const ShardMetrics& m = state.metrics;
    shard->version_ = m.version;
    shard->schedule_.GoOnFrom(m.total_steps, m.steps_per_epoch);
    shard->buffers_ = state.buffers;
    shard->replica_.Restored(m.version, state.buffers);
    shard->stats_.GoOnFrom(m);
  }
  if (state.retired) shard->Retire();
  return shard;
}

// ---------------------------------------------------------- membership --

absl::Status ParameterShard::SetMembers(const std::vector<MemberSpec>& members,
                                        int64_t hold_id,
                                        const PlanChange& plan) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (hold_id != 0 && hold_id != hold_id_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "hold ", hold_id, " is not in force (it lapsed or was replaced)"));
    }
    if (plan.plan > 0) {
      TALLY_RETURN_IF_ERROR(schedule_.SetPlan(plan.plan, plan.total_steps,
                                              version_, optimizer_.get()));
    }
    members_.Set(members, rules_.async(), &apply_queue_);
    sum_.CheckParts(version_, &ready);
    if (hold_id != 0) hold_id_ = 0;
    MaybeCloseLocked(&ready);
  }
  RunReady(ready);
  return absl::OkStatus();
}

HoldReport ParameterShard::Hold(int64_t hold_id, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  hold_id_ = hold_id;
  hold_deadline_ = deadline;
  HoldReport r;
  r.version = version_;
  // With each member's clock: an async job's joiners start past them all.
  r.members = members_.Progress();
  return r;
}

void ParameterShard::AddMember(const std::string& worker_id,
                               int64_t incarnation) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    bool pushed = false;
    int rank = 0;
    std::vector<MemberSpec> specs;
    for (const auto& [id, m] : members_.all()) {
      if ((m.pushed_step >= version_ || sum_.HasPart(id)) && !rules_.async())
        pushed = true;
      rank = std::max(rank, m.spec.rank + 1);
      if (id != worker_id) specs.push_back(m.spec);
    }
    MemberSpec spec;
    spec.worker_id = worker_id;
    spec.incarnation = incarnation;
    spec.rank = rank;
    // Joining a step that already has pushes would make its worker set
    // depend on timing; wait for the next one.
    spec.join_step = pushed ? version_ + 1 : version_;
    specs.push_back(spec);
    members_.Set(specs, rules_.async(), &apply_queue_);
    sum_.CheckParts(version_, &ready);
  }
  RunReady(ready);
}

void ParameterShard::RemoveMember(const std::string& worker_id) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    std::vector<MemberSpec> specs;
    for (const auto& [id, m] : members_.all()) {
      if (id == worker_id) {
        // Out from the open step, unless it already committed it (async:
        // out at once; what it committed is queued already).
        MemberSpec spec = m.spec;
        if (!rules_.async() && m.committed_step >= version_) {
          spec.leave_step = version_ + 1;
          specs.push_back(spec);
        }
        continue;
      }
      specs.push_back(m.spec);
    }
    members_.Set(specs, rules_.async(), &apply_queue_);
    sum_.CheckParts(version_, &ready);
    MaybeCloseLocked(&ready);
  }
  RunReady(ready);
}

absl::Status ParameterShard::CheckMember(const std::string& worker_id,
                                         int64_t incarnation) const {
  absl::MutexLock lock(&mu_);
  return CheckMemberLocked(worker_id, incarnation);
}

absl::Status ParameterShard::SetSchedule(int64_t total_steps,
                                         int64_t steps_per_epoch,
                                         const std::string& fingerprint,
                                         int64_t plan) {
  absl::MutexLock lock(&mu_);
  return schedule_.Set(total_steps, steps_per_epoch, fingerprint, plan);
}

ParameterShard::Report ParameterShard::Describe() const {
  absl::MutexLock lock(&mu_);
  return {members_.Specs(), members_.Progress(), stats_.Spans()};
}

// --------------------------------------------------------------- pushes --

absl::Status ParameterShard::CheckPush(const PushMeta& meta,
                                       bool* duplicate) const {
  *duplicate = false;
  absl::MutexLock lock(&mu_);
  TALLY_RETURN_IF_ERROR(
      CheckMemberLocked(meta.worker_id, meta.incarnation));
  return rules_.CheckPush(meta, members_.all().at(meta.worker_id), version_,
                          schedule_.Ended(version_), duplicate,
                          stats_.counts());
}

absl::Status ParameterShard::Accept(const PushMeta& meta,
                                    std::unique_ptr<std::vector<float>> grads,
                                    bool* duplicate) {
  *duplicate = false;
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    absl::Status s =
        CheckMemberLocked(meta.worker_id, meta.incarnation);
    if (s.ok()) {
      s = rules_.CheckPush(meta, members_.at(meta.worker_id), version_,
                           schedule_.Ended(version_), duplicate,
                           stats_.counts());
    }
    if (!s.ok() || *duplicate) {
      pool_.Release(std::move(grads), members_.size());
      return s;
    }
    if (meta.samples > 0 &&
        (grads == nullptr ||
         static_cast<int64_t>(grads->size()) != num_params_)) {
      if (grads != nullptr) pool_.Forget();  // not ours to keep
      return absl::InvalidArgumentError("a push with samples needs a gradient");
    }
    ShardMember& m = members_.at(meta.worker_id);
    const bool streamed = meta.samples > 0 && sum_.on();
    if (streamed && m.committed_step >= meta.step) {
      pool_.Release(std::move(grads), members_.size());
      return absl::InvalidArgumentError(
          absl::StrCat("a push of step ", meta.step, " after its commit"));
    }
    members_.KeepBuffers(meta);
    if (streamed) {
      // A whole push in a streamed sum: kept until its turn comes (its
      // member counts as pushed once its part is in place).
      sum_.Keep(meta,
                static_cast<float>(meta.samples) *
                    rules_.Scale(version_ - meta.base_version),
                std::move(grads), version_, &ready);
      m.pushed_step = meta.step;
      m.push_again = -1;
      stats_.Arrived(meta.step, version_, /*commit=*/false);
      sum_.Progress(version_, &ready);
    } else {
      m.pushed_step = meta.step;
      m.push_again = -1;
      stats_.Arrived(meta.step, version_, /*commit=*/false);
      members_.Stage(m, meta, std::move(grads));
    }
  }
  RunReady(ready);
  return absl::OkStatus();
}

absl::Status ParameterShard::Accept(const PushMeta& meta, const float* grads,
                                    bool* duplicate) {
  std::unique_ptr<std::vector<float>> copy;
  if (meta.samples > 0 && grads != nullptr) {
    TALLY_ASSIGN_OR_RETURN(copy, AcquireStaging());
    std::copy(grads, grads + num_params_, copy->begin());
  }
  return Accept(meta, std::move(copy), duplicate);
}

bool ParameterShard::StreamsPushes() const {
  absl::MutexLock lock(&mu_);
  return sum_.on();
}

absl::StatusOr<int64_t> ParameterShard::BeginStreamed(const PushMeta& meta) {
  Ready ready;
  int64_t token = 0;
  {
    absl::MutexLock lock(&mu_);
    bool duplicate = false;
    TALLY_RETURN_IF_ERROR(
        CheckMemberLocked(meta.worker_id, meta.incarnation));
    ShardMember& m = members_.at(meta.worker_id);
    TALLY_RETURN_IF_ERROR(rules_.CheckPush(meta, m, version_,
                                           schedule_.Ended(version_),
                                           &duplicate, stats_.counts()));
    // A duplicate (another stream finished it meanwhile) is answered as one
    // by AddStreamed and FinishStreamed.
    if (duplicate) return sum_.generation();
    if (!sum_.on() || meta.samples <= 0) {
      return absl::FailedPreconditionError("this push is not streamed");
    }
    if (m.committed_step >= meta.step) {
      return absl::InvalidArgumentError(
          absl::StrCat("a push of step ", meta.step, " after its commit"));
    }
    const float weight = static_cast<float>(meta.samples) *
                         rules_.Scale(version_ - meta.base_version);
    // The same push again goes on where it stopped.
    if (!sum_.Begin(meta, weight, version_, &ready)) return sum_.generation();
    members_.KeepBuffers(meta);
    m.push_again = -1;
    token = sum_.generation();
  }
  RunReady(ready);
  return token;
}

absl::StatusOr<bool> ParameterShard::AddStreamed(const PushMeta& meta,
                                                 int64_t token, int64_t local,
                                                 int64_t n, const float* values,
                                                 std::function<void()> wake) {
  Ready ready;
  absl::StatusOr<bool> added;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.ok()) return closed_;
    bool duplicate = false;
    TALLY_ASSIGN_OR_RETURN(
        StreamedSum::Part * part,
        sum_.Find(meta, token, version_, retired_, &duplicate));
    if (duplicate) return true;  // counted already: the rest is ignored
    added = sum_.Add(meta.worker_id, *part, local, n, values, std::move(wake),
                     version_, &ready);
  }
  RunReady(ready);
  return added;
}

absl::Status ParameterShard::FinishStreamed(const PushMeta& meta, int64_t token,
                                            bool* duplicate) {
  *duplicate = false;
  absl::MutexLock lock(&mu_);
  if (!closed_.ok()) return closed_;
  TALLY_ASSIGN_OR_RETURN(StreamedSum::Part * part,
                         sum_.Find(meta, token, version_, retired_, duplicate));
  if (*duplicate) return absl::OkStatus();
  TALLY_RETURN_IF_ERROR(sum_.Finish(*part));
  members_.at(meta.worker_id).pushed_step = meta.step;
  stats_.Arrived(meta.step, version_, /*commit=*/false);
  return absl::OkStatus();
}

bool ParameterShard::Commit(const std::string& worker_id, int64_t incarnation,
                            int64_t step, bool contributed) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (!CheckMemberLocked(worker_id, incarnation).ok())
      return true;
    ShardMember& m = members_.at(worker_id);
    if (m.committed_step >= step) return true;  // settled already
    if (rules_.async()) {
      if (hold_id_ != 0) return false;
      // (A push refused on some shard, too stale there, is committed as
      // nothing; it may never have been staged here.)
      if (schedule_.Ended(version_) || (contributed && step > m.pushed_step))
        return true;
      apply_queue_.push_back(members_.QueueCommitted(m, step, contributed));
    } else {
      // Settled already, or nonsense.
      if (step < version_ || step > version_ + rules_.window()) return true;
      if (!Required(m, step)) return true;
      // Its push is no longer in the sum: it pushes again first (the pull
      // that carries this commit is told so), unless it says the push
      // counts as nothing anyway (another shard refused it).
      if (m.push_again == step) {
        if (contributed) return true;
        m.push_again = -1;
      }
      // Committed as pushed, but its push never reached this range: a
      // backup that took over from its lost primary, which had it. It
      // pushes again first, as above.
      if (replica_.taken_over() && contributed && m.pushed_step < step &&
          !sum_.HasPart(worker_id)) {
        m.push_again = step;
        return true;
      }
      if (!contributed) {
        members_.Unstage(m, step);
        m.buffers.erase(step);
        // Nor its rows (under ssp a later step's commit may come before
        // this one closes, and last_refused is that step's).
        m.rows.erase(step);
      }
      m.committed_step = step;
      m.last_refused = !contributed;
      stats_.Arrived(step, version_, /*commit=*/true);
      if (sum_.on()) {
        // Refused on another shard: out of the sum here too. Either way a
        // lower rank that is settled may let others' blocks in.
        if (!contributed) sum_.DropPart(worker_id, version_, &ready);
        sum_.Progress(version_, &ready);
      }
    }
    MaybeCloseLocked(&ready);
  }
  RunReady(ready);
  return true;
}

void ParameterShard::Reject(const PushMeta& meta) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.counts()->rejected;
    bool duplicate = false;
    if (!CheckMemberLocked(meta.worker_id, meta.incarnation)
             .ok()) {
      return;
    }
    ShardMember& m = members_.at(meta.worker_id);
    if (!rules_
             .CheckPush(meta, m, version_, schedule_.Ended(version_),
                        &duplicate, stats_.counts())
             .ok() ||
        duplicate) {
      return;
    }
    // Settled as nothing; the commit still comes.
    members_.Unstage(m, meta.step);
    m.buffers.erase(meta.step);
    m.rows.erase(meta.step);
    m.pushed_step = std::max(m.pushed_step, meta.step);
    if (sum_.on() && meta.step == version_) {
      sum_.DropPart(meta.worker_id, version_, &ready);
      sum_.Progress(version_, &ready);
    }
  }
  RunReady(ready);
}

// ------------------------------------------------------ closing a step --

void ParameterShard::MaybeCloseLocked(Ready* ready) {
  const int64_t before = replica_.published().version;
  while (!retired_ && hold_id_ == 0 &&
         (save_at_.empty() || version_ < *save_at_.begin()) &&
         !schedule_.Ended(version_)) {
    if (!rules_.async()) {
      if (!CloseStepLocked(ready)) break;
      stats_.Published(version_ - 1, ready);
      continue;
    }
    if (apply_queue_.empty()) break;
    StagedPush st = std::move(apply_queue_.front());
    apply_queue_.pop_front();
    StepTally tally{0, st.loss_sum, st.correct};
    if (st.grads != nullptr && st.samples > 0) {
      // One push is its own step: its mean gradient, scaled by staleness.
      const float scale = rules_.Scale(version_ - st.base);
      if (internal::ScaleFinite(st.grads->data(), scale, num_params_)) {
        tally.samples = st.samples;
      } else {
        ++stats_.counts()->rejected;
        st.buffers.reset();  // not applied: nor are its buffers
      }
    }
    // From the lowest rank still a member (rank 0 may have left).
    if (st.buffers != nullptr && members_.Lowest(st.rank))
      buffers_ = std::move(st.buffers);
    AdvanceLocked(tally, tally.samples > 0 ? st.grads->data() : nullptr);
    pool_.Release(std::move(st.grads), members_.size());
    // The rows were stepped as they came; a version is a step for the
    // tables' eviction.
    rows_.EndStep(version_);
  }
  if (schedule_.Ended(version_)) {
    // Nothing more is applied: pushes still queued go.
    for (StagedPush& st : apply_queue_)
      pool_.Release(std::move(st.grads), members_.size());
    apply_queue_.clear();
  }
  if (replica_.published().version != before)
    waiters_.Release(replica_.published().version, ready);
}

bool ParameterShard::CloseStepLocked(Ready* ready) {
  std::vector<ShardMember*> required;
  if (!members_.ReadyToClose(version_, rules_.backups(), &required))
    return false;
  StepTally tally;
  // Streamed: the sum is made already. Staged: it is made in the first
  // contributing push's own buffer (no buffer of its own), and then scaled
  // there into the mean.
  const bool streamed = sum_.on();
  std::unique_ptr<std::vector<float>> staged_sum;
  float* sum = nullptr;
  if (streamed) {
    if (!sum_.Tally(required, version_, &tally, ready)) return false;
    sum = sum_.data();
  } else {
    staged_sum =
        members_.SumStaged(required, version_, rules_, stats_.counts(), &tally);
    if (staged_sum != nullptr) sum = staged_sum->data();
  }
  members_.ReleaseStaged(version_);
  if (tally.samples > 0 &&
      !internal::ScaleFinite(sum, 1.0f / tally.samples, num_params_)) {
    // The step's mean is not finite: it is not applied (the weights stay
    // as they are), and it is counted with the refused pushes.
    ++stats_.counts()->rejected;
    tally.samples = 0;
    for (ShardMember* m : required)
      m->buffers.erase(version_);  // nor its buffers
  }
  if (rows_.tables() != nullptr) {
    rows_.Apply(required, version_, tally.samples, rules_.spec().tables_async,
                stats_.counts());
    members_.EraseRows(version_);
  }
  if (rules_.buffer_bytes() != 0)
    members_.TakeBuffers(required, version_, &buffers_);
  stats_.Closed(required, version_, tally.samples);
  AdvanceLocked(tally, tally.samples > 0 ? sum : nullptr);
  pool_.Release(std::move(staged_sum), members_.size());  // sum_ stays
  // Members whose last step this was are done here.
  members_.DropLeavers(version_);
  if (streamed) sum_.Progress(version_, ready);  // blocks of the next step
  return true;
}

void ParameterShard::AdvanceLocked(const StepTally& tally, const float* mean) {
  ClosedStep closed;
  if (replica_.forwarding()) {
    // What the backup steps with.
    closed.step = version_;
    closed.samples = tally.samples;
    closed.loss_sum = tally.loss;
    closed.correct = tally.correct;
    if (tally.samples > 0) {
      closed.mean =
          std::make_shared<const std::vector<float>>(mean, mean + num_params_);
    }
    closed.buffers = buffers_;
    replica_.Leaving(weights_.current());
  }
  if (tally.samples > 0) optimizer_->Step(weights_.Writable(), mean);
  stats_.Advanced(tally, /*finished=*/version_ + 1 == schedule_.total_steps());
  ++version_;
  replica_.Made(version_, buffers_, std::move(closed));
}

absl::Status ParameterShard::CheckMemberLocked(const std::string& worker_id,
                                               int64_t incarnation) const {
  if (replica_.backup()) {
    return absl::UnavailableError(
        "this range is a backup copy: its primary takes the pushes and "
        "pulls (the shard map is stale)");
  }
  return members_.Check(worker_id, incarnation, version_, retired_);
}

// ----------------------------------------------------------- replication --

void ParameterShard::Acknowledge(int64_t version, int64_t sender) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (replica_.Acknowledge(version, version_, sender))
      waiters_.Release(replica_.published().version, &ready);
  }
  RunReady(ready);
}

void ParameterShard::StopForwarding() {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (replica_.Stop(version_, buffers_))
      waiters_.Release(replica_.published().version, &ready);
  }
  RunReady(ready);
}

absl::Status ParameterShard::StartForwarding(
    int64_t from_version, std::function<void(ClosedStep)> forward,
    int64_t sender) {
  absl::MutexLock lock(&mu_);
  return replica_.Start(version_, from_version, std::move(forward), sender);
}

absl::Status ParameterShard::ApplyClosed(const ClosedStep& step) {
  absl::MutexLock lock(&mu_);
  if (retired_) return JobEnded();
  bool made_already = false;
  TALLY_RETURN_IF_ERROR(replica_.CheckClosed(
      step, version_, num_params_, rules_.buffer_bytes(), &made_already));
  if (made_already) return absl::OkStatus();  // a forward sent again
  if (step.buffers != nullptr) buffers_ = step.buffers;
  const StepTally tally{step.samples, step.loss_sum, step.correct};
  AdvanceLocked(tally, step.samples > 0 ? step.mean->data() : nullptr);
  return absl::OkStatus();
}

void ParameterShard::Promote() {
  absl::MutexLock lock(&mu_);
  replica_.Promote();
}

absl::StatusOr<ShardState> ParameterShard::SaveForBackup(
    std::function<void(ClosedStep)> forward, int64_t sender) {
  absl::MutexLock lock(&mu_);
  if (retired_) return JobEnded();
  TALLY_RETURN_IF_ERROR(
      replica_.CatchUp(version_, std::move(forward), sender));
  return SaveLocked(nullptr);
}

ParameterShard::Copies ParameterShard::copies() const {
  absl::MutexLock lock(&mu_);
  return {replica_.backup(), replica_.in_step(), replica_.published().version};
}

// ----------------------------------------------------------------- rows --

absl::Status ParameterShard::CheckPullRows(
    const v1::PullRowsRequest& req) const {
  std::shared_ptr<const SparseTables> tables;
  {
    absl::MutexLock lock(&mu_);
    TALLY_RETURN_IF_ERROR(
        CheckMemberLocked(req.worker_id(), req.incarnation()));
    tables = rows_.tables();
  }
  // Outside the lock every push and pull of the range takes: the rows'
  // checks read only what the tables were made with.
  return RowStaging::CheckPull(tables.get(), req);
}

absl::Status ParameterShard::ReadRows(const v1::PullRowsRequest& req,
                                      v1::PullRowsResponse* resp) {
  absl::MutexLock lock(&mu_);
  // Again after a wait: the member may have left meanwhile.
  TALLY_RETURN_IF_ERROR(
      CheckMemberLocked(req.worker_id(), req.incarnation()));
  return rows_.Read(req, version_, resp);
}

absl::Status ParameterShard::StageRows(const v1::PushRowsRequest& req,
                                       bool* replaced) {
  *replaced = false;
  absl::MutexLock lock(&mu_);
  TALLY_RETURN_IF_ERROR(
      CheckMemberLocked(req.worker_id(), req.incarnation()));
  if (rows_.tables() == nullptr) return RowStaging::NoTables(req.job_id());
  ShardMember& m = members_.at(req.worker_id());
  TALLY_RETURN_IF_ERROR(rules_.CheckRows(m, req.step(), req.samples(), version_,
                                         schedule_.Ended(version_)));
  const bool now = rules_.spec().tables_async || rules_.async();
  return rows_.Stage(m, req, now, version_, stats_.counts(), replaced);
}

// ---------------------------------------------------------------- pulls --

int64_t ParameterShard::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

std::shared_ptr<const std::vector<float>> ParameterShard::Snapshot(
    int64_t* version, int64_t* total_steps,
    std::shared_ptr<const std::string>* buffers) const {
  absl::MutexLock lock(&mu_);
  const RangeReplication::Version& published = replica_.published();
  if (version != nullptr) *version = published.version;
  if (total_steps != nullptr) *total_steps = schedule_.total_steps();
  if (buffers != nullptr) *buffers = published.buffers;
  if (published.weights != nullptr) return published.weights;
  return weights_.current();
}

ShardMetrics ParameterShard::Metrics() const {
  absl::MutexLock lock(&mu_);
  return MetricsLocked();
}

ShardMetrics ParameterShard::MetricsLocked() const {
  ShardMetrics m;
  m.tables = rows_.Metrics();
  m.version = version_;
  m.total_steps = schedule_.total_steps();
  m.steps_per_epoch = schedule_.steps_per_epoch();
  stats_.Fill(&m);
  m.sum_resets = sum_.resets();
  m.members = static_cast<int>(members_.size());
  return m;
}

std::shared_ptr<const std::vector<uint16_t>> ParameterShard::Bfloat16Of(
    const std::shared_ptr<const std::vector<float>>& snapshot,
    int64_t version) {
  {
    absl::MutexLock lock(&mu_);
    if (auto kept = weights_.Bfloat16Of(*snapshot, version); kept != nullptr)
      return kept;
  }
  // Encoded outside the lock (pushes go on); two pulls of a fresh version
  // may both encode it, and the second keeps its own.
  auto encoded = std::make_shared<std::vector<uint16_t>>(snapshot->size());
  FloatToBfloat16(snapshot->data(), reinterpret_cast<char*>(encoded->data()),
                  static_cast<int64_t>(snapshot->size()));
  absl::MutexLock lock(&mu_);
  weights_.KeepBfloat16(version, encoded);
  return encoded;
}

absl::StatusOr<std::unique_ptr<std::vector<float>>>
ParameterShard::AcquireStaging() {
  {
    absl::MutexLock lock(&mu_);
    TALLY_ASSIGN_OR_RETURN(StagingPool::Buffer pooled,
                           pool_.Acquire(rules_.StagingLimit(members_.size())));
    if (pooled != nullptr) return pooled;
  }
  return std::make_unique<std::vector<float>>(num_params_);
}

void ParameterShard::ReleaseStaging(
    std::unique_ptr<std::vector<float>> buffer) {
  if (buffer == nullptr) return;
  absl::MutexLock lock(&mu_);
  pool_.Release(std::move(buffer), members_.size());
}

// -------------------------------------------------------------- waiting --

void ParameterShard::WhenClock(const std::string& worker_id, int64_t clock,
                               int64_t min_version, absl::Time deadline,
                               std::function<void(absl::Status)> done) {
  int64_t v = min_version;
  {
    absl::MutexLock lock(&mu_);
    v = std::max(v, rules_.spec().FirstUsableVersion(clock));
    auto it = members_.all().find(worker_id);
    if (it != members_.all().end())
      it->second.waiting = replica_.published().version < v;
  }
  WhenVersion(
      v, deadline,
      [this, worker_id, clock, done = std::move(done)](absl::Status s) {
        {
          absl::MutexLock lock(&mu_);
          auto it = members_.all().find(worker_id);
          if (it != members_.all().end()) {
            it->second.waiting = false;
            if (s.ok()) {
              it->second.clock =
                  rules_.async() ? clock
                                : std::max(clock, replica_.published().version);
            }
          }
        }
        done(s);
      },
      worker_id);
}

void ParameterShard::WhenVersion(int64_t v, absl::Time deadline,
                                 std::function<void(absl::Status)> done,
                                 const std::string& worker_id) {
  absl::Status now;
  {
    absl::MutexLock lock(&mu_);
    now = closed_;
    auto m = worker_id.empty() ? members_.all().end()
                               : members_.all().find(worker_id);
    if (now.ok() && m != members_.all().end() &&
        m->second.push_again == version_ && v > version_) {
      // It would wait for a step its push is no longer in (checked under
      // the lock that registers the wait: a drop tells the waiters it
      // finds).
      m->second.waiting = false;
      now = StreamedSum::PushAgain(version_);
    } else if (now.ok() && m != members_.all().end() &&
               replica_.taken_over() &&
               !rules_.async() && v > version_ &&
               Required(m->second, version_) &&
               m->second.pushed_step < version_ &&
               m->second.committed_step < version_ &&
               !sum_.HasPart(worker_id)) {
      // A backup that took over: this member's push of the open step went
      // to the lost primary alone (it committed it there, with the push),
      // and it now waits for the version after. It pushes again first.
      m->second.push_again = version_;
      m->second.waiting = false;
      now = StreamedSum::PushAgain(version_);
    } else if (now.ok()) {
      // Training time counts from the first pull of the weights.
      if (!retired_) stats_.Start();
      if (replica_.published().version < v) {
        waiters_.Add(v, deadline, std::move(done), worker_id);
        return;
      }
    }
  }
  done(now);
}

void ParameterShard::ExpireWaiters() {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    if (hold_id_ != 0 && hold_deadline_ <= now) {
      hold_id_ = 0;  // the coordinator did not finish: the old members stand
      MaybeCloseLocked(&ready);
    }
    waiters_.Expire(now, replica_.published().version, &ready);
  }
  RunReady(ready);
}

// ------------------------------------------------------------- the end --

void ParameterShard::Close(absl::Status why) {
  std::vector<std::function<void()>> parked;
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    closed_ = why;
    parked = sum_.TakeParked();
    waiters_.Cancel(why.ok() ? JobEnded() : why, &ready);
  }
  for (auto& wake : parked) wake();  // they find the range closed
  RunReady(ready);
}

std::shared_ptr<const SparseTables> ParameterShard::Retire() {
  std::vector<std::function<void()>> parked;
  Ready ready;
  std::shared_ptr<const SparseTables> tables;
  {
    absl::MutexLock lock(&mu_);
    waiters_.Cancel(JobEnded(), &ready);
    parked = sum_.Retire();
    for (StagedPush& st : apply_queue_)
      pool_.Release(std::move(st.grads), members_.size());
    apply_queue_.clear();
    members_.Retire();
    retired_ = true;
    rows_.Freeze();
    optimizer_.reset();
    weights_.Retire();  // the final weights stay
    pool_.Close();
    tables = rows_.tables();
  }
  for (auto& wake : parked) wake();  // they find the job ended
  RunReady(ready);
  return tables;
}

}  // namespace tally
