#include "server/shard.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/vectorize.h"
#include "proto/errors.h"

namespace tally {

namespace {

TALLY_VECTORIZE void AddScaled(float* __restrict sum, const float* __restrict g,
                               float w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) sum[i] += w * g[i];
}

TALLY_VECTORIZE void SetScaled(float* __restrict sum, const float* __restrict g,
                               float w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) sum[i] = w * g[i];
}

TALLY_VECTORIZE void ScaleInto(float* __restrict out,
                               const float* __restrict sum, float inv,
                               int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = sum[i] * inv;
}

}  // namespace

ParameterShard::ParameterShard(std::vector<float> weights,
                               std::unique_ptr<Optimizer> optimizer,
                               const Clock* clock)
    : num_params_(static_cast<int64_t>(weights.size())), clock_(clock) {
  absl::MutexLock lock(&mu_);
  optimizer_ = std::move(optimizer);
  weights_ = std::move(weights);
  snapshot_ = std::make_shared<const std::vector<float>>(weights_);
  sum_.assign(num_params_, 0.0f);
  mean_.assign(num_params_, 0.0f);
}

ShardState ParameterShard::Save() const {
  absl::MutexLock lock(&mu_);
  ShardState s;
  s.metrics = MetricsLocked();
  s.retired = retired_;
  s.weights = snapshot_;
  if (optimizer_ != nullptr) s.optimizer = optimizer_->SaveState();
  return s;
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
    if (absl::Status s = optimizer->LoadState(state.optimizer); !s.ok()) {
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

void ParameterShard::AddMember(const std::string& worker_id,
                               int64_t incarnation) {
  absl::MutexLock lock(&mu_);
  Member m;
  m.incarnation = incarnation;
  // Joining an open step that already has contributions would make the
  // step's worker set differ between shards; wait for the next one.
  m.join_step = step_contributions_ > 0 ? version_ + 1 : version_;
  members_[worker_id] = m;
}

void ParameterShard::RemoveMember(const std::string& worker_id) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    members_.erase(worker_id);
    MaybeCloseLocked(&ready);
  }
  RunReady(ready);
}

bool ParameterShard::IsMember(const std::string& worker_id,
                              int64_t incarnation) const {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(worker_id);
  return it != members_.end() && it->second.incarnation == incarnation;
}

absl::Status ParameterShard::SetSchedule(int64_t total_steps,
                                         int64_t steps_per_epoch) {
  if (total_steps <= 0 || steps_per_epoch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("total_steps and steps_per_epoch must be positive, got ",
                     total_steps, " and ", steps_per_epoch));
  }
  absl::MutexLock lock(&mu_);
  if (total_steps_ == 0) {
    total_steps_ = total_steps;
    steps_per_epoch_ = steps_per_epoch;
    return absl::OkStatus();
  }
  if (total_steps_ != total_steps || steps_per_epoch_ != steps_per_epoch) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "this worker's schedule (", total_steps, " steps, ",
            steps_per_epoch, " per epoch) differs from the job's (",
            total_steps_, ", ", steps_per_epoch_,
            "): does this worker see another dataset?")),
        v1::SCHEDULE_MISMATCH);
  }
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
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "worker ", worker_id,
                          " is not a member of this job (lease lost?)")),
                      v1::NOT_A_MEMBER);
  }
  if (it->second.incarnation != incarnation) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "stale incarnation ", incarnation, " of worker ", worker_id,
            " (current ", it->second.incarnation, ")")),
        v1::REGISTER_AGAIN);
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
  const Member& m = members_.at(meta.worker_id);
  if (meta.samples < 0) {
    return absl::InvalidArgumentError("samples must not be negative");
  }
  if (meta.step < version_ && m.pushed_step >= meta.step) {
    *duplicate = true;
    return absl::OkStatus();
  }
  // A step that closed without this push, or one that will never open (the
  // training is over): either way, the next thing to do is to pull.
  if (meta.step < version_ || (total_steps_ > 0 && version_ >= total_steps_)) {
    return WithReason(
        absl::AbortedError(absl::StrCat("step ", meta.step,
                                        " is closed; the weights are at "
                                        "version ",
                                        version_, ": pull and go on")),
        v1::STEP_CLOSED, version_);
  }
  if (meta.step > version_) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "step ", meta.step, " is not open yet (open: ",
                          version_, ")")),
                      v1::STEP_NOT_OPEN, version_);
  }
  if (meta.base_version != meta.step) {
    return absl::InvalidArgumentError(
        absl::StrCat("sync mode: a push for step ", meta.step,
                     " must be computed from version ", meta.step, ", not ",
                     meta.base_version));
  }
  if (m.join_step > version_) {
    return WithReason(
        absl::FailedPreconditionError(
            absl::StrCat("worker ", meta.worker_id, " joins at step ",
                         m.join_step, "; pull that version first")),
        v1::JOIN_LATER, m.join_step);
  }
  if (m.pushed_step >= meta.step) *duplicate = true;
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckPush(const PushMeta& meta,
                                       bool* duplicate) const {
  absl::MutexLock lock(&mu_);
  return CheckPushLocked(meta, duplicate);
}

absl::Status ParameterShard::Commit(const PushMeta& meta, const float* grads,
                                    bool* duplicate) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    absl::Status s = CheckPushLocked(meta, duplicate);
    if (!s.ok() || *duplicate) return s;
    if (meta.samples > 0 && grads == nullptr) {
      return absl::InvalidArgumentError("a push with samples needs a gradient");
    }
    if (meta.samples > 0) {
      // The step's first gradient sets the sum: no zeroing pass per step.
      const float w = static_cast<float>(meta.samples);
      if (step_samples_ == 0) {
        SetScaled(sum_.data(), grads, w, num_params_);
      } else {
        AddScaled(sum_.data(), grads, w, num_params_);
      }
      step_samples_ += meta.samples;
      step_loss_ += meta.loss_sum;
      step_correct_ += meta.correct;
    }
    ++step_contributions_;
    members_[meta.worker_id].pushed_step = meta.step;
    MaybeCloseLocked(&ready);
  }
  RunReady(ready);
  return absl::OkStatus();
}

void ParameterShard::Reject(const PushMeta& meta) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    ++rejected_;
    bool duplicate = false;
    if (!CheckPushLocked(meta, &duplicate).ok() || duplicate) return;
    ++step_contributions_;
    members_[meta.worker_id].pushed_step = meta.step;
    MaybeCloseLocked(&ready);
  }
  RunReady(ready);
}

void ParameterShard::MaybeCloseLocked(Ready* ready) {
  if (retired_ || (total_steps_ > 0 && version_ >= total_steps_)) return;
  int required = 0;
  for (const auto& [id, m] : members_) {
    if (m.join_step > version_) continue;
    ++required;
    if (m.pushed_step < version_) return;  // still waiting for this one
  }
  if (required == 0) return;  // nobody to close it with
  if (step_samples_ > 0) {
    ScaleInto(mean_.data(), sum_.data(), 1.0f / step_samples_, num_params_);
    optimizer_->Step(weights_.data(), mean_.data());
    // Publish the new weights in a snapshot buffer no reader holds.
    std::shared_ptr<std::vector<float>> fresh;
    for (auto& s : snapshot_pool_) {
      if (s.use_count() == 1) {
        fresh = s;
        break;
      }
    }
    if (fresh == nullptr) {
      fresh = std::make_shared<std::vector<float>>(num_params_);
      if (snapshot_pool_.size() < 4) snapshot_pool_.push_back(fresh);
    }
    std::copy(weights_.begin(), weights_.end(), fresh->begin());
    snapshot_ = fresh;
    last_loss_ = step_loss_ / step_samples_;
    last_accuracy_ = static_cast<double>(step_correct_) / step_samples_;
  }
  samples_total_ += step_samples_;
  const absl::Time now = clock_->Now();
  closes_.emplace_back(now, samples_total_);
  // Keep about five seconds of history for the throughput figure.
  while (closes_.size() > 2 && now - closes_.front().first > absl::Seconds(5)) {
    closes_.erase(closes_.begin());
  }
  step_samples_ = 0;  // the next step's first gradient overwrites sum_
  step_contributions_ = 0;
  step_loss_ = 0.0;
  step_correct_ = 0;
  ++version_;
  if (version_ == total_steps_) finished_ = now;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->version <= version_) {
      ready->emplace_back(std::move(it->done), absl::OkStatus());
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

void ParameterShard::RunReady(Ready& ready) {
  for (auto& [fn, status] : ready) fn(status);
}

absl::StatusOr<std::unique_ptr<std::vector<float>>>
ParameterShard::AcquireStaging() {
  {
    absl::MutexLock lock(&mu_);
    const int limit = 2 * static_cast<int>(members_.size()) + 4;
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
  if (retired_) return;
  if (staging_pool_.size() < 8) staging_pool_.push_back(std::move(buffer));
}

int64_t ParameterShard::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

std::shared_ptr<const std::vector<float>> ParameterShard::Snapshot(
    int64_t* version, int64_t* total_steps) const {
  absl::MutexLock lock(&mu_);
  if (version != nullptr) *version = version_;
  if (total_steps != nullptr) *total_steps = total_steps_;
  return snapshot_;
}

ShardMetrics ParameterShard::Metrics() const {
  absl::MutexLock lock(&mu_);
  return MetricsLocked();
}

ShardMetrics ParameterShard::MetricsLocked() const {
  ShardMetrics m;
  m.version = version_;
  m.total_steps = total_steps_;
  m.steps_per_epoch = steps_per_epoch_;
  m.loss = last_loss_;
  m.accuracy = last_accuracy_;
  m.samples = samples_total_;
  m.rejected_pushes = rejected_;
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

void ParameterShard::WhenVersion(int64_t v, absl::Time deadline,
                                 std::function<void(absl::Status)> done) {
  {
    absl::MutexLock lock(&mu_);
    // Training time counts from the first pull of the weights.
    if (started_ == absl::InfinitePast() && !retired_) started_ = clock_->Now();
    if (version_ < v) {
      waiters_.push_back({v, deadline, std::move(done)});
      return;
    }
  }
  done(absl::OkStatus());
}

void ParameterShard::ExpireWaiters() {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
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
  absl::MutexLock lock(&mu_);
  retired_ = true;
  members_.clear();
  optimizer_.reset();
  std::vector<float>().swap(sum_);
  std::vector<float>().swap(mean_);
  std::vector<float>().swap(weights_);  // snapshot_ holds the final weights
  snapshot_pool_.clear();
  staging_pool_.clear();
}

void ParameterShard::CancelWaiters() {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    for (Waiter& w : waiters_) {
      ready.emplace_back(
          std::move(w.done),
          WithReason(absl::FailedPreconditionError("the job ended"),
                     v1::JOB_ENDED));
    }
    waiters_.clear();
  }
  RunReady(ready);
}

}  // namespace tally
