#include "server/data/shard.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/bfloat16.h"
#include "common/status_macros.h"
#include "common/vectorize.h"
#include "proto/errors.h"
#include "server/data/internal/finite.h"

namespace tally {

namespace {

TALLY_VECTORIZE void AddScaled(float* __restrict sum, const float* __restrict g,
                               float w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) sum[i] += w * g[i];
}

TALLY_VECTORIZE void Scale(float* __restrict x, float w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = w * x[i];
}

// Scale's products, from another buffer.
TALLY_VECTORIZE void PutScaled(float* __restrict x, const float* __restrict g,
                               float w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = w * g[i];
}

// x *= inv; false when a value of x is then infinite or NaN (a sum of
// finite gradients can still overflow).
TALLY_VECTORIZE bool ScaleFinite(float* __restrict x, float inv, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = x[i] * inv;
    uint32_t bits;
    std::memcpy(&bits, &x[i], sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

// A message's bytes on the wire, by its table blocks: each block's own,
// and the rest of the message (its other fields, the blocks' tags and
// lengths) with the first, so that they add up to the whole message.
std::vector<int64_t> WireShares(
    const google::protobuf::MessageLite& message,
    const google::protobuf::RepeatedPtrField<v1::TableRows>& blocks) {
  std::vector<int64_t> out;
  int64_t rest = static_cast<int64_t>(message.ByteSizeLong());
  for (const v1::TableRows& t : blocks) {
    out.push_back(static_cast<int64_t>(t.ByteSizeLong()));
    rest -= out.back();
  }
  if (!out.empty()) out[0] += rest;
  return out;
}

// A request's table blocks as SparseTables::CheckRequest sees them (the
// count checked before the list is made of it).
absl::StatusOr<std::vector<SparseTables::Block>> BlocksOf(
    const google::protobuf::RepeatedPtrField<v1::TableRows>& tables,
    absl::string_view what) {
  if (tables.size() > SparseTables::kMaxBlocksPerMessage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a ", what, " of rows in ", tables.size(), " table blocks; at most ",
        SparseTables::kMaxBlocksPerMessage, " a request"));
  }
  std::vector<SparseTables::Block> blocks;
  blocks.reserve(tables.size());
  for (const v1::TableRows& t : tables)
    blocks.push_back({t.table(), t.rows().data(), t.rows_size()});
  return blocks;
}

// A pull's rows: kInvalidArgument unless the job has tables here (`tables`
// not null) and SparseTables::CheckRequest lets the request's rows in.
absl::Status CheckPullRequest(const SparseTables* tables,
                              const v1::PullRowsRequest& req) {
  if (tables == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", Quoted(req.job_id()),
                     " has no embedding tables (model.embeddings)"));
  }
  TALLY_ASSIGN_OR_RETURN(std::vector<SparseTables::Block> blocks,
                         BlocksOf(req.tables(), "pull"));
  return tables->CheckRequest(blocks, "pull");
}

}  // namespace

ParameterShard::ParameterShard(std::vector<float> weights,
                               std::unique_ptr<Optimizer> optimizer,
                               const Clock* clock)
    : num_params_(static_cast<int64_t>(weights.size())), clock_(clock) {
  absl::MutexLock lock(&mu_);
  optimizer_ = std::move(optimizer);
  weights_ = std::make_shared<std::vector<float>>(std::move(weights));
}

ShardState ParameterShard::Save(TableCapture* capture) const {
  absl::MutexLock lock(&mu_);
  if (capture != nullptr && tables_ != nullptr && !retired_) {
    capture->file = tables_->TakeSave(capture->base);
    capture->file.version = version_;
    capture->taken = true;
  }
  ShardState s;
  s.metrics = MetricsLocked();
  s.retired = retired_;
  s.weights = weights_;
  if (optimizer_ != nullptr) s.optimizer = optimizer_->SaveState();
  s.buffers = buffers_;
  return s;
}

void ParameterShard::SaveAt(
    int64_t v, absl::Time deadline,
    std::function<void(absl::StatusOr<ShardState>)> done,
    std::shared_ptr<TableCapture> capture) {
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
        waiters_.push_back({v, deadline,
                            [this, v, done, capture](absl::Status s) {
                              absl::StatusOr<ShardState> state =
                                  s.ok() ? absl::StatusOr<ShardState>(
                                               Save(capture.get()))
                                         : absl::StatusOr<ShardState>(s);
                              Ready ready;
                              {
                                absl::MutexLock lock(&mu_);
                                save_at_.erase(save_at_.find(v));
                                MaybeCloseLocked(&ready);
                              }
                              RunReady(ready);
                              done(std::move(state));
                            },
                            /*worker_id=*/""});
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
  absl::StatusOr<ShardState> state = Save(capture.get());
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    save_at_.erase(save_at_.find(v));
    MaybeCloseLocked(&ready);
  }
  RunReady(ready);
  done(std::move(state));
}

absl::StatusOr<std::unique_ptr<ParameterShard>> ParameterShard::Restore(
    const ShardState& state, std::unique_ptr<Optimizer> optimizer,
    const Clock* clock) {
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
    if (absl::Status s = fresh ? absl::OkStatus()
                               : optimizer->LoadState(state.optimizer);
        !s.ok()) {
      return s;
    }
  }
  auto shard = std::make_unique<ParameterShard>(*state.weights,
                                                std::move(optimizer), clock);
  {
    absl::MutexLock lock(&shard->mu_);
    const ShardMetrics& m = state.metrics;
    shard->version_ = m.version;
    shard->total_steps_ = m.total_steps;
    shard->steps_per_epoch_ = m.steps_per_epoch;
    shard->samples_total_ = m.samples;
    shard->rejected_ = m.rejected_pushes;
    shard->last_loss_ = m.loss;
    shard->last_accuracy_ = m.accuracy;
    shard->buffers_ = state.buffers;
    if (m.total_steps > 0) {
      // Training time goes on from where it was.
      const absl::Time now = clock->Now();
      shard->started_ = now - absl::Seconds(m.train_seconds);
      if (m.version >= m.total_steps) shard->finished_ = now;
    }
  }
  if (state.retired) shard->Retire();
  return shard;
}

bool ParameterShard::RequiredLocked(const Member& m, int64_t step) const {
  return m.spec.join_step <= step && step < m.spec.leave_step;
}

void ParameterShard::ReleaseLocked(std::unique_ptr<std::vector<float>> b) {
  if (b == nullptr) return;
  --staging_out_;
  PoolLocked(std::move(b));
}

void ParameterShard::PoolLocked(std::unique_ptr<std::vector<float>> b) {
  // As many as a step stages (a push a member), within 256 MiB: a step's
  // buffers come back for the next instead of being freed and made again,
  // zeroed, by the hundred (bench/swarm.sh: 256 members).
  constexpr int64_t kPoolBytes = int64_t{256} << 20;
  const size_t by_bytes = static_cast<size_t>(
      std::max<int64_t>(8, kPoolBytes / std::max<int64_t>(1, 4 * num_params_)));
  if (!retired_ && staging_pool_.size() < std::min(members_.size() + 8, by_bytes))
    staging_pool_.push_back(std::move(b));
}

void ParameterShard::UnstageLocked(Member& m) {
  for (auto& [step, st] : m.staged) ReleaseLocked(std::move(st.grads));
  m.staged.clear();
  m.buffers.clear();
}

void ParameterShard::KeepBuffersLocked(const PushMeta& meta) {
  if (meta.buffers != nullptr)
    members_.at(meta.worker_id).buffers[meta.step] = meta.buffers;
}

void ParameterShard::TakeBuffersLocked(const std::vector<Member*>& required) {
  if (buffer_bytes_ == 0) return;
  for (Member* m : required) {
    // A push that counts as nothing had its buffers dropped with it.
    const bool counted = m->committed_step >= version_;
    auto it = m->buffers.find(version_);
    if (counted && it != m->buffers.end()) {
      buffers_ = it->second;
      break;
    }
  }
  for (auto& [id, m] : members_) {
    m.buffers.erase(m.buffers.begin(), m.buffers.upper_bound(version_));
  }
}

float ParameterShard::ScaleLocked(int64_t tau) const {
  if (consistency_.lr_scaling != LrScaling::kStaleness || tau <= 1) return 1.0f;
  return 1.0f / static_cast<float>(tau);
}

void ParameterShard::SetConsistency(const ConsistencySpec& consistency) {
  absl::MutexLock lock(&mu_);
  consistency_ = consistency;
}

void ParameterShard::SetMembersLocked(const std::vector<MemberSpec>& members,
                                      Ready* ready) {
  std::map<std::string, Member> next;
  std::set<std::string> seen;
  for (const MemberSpec& spec : members) {
    if (!seen.insert(spec.worker_id).second) continue;  // the first stands
    Member& m = next[spec.worker_id];
    auto old = members_.find(spec.worker_id);
    const bool known = old != members_.end() &&
                       old->second.spec.incarnation == spec.incarnation;
    if (known) m = std::move(old->second);  // progress and staged pushes go on
    m.spec = spec;
    const bool leaves = spec.leave_step != MemberSpec::kNoStep;
    if (consistency_.mode == ConsistencyMode::kAsync && leaves) {
      // Out at once. Its commits reach the job's shards one pull at a
      // time, so this shard misses at most its last one, which another
      // shard had: that push is one version here as there (as nothing if
      // it was refused somewhere). A leaver unknown here changes nothing.
      if (known && m.committed_step < spec.leave_step - 1) {
        Staged st;
        auto it = m.staged.find(spec.leave_step - 1);
        if (it != m.staged.end()) {
          if (!spec.last_refused) st = std::move(it->second);
          ReleaseLocked(std::move(it->second.grads));
          m.staged.erase(it);
        }
        apply_queue_.push_back(std::move(st));
      }
      UnstageLocked(m);
      next.erase(spec.worker_id);
      continue;
    }
    for (auto it = m.staged.lower_bound(spec.leave_step);
         it != m.staged.end();) {
      // Pushed past its last step: not counted anywhere.
      ReleaseLocked(std::move(it->second.grads));
      it = m.staged.erase(it);
    }
    if (leaves && m.committed_step < spec.leave_step - 1) {
      // Its last step counts as committed: another shard had its commit,
      // so its push reached every shard, this one included (staged here,
      // or refused here and so contributing nothing), unless that commit
      // said it was refused somewhere.
      auto it = m.staged.find(spec.leave_step - 1);
      if (spec.last_refused && it != m.staged.end()) {
        ReleaseLocked(std::move(it->second.grads));
        m.staged.erase(it);
      }
      if (spec.last_refused) m.buffers.erase(spec.leave_step - 1);
      m.committed_step = spec.leave_step - 1;
      m.last_refused = spec.last_refused;
    }
  }
  for (auto& [id, m] : members_) {
    if (!next.count(id) || next[id].spec.incarnation != m.spec.incarnation)
      UnstageLocked(m);
  }
  members_ = std::move(next);
  CheckPartsLocked(ready);
}

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
    if (plan.plan > 0)
      TALLY_RETURN_IF_ERROR(SetPlanLocked(plan.plan, plan.total_steps));
    SetMembersLocked(members, &ready);
    if (hold_id != 0) hold_id_ = 0;
    MaybeCloseLocked(&ready);
  }
  RunReady(ready);
  return absl::OkStatus();
}

std::vector<MemberSpec> ParameterShard::Members() const {
  absl::MutexLock lock(&mu_);
  std::vector<MemberSpec> out;
  for (const auto& [id, m] : members_) out.push_back(m.spec);
  return out;
}

std::vector<MemberProgress> ParameterShard::Progress() const {
  absl::MutexLock lock(&mu_);
  std::vector<MemberProgress> out;
  for (const auto& [id, m] : members_) {
    out.push_back({id, m.spec.incarnation, m.pushed_step, m.committed_step,
                   m.clock, m.waiting, m.last_refused});
  }
  return out;
}

HoldReport ParameterShard::Hold(int64_t hold_id, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  hold_id_ = hold_id;
  hold_deadline_ = deadline;
  HoldReport r;
  r.version = version_;
  // With each member's clock: an async job's joiners start past them all.
  for (const auto& [id, m] : members_) {
    r.members.push_back({id, m.spec.incarnation, m.pushed_step,
                         m.committed_step, m.clock, m.waiting,
                         m.last_refused});
  }
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
    for (const auto& [id, m] : members_) {
      if ((m.pushed_step >= version_ || parts_.count(id) > 0) &&
          consistency_.mode != ConsistencyMode::kAsync)
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
    SetMembersLocked(specs, &ready);
  }
  RunReady(ready);
}

void ParameterShard::RemoveMember(const std::string& worker_id) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    std::vector<MemberSpec> specs;
    for (const auto& [id, m] : members_) {
      if (id == worker_id) {
        // Out from the open step, unless it already committed it (async:
        // out at once; what it committed is queued already).
        MemberSpec spec = m.spec;
        if (consistency_.mode != ConsistencyMode::kAsync &&
            m.committed_step >= version_) {
          spec.leave_step = version_ + 1;
          specs.push_back(spec);
        }
        continue;
      }
      specs.push_back(m.spec);
    }
    SetMembersLocked(specs, &ready);
    MaybeCloseLocked(&ready);
  }
  RunReady(ready);
}

bool ParameterShard::IsMember(const std::string& worker_id,
                              int64_t incarnation) const {
  return CheckMember(worker_id, incarnation).ok();
}

void ParameterShard::SetMaxSamples(int64_t max_samples) {
  absl::MutexLock lock(&mu_);
  max_samples_ = max_samples;
}

void ParameterShard::SetBufferBytes(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  buffer_bytes_ = bytes;
}

absl::Status ParameterShard::SetSchedule(int64_t total_steps,
                                         int64_t steps_per_epoch,
                                         const std::string& fingerprint,
                                         int64_t plan) {
  if (total_steps <= 0 || steps_per_epoch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("total_steps and steps_per_epoch must be positive, got ",
                     total_steps, " and ", steps_per_epoch));
  }
  absl::MutexLock lock(&mu_);
  if (total_steps_ == 0) {
    plan_ = plan;  // the first: the coordinator's, at install
  } else if (plan < plan_) {
    return WithReason(
        absl::AbortedError(absl::StrCat(
            "the job's plan changed (plan ", plan_, ", this worker's ", plan,
            "): a worker joined; take the new plan and pull again")),
        v1::PLAN_CHANGED, plan_);
  } else if (plan > plan_) {
    return absl::UnavailableError(absl::StrCat(
        "the job's plan ", plan, " has not reached this shard yet (it has ",
        plan_, "): pull again"));
  }
  if (!fingerprint.empty() && !data_fingerprint_.empty() &&
      data_fingerprint_ != fingerprint) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "this worker's dataset files (", fingerprint,
            ") differ from the job's (", data_fingerprint_,
            "): every worker must read the same files")),
        v1::SCHEDULE_MISMATCH);
  }
  if (total_steps_ != 0 &&
      (total_steps_ != total_steps || steps_per_epoch_ != steps_per_epoch)) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "this worker's schedule (", total_steps, " steps, ",
            steps_per_epoch, " per epoch) differs from the job's (",
            total_steps_, ", ", steps_per_epoch_,
            "): does this worker see another dataset?")),
        v1::SCHEDULE_MISMATCH);
  }
  total_steps_ = total_steps;
  steps_per_epoch_ = steps_per_epoch;
  if (data_fingerprint_.empty()) data_fingerprint_ = fingerprint;
  return absl::OkStatus();
}

void ParameterShard::InstallPlan(int64_t plan) {
  absl::MutexLock lock(&mu_);
  plan_ = plan;
}

absl::Status ParameterShard::SetPlan(int64_t plan, int64_t total_steps) {
  absl::MutexLock lock(&mu_);
  return SetPlanLocked(plan, total_steps);
}

absl::Status ParameterShard::SetPlanLocked(int64_t plan, int64_t total_steps) {
  if (plan <= plan_) return absl::OkStatus();
  if (total_steps <= version_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan ", plan, " ends at version ", total_steps,
        ", which this range has passed (", version_, ")"));
  }
  plan_ = plan;
  total_steps_ = total_steps;
  if (optimizer_ != nullptr) optimizer_->set_total_steps(total_steps);
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckMember(const std::string& worker_id,
                                         int64_t incarnation) const {
  absl::MutexLock lock(&mu_);
  return CheckMemberLocked(worker_id, incarnation);
}

absl::Status ParameterShard::CheckMemberLocked(const std::string& worker_id,
                                               int64_t incarnation) const {
  if (retired_) {
    return WithReason(absl::FailedPreconditionError("the job has ended"),
                      v1::JOB_ENDED);
  }
  auto it = members_.find(worker_id);
  if (it == members_.end()) {
    return WithReason(absl::PermissionDeniedError(absl::StrCat(
                          "worker ", Quoted(worker_id),
                          " is not a member of this job (lease lost?)")),
                      v1::NOT_A_MEMBER);
  }
  if (it->second.spec.incarnation != incarnation) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "stale incarnation ", incarnation, " of worker ", Quoted(worker_id),
            " (current ", it->second.spec.incarnation, ")")),
        v1::REGISTER_AGAIN);
  }
  if (it->second.spec.leave_step <= version_) {
    return WithReason(
        absl::PermissionDeniedError(absl::StrCat("worker ", Quoted(worker_id),
                                                 " left this job at step ",
                                                 it->second.spec.leave_step)),
        v1::NOT_A_MEMBER);
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckPushLocked(const PushMeta& meta,
                                             bool* duplicate) const {
  *duplicate = false;
  if (absl::Status s = CheckMemberLocked(meta.worker_id, meta.incarnation);
      !s.ok()) {
    return s;
  }
  if (meta.samples < 0) {
    return absl::InvalidArgumentError("samples must not be negative");
  }
  if (max_samples_ > 0 && meta.samples > max_samples_) {
    return absl::InvalidArgumentError(
        absl::StrCat("samples ", meta.samples, " is over the job's batch size ",
                     max_samples_));
  }
  if (meta.buffers != nullptr &&
      static_cast<int64_t>(meta.buffers->size()) != buffer_bytes_) {
    return absl::InvalidArgumentError(
        buffer_bytes_ == 0
            ? std::string("this range keeps no buffers (a Python model's go "
                          "to the range at offset 0)")
            : absl::StrCat("buffers of ", meta.buffers->size(),
                           " bytes; the job's are ", buffer_bytes_));
  }
  const Member& m = members_.at(meta.worker_id);
  return consistency_.mode == ConsistencyMode::kAsync
             ? CheckAsyncPushLocked(meta, m, duplicate)
             : CheckStepPushLocked(meta, m, duplicate);
}

absl::Status ParameterShard::StaleLocked(const PushMeta& meta,
                                         int64_t staleness) const {
  ++stale_;
  return WithReason(
      absl::AbortedError(absl::StrCat(
          "the push was computed from version ", meta.base_version,
          ", staleness ", staleness, " > max_staleness ",
          consistency_.max_staleness, "; refused and counted: pull and go on")),
      v1::STALE_GRADIENT, version_);
}

// Async: a member's steps are its own clock; every push is applied alone.
absl::Status ParameterShard::CheckAsyncPushLocked(const PushMeta& meta,
                                                  const Member& m,
                                                  bool* duplicate) const {
  if (meta.step <= m.pushed_step) {
    *duplicate = true;
    return absl::OkStatus();
  }
  if (EndedLocked()) {
    return WithReason(absl::AbortedError(absl::StrCat(
                          "the training is over at version ", version_)),
                      v1::STEP_CLOSED, version_);
  }
  if (meta.base_version < 0 || meta.base_version > version_) {
    return absl::InvalidArgumentError(
        absl::StrCat("async: base version ", meta.base_version,
                     " is not one this shard served (at ", version_, ")"));
  }
  const int64_t tau = version_ - meta.base_version;
  const int64_t max_stale = consistency_.max_staleness;
  if (max_stale >= 0 && tau > max_stale) return StaleLocked(meta, tau);
  return absl::OkStatus();
}

// bsp and ssp: the push's step against the open ones, its base version
// against the step.
absl::Status ParameterShard::CheckStepPushLocked(const PushMeta& meta,
                                                 const Member& m,
                                                 bool* duplicate) const {
  if (meta.step < version_ && m.pushed_step >= meta.step) {
    *duplicate = true;
    return absl::OkStatus();
  }
  // A step that closed without this push, or one that will never open (the
  // training is over): either way, the next thing to do is to pull.
  if (meta.step < version_ || EndedLocked()) {
    if (meta.step < version_ && RequiredLocked(m, meta.step)) ++late_;
    return WithReason(
        absl::AbortedError(absl::StrCat("step ", meta.step,
                                        " is closed; the weights are at "
                                        "version ",
                                        version_, ": pull and go on")),
        v1::STEP_CLOSED, version_);
  }
  const int64_t window =
      consistency_.mode == ConsistencyMode::kSsp ? consistency_.staleness : 0;
  if (meta.step > version_ + window) {
    // ABORTED: redo at a higher level (pull this step, compute it again).
    return WithReason(
        absl::AbortedError(absl::StrCat(
            "step ", meta.step, " is not open yet (open: ", version_,
            window > 0 ? absl::StrCat(" to ", version_ + window) : "", ")")),
        v1::STEP_NOT_OPEN, version_);
  }
  if (meta.base_version > meta.step || meta.base_version < meta.step - window ||
      meta.base_version > version_) {
    return absl::InvalidArgumentError(
        window == 0
            ? absl::StrCat("bsp: a push for step ", meta.step,
                           " must be computed from version ", meta.step,
                           ", not ", meta.base_version)
            : absl::StrCat("ssp(", window, "): a push for step ", meta.step,
                           " must be computed from a version in [",
                           meta.step - window, ", ",
                           std::min(meta.step, version_), "], not ",
                           meta.base_version));
  }
  const int64_t max_stale = consistency_.max_staleness;
  if (max_stale >= 0 && meta.step - meta.base_version > max_stale)
    return StaleLocked(meta, meta.step - meta.base_version);
  if (m.spec.join_step > meta.step) {
    return WithReason(absl::AbortedError(absl::StrCat(
                          "worker ", meta.worker_id, " joins at step ",
                          m.spec.join_step, "; pull that version first")),
                      v1::JOIN_LATER, m.spec.join_step);
  }
  if (m.pushed_step >= meta.step) *duplicate = true;
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckPush(const PushMeta& meta,
                                       bool* duplicate) const {
  absl::MutexLock lock(&mu_);
  return CheckPushLocked(meta, duplicate);
}

absl::Status ParameterShard::Accept(const PushMeta& meta,
                                    std::unique_ptr<std::vector<float>> grads,
                                    bool* duplicate) {
  Ready ready;
  absl::Status s;
  {
    absl::MutexLock lock(&mu_);
    s = AcceptLocked(meta, std::move(grads), duplicate, &ready);
  }
  RunReady(ready);
  return s;
}

absl::Status ParameterShard::AcceptLocked(
    const PushMeta& meta, std::unique_ptr<std::vector<float>> grads,
    bool* duplicate, Ready* ready) {
  absl::Status s = CheckPushLocked(meta, duplicate);
  if (!s.ok() || *duplicate) {
    ReleaseLocked(std::move(grads));
    return s;
  }
  if (meta.samples > 0 &&
      (grads == nullptr ||
       static_cast<int64_t>(grads->size()) != num_params_)) {
    if (grads != nullptr) --staging_out_;  // not ours to keep
    return absl::InvalidArgumentError("a push with samples needs a gradient");
  }
  Member& m = members_.at(meta.worker_id);
  if (meta.samples > 0 && StreamedLocked()) {
    // A whole push in a streamed sum: kept until its turn comes.
    if (m.committed_step >= meta.step) {
      ReleaseLocked(std::move(grads));
      return absl::InvalidArgumentError(
          absl::StrCat("a push of step ", meta.step, " after its commit"));
    }
    KeepBuffersLocked(meta);
    DropPartLocked(meta.worker_id, ready);
    RestartIfLateLocked(meta.worker_id, ready);
    SumPart& part = parts_[meta.worker_id];
    part.incarnation = meta.incarnation;
    part.samples = meta.samples;
    part.loss_sum = meta.loss_sum;
    part.correct = meta.correct;
    part.weight = static_cast<float>(meta.samples) *
                  ScaleLocked(version_ - meta.base_version);
    part.complete = true;
    part.whole = std::move(grads);
    m.pushed_step = meta.step;
    m.push_again = -1;
    NoteLocked(meta.step, /*commit=*/false);
    ProgressLocked(ready);
    return absl::OkStatus();
  }
  KeepBuffersLocked(meta);
  m.pushed_step = meta.step;
  NoteLocked(meta.step, /*commit=*/false);
  Staged& st = m.staged[meta.step];
  ReleaseLocked(std::move(st.grads));
  st = Staged{};
  st.base = meta.base_version;
  if (meta.samples > 0) {
    st.grads = std::move(grads);
    st.samples = meta.samples;
    st.loss_sum = meta.loss_sum;
    st.correct = meta.correct;
  } else {
    ReleaseLocked(std::move(grads));
  }
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

bool ParameterShard::Commit(const std::string& worker_id, int64_t incarnation,
                            int64_t step, bool contributed) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (!CheckMemberLocked(worker_id, incarnation).ok()) return true;
    Member& m = members_.at(worker_id);
    if (m.committed_step >= step) return true;  // settled already
    if (consistency_.mode == ConsistencyMode::kAsync) {
      if (hold_id_ != 0) return false;
      // (A push refused on some shard, too stale there, is committed as
      // nothing; it may never have been staged here.)
      if (EndedLocked() || (contributed && step > m.pushed_step)) return true;
      QueueCommittedLocked(m, step, contributed);
    } else {
      const int64_t window = consistency_.mode == ConsistencyMode::kSsp
                                 ? consistency_.staleness
                                 : 0;
      // Settled already, or nonsense.
      if (step < version_ || step > version_ + window) return true;
      if (!RequiredLocked(m, step)) return true;
      // Its push is no longer in the sum: it pushes again first (the pull
      // that carries this commit is told so), unless it says the push
      // counts as nothing anyway (another shard refused it).
      if (m.push_again == step) {
        if (contributed) return true;
        m.push_again = -1;
      }
      auto it = m.staged.find(step);
      if (it != m.staged.end() && !contributed) {
        ReleaseLocked(std::move(it->second.grads));
        m.staged.erase(it);
      }
      if (!contributed) {
        m.buffers.erase(step);
        // Nor its rows (under ssp a later step's commit may come before
        // this one closes, and last_refused is that step's).
        m.rows.erase(step);
      }
      m.committed_step = step;
      m.last_refused = !contributed;
      NoteLocked(step, /*commit=*/true);
      if (StreamedLocked()) {
        // Refused on another shard: out of the sum here too. Either way a
        // lower rank that is settled may let others' blocks in.
        if (!contributed) DropPartLocked(worker_id, &ready);
        ProgressLocked(&ready);
      }
    }
    MaybeCloseLocked(&ready);
  }
  RunReady(ready);
  return true;
}

void ParameterShard::QueueCommittedLocked(Member& m, int64_t step,
                                          bool contributed) {
  // Its push of `step` is one version, whatever it holds; pushes it
  // abandoned before (never committed) go.
  Staged st;
  for (auto it = m.staged.begin();
       it != m.staged.end() && it->first <= step;) {
    if (it->first == step && contributed) {
      st = std::move(it->second);
    } else {
      ReleaseLocked(std::move(it->second.grads));
    }
    it = m.staged.erase(it);
  }
  auto b = m.buffers.find(step);
  if (contributed && b != m.buffers.end()) {
    st.buffers = b->second;
    st.rank = m.spec.rank;
  }
  m.buffers.erase(m.buffers.begin(), m.buffers.upper_bound(step));
  apply_queue_.push_back(std::move(st));
  m.committed_step = step;
  m.last_refused = !contributed;
}

void ParameterShard::Reject(const PushMeta& meta) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    ++rejected_;
    bool duplicate = false;
    if (!CheckPushLocked(meta, &duplicate).ok() || duplicate) return;
    Member& m = members_.at(meta.worker_id);
    // Settled as nothing; the commit still comes.
    auto it = m.staged.find(meta.step);
    if (it != m.staged.end()) {
      ReleaseLocked(std::move(it->second.grads));
      m.staged.erase(it);
    }
    m.buffers.erase(meta.step);
    m.rows.erase(meta.step);
    m.pushed_step = std::max(m.pushed_step, meta.step);
    if (StreamedLocked() && meta.step == version_) {
      DropPartLocked(meta.worker_id, &ready);
      ProgressLocked(&ready);
    }
  }
  RunReady(ready);
}

void ParameterShard::MaybeCloseLocked(Ready* ready) {
  const int64_t before = version_;
  while (!retired_ && hold_id_ == 0 &&
         (save_at_.empty() || version_ < *save_at_.begin()) && !EndedLocked()) {
    if (consistency_.mode != ConsistencyMode::kAsync) {
      if (!CloseStepLocked(ready)) break;
      NotePublishedLocked(version_ - 1, ready);
      continue;
    }
    if (apply_queue_.empty()) break;
    Staged st = std::move(apply_queue_.front());
    apply_queue_.pop_front();
    int64_t samples = 0;
    if (st.grads != nullptr && st.samples > 0) {
      // One push is its own step: its mean gradient, scaled by staleness.
      const float scale = ScaleLocked(version_ - st.base);
      if (ScaleFinite(st.grads->data(), scale, num_params_)) {
        samples = st.samples;
      } else {
        ++rejected_;
        st.buffers.reset();  // not applied: nor are its buffers
      }
    }
    if (st.buffers != nullptr) {
      // From the lowest rank still a member (rank 0 may have left).
      bool lowest = true;
      for (const auto& [id, m] : members_) lowest &= m.spec.rank >= st.rank;
      if (lowest) buffers_ = std::move(st.buffers);
    }
    AdvanceLocked(samples, st.loss_sum, st.correct,
                  samples > 0 ? st.grads->data() : nullptr);
    ReleaseLocked(std::move(st.grads));
    // The rows were stepped as they came; a version is a step for the
    // tables' eviction.
    if (tables_ != nullptr) tables_->EndStep(version_);
  }
  if (EndedLocked()) {
    // Nothing more is applied: pushes still queued go.
    for (Staged& st : apply_queue_) ReleaseLocked(std::move(st.grads));
    apply_queue_.clear();
  }
  if (version_ == before) return;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->version <= version_) {
      ready->emplace_back(std::move(it->done), absl::OkStatus());
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

bool ParameterShard::CloseStepLocked(Ready* ready) {
  std::vector<Member*> required;
  if (!ReadyToCloseLocked(&required)) return false;
  int64_t samples = 0, correct = 0;
  double loss = 0.0;
  // Streamed: the sum is made already (sum_). Staged: it is made in the
  // first contributing push's own buffer (no buffer of its own), and then
  // scaled there into the mean.
  const bool streamed = StreamedLocked();
  std::unique_ptr<std::vector<float>> staged_sum;
  float* sum = nullptr;
  if (streamed) {
    if (!TallyStreamedLocked(required, &samples, &loss, &correct, ready))
      return false;
    sum = sum_->data();
  } else {
    staged_sum = SumStagedLocked(required, &samples, &loss, &correct);
    if (staged_sum != nullptr) sum = staged_sum->data();
  }
  for (auto& [id, m] : members_) {
    for (auto it = m.staged.begin();
         it != m.staged.end() && it->first <= version_;) {
      ReleaseLocked(std::move(it->second.grads));
      it = m.staged.erase(it);
    }
  }
  if (samples > 0 && !ScaleFinite(sum, 1.0f / samples, num_params_)) {
    // The step's mean is not finite: it is not applied (the weights stay
    // as they are), and it is counted with the refused pushes.
    ++rejected_;
    samples = 0;
    for (Member* m : required) m->buffers.erase(version_);  // nor its buffers
  }
  if (tables_ != nullptr) ApplyRowsLocked(required, samples);
  TakeBuffersLocked(required);
  NoteClosedLocked(required, samples);
  AdvanceLocked(samples, loss, correct, samples > 0 ? sum : nullptr);
  ReleaseLocked(std::move(staged_sum));  // sum_ stays for the next step
  // Members whose last step this was are done here.
  for (auto it = members_.begin(); it != members_.end();) {
    if (it->second.spec.leave_step <= version_) {
      UnstageLocked(it->second);
      it = members_.erase(it);
    } else {
      ++it;
    }
  }
  if (streamed) ProgressLocked(ready);  // blocks of the next step may wait
  return true;
}

void ParameterShard::NoteClosedLocked(const std::vector<Member*>& required,
                                      int64_t samples) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (const Member* m : required) {
    const std::string key =
        absl::StrCat(m->spec.worker_id, "/", m->spec.incarnation, "\n");
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  }
  const int n = static_cast<int>(required.size());
  if (!spans_.empty() && spans_.back().end_step == version_ &&
      spans_.back().members_hash == h && spans_.back().members == n) {
    spans_.back().end_step = version_ + 1;
    spans_.back().samples += samples;
    return;
  }
  spans_.push_back({version_, version_ + 1, n, h, samples});
  if (spans_.size() > kMaxSpans) spans_.pop_front();
}

std::vector<ParameterShard::ClosedSpan> ParameterShard::ClosedSpans() const {
  absl::MutexLock lock(&mu_);
  return {spans_.begin(), spans_.end()};
}

void ParameterShard::SetPublishObserver(
    std::function<void(const PublishTimes&)> observer) {
  absl::MutexLock lock(&mu_);
  publish_observer_ = std::move(observer);
}

void ParameterShard::NoteLocked(int64_t step, bool commit) {
  if (consistency_.mode == ConsistencyMode::kAsync || step < version_) return;
  LastArrivals& at = last_at_[step];
  (commit ? at.commit : at.push) = clock_->Now();
}

void ParameterShard::NotePublishedLocked(int64_t closed, Ready* ready) {
  auto it = last_at_.find(closed);
  if (it != last_at_.end() && publish_observer_ != nullptr &&
      it->second.push != absl::InfinitePast()) {
    const absl::Time now = clock_->Now();
    PublishTimes t;
    t.since_push = absl::ToDoubleSeconds(now - it->second.push);
    t.since_commit = absl::ToDoubleSeconds(
        now - std::max(it->second.commit, it->second.push));
    ready->emplace_back(
        [observer = publish_observer_, t](const absl::Status&) { observer(t); },
        absl::OkStatus());
  }
  last_at_.erase(last_at_.begin(), last_at_.upper_bound(closed));
}

bool ParameterShard::ReadyToCloseLocked(std::vector<Member*>* required) {
  int64_t committed = 0;
  for (auto& [id, m] : members_) {
    if (!RequiredLocked(m, version_)) continue;
    required->push_back(&m);
    if (m.committed_step >= version_) ++committed;
  }
  if (required->empty()) return false;  // nobody to close it with
  // bsp with backup workers: all but b suffice (at least one).
  const int64_t backups = consistency_.mode == ConsistencyMode::kBsp
                              ? consistency_.backup_workers
                              : 0;
  const int64_t need =
      std::max<int64_t>(1, static_cast<int64_t>(required->size()) - backups);
  if (committed < need) return false;  // still waiting
  // In the order of summation.
  std::sort(required->begin(), required->end(), [](Member* a, Member* b) {
    return a->spec.rank != b->spec.rank ? a->spec.rank < b->spec.rank
                                        : a->spec.worker_id < b->spec.worker_id;
  });
  return true;
}

std::unique_ptr<std::vector<float>> ParameterShard::SumStagedLocked(
    const std::vector<Member*>& required, int64_t* samples, double* loss,
    int64_t* correct) {
  std::unique_ptr<std::vector<float>> sum;
  for (Member* m : required) {
    auto it = m->staged.find(version_);
    if (m->committed_step < version_) {
      // A backup: its push of this step, if any, is late.
      if (it != m->staged.end()) {
        ++late_;
        ReleaseLocked(std::move(it->second.grads));
        m->staged.erase(it);
      }
      continue;
    }
    if (it == m->staged.end() || it->second.grads == nullptr) continue;
    Staged& st = it->second;
    // Weighted by samples (and staleness), in rank order.
    const float w =
        static_cast<float>(st.samples) * ScaleLocked(version_ - st.base);
    if (sum == nullptr) {
      sum = std::move(st.grads);
      Scale(sum->data(), w, num_params_);
    } else {
      AddScaled(sum->data(), st.grads->data(), w, num_params_);
    }
    *samples += st.samples;
    *loss += st.loss_sum;
    *correct += st.correct;
  }
  return sum;
}

bool ParameterShard::TallyStreamedLocked(const std::vector<Member*>& required,
                                         int64_t* samples, double* loss,
                                         int64_t* correct, Ready* ready) {
  // Every committed member's push is whole and in the sum (it is, unless a
  // member committed a push it had not finished here: then the sum goes).
  for (Member* m : required) {
    auto it = parts_.find(m->spec.worker_id);
    if (it == parts_.end() || it->second.incarnation != m->spec.incarnation)
      continue;  // nothing from it here
    const SumPart& part = it->second;
    if (!part.complete || part.whole != nullptr ||
        part.added.covered() != num_params_) {
      ResetSumLocked("", ready);
      return false;
    }
    // In rank order, as the staged sum.
    *samples += part.samples;
    *loss += part.loss_sum;
    *correct += part.correct;
  }
  parts_.clear();
  ++sum_generation_;
  if (sum_ == nullptr) {  // a range of no elements
    sum_ = std::make_unique<std::vector<float>>(num_params_);
    ++staging_out_;
  }
  return true;
}

void ParameterShard::SetTables(std::shared_ptr<SparseTables> tables) {
  absl::MutexLock lock(&mu_);
  tables_ = std::move(tables);
}

std::shared_ptr<const SparseTables> ParameterShard::RetiredTables() const {
  absl::MutexLock lock(&mu_);
  if (!retired_) return nullptr;
  return tables_;
}

absl::Status ParameterShard::CheckPullRows(
    const v1::PullRowsRequest& req) const {
  std::shared_ptr<const SparseTables> tables;
  {
    absl::MutexLock lock(&mu_);
    TALLY_RETURN_IF_ERROR(
        CheckMemberLocked(req.worker_id(), req.incarnation()));
    tables = tables_;
  }
  // Outside the lock every push and pull of the range takes: the rows'
  // checks read only what the tables were made with.
  return CheckPullRequest(tables.get(), req);
}

absl::Status ParameterShard::ReadRows(const v1::PullRowsRequest& req,
                                      v1::PullRowsResponse* resp) {
  absl::MutexLock lock(&mu_);
  // Again after a wait: the member may have left meanwhile.
  TALLY_RETURN_IF_ERROR(CheckMemberLocked(req.worker_id(), req.incarnation()));
  TALLY_RETURN_IF_ERROR(CheckPullRequest(tables_.get(), req));
  resp->set_version(version_);
  for (const v1::TableRows& t : req.tables()) {
    v1::TableRows* out = resp->add_tables();
    out->set_table(t.table());
    *out->mutable_rows() = t.rows();
    std::string* bytes = out->mutable_values();
    bytes->resize(t.rows_size() * tables_->spec(t.table()).dim * 4);
    TALLY_RETURN_IF_ERROR(tables_->Read(t.table(), t.rows().data(),
                                        t.rows_size(),
                                        reinterpret_cast<float*>(bytes->data())));
  }
  const std::vector<int64_t> wire = WireShares(*resp, resp->tables());
  for (int i = 0; i < resp->tables_size(); ++i) {
    tables_->CountPull(resp->tables(i).table(), resp->tables(i).rows_size(),
                       wire[i]);
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::StageRows(const v1::PushRowsRequest& req,
                                       bool* replaced) {
  *replaced = false;
  absl::MutexLock lock(&mu_);
  TALLY_RETURN_IF_ERROR(CheckMemberLocked(req.worker_id(), req.incarnation()));
  if (tables_ == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", Quoted(req.job_id()),
                     " has no embedding tables (model.embeddings)"));
  }
  Member& m = members_.at(req.worker_id());
  TALLY_RETURN_IF_ERROR(CheckRowsStepLocked(m, req.step()));
  if (req.samples() < 0 || (max_samples_ > 0 && req.samples() > max_samples_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "samples ", req.samples(), " outside [0, ", max_samples_, "]"));
  }
  // Piece 0 first (it starts the member's rows of the step), then the
  // others in any order (a worker sends them at once), at most
  // kMaxRowPieces: the rows a member stages for a step stay bounded.
  auto has = m.rows.find(req.step());
  const bool started = has != m.rows.end() && has->second.pieces.count(0);
  if (req.piece() < 0 || req.piece() >= kMaxRowPieces ||
      (req.piece() > 0 && !started)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "piece ", req.piece(), " of a push of rows (piece 0 first, then up "
        "to ", kMaxRowPieces - 1, " more in any order; piece 0 ",
        started ? "came" : "has not come", ")"));
  }
  if (consistency_.tables_async || consistency_.mode == ConsistencyMode::kAsync)
    return StepRowsNowLocked(m, req);
  std::vector<RowGrads> blocks;
  TALLY_RETURN_IF_ERROR(DecodeRowGradsLocked(req, &blocks));
  StagedRows& staged = m.rows[req.step()];
  if (req.piece() == 0) {
    *replaced = !staged.pieces.empty();
    staged.pieces.clear();
    staged.samples = req.samples();
  }
  staged.pieces[req.piece()] = std::move(blocks);
  return absl::OkStatus();
}

absl::Status ParameterShard::StepRowsNowLocked(Member& m,
                                               const v1::PushRowsRequest& req) {
  // Each piece is stepped once: a retried one (its answer lost) is not
  // stepped again. What is kept is the mark, not the gradients.
  StagedRows& staged = m.rows[req.step()];
  if (staged.pieces.count(req.piece())) return absl::OkStatus();
  std::vector<RowGrads> blocks;
  TALLY_RETURN_IF_ERROR(DecodeRowGradsLocked(req, &blocks));
  staged.pieces[req.piece()];
  // Async has no closing step to drop the marks: a member's earlier
  // steps' go once it sends a later one's.
  m.rows.erase(m.rows.begin(), m.rows.find(req.step()));
  if (req.samples() <= 0) return absl::OkStatus();  // nothing to step
  // The member's rows are its batch's mean gradients already: each table
  // steps them alone (a row listed once a table in a request).
  for (const RowGrads& g : blocks) {
    tables_->Apply(g.table, g.rows.data(), static_cast<int64_t>(g.rows.size()),
                   g.grads.data(), version_);
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckRowsStepLocked(const Member& m,
                                                 int64_t step) const {
  if (consistency_.mode == ConsistencyMode::kAsync) {
    // A member's steps are its own clock: rows of a step it has not
    // pushed yet.
    if (EndedLocked()) {
      return WithReason(absl::AbortedError(absl::StrCat(
                            "the training is over at version ", version_)),
                        v1::STEP_CLOSED, version_);
    }
    if (step <= m.pushed_step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rows of step ", step, " after its push: send them before it"));
    }
    return absl::OkStatus();
  }
  // bsp: the open step; ssp: one of the open window's.
  const int64_t window =
      consistency_.mode == ConsistencyMode::kSsp ? consistency_.staleness : 0;
  if (EndedLocked() || step < version_) {
    return WithReason(absl::AbortedError(absl::StrCat(
                          "step ", step, " closed; the weights are at version ",
                          version_)),
                      v1::STEP_CLOSED, version_);
  }
  if (step > version_ + window) {
    return WithReason(absl::AbortedError(absl::StrCat(
                          "step ", step, " is not open; the weights are at ",
                          "version ", version_)),
                      v1::STEP_NOT_OPEN, version_);
  }
  if (m.spec.join_step > step) {
    return WithReason(
        absl::AbortedError(absl::StrCat("a member from step ",
                                        m.spec.join_step, " on")),
        v1::JOIN_LATER, m.spec.join_step);
  }
  if (m.committed_step >= step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rows of step ", step, " after its commit: send them before the push"));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::DecodeRowGradsLocked(
    const v1::PushRowsRequest& req, std::vector<RowGrads>* blocks) {
  {
    TALLY_ASSIGN_OR_RETURN(std::vector<SparseTables::Block> rows,
                           BlocksOf(req.tables(), "push"));
    TALLY_RETURN_IF_ERROR(tables_->CheckRequest(rows, "push"));
  }
  for (const v1::TableRows& t : req.tables()) {
    const EmbeddingTableSpec& spec = tables_->spec(t.table());
    const int64_t n = t.rows_size() * spec.dim;
    if (static_cast<int64_t>(t.values().size()) != n * 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", Quoted(spec.name), ": ", t.values().size(),
          " bytes of gradients for ", t.rows_size(), " rows of ", spec.dim,
          " values (", n * 4, " bytes)"));
    }
    RowGrads g;
    g.table = t.table();
    g.rows.assign(t.rows().begin(), t.rows().end());
    g.grads.resize(n);
    const int64_t bad =
        internal::CopyAndFindNonFinite(g.grads.data(), t.values().data(), n);
    if (bad >= 0) {
      ++rejected_;
      return WithReason(absl::InvalidArgumentError(absl::StrCat(
                            "table ", Quoted(spec.name), ": row ",
                            g.rows[bad / spec.dim], " has a non-finite gradient")),
                        v1::NON_FINITE);
    }
    blocks->push_back(std::move(g));
  }
  const std::vector<int64_t> wire = WireShares(req, req.tables());
  for (int i = 0; i < req.tables_size(); ++i) {
    tables_->CountPush(req.tables(i).table(), req.tables(i).rows_size(),
                       wire[i]);
  }
  return absl::OkStatus();
}

void ParameterShard::ApplyRowsLocked(const std::vector<Member*>& required,
                                     int64_t samples) {
  // Per table: each row's place in the sum, the rows in order of first
  // contribution, and the sum (dim a row).
  struct Sum {
    absl::flat_hash_map<int64_t, int64_t> at;
    std::vector<int64_t> rows;
    std::vector<float> values;
  };
  std::vector<Sum> sums(tables_->size());
  for (Member* m : required) {
    // Nothing to sum: the step contributes nothing, or its rows were
    // stepped as they came (tables: async).
    if (samples <= 0 || consistency_.tables_async) break;
    // A push that counted: committed as contributing (a backup's late or
    // missing one, or one refused on some range, does not).
    if (m->committed_step < version_ ||
        (m->committed_step == version_ && m->last_refused)) {
      continue;
    }
    auto it = m->rows.find(version_);
    if (it == m->rows.end()) continue;
    const float w = static_cast<float>(it->second.samples);
    for (const auto& [piece, blocks] : it->second.pieces)
    for (const RowGrads& g : blocks) {
      Sum& sum = sums[g.table];
      const int64_t dim = tables_->spec(g.table).dim;
      for (size_t i = 0; i < g.rows.size(); ++i) {
        auto [place, fresh] = sum.at.try_emplace(g.rows[i], sum.rows.size());
        const float* src = g.grads.data() + i * dim;
        if (fresh) {
          sum.rows.push_back(g.rows[i]);
          sum.values.resize(sum.values.size() + dim);
          PutScaled(sum.values.data() + place->second * dim, src, w, dim);
        } else {
          AddScaled(sum.values.data() + place->second * dim, src, w, dim);
        }
      }
    }
  }
  for (int t = 0; t < tables_->size(); ++t) {
    Sum& sum = sums[t];
    if (sum.rows.empty()) continue;
    if (!ScaleFinite(sum.values.data(), 1.0f / samples,
                     static_cast<int64_t>(sum.values.size()))) {
      ++rejected_;  // the table's mean overflowed: its rows stay
      continue;
    }
    tables_->Apply(t, sum.rows.data(), static_cast<int64_t>(sum.rows.size()),
                   sum.values.data(), version_);
  }
  tables_->EndStep(version_);
  for (auto& [id, m] : members_) {
    for (auto it = m.rows.begin(); it != m.rows.end() && it->first <= version_;)
      it = m.rows.erase(it);
  }
}

void ParameterShard::AdvanceLocked(int64_t samples, double loss,
                                   int64_t correct, const float* mean) {
  if (samples > 0) {
    // The weights are published as they are (pulls send from them): they
    // are stepped in place when nobody else holds them, which is the rule
    // in a steady job (every member pulled them before it pushed), and
    // copied first otherwise, into a spare buffer no reader holds.
    if (weights_.use_count() > 1) {
      std::shared_ptr<std::vector<float>> fresh;
      for (auto it = spare_weights_.begin(); it != spare_weights_.end(); ++it) {
        if (it->use_count() == 1) {
          fresh = std::move(*it);
          spare_weights_.erase(it);
          break;
        }
      }
      if (fresh == nullptr) {
        fresh = std::make_shared<std::vector<float>>(num_params_);
      }
      // Its last readers let go with a release decrement: their reads come
      // before the copy's writes.
      std::atomic_thread_fence(std::memory_order_acquire);
      std::copy(weights_->begin(), weights_->end(), fresh->begin());
      // Kept for reuse once its readers are done (a few at most).
      if (spare_weights_.size() < 2) spare_weights_.push_back(weights_);
      weights_ = std::move(fresh);
    }
    // Readers let go with a release decrement: their reads come before
    // the writes below.
    std::atomic_thread_fence(std::memory_order_acquire);
    optimizer_->Step(weights_->data(), mean);
    last_loss_ = loss / samples;
    last_accuracy_ = static_cast<double>(correct) / samples;
  }
  samples_total_ += samples;
  const absl::Time now = clock_->Now();
  closes_.emplace_back(now, samples_total_);
  // Keep about five seconds of history for the throughput figure.
  while (closes_.size() > 2 && now - closes_.front().first > absl::Seconds(5)) {
    closes_.erase(closes_.begin());
  }
  ++version_;
  if (version_ == total_steps_) finished_ = now;
}

void ParameterShard::RunReady(Ready& ready) {
  for (auto& [fn, status] : ready) fn(status);
}

absl::StatusOr<std::unique_ptr<std::vector<float>>>
ParameterShard::AcquireStaging() {
  {
    absl::MutexLock lock(&mu_);
    // Each member may have a push in flight and one staged per open step.
    const int window = consistency_.mode == ConsistencyMode::kSsp
                           ? static_cast<int>(consistency_.staleness)
                           : 0;
    const int limit = (2 + window) * static_cast<int>(members_.size()) + 4;
    if (staging_out_ >= limit) {
      return absl::ResourceExhaustedError(absl::StrCat(
          staging_out_, " pushes already in flight for this job (limit ", limit,
          ")"));
    }
    ++staging_out_;
    if (!staging_pool_.empty()) {
      auto b = std::move(staging_pool_.back());
      staging_pool_.pop_back();
      return b;
    }
  }
  return std::make_unique<std::vector<float>>(num_params_);
}

void ParameterShard::ReleaseStaging(
    std::unique_ptr<std::vector<float>> buffer) {
  if (buffer == nullptr) return;
  absl::MutexLock lock(&mu_);
  --staging_out_;
  PoolLocked(std::move(buffer));
}

int64_t ParameterShard::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

std::shared_ptr<const std::vector<float>> ParameterShard::Snapshot(
    int64_t* version, int64_t* total_steps,
    std::shared_ptr<const std::string>* buffers) const {
  absl::MutexLock lock(&mu_);
  if (version != nullptr) *version = version_;
  if (total_steps != nullptr) *total_steps = total_steps_;
  if (buffers != nullptr) *buffers = buffers_;
  return weights_;
}

std::shared_ptr<const std::vector<uint16_t>> ParameterShard::Bfloat16Of(
    const std::shared_ptr<const std::vector<float>>& snapshot,
    int64_t version) {
  {
    absl::MutexLock lock(&mu_);
    if (bf16_ != nullptr && bf16_version_ == version &&
        bf16_->size() == snapshot->size())
      return bf16_;
  }
  // Encoded outside the lock (pushes go on); two pulls of a fresh version
  // may both encode it, and the second keeps its own.
  auto encoded = std::make_shared<std::vector<uint16_t>>(snapshot->size());
  FloatToBfloat16(snapshot->data(), reinterpret_cast<char*>(encoded->data()),
                  static_cast<int64_t>(snapshot->size()));
  absl::MutexLock lock(&mu_);
  bf16_version_ = version;
  bf16_ = encoded;
  return encoded;
}

ShardMetrics ParameterShard::Metrics() const {
  absl::MutexLock lock(&mu_);
  return MetricsLocked();
}

ShardMetrics ParameterShard::MetricsLocked() const {
  ShardMetrics m;
  if (tables_ != nullptr) m.tables = tables_->Metrics();
  m.version = version_;
  m.total_steps = total_steps_;
  m.steps_per_epoch = steps_per_epoch_;
  m.loss = last_loss_;
  m.accuracy = last_accuracy_;
  m.samples = samples_total_;
  m.rejected_pushes = rejected_;
  m.stale_pushes = stale_;
  m.late_pushes = late_;
  m.sum_resets = sum_resets_;
  m.members = static_cast<int>(members_.size());
  if (started_ != absl::InfinitePast()) {
    const absl::Time end =
        finished_ != absl::InfinitePast() ? finished_ : clock_->Now();
    m.train_seconds = absl::ToDoubleSeconds(end - started_);
  }
  if (closes_.size() >= 2) {
    const double dt =
        absl::ToDoubleSeconds(closes_.back().first - closes_.front().first);
    if (dt > 0) {
      m.samples_per_sec = (closes_.back().second - closes_.front().second) / dt;
    }
  }
  return m;
}

void ParameterShard::WhenClock(const std::string& worker_id, int64_t clock,
                               int64_t min_version, absl::Time deadline,
                               std::function<void(absl::Status)> done) {
  int64_t v = min_version;
  {
    absl::MutexLock lock(&mu_);
    v = std::max(v, consistency_.FirstUsableVersion(clock));
    auto it = members_.find(worker_id);
    if (it != members_.end()) it->second.waiting = version_ < v;
  }
  WhenVersionFor(
      worker_id, v, deadline,
      [this, worker_id, clock, done = std::move(done)](absl::Status s) {
        {
          absl::MutexLock lock(&mu_);
          auto it = members_.find(worker_id);
          if (it != members_.end()) {
            it->second.waiting = false;
            if (s.ok()) {
              it->second.clock = consistency_.mode == ConsistencyMode::kAsync
                                     ? clock
                                     : std::max(clock, version_);
            }
          }
        }
        done(s);
      });
}

void ParameterShard::WhenVersion(int64_t v, absl::Time deadline,
                                 std::function<void(absl::Status)> done) {
  WhenVersionFor("", v, deadline, std::move(done));
}

void ParameterShard::WhenVersionFor(const std::string& worker_id, int64_t v,
                                    absl::Time deadline,
                                    std::function<void(absl::Status)> done) {
  absl::Status now;
  {
    absl::MutexLock lock(&mu_);
    now = closed_;
    auto m = worker_id.empty() ? members_.end() : members_.find(worker_id);
    if (now.ok() && m != members_.end() && m->second.push_again == version_ &&
        v > version_) {
      // It would wait for a step its push is no longer in (checked under
      // the lock that registers the wait: a drop tells the waiters it
      // finds).
      m->second.waiting = false;
      now = PushAgainLocked();
    } else if (now.ok()) {
      // Training time counts from the first pull of the weights.
      if (started_ == absl::InfinitePast() && !retired_)
        started_ = clock_->Now();
      if (version_ < v) {
        waiters_.push_back({v, deadline, std::move(done), worker_id});
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
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->deadline <= now) {
        ready.emplace_back(std::move(it->done),
                           absl::DeadlineExceededError(absl::StrCat(
                               "version ", it->version,
                               " not reached in time (at ", version_, ")")));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  RunReady(ready);
}

void ParameterShard::Retire() {
  std::vector<std::function<void()>> parked;
  {
    absl::MutexLock lock(&mu_);
    RetireLocked();
    parked.swap(parked_);
  }
  for (auto& wake : parked) wake();  // they find the job ended
}

void ParameterShard::RetireLocked() {
  for (auto& [id, part] : parts_) ReleaseLocked(std::move(part.whole));
  parts_.clear();
  ReleaseLocked(std::move(sum_));
  ++sum_generation_;
  for (auto& [id, m] : members_) UnstageLocked(m);
  for (Staged& st : apply_queue_) ReleaseLocked(std::move(st.grads));
  apply_queue_.clear();
  retired_ = true;
  if (tables_ != nullptr) tables_->Freeze();
  members_.clear();
  optimizer_.reset();
  spare_weights_.clear();  // weights_ keeps the final weights
  staging_pool_.clear();
  bf16_.reset();
}

void ParameterShard::Close(absl::Status why) {
  std::vector<std::function<void()>> parked;
  {
    absl::MutexLock lock(&mu_);
    closed_ = why;
    parked.swap(parked_);
  }
  for (auto& wake : parked) wake();  // they find the range closed
  CancelWaiters(why);
}

void ParameterShard::CancelWaiters(absl::Status why) {
  if (why.ok()) {
    why = WithReason(absl::FailedPreconditionError("the job ended"),
                     v1::JOB_ENDED);
  }
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    for (Waiter& w : waiters_) ready.emplace_back(std::move(w.done), why);
    waiters_.clear();
  }
  RunReady(ready);
}

// ------------------------------------------------------- streamed sums --

bool ParameterShard::StreamedLocked() const {
  if (!streamed_sums_ || retired_) return false;
  switch (consistency_.mode) {
    case ConsistencyMode::kAsync:
      return false;
    case ConsistencyMode::kSsp:
      return consistency_.staleness == 0;
    case ConsistencyMode::kBsp:
      return consistency_.backup_workers == 0;
  }
  return false;
}

bool ParameterShard::StreamsPushes() const {
  absl::MutexLock lock(&mu_);
  return StreamedLocked();
}

void ParameterShard::SetStreamedSums(bool on) {
  // The step's one sum, made (and its pages touched) now rather than by the
  // first push of the job, under the lock every other push of that step
  // waits on while their data piles up in the transport.
  // (After SetConsistency: a rule that stages needs none.)
  bool make = false;
  {
    absl::MutexLock lock(&mu_);
    streamed_sums_ = on;
    make = StreamedLocked() && sum_ == nullptr && staging_pool_.empty();
  }
  if (!make) return;
  auto sum = std::make_unique<std::vector<float>>(num_params_);
  absl::MutexLock lock(&mu_);
  if (sum_ == nullptr && staging_pool_.empty() && !retired_)
    staging_pool_.push_back(std::move(sum));
}

absl::Status ParameterShard::PushAgainLocked() const {
  return WithReason(
      absl::AbortedError(absl::StrCat(
          "the sum of step ", version_,
          " was dropped (a push in it could not count): push step ", version_,
          " again")),
      v1::PUSH_AGAIN, version_);
}

absl::StatusOr<int64_t> ParameterShard::BeginStreamed(const PushMeta& meta) {
  Ready ready;
  int64_t token = 0;
  {
    absl::MutexLock lock(&mu_);
    bool duplicate = false;
    TALLY_RETURN_IF_ERROR(CheckPushLocked(meta, &duplicate));
    // A duplicate (another stream finished it meanwhile) is answered as one
    // by AddStreamed and FinishStreamed.
    if (duplicate) return sum_generation_;
    if (!StreamedLocked() || meta.samples <= 0) {
      return absl::FailedPreconditionError("this push is not streamed");
    }
    Member& m = members_.at(meta.worker_id);
    if (m.committed_step >= meta.step) {
      return absl::InvalidArgumentError(
          absl::StrCat("a push of step ", meta.step, " after its commit"));
    }
    const float weight = static_cast<float>(meta.samples) *
                         ScaleLocked(version_ - meta.base_version);
    auto it = parts_.find(meta.worker_id);
    if (it != parts_.end()) {
      const SumPart& p = it->second;
      if (p.incarnation == meta.incarnation && p.samples == meta.samples &&
          p.weight == weight && p.loss_sum == meta.loss_sum &&
          p.correct == meta.correct && p.whole == nullptr) {
        return sum_generation_;  // the same push again: it goes on
      }
      // Another push of the step in its place: what the first added goes.
      DropPartLocked(meta.worker_id, &ready);
    }
    RestartIfLateLocked(meta.worker_id, &ready);
    KeepBuffersLocked(meta);
    SumPart& part = parts_[meta.worker_id];
    part = SumPart{};
    part.incarnation = meta.incarnation;
    part.samples = meta.samples;
    part.loss_sum = meta.loss_sum;
    part.correct = meta.correct;
    part.weight = weight;
    m.push_again = -1;
    token = sum_generation_;
  }
  RunReady(ready);
  return token;
}

absl::Status ParameterShard::StreamedPartLocked(const PushMeta& meta,
                                                int64_t token, SumPart** part,
                                                bool* duplicate) {
  *duplicate = false;
  if (!closed_.ok()) return closed_;
  TALLY_RETURN_IF_ERROR(CheckMemberLocked(meta.worker_id, meta.incarnation));
  if (members_.at(meta.worker_id).pushed_step >= meta.step) {
    *duplicate = true;  // another stream of it finished it
    return absl::OkStatus();
  }
  // Another push of the step that replaced this one in the sum (a part
  // dropped before it added anything keeps the generation) is not this
  // push's: its blocks must not go into that part.
  auto it = parts_.find(meta.worker_id);
  if (token != sum_generation_ || it == parts_.end() ||
      it->second.incarnation != meta.incarnation ||
      it->second.samples != meta.samples ||
      it->second.loss_sum != meta.loss_sum ||
      it->second.correct != meta.correct) {
    return PushAgainLocked();
  }
  *part = &it->second;
  return absl::OkStatus();
}

absl::StatusOr<bool> ParameterShard::AddStreamed(const PushMeta& meta,
                                                 int64_t token, int64_t local,
                                                 int64_t n, const float* values,
                                                 std::function<void()> wake) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    SumPart* found = nullptr;
    bool duplicate = false;
    TALLY_RETURN_IF_ERROR(StreamedPartLocked(meta, token, &found, &duplicate));
    if (duplicate) return true;  // counted already: the rest is ignored
    if (local < 0 || n < 0 || local > num_params_ - n) {
      return absl::InvalidArgumentError(
          absl::StrCat("values [", local, ", +", n, ") are outside the range"));
    }
    SumPart& part = *found;
    bool first = true;
    if (!TurnLocked(meta.worker_id, local, local + n, &first)) {
      parked_.push_back(std::move(wake));
      return false;
    }
    // Only what is not in yet (a push sent again after a broken stream).
    for (const auto& [b, e] : part.added.Gaps(local, local + n))
      SumInLocked(part, b, e, values + (b - local), first);
    ProgressLocked(&ready);
  }
  RunReady(ready);
  return true;
}

absl::Status ParameterShard::FinishStreamed(const PushMeta& meta, int64_t token,
                                            bool* duplicate) {
  absl::MutexLock lock(&mu_);
  SumPart* part = nullptr;
  TALLY_RETURN_IF_ERROR(StreamedPartLocked(meta, token, &part, duplicate));
  if (*duplicate) return absl::OkStatus();
  if (part->added.covered() != num_params_) {
    return absl::InvalidArgumentError(
        absl::StrCat("the push covers ", part->added.covered(), " of ",
                     num_params_, " gradient elements"));
  }
  part->complete = true;
  members_.at(meta.worker_id).pushed_step = meta.step;
  NoteLocked(meta.step, /*commit=*/false);
  return absl::OkStatus();
}

void ParameterShard::RestartIfLateLocked(const std::string& id, Ready* ready) {
  // Ranks add each element in order, so a rank's blocks wait for lower
  // ones it knows nothing of yet; a lower rank beginning after a higher one
  // added something (a member set changed under the step) restarts the sum.
  auto self = members_.find(id);
  if (self == members_.end()) return;
  const auto key = std::make_pair(self->second.spec.rank, id);
  for (const auto& [qid, p] : parts_) {
    auto q = members_.find(qid);
    if (q != members_.end() && std::make_pair(q->second.spec.rank, qid) > key &&
        !p.added.empty()) {
      ResetSumLocked("", ready);
      return;
    }
  }
}

bool ParameterShard::TurnLocked(const std::string& id, int64_t b, int64_t e,
                                bool* first) const {
  *first = true;
  auto self = members_.find(id);
  if (self == members_.end()) return false;  // not a member: never its turn
  const auto key = std::make_pair(self->second.spec.rank, id);
  for (const auto& [qid, q] : members_) {
    if (qid == id || !RequiredLocked(q, version_) ||
        !(std::make_pair(q.spec.rank, qid) < key)) {
      continue;
    }
    auto it = parts_.find(qid);
    if (it != parts_.end() && it->second.incarnation == q.spec.incarnation) {
      if (!it->second.added.Covers(b, e)) return false;
      *first = false;
      continue;
    }
    // Settled here as nothing (no samples, refused, committed without a
    // push here), or not begun: its push may still come first.
    if (q.pushed_step >= version_ || q.committed_step >= version_) continue;
    return false;
  }
  return true;
}

void ParameterShard::SumInLocked(SumPart& part, int64_t b, int64_t e,
                                 const float* g, bool first) {
  if (sum_ == nullptr) {
    if (!staging_pool_.empty()) {
      sum_ = std::move(staging_pool_.back());
      staging_pool_.pop_back();
    } else {
      sum_ = std::make_unique<std::vector<float>>(num_params_);
    }
    ++staging_out_;
  }
  float* dst = sum_->data() + b;
  if (first) {
    PutScaled(dst, g, part.weight, e - b);
  } else {
    AddScaled(dst, g, part.weight, e - b);
  }
  part.added.Add(b, e);
}

void ParameterShard::ProgressLocked(Ready* ready) {
  if (StreamedLocked()) {
    // Whole pushes (Accept) whose turn came, lowest rank first.
    for (bool again = true; again;) {
      again = false;
      for (auto& [id, part] : parts_) {
        if (part.whole == nullptr) continue;
        bool first = true;
        if (!TurnLocked(id, 0, num_params_, &first)) continue;
        SumInLocked(part, 0, num_params_, part.whole->data(), first);
        ReleaseLocked(std::move(part.whole));
        again = true;
      }
    }
  }
  for (auto& wake : parked_) {
    ready->emplace_back([wake = std::move(wake)](absl::Status) { wake(); },
                        absl::OkStatus());
  }
  parked_.clear();
}

void ParameterShard::ResetSumLocked(const std::string& keep_out, Ready* ready) {
  ++sum_resets_;
  ++sum_generation_;
  std::set<std::string> again;
  for (auto& [id, part] : parts_) {
    ReleaseLocked(std::move(part.whole));
    if (id == keep_out) continue;
    auto it = members_.find(id);
    if (it == members_.end() || it->second.spec.incarnation != part.incarnation)
      continue;
    Member& m = it->second;
    m.pushed_step = std::min(m.pushed_step, version_ - 1);
    if (m.committed_step >= version_) {
      m.committed_step = version_ - 1;
      m.last_refused = false;
    }
    m.push_again = version_;
    again.insert(id);
  }
  parts_.clear();
  // Those waiting for the step's end push again first.
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->version > version_ && again.count(it->worker_id) > 0) {
      ready->emplace_back(std::move(it->done), PushAgainLocked());
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  ProgressLocked(ready);  // waiting blocks find their tokens stale
}

void ParameterShard::DropPartLocked(const std::string& id, Ready* ready) {
  auto it = parts_.find(id);
  if (it == parts_.end()) return;
  if (!it->second.added.empty()) {
    ResetSumLocked(id, ready);
    return;
  }
  ReleaseLocked(std::move(it->second.whole));
  parts_.erase(it);
  ProgressLocked(ready);
}

void ParameterShard::CheckPartsLocked(Ready* ready) {
  for (auto it = parts_.begin(); it != parts_.end();) {
    auto m = members_.find(it->first);
    const bool gone = m == members_.end() ||
                      m->second.spec.incarnation != it->second.incarnation ||
                      !RequiredLocked(m->second, version_);
    const bool refused =
        !gone && m->second.committed_step >= version_ && m->second.last_refused;
    if (!gone && !refused) {
      ++it;
      continue;
    }
    if (!it->second.added.empty()) {
      // In the sum, and cannot count: the others push again.
      ResetSumLocked(refused ? it->first : "", ready);
      return;
    }
    ReleaseLocked(std::move(it->second.whole));
    it = parts_.erase(it);
  }
  ProgressLocked(ready);  // a member set changed: waiting blocks look again
}

}  // namespace tally
